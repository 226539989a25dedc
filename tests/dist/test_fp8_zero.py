"""Emulated FP8 inside real DeepSpeed engines at ZeRO-1 and ZeRO-2 on 2 gloo ranks (one torchrun launch).

Per stage the worker converts the tiny model (stage 1: delayed recipe, stage 2: DeepSeek block recipe),
builds a bf16 DeepSpeed engine, and trains on one repeated batch. Checked: the root forward ran in FP8
(amax histories for input, weight *and* gradient filled: backward went through the FP8 path), the loss
falls, the first loss is within 1% of the unconverted model's, both ranks hold identical weights after
the optimizer steps, the state dict keys are nn.Linear's, and `revert` gives back a plain model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # one 2-rank launch, ~60 s on the shared CPU

STEPS = 5


def _worker(out_path: str) -> None:
    import deepspeed
    import torch
    from torch import nn

    from dstoolkit.runtime.fp8 import EmulatedFp8Linear, convert, revert
    from dstoolkit.models.presets import get_preset
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch

    from dstoolkit.runtime.rankexit import install_exit_guard

    torch.set_num_threads(1)
    install_exit_guard()  # groups released before exit: a gloo worker alive at exit aborts a finished run
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    shape = get_preset("tiny")
    results = {}
    for stage, cfg in ((1, {"recipe": "delayed", "amax_history_len": 16}), (2, {"recipe": "block", "format": "e4m3"})):
        ids, labels = synthetic_batch(shape, 2, 32, step=0, rank=rank)
        ref = build_model(shape, seed=0).to(torch.bfloat16)
        with torch.no_grad():
            ref_loss = ref(ids, labels).item()
        model = build_model(shape, seed=0)
        report = convert(model, cfg, backend="emulated")
        ds_cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
                  "zero_optimization": {"stage": stage}, "steps_per_print": 10**9,
                  "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "torch_adam": True}}}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
        init_w = engine.module.blocks[0].mlp.down_proj.weight.detach().float().clone()
        losses = []
        for _ in range(STEPS):
            loss = engine(ids, labels)
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        mod = engine.module.blocks[0].mlp.down_proj
        w = mod.weight.detach().float()
        gathered = [torch.zeros_like(w) for _ in range(2)]
        torch.distributed.all_gather(gathered, w)
        res = {
            "swapped": len(report.swapped),
            "is_fp8": isinstance(mod, EmulatedFp8Linear),
            "losses": losses,
            "ref_loss": ref_loss,
            "weights_equal_across_ranks": bool(torch.equal(gathered[0], gathered[1])),
            "weight_changed": not torch.equal(w, init_w),
            "state_keys_plain": list(engine.module.state_dict()) == list(build_model(shape).state_dict()),
        }
        if cfg["recipe"] == "delayed":
            st = mod.amax_state()
            res["history_filled"] = {k: int((v["history"] > 0).sum()) for k, v in st.items()}
        with torch.no_grad():
            engine.module.eval()
            res["fp8_eval_loss"] = engine(ids, labels).item()
            res["reverted"] = revert(engine.module)
            res["plain_after_revert"] = type(engine.module.blocks[0].mlp.down_proj) is nn.Linear
            res["plain_eval_loss"] = engine.module(ids, labels).item()
        results[f"zero{stage}"] = res
        del engine
    # MoE (DeepSpeed native experts, built after init_distributed): the plan predicts exactly the swaps.
    from dstoolkit.fp8.plan import plan_from_shape
    from dstoolkit.dsconfig.fp8 import Fp8Config
    from dstoolkit.hardware.table import get_gpu

    moe_shape = get_preset("tiny-moe")
    moe_cfg = Fp8Config(recipe="block", format="e4m3")
    moe = build_model(moe_shape, seed=0)
    moe_rep = convert(moe, moe_cfg, backend="emulated")
    moe_plan = plan_from_shape(moe_shape, moe_cfg, gpu=get_gpu("H100-SXM"))
    results["moe"] = {
        "report": [e.name for e in moe_rep.swapped],
        "plan": [e.name for e in moe_plan.report.swapped],
        "router_kept": [s.reason for s in moe_rep.skipped if s.name.endswith("gate.wg")],
        "expert_params_marked": all(getattr(p, "allreduce", True) is False
                                    for n, p in moe.named_parameters() if "deepspeed_experts" in n),
    }
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)


def test_emulated_fp8_trains_under_zero1_and_zero2(tmp_path, repo_root):
    from dstoolkit.runtime.bench.harness import free_port

    out = tmp_path / "fp8_zero.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo_root))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), __file__, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    for stage in ("zero1", "zero2"):
        r = results[stage]
        assert r["swapped"] == 28 and r["is_fp8"], r
        assert r["losses"][-1] < r["losses"][0] - 0.05, r["losses"]
        assert abs(r["losses"][0] - r["ref_loss"]) / r["ref_loss"] < 0.01, (r["losses"][0], r["ref_loss"])
        assert r["weights_equal_across_ranks"] and r["weight_changed"]
        assert r["state_keys_plain"]
        assert r["reverted"] == 28 and r["plain_after_revert"]
        # After revert the same weights run without quantisation: close to, but not bit-equal with, FP8.
        assert r["plain_eval_loss"] != r["fp8_eval_loss"]
        assert abs(r["plain_eval_loss"] - r["fp8_eval_loss"]) / r["plain_eval_loss"] < 0.02
    moe = results["moe"]
    assert moe["report"] == moe["plan"] and len(moe["report"]) == 4 * (4 + 4 * 3)  # q,k,v,o + 4 experts x 3
    assert moe["router_kept"] == ["excluded by pattern '*.gate.wg'"] * 4
    assert moe["expert_params_marked"]  # DeepSpeed's expert marks survive the swap (shared Parameters)
    # Delayed recipe: each of the STEPS training passes recorded an amax for input, weight and gradient
    # (read before the eval forward).
    assert results["zero1"]["history_filled"] == {"input": STEPS, "weight": STEPS, "grad": STEPS}


if __name__ == "__main__":
    _worker(sys.argv[1])
