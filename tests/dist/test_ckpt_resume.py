"""`dstoolkit ckpt reshard` / `export` / `inspect`, proven on real DeepSpeed 0.19.8 engines on 2 CPU gloo ranks.

One module-scoped fixture runs three launches (world 1, world 2, world 1) of `dstoolkit.runtime.ckpt.runs`, which
train, save, convert to universal (through `dstoolkit.runtime.ckpt.reshard.to_universal`, the code behind the CLI)
and resume at another layout, all inside one process group per launch; every test below reads what they wrote.

Tolerances, derived from what differs between a resumed run and the uninterrupted one:
- the saved state itself (fp32 master weights, Adam exp_avg / exp_avg_sq, step, LR, scheduler position) is copied,
  not recomputed: the universal checkpoint holds the fp32 values, so they must come back bit-identical;
- the losses after the resume differ only in the order of floating-point reductions (dp 2 all-reduces two
  micro-batch gradients, dp 1 accumulates them; ZeRO-2/3 reduce-scatter in buckets where ZeRO-1 all-reduces).
  fp32: a sum of n terms reordered moves by <= n * eps * sum|terms| (Higham, Accuracy and Stability of Numerical
  Algorithms, eq. 4.4); with eps = 2^-24, n <= 4096 terms per reduction and a few steps of Adam carrying it, we
  allow 1e-5 relative on the loss (about 170 eps). Measured (2026-12, this machine): 0.0 in every fp32 case - on
  this tiny model both reduction orders happen to round alike.
  bf16: the weights the forward uses are the fp32 master rounded to 8 bits of mantissa (eps = 2^-8 = 3.9e-3), so a
  reordering that moves a master weight across a rounding boundary moves that weight by one bf16 ulp; the loss then
  moves by O(eps) relative: we allow 2e-2 relative (about 5 bf16 eps). Measured: 0.0 (dp 2 -> 1, ZeRO-2, bf16).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]

FP32_RTOL = 1e-5
BF16_RTOL = 2e-2
SAVE_AT = 3
K = 2  # steps per segment after a resume
TOTAL = 12
DENSE = {"kind": "tiny", "shape": dict(name="ck", model_type="llama", hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                       vocab_size=64)}
MOE = {"kind": "tiny", "shape": dict(name="ckm", model_type="mixtral", hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                     vocab_size=64, num_experts=4, num_experts_per_tok=2)}
HF_DIR = Path(__file__).resolve().parents[1] / "golden" / "hf_configs"


def _hf(name: str) -> dict:
    from dstoolkit.runtime.shrink import shrink_config
    from dstoolkit.runtime.shrink_sizes import ShrinkSizes

    cfg = json.loads((HF_DIR / f"{name}.json").read_text())
    return {"kind": "hf", "config": shrink_config(cfg, ShrinkSizes(layers=2, hidden=32, heads=2, head_dim=16,
                                                                   experts=8, vocab=128)).config}


def _seg(name, model, stage, world_micro_ga, steps_to, **kw):
    micro, ga = world_micro_ga
    return {"kind": "train", "name": name, "model": model, "zero_stage": stage, "micro": micro, "ga": ga,
            "steps_to": steps_to, **kw}


def _launch(plan: dict, path: Path, nproc: int, timeout_s: float = 300) -> float:
    from dstoolkit.runtime.train.launch import free_port

    path.write_text(json.dumps(plan))
    bindir = Path(sys.executable).parent
    cmd = [str(bindir / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", str(free_port()),
           "-m", "dstoolkit.runtime.ckpt.runs", str(path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    ck, u, probe = d / "ck", d / "u", d / "probe"
    w1 = _seg("ref_w1", DENSE, 1, (2, 2), SAVE_AT + K, save=[{"step": SAVE_AT, "dir": str(ck / "w1")}],
              probe=[SAVE_AT])
    launch1 = [w1]
    ref = _seg("ref_w2", DENSE, 1, (2, 1), SAVE_AT + 4 * K, save=[{"step": SAVE_AT, "dir": str(ck / "w2z1")}],
               probe=[SAVE_AT + i * K for i in range(4)])
    chain = []
    src = ck / "w2z1" / f"global_step{SAVE_AT}"
    for i, (name, stage) in enumerate((("z1_to_z2", 2), ("z2_to_z3", 3), ("z3_to_z2", 2), ("z2_to_z1", 1))):
        start = SAVE_AT + i * K
        out = u / name
        chain.append({"kind": "convert", "src": str(src), "out": str(out)})
        chain.append(_seg(name, DENSE, stage, (2, 1), start + K, load={"dir": str(out), "universal": True},
                          save=[{"step": start + K, "dir": str(ck / name)}], probe=[start, start + K]))
        src = ck / name / f"global_step{start + K}"
    ref_bf16 = _seg("ref_w2_bf16", DENSE, 2, (2, 1), SAVE_AT + K, bf16=True, probe=[SAVE_AT],
                    save=[{"step": SAVE_AT, "dir": str(ck / "w2bf16")}])
    launch2 = [
        ref, *chain,
        {"kind": "convert", "src": str(ck / "w1" / f"global_step{SAVE_AT}"), "out": str(u / "w1")},
        _seg("dp1_to_dp2", DENSE, 1, (2, 1), SAVE_AT + K, load={"dir": str(u / "w1"), "universal": True},
             probe=[SAVE_AT]),
        {"kind": "convert", "src": str(ck / "w2z1" / f"global_step{SAVE_AT}"), "out": str(u / "w2z1")},
        ref_bf16,
        {"kind": "convert", "src": str(ck / "w2bf16" / f"global_step{SAVE_AT}"), "out": str(u / "w2bf16")},
        _seg("moe_ep2", MOE, 2, (2, 1), SAVE_AT + K, ep=2, save=[{"step": SAVE_AT, "dir": str(ck / "moe")}]),
        _seg("offload_z2", DENSE, 2, (2, 1), 1, offload=True, save=[{"step": 1, "dir": str(ck / "offload")}]),
        _seg("z0", DENSE, 0, (2, 1), 1, save=[{"step": 1, "dir": str(ck / "z0")}]),
    ]
    for model_name, model in (("llama", _hf("llama-3.2-1b")), ("qwen3moe", _hf("qwen3-30b-a3b"))):
        for stage in (2, 3):
            launch2.append(_seg(f"{model_name}_z{stage}", model, stage, (2, 1), 2, logits=True,
                                save=[{"step": 2, "dir": str(ck / f"{model_name}_z{stage}")}]))
    # last: a PipelineModule engine leaves DeepSpeed's global model-parallel state set for later engines
    launch2.append({"kind": "pipe", "name": "pipe", "steps_to": 2, "save": [{"step": 2, "dir": str(ck / "pipe")}]})
    launch3 = [
        _seg("dp2_to_dp1", DENSE, 1, (2, 2), SAVE_AT + K, load={"dir": str(u / "w2z1"), "universal": True},
             probe=[SAVE_AT]),
        _seg("dp2_to_dp1_bf16", DENSE, 2, (2, 2), SAVE_AT + K, bf16=True,
             load={"dir": str(u / "w2bf16"), "universal": True}, probe=[SAVE_AT]),
    ]
    common = {"total_steps": TOTAL, "probe_dir": str(probe)}
    secs = []
    results = {}
    for i, (segs, nproc) in enumerate(((launch1, 1), (launch2, 2), (launch3, 1))):
        res = d / f"result{i}.json"
        secs.append(_launch({**common, "segments": segs, "result": str(res)}, d / f"plan{i}.json", nproc))
        results.update({r["name"]: r for r in json.loads(res.read_text())["segments"]})
    print(f"[ckpt runs] launches took {', '.join(f'{s:.1f}' for s in secs)} s")
    return {"dir": d, "ck": ck, "u": u, "probe": probe, "res": results}


def _losses(rec) -> dict[int, float]:
    return {int(k): v for k, v in rec["losses"].items()}


def _probe(runs, name, step, rank=0):
    import torch

    return torch.load(runs["probe"] / f"{name}_step{step}_rank{rank}.pt", weights_only=False)


def _assert_state_equal(a: dict, b: dict, what: str) -> None:
    import torch

    for kind in ("fp32", "exp_avg", "exp_avg_sq"):
        assert a[kind].keys() == b[kind].keys(), what
        for name in a[kind]:
            assert torch.equal(a[kind][name], b[kind][name]), f"{what}: {kind} of {name} changed"
    for key in ("optimizer_steps", "lr", "scheduler_position", "global_steps"):
        assert a[key] == b[key], f"{what}: {key} {a[key]} != {b[key]}"


CASES = [  # (resumed segment, uninterrupted reference, resume step, segment whose saved state it loaded, rtol)
    ("dp2_to_dp1", "ref_w2", SAVE_AT, "ref_w2", FP32_RTOL),
    ("dp1_to_dp2", "ref_w1", SAVE_AT, "ref_w1", FP32_RTOL),
    ("z1_to_z2", "ref_w2", SAVE_AT, "ref_w2", FP32_RTOL),
    ("z2_to_z3", "ref_w2", SAVE_AT + K, "z1_to_z2", FP32_RTOL),
    ("z3_to_z2", "ref_w2", SAVE_AT + 2 * K, "z2_to_z3", FP32_RTOL),
    ("z2_to_z1", "ref_w2", SAVE_AT + 3 * K, "z3_to_z2", FP32_RTOL),
    ("dp2_to_dp1_bf16", "ref_w2_bf16", SAVE_AT, "ref_w2_bf16", BF16_RTOL),
]


@pytest.mark.parametrize("name,ref,at,saved_by,rtol", CASES, ids=[c[0] for c in CASES])
def test_resume_at_other_layout_continues_the_run(runs, name, ref, at, saved_by, rtol):
    got, want = _losses(runs["res"][name]), _losses(runs["res"][ref])
    assert sorted(got) == list(range(at + 1, at + K + 1)), got
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in got)
    print(f"[ckpt resume] {name}: before resume (step {at}) {want[at]:.6f}; after: "
          + ", ".join(f"step {s} {got[s]:.6f} vs uninterrupted {want[s]:.6f}" for s in sorted(got))
          + f"; worst relative difference {worst:.2e} (tolerance {rtol:.0e})")
    assert worst <= rtol
    # the optimizer state the resumed engine holds is the one the saving engine had (bit for bit)
    _assert_state_equal(_probe(runs, name, at), _probe(runs, saved_by, at), name)


# ------------------------------------------------------------------------------------------------------------
# export: the consolidated weights in transformers give the engine's logits

EXPORT_ATOL = 1e-4
"""fp32 logits of the same weights through the same transformers ops (sdpa attention, eager experts): only the
accumulation order of kernels can differ; measured differences are printed."""


@pytest.mark.parametrize("name", ["llama_z2", "llama_z3", "qwen3moe_z2", "qwen3moe_z3"])
def test_export_hf_gives_the_engine_logits(runs, name, tmp_path, capsys):
    import torch
    import transformers as tf

    from dstoolkit.cli import main
    from dstoolkit.runtime.ckpt.runs import global_batch

    out = tmp_path / "hf"
    assert main(["ckpt", "export", str(runs["ck"] / name), "--hf", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "model.safetensors" in printed and "prefix stripped: 'hf.'" in printed, printed
    model = tf.AutoModelForCausalLM.from_pretrained(str(out), attn_implementation="sdpa",
                                                    experts_implementation="eager").eval()
    assert model.dtype == torch.float32  # config.json says what was exported
    ids, _ = global_batch(10 ** 6, 2, model.config.vocab_size)
    with torch.no_grad():
        got = model(input_ids=ids, use_cache=False).logits.float()
    want = torch.load(runs["probe"] / f"{name}_logits.pt")
    diff = float((got - want).abs().max())
    with capsys.disabled():
        print(f"[ckpt export] {name}: {type(model).__name__}, largest logit difference {diff:.3e} "
              f"(logits up to {float(want.abs().max()):.2f}; tolerance {EXPORT_ATOL:.0e})")
    assert diff <= EXPORT_ATOL


def test_export_bf16_halves_the_weights(runs, tmp_path):
    from dstoolkit.cli import main

    a, b = tmp_path / "fp32", tmp_path / "bf16"
    assert main(["ckpt", "export", str(runs["ck"] / "llama_z2"), "--hf", str(a)]) == 0
    assert main(["ckpt", "export", str(runs["ck"] / "llama_z2"), "--hf", str(b), "--dtype", "bf16"]) == 0
    from safetensors import safe_open

    with safe_open(str(b / "model.safetensors"), "pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.bfloat16"}
    ratio = (b / "model.safetensors").stat().st_size / (a / "model.safetensors").stat().st_size
    assert 0.49 < ratio < 0.52, ratio


# ------------------------------------------------------------------------------------------------------------
# inspect: every kind of checkpoint these runs wrote

INSPECT_CASES = [  # (checkpoint, format, ZeRO stage, dp, ep, optimizer states)
    ("z0", "deepspeed-zero", 0, 2, None, True),
    ("w2z1", "deepspeed-zero", 1, 2, None, True),
    ("w1", "deepspeed-zero", 1, 1, None, True),
    ("z1_to_z2", "deepspeed-zero", 2, 2, None, True),
    ("z2_to_z3", "deepspeed-zero", 3, 2, None, True),
    ("offload", "deepspeed-zero", 2, 2, None, True),
    ("w2bf16", "deepspeed-zero", 2, 2, None, True),
    ("moe", "deepspeed-moe", 2, 2, 2, True),
    ("qwen3moe_z3", "deepspeed-zero", 3, 2, None, True),
    ("pipe", "deepspeed-pipeline", 1, 1, None, True),
]


@pytest.mark.parametrize("name,fmt,stage,dp,ep,opt", INSPECT_CASES, ids=[c[0] for c in INSPECT_CASES])
def test_inspect_every_kind(runs, name, fmt, stage, dp, ep, opt):
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    info = inspect_checkpoint(runs["ck"] / name)
    pp = 2 if fmt == "deepspeed-pipeline" else 1
    assert (info.format, info.zero_stage, info.dp, info.tp, info.pp, info.ep) == (fmt, stage, dp, 1, pp, ep)
    assert info.complete and not info.problems
    assert info.optimizer_states is opt and info.scheduler is (name != "pipe")  # the pipeline run has no scheduler
    assert info.world_size == dp * pp
    on_disk = sum(p.stat().st_size for p in (runs["ck"] / name / info.tag).iterdir() if p.is_file())
    assert info.total_bytes == on_disk
    if stage >= 1:
        assert len(info.ranks) == dp * pp and all(r.bytes > 0 for r in info.ranks)
    if name == "offload":
        assert info.offload == "cpu"
    if name == "w2bf16":
        assert info.dtypes["model"] == "bfloat16" and info.dtypes["master"] == "float32"


def test_inspect_universal(runs):
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    info = inspect_checkpoint(runs["u"] / "w2z1")
    assert info.format == "deepspeed-universal" and info.complete and info.optimizer_states
    assert info.step == SAVE_AT and info.tag == f"global_step{SAVE_AT}"


# ------------------------------------------------------------------------------------------------------------
# bad input: one line naming the file, the problem and the fix; exit 2 (inspect: 1 for an incomplete folder)


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _snapshot(d: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file()}


def test_truncated_shard_is_named(runs, tmp_path, capsys):
    from dstoolkit.cli import main

    ck = _copy(runs["ck"] / "w2z1", tmp_path / "cut")
    shard = ck / f"global_step{SAVE_AT}" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.truncate(shard, shard.stat().st_size // 2)
    before = _snapshot(ck)
    assert main(["ckpt", "inspect", str(ck)]) == 1
    out = capsys.readouterr().out
    with capsys.disabled():
        print("[ckpt inspect, truncated shard]\n" + out)
    assert f"{shard}: is truncated" in out and "complete     NO" in out
    for argv in (["ckpt", "reshard", str(ck), "--out", str(tmp_path / "u")],
                 ["ckpt", "export", str(ck), "--hf", str(tmp_path / "hf"), "--config", str(tmp_path / "none.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and str(shard) in err and "truncated" in err, err
    assert not (tmp_path / "u").exists() and not (tmp_path / "hf").exists()
    assert _snapshot(ck) == before


def test_missing_shard_is_named(runs, tmp_path, capsys):
    from dstoolkit.cli import main

    ck = _copy(runs["ck"] / "z2_to_z3", tmp_path / "gone")
    tag = ck / f"global_step{SAVE_AT + 2 * K}"
    (tag / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert main(["ckpt", "inspect", str(ck), "--format", "json"]) == 1
    info = json.loads(capsys.readouterr().out)
    assert info["complete"] is False
    assert {p["file"] for p in info["problems"]} == {str(tag / "zero_pp_rank_1_mp_rank_00_model_states.pt")}


def test_not_a_checkpoint_and_existing_output(runs, tmp_path, capsys):
    from dstoolkit.cli import main

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["ckpt", "inspect", str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"{empty}: is not a checkpoint folder" in err and "Traceback" not in err
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    for argv in (["ckpt", "reshard", str(runs["ck"] / "w2z1"), "--out", str(taken)],
                 ["ckpt", "export", str(runs["ck"] / "llama_z2"), "--hf", str(taken)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{taken}: already exists" in err and "new folder" in err, err
    assert [p.name for p in taken.iterdir()] == ["mine.txt"] and (taken / "mine.txt").read_text() == "keep me"


def test_reshard_refuses_layouts_it_cannot_reach(runs, tmp_path, capsys):
    from dstoolkit.cli import main

    assert main(["ckpt", "reshard", str(runs["ck"] / "w2z1"), "--out", str(tmp_path / "a"), "--to", "tp=2"]) == 2
    err = capsys.readouterr().err
    assert "target tp=2 but the checkpoint was written at tp=1" in err and "keep tp=1" in err
    # native MoE at ep=2: DeepSpeed's converter cannot move experts (reason with file and line)
    assert main(["ckpt", "reshard", str(runs["ck"] / "moe"), "--out", str(tmp_path / "b"), "--to", "ep=1"]) == 2
    err = capsys.readouterr().err
    assert "ds_to_universal.py:1250-1252" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_reshard_cli_writes_a_universal_checkpoint(runs, tmp_path, capsys):
    from dstoolkit.cli import main
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    out = tmp_path / "u"
    assert main(["ckpt", "reshard", str(runs["ck"] / "w2z1"), "--out", str(out), "--to", "world=1,zero=3"]) == 0
    assert "load_universal" in capsys.readouterr().out
    info = inspect_checkpoint(out)
    assert info.format == "deepspeed-universal" and info.complete and (out / "latest_universal").is_file()
    # the same parameters the proof runs resumed from
    ref = sorted(p.name for p in (runs["u"] / "w2z1" / f"global_step{SAVE_AT}" / "zero").iterdir())
    assert sorted(p.name for p in (out / f"global_step{SAVE_AT}" / "zero").iterdir()) == ref


# ------------------------------------------------------------------------------------------------------------
# estimate: the checkpoint bytes it predicts are the tensor bytes these checkpoints hold

BYTES_CASES = [("w2z1", DENSE, 1, 1, "fp32"), ("z1_to_z2", DENSE, 2, 1, "fp32"), ("z2_to_z3", DENSE, 3, 1, "fp32"),
               ("w2bf16", DENSE, 2, 1, "bf16"), ("moe", MOE, 2, 2, "fp32")]


@pytest.mark.parametrize("name,model,stage,ep,precision", BYTES_CASES, ids=[c[0] for c in BYTES_CASES])
def test_estimate_checkpoint_bytes_match_the_files(runs, name, model, stage, ep, precision):
    from dstoolkit.ckpt.inspect import inspect_checkpoint
    from dstoolkit.ckpt.torchzip import payload_bytes
    from dstoolkit.estimate.checkpoint_bytes import checkpoint_bytes
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runplan import RunPlan

    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    plan = RunPlan(shape=ModelShape(**model["shape"]), ds_config=ds, world_size=2, gpus_per_node=2,
                   gpu=get_gpu("cpu"), seq_len=16, precision=precision, ep=ep)
    cb = checkpoint_bytes(plan)
    info = inspect_checkpoint(runs["ck"] / name)
    files = [p for p in info.tag_dir.iterdir() if p.suffix == ".pt"]
    optim = sorted(payload_bytes(p) for p in files if p.name.endswith("_optim_states.pt"))
    model_files = [p for p in files if p.name.endswith("model_states.pt") and "expert" not in p.name]
    assert optim == [cb.optimizer_states_per_rank_bytes] * 2
    assert max(payload_bytes(p) for p in model_files) == cb.model_states_per_rank_bytes
    assert sum(payload_bytes(p) for p in files) == cb.total_with_optimizer_bytes
