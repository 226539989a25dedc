"""Activation bytes of an MoE block (split from estimate.activations, which calls them per block): DeepSpeed's
capacity-padded top-k MoE itemised from what its autograd graph keeps, and Megatron-Core's dropless MoE with
grouped GEMMs; the capacity DeepSpeed's gate allots. No torch import."""
from __future__ import annotations

import math

from dstoolkit.estimate.dtype_bytes import FP32_BYTES, INDEX_BYTES
from dstoolkit.runplan import RunPlan

DS_MOE_MIN_CAPACITY = 4
"""deepspeed.moe.layer.MoE default min_capacity (sharded_moe.py _capacity)."""


def moe_capacity(plan: RunPlan, tokens: int) -> int:
    """Tokens per expert DeepSpeed's TopKGate allots: ceil(k * tokens / E * capacity_factor), at least 4."""
    shape = plan.shape
    k = max(1, shape.num_experts_per_tok)
    cap = math.ceil(tokens / shape.num_experts * plan.moe_capacity_factor * k)
    return max(cap, DS_MOE_MIN_CAPACITY)


def moe_block_bytes(plan: RunPlan, tok: int, p: int, pl: int) -> float:
    """DeepSpeed 0.19.8 top-k MoE (moe/sharded_moe.py), itemised from what its autograd graph keeps.

    Router: fp32 softmax gates (T·E), the top-1 mask (bool) and two (T, E, 1) fp32 einsum operands, four
    fp32 per-token normalisers; in bf16/fp16 also the fp32 copy of the router input and of wg. Dispatch is
    index based (no dense one-hot einsum): an int64 index of E·C+1 slots and the (E, C, h) dispatched tokens,
    which every expert's MLP reads; experts keep SwiGLU's gate/SiLU/up/product over their C slots; combine
    keeps the k·T slot index, the (k, T) gates and the (k, T, h) routed outputs.
    """
    shape = plan.shape
    h, e = shape.hidden_size, shape.num_experts
    k = max(1, shape.num_experts_per_tok)
    i = shape.expert_ffn_size
    c = moe_capacity(plan, tok)
    slots = e * c  # every rank computes E*C token slots in total (E/ep local experts x ep*C)
    router = FP32_BYTES * tok * e + tok * e + 2 * FP32_BYTES * tok * e + 4 * FP32_BYTES * tok + FP32_BYTES * e
    if p != FP32_BYTES:
        router += FP32_BYTES * tok * h + FP32_BYTES * e * h  # input.float() and wg.weight.float() for the router
    dispatch = INDEX_BYTES * (slots + 1) + p * slots * h
    local = e // plan.ep
    if plan.ep > 1 and local > 1:
        # moe/experts.py chunks the (ep, E_local, C, h) all-to-all output along the expert dim; each chunk is
        # non-contiguous, so every expert linear (gate and up) folds it into its own contiguous copy and keeps
        # that instead of the shared dispatched buffer (measured with saved_tensors_hooks).
        dispatch += ((2 if shape.mlp_gated else 1) * pl - p) * slots * h
    if shape.mlp_gated:
        experts = (3 * p + pl) * slots * i / plan.tp
    else:
        experts = (p + pl) * slots * i / plan.tp
    combine = INDEX_BYTES * k * tok + FP32_BYTES * k * tok + p * k * tok * h
    shared = 0.0
    if shape.num_shared_experts > 0:
        shared = (3 * p + pl) * tok * shape.num_shared_experts * i / plan.tp
    elif shape.shared_expert_intermediate_size:
        shared = (3 * p + pl) * tok * shape.shared_expert_intermediate_size / plan.tp + p * tok
    return router + dispatch + experts + combine + shared


def fused_moe_block_bytes(plan: RunPlan, tok: float, p: int, pl: int | None = None) -> float:
    """Megatron-Core dropless MoE with grouped GEMMs (alltoall dispatcher), per rank before SP sharding: the fp32
    router logits and probabilities (2·4·E), the permuted tokens each expert FC1 reads (k·h), FC1's output and
    FC2's input (k·3i gated, k·2i GELU), the FC2 output the unpermute/combine reads (k·h), and the shared
    expert's FC1 output and FC2 input (3·i_s). Balanced routing: a rank computes as many routed tokens as it
    sends."""
    pl = p if pl is None else pl
    shape = plan.shape
    h, e = shape.hidden_size, shape.num_experts
    k = max(1, shape.num_experts_per_tok)
    i = shape.expert_ffn_size
    fc1_out = 2 if shape.mlp_gated else 1  # the FC1 output the activation's backward reads (p)
    router = 2 * FP32_BYTES * e * tok
    mods = set(plan.recompute_modules)
    # per routed copy: FC1 input (pl: FP8 GEMM input cached in FP8), FC1 output (p), FC2 input (pl), FC2 output
    # the combine reads (p); moe_act recompute drops the FC2 input (the activation's output), re-made from the FC1
    # output in backward (Megatron --recompute-modules moe_act; DeepSeek-V3 §3.3.3 caches the SwiGLU input and
    # recomputes its output)
    fc2_in = 0 if "moe_act" in mods else pl
    routed = k * tok * ((pl + p) * h + (fc1_out * p + fc2_in) * i)
    shared_width = shape.num_shared_experts * i if shape.num_shared_experts else (shape.shared_expert_intermediate_size or 0)
    shared = 0.0 if "shared_experts" in mods else tok * (fc1_out * p + pl) * shared_width
    return router + routed + shared
