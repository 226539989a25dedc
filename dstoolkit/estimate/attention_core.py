"""Seconds of an eager (unfused) attention core on one GPU rank, kernel by kernel (issue 24). No torch import.
cluster_model.layer_compute_s asks eager_core; the bytes it keeps for backward are activations.eager_score_bytes.

Megatron-LM's CoreAttention before flash attention (megatron/model/transformer.py, 2021-2023; Megatron-DeepSpeed
and vTrain's copy of the model, src/model/gpt_modeling.py, run the same four kernels) computes the attention of
one micro batch as
    scores = torch.baddbmm(Q, K^T)              batched GEMM, (q x d) @ (d x s) per head
    probs  = FusedScaleMaskSoftmax(scores)      one read and one write of the s x s scores (when its fused
                                                kernel runs; else five torch ops, estimate.megatron_softmax)
    probs  = attention_dropout(probs)           (when the model has it) a read, a write and a 1-byte mask
    ctx    = torch.bmm(probs, V)                batched GEMM, (q x s) @ (s x d) per head
and its backward the transposed GEMMs (dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q: the chain rule of a
matrix product), the dropout's and the softmax's backward (the softmax backward reads its output and the
incoming gradient and writes dS). Each kernel is charged by the roofline (Williams et al. 2009): a batched GEMM
takes the longer of its FLOPs at gemm.gemm_rate for its own shape (the reduction depth of QK^T and of dP is the
head dimension, 64-128, where one GEMM runs at a fraction of its large-GEMM rate) and its s x s operand's bytes at
HBM bandwidth; the elementwise kernels move their bytes at HBM bandwidth. What a flash kernel fuses into one pass
costs here a pass over the whole s x s square per kernel, so the core's time grows with heads x seq^2, not only
with its FLOPs: it weighs most in models with few, narrow heads (GPT 3.6B: h 3072, 32 heads of 96) and at long
sequences.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dstoolkit.estimate.activations import _act_bytes
from dstoolkit.estimate.flops import attention_head_dims
from dstoolkit.estimate.gemm import gemm_rate
from dstoolkit.estimate.megatron_softmax import plan_fused_softmax, softmax_bytes_per_element
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.runplan import RunPlan

DROPOUT_PASSES = 2
"""Dropout forward (read, write) and backward (read the gradient, write it), each with the 1-byte mask
(torch's fused dropout kernel keeps a bool mask; written in forward, read in backward)."""
MASK_BYTES = 1
"""Bytes of dropout's mask per element (torch.bool)."""
WINDOWED_KERNELS = ("flash", "te")
"""Attention implementations that skip the tiles outside a sliding window: flash-attn 2 (window_size, which
transformers' flash_attention_2 passes from the layer's sliding_window) and Transformer Engine's fused attention
(Megatron-LM --window-size). Eager attention and torch SDPA (handed transformers' sliding-window mask: no flash
backend takes a mask) compute every score of the s x s square and mask it, so their time counts every key."""


@dataclass(frozen=True)
class EagerCoreSeconds:
    """Seconds of one micro batch's eager attention core on one rank, for one layer."""

    forward_s: float
    backward_s: float


def eager_core_s(gpu: GpuSpec, precision: str, *, groups: int, queries: float, keys: float, head_dim_qk: float,
                 head_dim_v: float, element_bytes: int, dropout: bool, mem_bw: float,
                 fused_softmax: bool = True) -> EagerCoreSeconds:
    """The eager attention core of `groups` (micro batch x the rank's heads) independent heads, each `queries`
    local query rows over `keys` keys (see the module docstring for the kernels).

    Args:
        gpu, precision: for gemm.gemm_rate (fp8 plans run their attention core in bf16).
        groups: micro batch x heads on the rank (heads / tp / Ulysses).
        queries, keys: rows and columns of one head's score matrix on the rank (seq / cp and seq).
        head_dim_qk, head_dim_v: the q·k and the v width of a head.
        element_bytes: bytes of one score element (2 in fp16/bf16, 4 in fp32).
        dropout: whether the model applies attention dropout to the probabilities.
        mem_bw: HBM bytes/s.
        fused_softmax: Megatron's fused softmax kernel runs (fused_softmax_runs), else its torch fallback.
    """
    prec = "fp32" if precision == "fp32" else "bf16"
    elements = groups * queries * keys
    square_s = element_bytes * elements / mem_bw  # one pass over the score matrices

    def mm(m: float, n: float, k: float, depth: float) -> float:
        """One batched GEMM that reads or writes the s x s square once: roofline of its FLOPs and that pass."""
        flops = 2.0 * elements * depth
        return max(flops / gemm_rate(gpu, prec, m, n, k, groups), square_s)

    qk = mm(queries, keys, head_dim_qk, head_dim_qk)  # scores = Q K^T: depth d
    pv = mm(queries, head_dim_v, keys, head_dim_v)  # ctx = P V: depth = keys, output d wide
    drop_s = (DROPOUT_PASSES * element_bytes + MASK_BYTES) * elements / mem_bw if dropout else 0.0
    soft_fwd, soft_bwd = softmax_bytes_per_element(element_bytes, fused_softmax)
    forward = qk + soft_fwd * elements / mem_bw + drop_s + pv
    backward = (mm(queries, keys, head_dim_v, head_dim_v)  # dP = dO V^T
                + mm(keys, head_dim_v, queries, head_dim_v)  # dV = P^T dO
                + drop_s + soft_bwd * elements / mem_bw
                + mm(queries, head_dim_qk, keys, head_dim_qk)  # dQ = dS K
                + mm(keys, head_dim_qk, queries, head_dim_qk))  # dK = dS^T Q
    return EagerCoreSeconds(forward, backward)


def eager_core(plan: RunPlan, micro_batch: float, mem_bw: float) -> EagerCoreSeconds:
    """The eager attention core of one block for one micro batch on one rank (eager_core_s): micro batch x the
    rank's heads (heads / tp / Ulysses), each its seq / cp queries over the whole sequence, with the model's
    dropout."""
    shape = plan.shape
    _, d_qk = attention_head_dims(shape)
    d_v = (shape.v_head_dim or shape.head_size) if shape.is_mla else shape.head_size
    heads = max(1, math.ceil(shape.num_attention_heads / (plan.tp * plan.ulysses)))
    return eager_core_s(plan.gpu, plan.precision, groups=max(1, round(micro_batch * heads)),
                        queries=plan.seq_len / plan.cp, keys=plan.seq_len, head_dim_qk=d_qk, head_dim_v=d_v,
                        element_bytes=_act_bytes(plan)[0], dropout=plan.attention_dropout, mem_bw=mem_bw,
                        fused_softmax=plan_fused_softmax(plan))


def windowed_core_keys(plan: RunPlan, layer_index: int) -> float | None:
    """Keys per query a windowed fused kernel (WINDOWED_KERNELS) runs in layer `layer_index`: the band of the causal
    sliding-window mask, T·W - W²/2 of the T² scores (query q attends to its W latest keys), per query W·(1 - W/2T),
    which is the causal triangle's T/2 (cluster_model.CAUSAL_ATTENTION_WORK) at W = T. None where no window below
    seq_len applies or the kernel does not honour one: the caller counts the whole causal square."""
    w = plan.shape.attention_window(layer_index)
    if w is None or w >= plan.seq_len or plan.attention_kind not in WINDOWED_KERNELS:
        return None
    return w * (1.0 - w / (2.0 * plan.seq_len))
