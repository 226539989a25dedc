"""s33 ckpt finding 4, the pure parts: a --resume in another precision, at another expert-parallel size or of another
model is refused before DeepSpeed's loader (which died with a FileNotFoundError / parameter-alignment /
missing-keys traceback, exit 1). The trainer's manifest records what it trained ("run"); a tag saved before that is
read from DeepSpeed's own metadata, and what cannot be read is not compared (no false refusal)."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dstoolkit.cli import main
from dstoolkit.cli import train as train_cli
from dstoolkit.runtime.train.ckpt import CheckpointManager, read_manifest, write_manifest
from dstoolkit.runtime.train.resume_check import pick_resume, resume_refusal, saved_layout


@pytest.fixture
def no_launch(monkeypatch):
    def launch(*a, **k):
        raise AssertionError(f"ranks started: {a}")

    monkeypatch.setattr(train_cli.subprocess, "run", launch)


def _tag(root: Path, step: int = 6, *, bf16: bool = True, run: dict | None = None, head: dict | None = None) -> Path:
    """A ZeRO-2 dp-2 tag as DeepSpeed 0.19.8 names its files (metadata only), with a complete manifest."""
    import torch

    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    ds = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": bf16}}
    torch.save({"dp_world_size": 2, "ds_config": ds, **(head or {})}, d / "mp_rank_00_model_states.pt")
    for r in range(2):
        torch.save({"optimizer_state_dict": {"zero_stage": 2}},
                   d / f"{'bf16_' if bf16 else ''}zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    write_manifest(d, {"step": step, "healthy": True, **({"run": run} if run else {})})
    (root / "latest").write_text(d.name)
    return d


class _Engine:
    """What pick_resume and the manifest read of a DeepSpeed engine: ZeRO-2 on 2 ranks, a module."""

    def __init__(self, module, bf16: bool = True) -> None:
        self.module, self.bf16, self.dp_world_size = module, bf16, 2

    def zero_optimization_stage(self):
        return 2

    def bfloat16_enabled(self):
        return self.bf16

    def fp16_enabled(self):
        return False

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        (Path(save_dir) / tag).mkdir(parents=True)
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_bytes(b"x")


def _module(width: int = 4, ep: int | None = None):
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 2))
    if ep is not None:
        moe = type("MoE", (torch.nn.Module,), {})()  # deepspeed.moe.layer.MoE is read by its name and ep_size
        moe.ep_size = ep
        m.add_module("moe", moe)
    return m


def test_bf16_checkpoint_with_an_fp32_config_is_refused_before_launch(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    ds.write_text(json.dumps({**json.loads(ds.read_text()), "zero_optimization": {"stage": 2}}))  # fp32, ZeRO-2
    ck = tmp_path / "ck"
    _tag(ck, bf16=True)  # saved before the manifest recorded "run": the bf16_ file prefix says it
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "8", "--nproc", "2", "--metrics-out",
                 str(tmp_path / "m.jsonl"), "--", "--checkpoint-dir", str(ck), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dstoolkit train: error: --checkpoint-dir {ck}: --resume would load step_00000006, saved "
                          "in bf16, but this run is fp32; ")
    assert "Resume with bf16.enabled true" in err and "`dstoolkit ckpt reshard`" in err
    assert "loads across precision" in err and err.count("\n") == 1


def test_precision_compare_both_ways_and_no_false_refusal(tmp_path):
    ck = tmp_path / "ck"
    _tag(ck, bf16=False)
    z2 = {"zero_optimization": {"stage": 2}}
    assert "saved in fp32, but this run is bf16; " in resume_refusal(ck, {**z2, "bf16": {"enabled": True}}, 2)
    assert "Resume with bf16.enabled false" in resume_refusal(ck, {**z2, "bfloat16": {"enabled": True}}, 2)
    assert resume_refusal(ck, z2, 2) is None
    assert resume_refusal(ck, {**z2, "fp16": {"enabled": True}}, 2) is None  # fp16 / fp32: the same ZeRO files


def test_manifest_records_the_run_and_resume_compares_it(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    engine = _Engine(_module(4, ep=2))
    tag = mgr.save(engine, 3, {}, healthy=True, barrier=lambda: None)
    run = read_manifest(mgr.root / tag)["run"]
    assert run["precision"] == "bf16" and run["ep_size"] == 2
    assert run["params"][0] == ["0.weight", [4, 4]] and len(run["params"]) == 4
    assert pick_resume(mgr, engine)[1] is None  # the same run resumes

    found, why = pick_resume(mgr, _Engine(_module(4, ep=1)))
    assert found.tag == tag and why.startswith(f"--checkpoint-dir {mgr.root}: --resume would load {tag}, saved at "
                                               "expert-parallel size 2, but this run's is 1; ")
    assert "Resume with the trainer's --ep-size 2" in why

    why = pick_resume(mgr, _Engine(_module(8, ep=2)))[1]
    assert "saved from another model: parameter 0.weight is [4, 4] there and [8, 8] in this run's model" in why
    assert "Resume with the spec (and --shrink, or not) it was saved with" in why

    why = pick_resume(mgr, _Engine(_module(4, ep=2), bf16=False))[1]
    assert "saved in bf16, but this run is fp32" in why


def test_model_difference_names_a_missing_parameter(tmp_path):
    import torch

    mgr = CheckpointManager(tmp_path / "ck", keep=3)
    mgr.save(_Engine(_module(4)), 3, {}, healthy=True, barrier=lambda: None)
    bigger = _module(4)
    bigger.add_module("extra", torch.nn.Linear(4, 4))
    assert "this run's parameter extra.weight [4, 4] is not in it" in pick_resume(mgr, _Engine(bigger))[1]
    assert "parameter 1.weight [2, 4] is not in this run's model" in pick_resume(
        mgr, _Engine(torch.nn.Sequential(torch.nn.Linear(4, 4))))[1]


def test_old_tag_is_read_from_deepspeed_metadata(tmp_path):
    """Without the manifest's "run": param_shapes and num_experts (as DeepSpeed 0.19.8 pickles them) give the
    model and the ep size; a tag without them is not compared."""
    import torch

    ck = tmp_path / "ck"
    shapes = [{"0.weight": torch.Size([4, 4]), "0.bias": torch.Size([4]),
               "moe.deepspeed_moe.experts.deepspeed_experts.0.w": torch.Size([2]),
               "moe.deepspeed_moe.experts.deepspeed_experts.1.w": torch.Size([2])}]
    d = _tag(ck, head={"param_shapes": shapes, "num_experts": [4]})
    run = saved_layout(d).run
    assert (run.precision, run.ep) == ("bf16", 2) and run.params["0.weight"] == (4, 4)
    found, why = pick_resume(CheckpointManager(ck), _Engine(_module(4, ep=1)))
    assert "saved at expert-parallel size 2, but this run's is 1" in why
    z2 = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    assert "saved at expert-parallel size 2, but this run's is 1" in resume_refusal(ck, z2, 2, ep=1)  # pre-flight
    assert resume_refusal(ck, z2, 2, ep=2) is None and resume_refusal(ck, z2, 2) is None

    bare = tmp_path / "bare"
    _tag(bare)  # no param_shapes / num_experts: only the precision is known
    run = saved_layout(bare / "step_00000006").run
    assert (run.precision, run.ep, run.params) == ("bf16", None, None)
    assert pick_resume(CheckpointManager(bare), _Engine(_module(4, ep=4)))[1] is None


def test_ckpt_inspect_still_asks_pick_resume_read_only(tmp_path, capsys):
    ck = tmp_path / "ck"
    _tag(ck, run={"precision": "bf16", "ep_size": 1, "params": [["0.weight", [4, 4]]]})
    assert main(["ckpt", "inspect", str(ck), "--format", "json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert out.get("resume_tag", "step_00000006") == "step_00000006"
