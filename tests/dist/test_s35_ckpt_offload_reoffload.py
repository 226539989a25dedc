"""s35 ckpt finding 1, on real DeepSpeed 0.19.8 engines (2 gloo ranks): an optimizer-offload checkpoint
(ZeRO-2, offload_optimizer cpu: DeepSpeedCPUAdam, whose Adam step is a Python int) is `dstoolkit ckpt reshard`ed to
universal and resumed WITH offload again (ZeRO-2 and ZeRO-3, offload_optimizer cpu, checkpoint.load_universal).
1599cc1 stores the resharded Adam step as a 0-dim float32 tensor so torch's AdamW takes it; this checks the same
universal checkpoint still loads into DeepSpeedCPUAdam (which reads the step through int(), ops/adam/cpu_adam.py
step: `state['step'] += 1` on whatever was loaded) and trains on.

Checked exactly (same world size, same micro-batches, state copied not recomputed): the fp32 masters and Adam
exp_avg / exp_avg_sq after the load equal the saved ones bit for bit, the Adam step is 2 after the load and 3 after
one step, and the first resumed loss equals the original run's loss at that step.

The bundled trainer does not load universal checkpoints (runtime/train/resume_check.universal_refusal, by design:
it resumes only its own step_* tags); the second test checks that `dstoolkit train --resume` on a `reshard` output
of a trainer-made offload checkpoint is that one-line refusal (exit 2), not a DeepSpeed traceback.

Run as a script by torchrun (the first test launches it): argv = mode, folder, output json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SAVE_AT = 2
TAG = f"step_{SAVE_AT}"  # a loop of its own naming tags like the trainer, without its manifest (finding 2)


def _state(engine) -> dict:
    """Full fp32 masters and Adam moments, per parameter, flattened (DeepSpeed's safe_get_full_* accessors,
    deepspeed/utils/tensor_fragment.py, which gather across ranks at ZeRO-3)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out: dict = {"fp32": [], "exp_avg": [], "exp_avg_sq": []}
    for p in engine.module.parameters():
        out["fp32"].append(safe_get_full_fp32_param(p).flatten().tolist())
        for key in ("exp_avg", "exp_avg_sq"):
            out[key].append(safe_get_full_optimizer_state(p, key).flatten().tolist())
    return out


