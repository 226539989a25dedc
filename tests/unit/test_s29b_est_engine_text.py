"""`dstoolkit estimate` names the optimizer the plan's engine builds, not DeepSpeed's, for a plan estimated under
Megatron-Core (a spec with framework: megatron, or --target megatron-lm) or PyTorch FSDP.

Before, every plan read "ZeRO-1", "(DeepSpeed FusedAdam (multi_tensor_adam, in place))" on the optimizer step
temporaries line and "(DeepSpeed path: zero12; ...)" on the fits line, and the JSON said nothing else. Megatron-Core
0.16 (megatron/core/optimizer/__init__.py) wraps the run in DistributedOptimizer (Float16OptimizerWithFloat16Params
over DDP at ZeRO 0, DistributedOptimizer over Megatron-FSDP at 3, + HybridDeviceOptimizer under
--optimizer-cpu-offload) and steps Transformer Engine's FusedAdam / FusedSGD (torch.optim.AdamW(fused=True) / SGD
on the host under offload). The bytes stay counted with DeepSpeed's classes as the stand-in, and both say so.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from dstoolkit.cli import main

ROOT = Path(__file__).resolve().parents[2]
MEGATRON_SPEC = ROOT / "benchmarks/specs/published/bridge260201_qwen3_30b_a3b_16gpu_fp8.yaml"  # framework: megatron
DS_SPEC = ROOT / "ds_configs/llama3_8b_1x8_h100.yaml"  # framework deepspeed; --target megatron-lm runs Megatron-Core
TE_ADAM = "Transformer Engine FusedAdam (multi_tensor_adam, in place)"
DS_ADAM = "DeepSpeed FusedAdam (multi_tensor_adam, in place)"


def _run(capsys, *argv) -> str:
    rc = main(["estimate", *map(str, argv)])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def _lines(out: str) -> tuple[str, str, str]:
    """(the first line, the optimizer step temporaries line, the fits line)."""
    lines = out.splitlines()
    temps = next(x for x in lines if x.startswith("  optimizer step temporaries"))
    fits = next(x for x in lines if x.startswith("fits in "))
    return lines[0], temps, fits


@pytest.mark.parametrize("argv", [(MEGATRON_SPEC,), (DS_SPEC, "--target", "megatron-lm")])
def test_megatron_plan_names_megatron_cores_optimizer(capsys, argv):
    out = _run(capsys, *argv)
    first, temps, fits = _lines(out)
    assert "; ZeRO-1 (Megatron-Core DistributedOptimizer), " in first
    assert temps.endswith(f"   ({TE_ADAM})")
    assert (f"   (Megatron-Core DistributedOptimizer, counted as DeepSpeed's zero12 path with {DS_ADAM}; ZeRO paper "
            "view for this stage: ") in fits
    assert "DeepSpeed path" not in out
    assert out.count("DeepSpeed FusedAdam") == 1  # only where the stand-in is named


def test_deepspeed_plan_keeps_deepspeeds_wording(capsys):
    first, temps, fits = _lines(_run(capsys, DS_SPEC))
    assert "; ZeRO-1, bf16, " in first
    assert temps.endswith(f"   ({DS_ADAM})")
    assert "   (DeepSpeed path: zero12; ZeRO paper view for this stage: " in fits


def test_json_engine(capsys):
    assert json.loads(_run(capsys, MEGATRON_SPEC, "--format", "json"))["engine"] == {
        "framework": "megatron", "engine": "Megatron-Core", "optimizer": "DistributedOptimizer",
        "implementation": TE_ADAM, "counted_as": f"DeepSpeed's zero12 path with {DS_ADAM}"}
    assert json.loads(_run(capsys, DS_SPEC, "--format", "json"))["engine"] == {
        "framework": "deepspeed", "engine": "DeepSpeed's engine", "optimizer": "zero12", "implementation": DS_ADAM,
        "counted_as": None}


def _plan(framework="megatron", stage=1, offload=False, optimizer="adamw", precision="bf16"):
    ds = SimpleNamespace(zero_stage=stage, offload_optimizer=offload, optimizer_type=optimizer)
    return SimpleNamespace(framework=framework, precision=precision, ds=ds)


@pytest.mark.parametrize("plan, optimizer, implementation", [
    (_plan(stage=0), "Float16OptimizerWithFloat16Params over DDP", TE_ADAM),
    (_plan(stage=0, precision="fp32"), "FP32Optimizer over DDP", TE_ADAM),
    (_plan(stage=2), "DistributedOptimizer", TE_ADAM),
    (_plan(stage=3), "DistributedOptimizer over Megatron-FSDP", TE_ADAM),
    (_plan(offload=True), "DistributedOptimizer + HybridDeviceOptimizer",
     "torch.optim.AdamW(fused=True) on the host (HybridDeviceOptimizer, in place)"),
    (_plan(optimizer="sgd"), "DistributedOptimizer", "Transformer Engine FusedSGD (multi_tensor_sgd, in place)"),
    (_plan(optimizer="lamb"), "DistributedOptimizer", "lamb: not a Megatron-Core optimizer (it builds adam or sgd)"),
    (_plan("fsdp", stage=3), "+ torch.optim.AdamW",
     "torch.optim.AdamW as the training script builds it (for-loop, foreach or fused)"),
])
def test_engine_optimizer_per_layout(plan, optimizer, implementation):
    from dstoolkit.cli.estimate_text import engine_optimizer

    m = SimpleNamespace(optimizer_path="zero12", optimizer_impl="deepspeed_fused_adam")
    eng = engine_optimizer(plan, m)
    assert (eng["optimizer"], eng["implementation"]) == (optimizer, implementation)
    assert eng["counted_as"] == f"DeepSpeed's zero12 path with {DS_ADAM}"
