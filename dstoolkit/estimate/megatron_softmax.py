"""Megatron's scale-mask-softmax of an eager attention core: whether its fused CUDA kernel runs for a plan, and
what the kernel or its torch fallback reads and writes per score element. attention_core charges the time,
activations.eager_score_bytes the bytes kept for backward, host_cost the kernel launches. No torch import.
"""
from __future__ import annotations

import math

from dstoolkit.runplan import RunPlan

SOFTMAX_FORWARD_PASSES = 2
"""Passes over the scores of the fused scale-mask-softmax forward: read the scores, write the probabilities
(Megatron's scaled_upper_triang_masked_softmax / scaled_masked_softmax CUDA kernels: one kernel, in registers)."""
SOFTMAX_BACKWARD_PASSES = 3
"""Its backward: read the saved probabilities and the incoming gradient, write dS (the same kernels' backward)."""
SOFTMAX_THREADS_PER_BLOCK = 128
"""Threads per block of Megatron's scaled (upper-triang) masked softmax kernels (megatron/fused_kernels
scaled_masked_softmax.h dispatch: threads_per_block = 128), which set how many score rows one block takes."""
UNFUSED_SOFTMAX_KERNELS = 5
"""Kernels of Megatron's torch fallback (FusedScaleMaskSoftmax.forward_torch_softmax) with 16-bit scores and the
softmax in fp32 (on whenever apply_query_key_layer_scaling, Megatron-LM's and Megatron-DeepSpeed's default):
input.float(), input * scale, mask_func (masked_fill_), torch.nn.Softmax, probs.half() / .bfloat16(); autograd
runs one backward kernel for each. With fp32 scores the two casts are no-ops: 3."""


def softmax_batch_per_block(keys: int) -> int:
    """Score rows one block of Megatron's fused softmax kernel takes (scaled_masked_softmax.h get_batch_per_block:
    a warp of min(next power of two of the key length, 32) lanes, two rows per warp up to 128 keys)."""
    pow2 = 1 << max(0, math.ceil(math.log2(max(1, keys))))
    warp = min(pow2, 32)
    return (SOFTMAX_THREADS_PER_BLOCK // warp) * (2 if pow2 <= 128 else 1)


def fused_softmax_blocker(precision: str, micro_batch: int, heads: int, queries: int, keys: int) -> str | None:
    """Why Megatron's FusedScaleMaskSoftmax cannot run its fused CUDA kernel for a causal mask, or None when it can
    (megatron/model/fused_softmax.py is_kernel_available in Megatron-DeepSpeed and Megatron-LM's legacy model):
    it needs 16-bit scores, 16 < keys <= 4096, queries and keys multiples of 4, and the micro batch x the rank's
    heads (attn_batches) a multiple of 4 and of softmax_batch_per_block. Otherwise it falls back to torch ops
    (UNFUSED_SOFTMAX_KERNELS): e.g. 16 heads at TP 8 with micro batch 1 (attn_batches 2). BigScience chose BLOOM's
    head count by the same rule (bigscience train/tr11-176B-ml/chronicles-prequel.md, "NHEADs comparison": "the
    constraint is (HEADS/TP)*MBS % 4 = 0"; "NHEADS=108 breaks constraints for invoking optimized fused softmax
    kernel")."""
    if precision == "fp32":
        return "fp32 scores (the kernel takes fp16 / bf16)"
    if not (16 < keys <= 4096 and queries % 4 == 0 and keys % 4 == 0):
        return f"{queries} queries over {keys} keys (the kernel takes 17-4096 keys, both multiples of 4)"
    batches = micro_batch * heads
    multiple = math.lcm(4, softmax_batch_per_block(keys))
    if batches % multiple:
        return f"micro batch {micro_batch} x {heads} heads per TP rank = {batches}, not a multiple of {multiple}"
    return None


def fused_softmax_runs(precision: str, micro_batch: int, heads: int, queries: int, keys: int) -> bool:
    """Whether Megatron's fused softmax kernel runs (fused_softmax_blocker finds nothing in its way)."""
    return fused_softmax_blocker(precision, micro_batch, heads, queries, keys) is None


def softmax_bytes_per_element(element_bytes: int, fused: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes per score element of the scale-mask-softmax. Fused: one kernel reads the scores
    and writes the probabilities; its backward reads them and the gradient and writes dS. The torch fallback
    (UNFUSED_SOFTMAX_KERNELS), per kernel its reads and writes: forward e->4 cast, 4->4 scale, 4->4 masked_fill_,
    4->4 softmax, 4->e cast; backward e->4, softmax backward 4+4->4, 4->4, 4->4, 4->e (no casts in fp32)."""
    e = element_bytes
    if fused:
        return SOFTMAX_FORWARD_PASSES * e, SOFTMAX_BACKWARD_PASSES * e
    if e == 4:
        return 24.0, 28.0
    return 2 * e + 32.0, 2 * e + 36.0


def softmax_kernels(plan: RunPlan) -> int:
    """Kernels the plan's eager-core softmax launches each way: 1 when the fused kernel runs, else the torch
    fallback's UNFUSED_SOFTMAX_KERNELS (3 with fp32 scores, whose casts are no-ops)."""
    if plan_fused_softmax(plan):
        return 1
    return UNFUSED_SOFTMAX_KERNELS - 2 if plan.precision == "fp32" else UNFUSED_SOFTMAX_KERNELS


def _plan_args(plan: RunPlan, micro_batch: int | None = None) -> tuple:
    """fused_softmax_blocker's arguments for the plan's eager core: its micro batch, heads per rank (heads / tp /
    Ulysses) and local queries (seq / cp) over the whole sequence."""
    heads = max(1, math.ceil(plan.shape.num_attention_heads / (plan.tp * plan.ulysses)))
    mb = plan.ds.micro_batch if micro_batch is None else micro_batch
    return plan.precision, mb, heads, plan.seq_len // plan.cp, plan.seq_len


def plan_fused_softmax(plan: RunPlan) -> bool:
    """fused_softmax_runs for the plan's eager core."""
    return fused_softmax_blocker(*_plan_args(plan)) is None


def fallback_note(plan: RunPlan) -> str | None:
    """A line for estimate / generate when an eager core's softmax falls back to torch ops (plan_fused_softmax),
    naming why and the nearest larger micro batch that runs the fused kernel; None otherwise."""
    if plan.attention_kind != "eager":
        return None
    why = fused_softmax_blocker(*_plan_args(plan))
    if why is None:
        return None
    mb = plan.ds.micro_batch
    fix = next((m for m in range(mb + 1, 4 * mb + 1) if fused_softmax_blocker(*_plan_args(plan, m)) is None), None)
    return (f"eager attention: Megatron's fused scale-mask-softmax kernel cannot run ({why}; megatron fused_softmax.py "
            f"is_kernel_available), so its torch fallback is charged: {UNFUSED_SOFTMAX_KERNELS} kernels and an fp32 "
            "softmax each way" + (f"; micro batch {fix} would run the fused kernel" if fix else ""))