def _main(mode: str, folder: str, out: str) -> None:
    import deepspeed
    import torch.distributed as dist

    from dstoolkit.runtime.rankexit import end_ranks, install_rank_guards
    from tests.dist.test_s34_ckpt_offload_resume import _adam_steps, _engine, _train_step

    install_rank_guards("test_s35_ckpt_offload_reoffload")
    deepspeed.init_distributed(dist_backend="gloo")
    res: dict = {}
    if mode == "source":
        engine = _engine(2, offload=True, universal=False)
        res["losses"] = {}
        for step in range(1, SAVE_AT + 2):
            res["losses"][step] = _train_step(engine, step)
            if step == SAVE_AT:
                engine.save_checkpoint(folder, tag=TAG)
                res["state"] = _state(engine)
                res["adam_steps"] = _adam_steps(engine)
    else:
        for stage in (2, 3):
            engine = _engine(stage, offload=True, universal=True)
            engine.load_checkpoint(folder)
            r = {"state": _state(engine), "adam_steps_loaded": _adam_steps(engine),
                 "global_steps": engine.global_steps, "optimizer": type(engine.optimizer.optimizer).__name__}
            r["loss"] = _train_step(engine, SAVE_AT + 1)
            r["adam_steps_after"] = _adam_steps(engine)
            res[f"zero{stage}"] = r
            engine.destroy()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(res))
    end_ranks()


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def _launch(mode: str, folder: Path, out: Path) -> dict:
    from dstoolkit.runtime.train.launch import free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), __file__, mode, str(folder), str(out)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def _reshard(src: Path, out: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "dstoolkit", "ckpt", "reshard", str(src), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("s35_offload")
    src = _launch("source", d / "ck", d / "src.json")
    assert src["adam_steps"] == [["int", 2.0]]  # DeepSpeedCPUAdam's int step is what the checkpoint holds
    return d, src


def test_inspect_of_a_real_step_tag_without_manifest(source):
    """s35 ckpt finding 2 on a real save: engine.save_checkpoint(dir, tag="step_2") from a loop of one's own."""
    d, _ = source
    proc = subprocess.run([sys.executable, "-m", "dstoolkit", "ckpt", "inspect", str(d / "ck")], capture_output=True,
                          text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    out = proc.stdout
    assert "  format       deepspeed-zero\n" in out and "  ZeRO stage   2, optimizer offload to cpu\n" in out
    assert ("  manifest     none: no step_* tag here has dstoolkit_manifest.json, so these are DeepSpeed tags saved "
            "outside `dstoolkit train`") in out
    assert f"`dstoolkit train --resume` does not load {TAG}" in out and out.endswith("  complete     yes\n")


def test_offload_checkpoint_resharded_resumes_with_offload_again(source):
    d, src = source
    tmp_path = d
    _reshard(tmp_path / "ck", tmp_path / "uni")
    res = _launch("resume", tmp_path / "uni", tmp_path / "res.json")
    for stage in ("zero2", "zero3"):
        r = res[stage]
        assert r["optimizer"] == "DeepSpeedCPUAdam", stage
        assert r["global_steps"] == SAVE_AT, stage
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            assert r["state"][key] == src["state"][key], (stage, key)  # bit for bit
        assert r["adam_steps_loaded"] == [["Tensor", 2.0]], stage  # reshard's float32 step, as loaded
        assert [s[1] for s in r["adam_steps_after"]] == [3.0], stage  # CPUAdam counted on from it
        assert r["loss"] == src["losses"][str(SAVE_AT + 1)], (stage, r["loss"], src["losses"])


def test_trainer_resume_of_a_resharded_offload_checkpoint_is_one_line(tmp_path):
    """The bundled trainer, ZeRO-2 with offload_optimizer cpu, saves step 2; `ckpt reshard` turns it into a universal
    checkpoint; `dstoolkit train --resume` on that folder is the pre-flight's refusal (exit 2, one line naming
    load_universal), not a load attempt."""
    from dstoolkit.runtime.cpu_precision import precision_for_this_cpu

    precision = precision_for_this_cpu("bf16")
    text = (REPO / "ds_configs" / "tiny_cpu.yaml").read_text().replace(
        "  precision: bf16\n", f"  precision: {precision}\n")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(text)
    ds = json.loads((REPO / "ds_configs/generated/tiny_cpu/zero2/ds_config.json").read_text())
    ds["bf16"]["enabled"] = precision == "bf16"
    ds["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    (tmp_path / "ds.json").write_text(json.dumps(ds))

    def train(ck: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dstoolkit", "train", "--spec", str(spec), "--config",
                               str(tmp_path / "ds.json"), "--steps", str(steps), "--nproc", "2", "--metrics-out",
                               str(tmp_path / "m.jsonl"), "--", "--checkpoint-dir", str(ck), "--no-progress", *extra],
                              cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)

    first = train(tmp_path / "ck", 2)
    assert first.returncode == 0, first.stderr[-3000:]
    losses = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [m["step"] for m in losses if "loss" in m] == [1, 2], losses
    _reshard(tmp_path / "ck", tmp_path / "uni")
    before = sorted(p.name for p in (tmp_path / "uni").iterdir())
    again = train(tmp_path / "uni", 4, "--resume")
    assert again.returncode == 2, again.stderr[-3000:]
    assert "holds a DeepSpeed universal checkpoint" in again.stderr
    assert "checkpoint.load_universal true" in again.stderr and "Traceback" not in again.stderr
    assert sorted(p.name for p in (tmp_path / "uni").iterdir()) == before


if __name__ == "__main__":
    _main(*sys.argv[1:4])
