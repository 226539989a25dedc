"""Guard on a real DeepSpeed 0.19.8 engine, one gloo rank, ZeRO-0 fp32 with a torch AdamW: the engine reports no
gradient norm there (engine.py `_take_model_step` copies `_global_grad_norm` only from optimizers that keep one), so
a NaN gradient (finite loss) at data position 5 was stepped into the weights, step 6 was saved healthy with NaN
weights, and the run stopped after 5 rollbacks that skipped the wrong positions ([6, 7]). Now the guard measures the
norm of the .grads before the step (`gradnorm.step_with_norm`), rolls back to step 4 and skips position 5."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed")

LOOP = r'''
import json, math, sys, torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from dstoolkit.runtime.train.guard import Guard
from dstoolkit.runtime.train.spike import SpikeGuardConfig
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
ds = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 9,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}}, "zero_optimization": {"stage": 0}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
ck, metrics = sys.argv[1], sys.argv[2]
cfg = SpikeGuardConfig(min_history=20, window=20)  # random toy data: no z-score decisions, NaN/Inf only
with Guard(engine, config=cfg, checkpoint_dir=ck, save_every=2, metrics_path=metrics, monitor_every=0) as g:
    g.resume()
    while g.step_count < 8:
        pos = g.data_pos
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(pos))
        loss = engine(x).pow(2).mean()
        if pos == 5:  # finite loss, NaN gradient
            w = next(engine.module.parameters())
            loss = loss + 0.0 * torch.sqrt((w - w.detach()).abs()).sum()
        g.step(loss)
print("FINITE", all(bool(torch.isfinite(p).all()) for p in engine.module.parameters()))
'''


def test_zero0_fp32_nan_gradient_rolls_back_and_skips_its_batch(tmp_path):
    from dstoolkit.runtime.train.launch import free_port

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-c", LOOP, str(tmp_path / "ck"), str(tmp_path / "m.jsonl")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "FINITE True"
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "event" not in r]
    (spike,) = [r for r in rows if r.get("event") == "spike"]
    (rb,) = [r for r in rows if r.get("event") == "rollback"]
    assert (spike["kind"], spike["step"], spike["data_pos"]) == ("nonfinite_grad_norm", 6, 5)
    assert (rb["to_tag"], rb["skip_positions"]) == ("step_00000004", [5])
    assert [r["grad_norm"] is not None for r in steps].count(False) == 1  # step 6's NaN, written as null
    done = [r for r in rows if r.get("event") == "done"][-1]
    assert (done["step"], done["data_pos"], done["rollbacks"]) == (8, 9, 1)
    assert not [r for r in rows if r.get("event") == "grad_norm_off"]
