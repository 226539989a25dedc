"""A rollback in the middle of gradient accumulation, real 2-rank gloo DeepSpeed runs (ZeRO-2 bf16, 4 micro-batches
per step). DeepSpeed 0.19.8's `engine.load_checkpoint` restores neither the micro-step count nor the gradients of
the window in progress: the abandoned micro-batches' gradients went into the first step after the rollback and
every later step ended two micro-batches early (measured before the fix: the replayed losses differed from the
first replayed step on, 4.105 vs 3.942, and the final weights by 0.12). Each test compares the run that rolls back
with a run that resumes cleanly from a copy of the same checkpoint: after the fix they are bitwise equal.

The example trainer: a poisoned third micro-batch (`--inject-poison STEP:2`) with --spike-action rollback. A user's
own loop under `Guard`: a NaN loss at the third micro-batch with on_nonfinite="rollback" (the window is closed with
a NaN gradient, a throwaway update the load overwrites)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dstoolkit.runtime.train.ckpt import tag_for
from dstoolkit.runtime.train.launch import free_port, read_metrics, run_local

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
GAS, MICRO, LR = 4, 2, 0.01
DS = {"train_batch_size": GAS * MICRO * 2, "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
      "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},
      "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
STEPS, SAVE_EVERY, BAD_STEP, BAD_MICRO = 14, 2, 12, 2


def _clean_copy(src: Path, dst: Path, tag: str) -> None:
    """A copy of the checkpoint root that holds only `tag` (with what the rollback recorded in it), `latest` on it."""
    shutil.copytree(src, dst)
    for d in dst.iterdir():
        if d.name.startswith("step_") and d.name != tag:
            shutil.rmtree(d)
    (dst / "latest").write_text(tag)


def _module(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["module"]


def test_trainer_rollback_mid_accumulation_equals_a_clean_resume(tmp_path):
    spec = {"name": "rbga", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": DS["train_batch_size"], "micro_batch": MICRO,
                         "precision": "bf16", "lr": LR, "zero_stage": 2}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(DS))
    # lr-scale 1: the cool-down after a rollback leaves the LR alone, so the clean resume is the same run
    common = ["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"), "--steps",
              str(STEPS), "--save-every", str(SAVE_EVERY), "--keep-checkpoints", "20", "--no-progress",
              "--monitor-every", "100", "--lr-scale", "1.0", "--lr-scale-steps", "1", "--spike-z", "10"]
    a = run_local(common + ["--metrics-out", str(tmp_path / "a.jsonl"), "--checkpoint-dir", str(tmp_path / "cka"),
                            "--spike-action", "rollback", "--inject-poison", f"{BAD_STEP}:{BAD_MICRO}"], timeout_s=600)
    assert a.returncode == 0, a.stderr[-3000:]
    ma = read_metrics(tmp_path / "a.jsonl")
    (inject,) = ma.of("inject")
    (rb,) = ma.of("rollback")
    assert (inject["step"], rb["step"], rb["skip_positions"]) == (BAD_STEP, BAD_STEP, [inject["data_pos"]])
    assert inject["data_pos"] == (BAD_STEP - 1) * GAS + BAD_MICRO  # the third micro-batch of the step
    assert rb["abandoned_micro_batches"] == BAD_MICRO
    assert rb["to_step"] <= BAD_STEP - 2 and rb["to_step"] % SAVE_EVERY == 0

    _clean_copy(tmp_path / "cka", tmp_path / "ckb", rb["to_tag"])
    b = run_local(common + ["--metrics-out", str(tmp_path / "b.jsonl"), "--checkpoint-dir", str(tmp_path / "ckb"),
                            "--resume"], timeout_s=600)
    assert b.returncode == 0, b.stderr[-3000:]
    mb = read_metrics(tmp_path / "b.jsonl")
    replay = [d for d in ma.lines[ma.lines.index(rb) + 1:] if "event" not in d]
    assert [s["step"] for s in replay] == [s["step"] for s in mb.steps] == list(range(rb["to_step"] + 1, STEPS + 1))
    got = [(s["step"], s["loss"], s["grad_norm"], s["data_pos"]) for s in replay]
    want = [(s["step"], s["loss"], s["grad_norm"], s["data_pos"]) for s in mb.steps]
    assert got == want  # bitwise: the step after the rollback holds none of the abandoned gradients
    last = f"{tag_for(STEPS)}/mp_rank_00_model_states.pt"
    wa, wb = _module(tmp_path / "cka" / last), _module(tmp_path / "ckb" / last)
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)


LOOP = r'''
import json, sys
import deepspeed, torch, torch.nn as nn
from dstoolkit.runtime.train.guard import Guard
from dstoolkit.runtime.train.spike import SpikeGuardConfig

cfg_path, ckpt, metrics, steps, nan_pos, out = sys.argv[1:7]
steps, nan_pos = int(steps), int(nan_pos)


class TinyLM(nn.Module):
    def __init__(self, vocab=128, hidden=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x, y):
        h = self.emb(x)
        return nn.functional.cross_entropy(self.out(h + self.mlp(h)).float().reshape(-1, 128), y.reshape(-1))


deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = TinyLM()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=json.load(open(cfg_path)))
rank = torch.distributed.get_rank()
cfg = SpikeGuardConfig(on_nonfinite="rollback", z_threshold=1e6, grad_norm_z_threshold=1e6,
                       lr_scale_on_rollback=False)
guard = Guard(engine, config=cfg, checkpoint_dir=ckpt, save_every=2, keep=20, metrics_path=metrics, monitor_every=0)
guard.resume()
while guard.step_count < steps:
    pos = guard.data_pos
    g = torch.Generator().manual_seed(1000 * pos + rank)
    x = torch.randint(0, 128, (2, 16), generator=g)
    loss = engine(x, (x * 3 + 1) % 128)
    if pos == nan_pos:
        loss = loss * float("nan")  # every rank: a NaN loss, its graph alive
    guard.step(loss)
guard.close()
if rank == 0:
    torch.save({k: v.detach().clone() for k, v in engine.module.state_dict().items()}, out)
'''


def _loop(tmp_path: Path, ckpt: str, metrics: str, nan_pos: int, out: str) -> subprocess.CompletedProcess:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(script), str(tmp_path / "ds.json"), ckpt, metrics, str(STEPS), str(nan_pos), out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def test_guard_rollback_on_nan_mid_accumulation_equals_a_clean_resume(tmp_path):
    import torch

    (tmp_path / "ds.json").write_text(json.dumps(DS))
    nan_pos = (BAD_STEP - 1) * GAS + BAD_MICRO
    a = _loop(tmp_path, str(tmp_path / "cka"), str(tmp_path / "a.jsonl"), nan_pos, str(tmp_path / "a.pt"))
    assert a.returncode == 0, a.stderr[-3000:]
    ma = read_metrics(tmp_path / "a.jsonl")
    (spike,) = ma.of("spike")
    (rb,) = ma.of("rollback")
    assert (spike["kind"], spike["action"], spike["data_pos"]) == ("nonfinite_loss", "rollback", nan_pos)
    assert (rb["step"], rb["skip_positions"], rb["abandoned_micro_batches"]) == (BAD_STEP, [nan_pos], BAD_MICRO)

    _clean_copy(tmp_path / "cka", tmp_path / "ckb", rb["to_tag"])
    b = _loop(tmp_path, str(tmp_path / "ckb"), str(tmp_path / "b.jsonl"), -1, str(tmp_path / "b.pt"))
    assert b.returncode == 0, b.stderr[-3000:]
    mb = read_metrics(tmp_path / "b.jsonl")
    replay = [d for d in ma.lines[ma.lines.index(rb) + 1:] if "event" not in d]
    got = [(s["step"], s["loss"], s["grad_norm"], s["data_pos"]) for s in replay]
    want = [(s["step"], s["loss"], s["grad_norm"], s["data_pos"]) for s in mb.steps]
    assert [g[0] for g in got] == list(range(rb["to_step"] + 1, STEPS + 1)) and got == want
    wa, wb = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert all(torch.isfinite(v).all() for v in wa.values())
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)
