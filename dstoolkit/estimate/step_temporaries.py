"""Temporaries of the optimizer step and of the gradient norm, per implementation (DeepSpeed 0.19.8, torch 2.13).

What the inner optimizer allocates while it runs, on top of the model states `memory.deepspeed_model_states`
counts, read from the code:

* **torch AdamW / Adam, for-loop** (torch/optim/adam.py `_single_tensor_adam`, torch's default for CPU tensors:
  `optimizer._default_to_fused_or_foreach` picks foreach only for CUDA-like devices):
  `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` holds the sqrt result and the quotient at once
  (2 copies of one parameter tensor, fp32) before `param.addcdiv_(exp_avg, denom, ...)`; parameters are updated
  one at a time, so the peak is 2 x the largest tensor the optimizer steps. Under DeepSpeed ZeRO-1/2 that tensor
  is the rank's whole flat fp32 partition (stage_1_and_2.py `single_partition_of_fp32_groups`), stage 3 one
  sub-group (stage3.py `fp32_partitioned_groups_flat`), BF16_Optimizer the flat fp32 partition of a group,
  FP16_Optimizer the flat fp32 master of a group, stage 0 / FP16_UnfusedOptimizer one parameter's fp32 copy.
  Adam's L2 decay (adam_w_mode false) adds `grad = grad.add(param, alpha=weight_decay)`: a third copy.
* **torch foreach** (`_multi_tensor_adam`, the default on CUDA): `exp_avg_sq_sqrt = torch._foreach_sqrt(...)`
  then in-place div/add: one copy of every tensor of a param group at once (+ one for L2 decay,
  `torch._foreach_add(device_grads, device_params, ...)`).
* **torch fused** (`_fused_adam`, `fused=True`), **DeepSpeed FusedAdam** (ops/adam/fused_adam.py: one
  `multi_tensor_adam` kernel over [g, p, m, v] lists, in place; the GPU default without torch_adam) and
  **DeepSpeedCPUAdam** (ops/adam/cpu_adam.py: the C++ step updates p, m, v in place; the offload default):
  no temporaries.

Gradient norm (computed at every ZeRO-1/2 step, stage_1_and_2.py `step` -> `scaled_global_norm` ->
`get_grad_norm_direct`): `torch.linalg.vector_norm(g.data.to(get_norm_dtype()))` per gradient of the partition;
`zero/utils.py get_norm_dtype` is fp64 where the accelerator supports it (CPU and CUDA), so one fp64 copy of the
largest gradient in the partition is alive at a time. Clipping itself is in place
(`unscale_and_clip_grads`: `grad.data.mul_`; stage 0 fp32 `clip_fp32_gradients` -> runtime/utils.py
`clip_grad_norm_`: `p.grad.data.float()` is the tensor itself for fp32 gradients), so it adds nothing.

No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate.dtype_bytes import FP32_BYTES

NORM_BYTES = 8
"""zero/utils.py get_norm_dtype: torch.double on accelerators with fp64 (CPU, CUDA)."""
FOR_LOOP_COPIES = 2
"""_single_tensor_adam: exp_avg_sq.sqrt() and its quotient by bias_correction2_sqrt, alive together."""
FOREACH_COPIES = 1
"""_multi_tensor_adam: torch._foreach_sqrt(exp_avg_sqs), then in-place _foreach_div_ / _foreach_add_."""
L2_DECAY_COPIES = 1
"""Adam (not AdamW) weight decay: grad.add(param) / torch._foreach_add(grads, params): one more copy."""

IMPLEMENTATIONS = {
    "torch_for_loop": "torch.optim AdamW/Adam for-loop (_single_tensor_adam)",
    "torch_foreach": "torch.optim AdamW/Adam foreach (_multi_tensor_adam)",
    "torch_fused": "torch.optim AdamW/Adam fused (_fused_adam)",
    "deepspeed_fused_adam": "DeepSpeed FusedAdam (multi_tensor_adam, in place)",
    "deepspeed_cpu_adam": "DeepSpeedCPUAdam (C++ step in place)",
    "other": "an optimizer whose temporaries are not modelled (counted as 0)",
}


@dataclass(frozen=True)
class StepTemporaries:
    """Peak bytes the optimizer step and the gradient norm allocate beyond the model states."""

    implementation: str
    """A key of IMPLEMENTATIONS."""
    optimizer_bytes: int
    """Peak temporaries inside the inner optimizer's step()."""
    optimizer_where: str
    """device | host (the optimizer steps host tensors under optimizer offload)."""
    grad_norm_bytes: int
    """The fp64 copy of the largest partition gradient while ZeRO-1/2 computes the global norm (0 elsewhere)."""
    source: str


def optimizer_implementation(optimizer_type: str, torch_adam: bool, foreach, fused, offload_optimizer: bool,
                             on_cpu: bool) -> str:
    """Which Adam implementation DeepSpeed 0.19.8 steps with (engine.py `get_optimizer_configuration`).

    Args:
        optimizer_type: the ds_config optimizer type, lower case.
        torch_adam: optimizer.params.torch_adam.
        foreach / fused: optimizer.params.foreach / fused (None = torch's default).
        offload_optimizer: zero_optimization.offload_optimizer on cpu/nvme (the optimizer steps host tensors).
        on_cpu: the tensors the optimizer steps are CPU tensors (CPU ranks, or offload).
    """
    if optimizer_type not in ("adam", "adamw"):
        return "other"
    if torch_adam:
        if fused:
            return "torch_fused"
        if foreach is None:
            # torch/optim/optimizer.py _default_to_fused_or_foreach: foreach only for CUDA-like native devices
            return "torch_for_loop" if on_cpu else "torch_foreach"
        return "torch_foreach" if foreach else "torch_for_loop"
    if offload_optimizer:
        return "deepspeed_cpu_adam"
    return "deepspeed_fused_adam"


def optimizer_temporary_bytes(implementation: str, stepped_numels: list[list[int]], l2_decay: bool) -> int:
    """Peak temporaries of one inner step() over `stepped_numels`: per call the optimizer makes (ZeRO-1/2 and
    stage 3 call it once per group / sub-group), the numels of the fp32 tensors it updates.

    Returns:
        for-loop: (2 + L2) x the largest tensor; foreach: (1 + L2) x the largest call's sum; else 0 (x 4 bytes).
    """
    extra = L2_DECAY_COPIES if l2_decay else 0
    if implementation == "torch_for_loop":
        largest = max((n for call in stepped_numels for n in call), default=0)
        return (FOR_LOOP_COPIES + extra) * largest * FP32_BYTES
    if implementation == "torch_foreach":
        largest_call = max((sum(call) for call in stepped_numels), default=0)
        return (FOREACH_COPIES + extra) * largest_call * FP32_BYTES
    return 0


def grad_norm_temporary_bytes(largest_partition_grad_numel: int) -> int:
    """stage_1_and_2.py get_grad_norm_direct: one fp64 copy of a partition gradient at a time."""
    return largest_partition_grad_numel * NORM_BYTES


__all__ = ["StepTemporaries", "IMPLEMENTATIONS", "optimizer_implementation", "optimizer_temporary_bytes",
           "grad_norm_temporary_bytes", "FOR_LOOP_COPIES", "FOREACH_COPIES", "L2_DECAY_COPIES", "NORM_BYTES"]
