"""s37 area A finding 2 on real ranks (2 gloo ranks, DeepSpeed 0.19.8): a run killed right after a spike rollback,
before its next save, then resumed, trains the same steps as the uninterrupted run -- bitwise losses, the LR
cool-down's multiplier, the same data positions and health marks. Before the fix the resume retrained at lr_mult 1.0
(the pre-spike trajectory) and marked the retrained checkpoint healthy. The bundled trainer (torchrun) and `Guard`
in a plain DeepSpeed loop."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.runtime.train.launch import free_port, launch_command, launch_env, read_metrics, run_local  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
      "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}


def _kill_a_rank_after_rollback(cmd, env, metrics: Path) -> int:
    """Start `cmd` in its own session and SIGKILL its newest rank once the metrics hold the rollback event (written
    after the rollback is recorded with its target); returns the launcher's exit code."""
    import psutil

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    t0 = time.monotonic()
    try:
        while not (metrics.exists() and '"event": "rollback"' in metrics.read_text()):
            assert proc.poll() is None, "the run ended before the rollback"
            assert time.monotonic() - t0 < 300, "no rollback"
            time.sleep(0.05)
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "-u" in c.cmdline()]
        max(ranks, key=lambda c: c.pid).send_signal(signal.SIGKILL)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _after_resume(metrics: Path):
    lines = read_metrics(metrics).lines
    i = max(k for k, r in enumerate(lines) if r.get("event") == "resume")
    after = lines[i:]
    return lines[i], [r for r in after if "event" not in r], [r for r in after if r.get("event") == "checkpoint"]


def test_trainer_resume_right_after_a_rollback_follows_the_uninterrupted_run(tmp_path):
    spec = {"name": "s37", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 4, "precision": "bf16", "lr": 0.003,
                         "zero_stage": 2}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(DS))

    def args(name, *more):
        return ["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"), "--steps", "10",
                "--metrics-out", str(tmp_path / f"{name}.jsonl"), "--no-progress", "--checkpoint-dir",
                str(tmp_path / name), "--save-every", "4", "--spike-action", "rollback", *more]

    ref = run_local(args("ref", "--inject-poison", "9"), timeout_s=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    # the same run: a rank SIGKILLed after the rollback to step 4 (the next save, step 8, is 4 slowed steps away)
    cut = args("cut", "--inject-poison", "9", "--data-delay-s", "0.3")
    assert _kill_a_rank_after_rollback(launch_command(cut), launch_env(2, "torchrun"), tmp_path / "cut.jsonl") != 0
    assert sorted(p.name for p in (tmp_path / "cut").glob("step_*")) == ["step_00000004"]
    # resumed (the poison fired in the killed process: not injected again)
    again = run_local(args("cut", "--resume"), timeout_s=300)
    assert again.returncode == 0, again.stderr[-3000:]
    resume, steps, ckpts = _after_resume(tmp_path / "cut.jsonl")
    ref_m = read_metrics(tmp_path / "ref.jsonl")
    assert len(ref_m.of("rollback")) == 1
    want = [(s["step"], s["loss"], s["lr_mult"], s["lr"], s["data_pos"]) for s in ref_m.steps[-6:]]
    assert [(s["step"], s["loss"], s["lr_mult"], s["lr"], s["data_pos"]) for s in steps] == want
    assert [m for _, _, m, _, _ in want] == [0.1] * 6  # was 1.0 after the resume
    assert [(c["step"], c["healthy"]) for c in ckpts] == [(c["step"], c["healthy"]) for c in ref_m.of("checkpoint")[-2:]
                                                          ] == [(8, False), (10, False)]  # step 8 was healthy
    assert (resume["tag"], resume["after_rollback"], resume["lr_cooldown_left"], resume["rollback_streak"]) == (
        "step_00000004", True, 10, 1)


LOOP = '''
import os, signal, sys, torch, deepspeed
from torch import nn
from dstoolkit.runtime.train.guard import Guard
from dstoolkit.runtime.train.spike import SpikeGuardConfig
ckpt, metrics, mode = sys.argv[1:4]
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}, "zero_optimization": {"stage": 1}}
engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
rank = torch.distributed.get_rank()
g = Guard(engine, config=SpikeGuardConfig(on_loss_spike="rollback"), checkpoint_dir=ckpt, save_every=4,
          metrics_path=metrics, monitor_every=0)
if mode == "resume":
    g.resume()
while g.step_count < 12:
    if g.should_skip_position():
        g.advance()
        continue
    gen = torch.Generator().manual_seed(g.data_pos * 10 + rank)
    x = torch.randn(4, 16, generator=gen)
    y = x.sum(1, keepdim=True) * (1000 if g.data_pos == 9 else 1)
    if g.step(nn.functional.mse_loss(engine(x), y)) == "rolled_back" and mode == "die":
        torch.distributed.barrier()  # every rank past the rollback (rank 0 recorded it), then killed
        os.kill(os.getpid(), signal.SIGKILL)
g.close()
'''


def test_guard_loop_resume_right_after_a_rollback_follows_the_uninterrupted_run(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))

    def run(ck, metrics, mode):
        cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
               str(free_port()), str(script), str(tmp_path / ck), str(tmp_path / metrics), mode]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)

    ref = run("ref", "ref.jsonl", "run")
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert run("cut", "cut.jsonl", "die").returncode != 0  # killed right after the rollback to step 8
    assert sorted(p.name for p in (tmp_path / "cut").glob("step_*")) == ["step_00000004", "step_00000008"]
    again = run("cut", "cut.jsonl", "resume")
    assert again.returncode == 0, again.stderr[-3000:]
    resume, steps, ckpts = _after_resume(tmp_path / "cut.jsonl")
    ref_m = read_metrics(tmp_path / "ref.jsonl")
    want = [(s["step"], s["loss"], s["lr_multiplier"], s["data_pos"]) for s in ref_m.steps[-4:]]
    assert [(s["step"], s["loss"], s["lr_multiplier"], s["data_pos"]) for s in steps] == want
    assert [m for _, _, m, _ in want] == [0.1] * 4 and [s for s, *_ in want] == [9, 10, 11, 12]
    assert [(c["step"], c["healthy"]) for c in ckpts] == [(12, False)] == [
        (c["step"], c["healthy"]) for c in ref_m.of("checkpoint")[-1:]]
    assert (resume["tag"], resume["after_rollback"], resume["lr_cooldown_left"]) == ("step_00000008", True, 10)
