"""The gradient norm of an optimizer step where DeepSpeed reports none, and whether the weights are finite.

DeepSpeed 0.19.8 sets `engine.get_global_grad_norm()` (`engine._global_grad_norm`) only from the optimizer's own
`_global_grad_norm` (deepspeed/runtime/engine.py `_take_model_step`: `if hasattr(self.optimizer,
'_global_grad_norm')`). DeepSpeed's own optimizers keep one (ZeRO-1/2 `stage_1_and_2.py`, ZeRO-3 `stage3.py`, bf16
`bf16_optimizer.py`, fp16 `fp16/fused_optimizer.py`); a plain torch optimizer at ZeRO-0 fp32 does not, so the engine
reports None for every step. `clip_fp32_gradients` (`gradient_clipping` at ZeRO-0 fp32) computes the norm
(`runtime/utils.py clip_grad_norm_`) and drops it, and the step's `zero_grad` then empties the `.grad`s: a spike
guard that waits for the engine's norm never sees a NaN / Inf gradient there, and it is stepped into the weights.

`step_with_norm` runs `engine.step()` and returns the step's norm: the engine's where it reports one, else (the
plain-optimizer case above, at the accumulation boundary) the 2-norm of the module's `.grad`s taken just before the
step. At ZeRO-0 those are already averaged over the data-parallel ranks (`engine.backward` -> `allreduce_gradients`
at the boundary), so every rank computes the same global norm (with model parallelism: this rank's shards, which
still catches a NaN / Inf). None where neither is known (ZeRO-1/2 with `compute_grad_norm: false`): the caller says
once that grad-norm detection is off (`NO_NORM_LINE`).
"""
from __future__ import annotations

import math
from typing import Any, Optional

NO_NORM_LINE = ("grad-norm detection is off for this run: DeepSpeed reports no gradient norm for this config "
                "(engine.get_global_grad_norm() is None; e.g. zero_optimization.compute_grad_norm is false) and the "
                "gradients are not available to measure; a NaN/Inf gradient is only caught when the loss turns "
                "non-finite")
"""Said once by a caller whose `step_with_norm` returned None."""


def engine_reports_norm(engine: Any) -> bool:
    """Whether `engine.get_global_grad_norm()` is set by the step (the optimizer keeps `_global_grad_norm`:
    engine.py `_take_model_step`)."""
    return hasattr(getattr(engine, "optimizer", None), "_global_grad_norm")


def module_grad_norm(engine: Any) -> Optional[float]:
    """2-norm over every `.grad` of `engine.module` (float64 sum of squares; NaN / Inf propagate); None when no
    parameter holds a gradient (ZeRO-2/3 keep them in their own buffers)."""
    import torch

    total, seen = None, False
    for p in _params(engine):
        g = p.grad
        if g is None:
            continue
        seen = True
        sq = g.detach().double().pow(2).sum()
        total = sq if total is None else total + sq
    if not seen:
        return None
    mpu = getattr(engine, "mpu", None)
    if mpu is not None:  # model parallelism: the sum over the group's shards (as clip_grad_norm_ does)
        import deepspeed.comm as dist

        total = total.to(torch.float32)
        dist.all_reduce(total, group=mpu.get_model_parallel_group())
    return float(total.sqrt().item())


def _params(engine: Any) -> list:
    module = getattr(engine, "module", None)
    return list(module.parameters()) if module is not None else []


def step_with_norm(engine: Any) -> Optional[float]:
    """`engine.step()`; returns the norm of the optimizer step it took (module docstring): the engine's
    `get_global_grad_norm()` where it reports one, else the `.grad` norm measured just before the step; None
    inside gradient accumulation (no optimizer step) or where no norm is known."""
    at_boundary = getattr(engine, "is_gradient_accumulation_boundary", None)
    measure = callable(at_boundary) and at_boundary() and not engine_reports_norm(engine)
    before = module_grad_norm(engine) if measure else None
    steps = getattr(engine, "global_steps", None)
    engine.step()
    if steps is not None and getattr(engine, "global_steps", None) == steps:
        return None
    getter = getattr(engine, "get_global_grad_norm", None)
    gn = getter() if callable(getter) else None
    return float(gn) if gn is not None else before


def weights_finite(engine: Any) -> bool:
    """Whether every weight of `engine.module` on every rank is finite (a ZeRO-3 rank checks its partition,
    `ds_tensor`); one all-reduce of a flag when a process group is up. A checkpoint is only a rollback target when
    this holds."""
    import torch

    bad = 0.0
    for p in _params(engine):
        t = getattr(p, "ds_tensor", None)
        t = p if t is None or t.numel() == 0 else t
        if t.numel() and not bool(torch.isfinite(t.detach()).all()):
            bad = 1.0
            break
    import deepspeed.comm as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        flag = torch.tensor([bad], dtype=torch.float32, device=getattr(engine, "device", None) or "cpu")
        dist.all_reduce(flag)
        bad = float(flag.item())
    return not (bad > 0 or math.isnan(bad))
