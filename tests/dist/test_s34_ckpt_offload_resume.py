"""s34 ckpt finding 1, on real DeepSpeed 0.19.8 engines (2 gloo ranks): a run with optimizer offload
(DeepSpeedCPUAdam, whose Adam step is a Python int) is saved, `dstoolkit ckpt reshard`ed, and resumed WITHOUT
offload at ZeRO-2 and at ZeRO-3 (torch's AdamW, "torch_adam": true). Before the fix the universal checkpoint kept
the int step and torch's AdamW raised "`state_steps` argument must contain a list of singleton tensors" at the
resumed run's first engine.step(); now both resumes train on.

Checked exactly: the fp32 master weights after the load equal the saved ones bit for bit (the universal checkpoint
copies them), the Adam step count is 2 after the load and 3 after one step, and the first resumed loss equals the
original run's loss at that step (same world size, same micro-batches, weights loaded bit-exact: the forward is the
same computation; measured 0.0).

Run as a script by torchrun (the test below launches it): argv = mode, folder, output json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

SAVE_AT = 2
TAG = f"global_step{SAVE_AT}"


def _batch(step: int):
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)


def _engine(stage: int, offload: bool, universal: bool):
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1,
                                                     **({} if offload else {"torch_adam": True})}},
           "zero_optimization": zero, "steps_per_print": 10 ** 9}
    if universal:
        cfg["checkpoint"] = {"load_universal": True}
    engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    return engine


def _train_step(engine, step: int) -> float:
    import torch
    import torch.distributed as dist

    x, y = _batch(step)
    rank = dist.get_rank()
    loss = torch.nn.functional.mse_loss(engine(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4])
    engine.backward(loss)
    engine.step()
    t = loss.detach().clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def _fp32(engine) -> list[float]:
    from deepspeed.utils import safe_get_full_fp32_param

    return [v for p in engine.module.parameters() for v in safe_get_full_fp32_param(p).flatten().tolist()]


def _adam_steps(engine) -> list:
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    return sorted({(type(s["step"]).__name__, float(s["step"])) for s in inner.state.values() if "step" in s})


def _main(mode: str, folder: str, out: str) -> None:
    import deepspeed
    import torch.distributed as dist

    from dstoolkit.runtime.rankexit import end_ranks, install_rank_guards

    install_rank_guards("test_s34_ckpt_offload_resume")  # gloo workers joined before exit (runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    res: dict = {}
    if mode == "source":
        engine = _engine(2, offload=True, universal=False)
        res["losses"] = {}
        for step in range(1, SAVE_AT + 2):
            res["losses"][step] = _train_step(engine, step)
            if step == SAVE_AT:
                engine.save_checkpoint(folder, tag=TAG)
                res["fp32"] = _fp32(engine)
                res["adam_steps"] = _adam_steps(engine)
    else:
        for stage in (2, 3):
            engine = _engine(stage, offload=False, universal=True)
            engine.load_checkpoint(folder)
            r = {"fp32": _fp32(engine), "adam_steps_loaded": _adam_steps(engine), "global_steps": engine.global_steps}
            r["loss"] = _train_step(engine, SAVE_AT + 1)
            r["adam_steps_after"] = _adam_steps(engine)
            res[f"zero{stage}"] = r
            engine.destroy()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(res))
    end_ranks()  # barrier, then every group destroyed


def _launch(mode: str, folder: Path, out: Path) -> dict:
    from dstoolkit.runtime.train.launch import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), __file__, mode, str(folder), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_offload_checkpoint_resharded_resumes_without_offload(tmp_path):
    src = _launch("source", tmp_path / "ck", tmp_path / "src.json")
    assert src["adam_steps"] == [["int", 2.0]]  # DeepSpeedCPUAdam's own form, what the checkpoint holds
    proc = subprocess.run([sys.executable, "-m", "dstoolkit", "ckpt", "reshard", str(tmp_path / "ck"), "--out",
                           str(tmp_path / "uni")], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = _launch("resume", tmp_path / "uni", tmp_path / "res.json")
    for stage in ("zero2", "zero3"):
        r = res[stage]
        assert r["global_steps"] == SAVE_AT
        assert r["fp32"] == src["fp32"], stage  # bit for bit
        assert r["adam_steps_loaded"] == [["Tensor", 2.0]], stage
        assert r["adam_steps_after"] == [["Tensor", 3.0]], stage
        assert r["loss"] == src["losses"][str(SAVE_AT + 1)], (stage, r["loss"], src["losses"])


if __name__ == "__main__":
    _main(*sys.argv[1:4])
