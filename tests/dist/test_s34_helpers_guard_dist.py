"""Guard and BatchRamp in a user's own loop, real 2-rank gloo DeepSpeed 0.19.8 runs (s34 helpers findings 1 and 3).

1. ZeRO-0 fp32 (torch AdamW): DeepSpeed reports no grad norm (engine.py `_take_model_step` copies
   `_global_grad_norm` only from optimizers that keep one), so a NaN gradient at data position 5 was stepped, saved
   healthy at step 6, and the run died after 5 rollbacks skipping positions [6, 7]. Now: rollback to step 4,
   position 5 skipped, and the norm equals what ZeRO-1 reports for the same steps.
2. BatchRamp.apply (4 -> 16 sequences, micro 2 x dp 2): each optimizer step must train on exactly its own
   gas micro-batches; before, steps 4 and 5 closed after 2 micro-batches (gas 3 and 4)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstoolkit.runtime.train.launch import free_port

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(300)]

LOOP = r'''
import json, os, sys, torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from dstoolkit.runtime.train.guard import Guard
from dstoolkit.runtime.train.ramp import BatchRamp
from dstoolkit.runtime.train.spike import SpikeGuardConfig
zero, ga, steps, nan_pos, ramp, ck, metrics = sys.argv[1:8]
zero, ga, steps, nan_pos = int(zero), int(ga), int(steps), int(nan_pos)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ds = {"train_batch_size": 4 * ga, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": ga,
      "steps_per_print": 10 ** 9, "zero_optimization": {"stage": zero},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
rank = torch.distributed.get_rank()
r = (BatchRamp(start_batch=4, end_batch=4 * ga, increment=4, ramp_samples=24, micro_batch=2, dp_size=2)
     if ramp == "1" else None)
cfg = SpikeGuardConfig(min_history=20, window=20)  # random toy data: NaN/Inf decisions only
g = Guard(engine, config=cfg, checkpoint_dir=ck or None, save_every=2 if ck else 0, metrics_path=metrics,
          monitor_every=0)
g.resume()
consumed, windows, n = 0, [], 0
with g:
    while g.step_count < steps:
        if r is not None and n == 0:
            r.apply(engine, consumed)
        pos = g.data_pos
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1000 * pos + rank))
        loss = engine(x).pow(2).mean()
        if pos == nan_pos:  # finite loss, NaN gradient
            w = next(engine.module.parameters())
            loss = loss + 0.0 * torch.sqrt((w - w.detach()).abs()).sum()
        before = engine.global_steps
        g.step(loss)
        n += 1
        if engine.global_steps != before:
            windows.append((n, engine.gradient_accumulation_steps()))
            consumed += engine.train_batch_size()
            n = 0
if rank == 0:
    print("WINDOWS", json.dumps(windows))
'''


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(script), *args]
    return subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=240)


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_zero0_fp32_nan_gradient_rolls_back_its_batch_and_norms_match_zero1(tmp_path):
    a = _run(tmp_path, "0", "1", "8", "5", "0", str(tmp_path / "ck"), str(tmp_path / "a.jsonl"))
    assert a.returncode == 0, a.stderr[-3000:]
    rows = _rows(tmp_path / "a.jsonl")
    (spike,) = [r for r in rows if r.get("event") == "spike"]
    (rb,) = [r for r in rows if r.get("event") == "rollback"]
    assert (spike["kind"], spike["step"], spike["data_pos"]) == ("nonfinite_grad_norm", 6, 5)
    assert (rb["to_tag"], rb["skip_positions"]) == ("step_00000004", [5])
    assert rows[-1]["event"] == "done" and (rows[-1]["step"], rows[-1]["rollbacks"]) == (8, 1)
    b = _run(tmp_path, "1", "1", "4", "-1", "0", "", str(tmp_path / "b.jsonl"))
    assert b.returncode == 0, b.stderr[-3000:]
    z0 = [r["grad_norm"] for r in rows if "event" not in r][:4]
    z1 = [r["grad_norm"] for r in _rows(tmp_path / "b.jsonl") if "event" not in r]
    assert z0 == pytest.approx(z1, rel=1e-5) and all(v is not None for v in z0)


def test_batch_ramp_steps_train_on_exactly_their_micro_batches(tmp_path):
    a = _run(tmp_path, "1", "4", "8", "-1", "1", "", str(tmp_path / "a.jsonl"))
    assert a.returncode == 0, a.stderr[-3000:]
    (line,) = [x for x in a.stdout.splitlines() if x.startswith("WINDOWS ")]
    windows = json.loads(line[len("WINDOWS "):])
    assert windows == [[1, 1], [1, 1], [2, 2], [3, 3], [4, 4], [4, 4], [4, 4], [4, 4]]


def test_trainer_reports_the_grad_norm_at_zero0_fp32(tmp_path):
    # trainer.py asked engine.get_global_grad_norm() only: null on every ZeRO-0 fp32 step
    from dstoolkit.runtime.train.launch import read_metrics, run_local

    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "torch_adam": True}}}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    spec = Path(__file__).parent / "user_scripts" / "spec.yaml"
    p = run_local(["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(spec), "--steps", "3",
                   "--metrics-out", str(tmp_path / "m.jsonl"), "--no-progress"], timeout_s=240)
    assert p.returncode == 0, p.stderr[-3000:]
    norms = [s["grad_norm"] for s in read_metrics(tmp_path / "m.jsonl").steps]
    assert len(norms) == 3 and all(isinstance(v, float) and v > 0 for v in norms)
