"""FLOP formulas `torch.utils.flop_counter` lacks or gets wrong, shared by the tracers (no torch import at
module level).

`torch.utils.flop_counter.FlopCounterMode` counts matmuls, convolutions and the CUDA attention kernels, but:

- the CPU flash-attention kernel that `F.scaled_dot_product_attention` picks on the host has no formula
  there and would count as zero (on the meta device sdpa decomposes into bmm and is counted without this);
- its `convolution_backward` formula (torch 2.13) ignores `groups`: the depthwise causal conv1d of Mamba and
  gated-DeltaNet layers (groups = channels) is charged channels x its real cost in backward, 549M FLOPs
  per token for one Qwen3-Next linear-attention layer whose forward conv is 67K. Counted here as the
  forward convolution once per gradient asked for (input, weight), as for a matmul.
"""
from __future__ import annotations


def attention_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Forward FLOPs of softmax attention from the q, k, v shapes (batch, heads, seq, dim).

    QK^T and PV, 2 FLOPs per multiply-add, every (query, key) pair (as PaLM App. B's 12·L·H·Q·T counts it);
    GQA shares the kv heads, the FLOPs are per query head.
    """
    b, h, s_q, d = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * d + 2 * b * h * s_q * s_k * d_v


def attention_backward_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Backward FLOPs: dQ, dK, dV and dP, four matmuls of the forward's two sizes."""
    return 2 * attention_flops(q, k, v)


def convolution_backward_flops(grad_out, x, w, *args, out_shape=None, **kwargs) -> int:
    """Backward FLOPs of a (grouped) convolution: the forward's 2·numel(out)·(C_in/groups)·prod(kernel) per
    gradient computed (`output_mask` of aten.convolution_backward: grad input, grad weight, grad bias)."""
    fwd = 2 * _prod(grad_out) * _prod(w[1:])  # w is (C_out, C_in / groups, *kernel): groups already divided
    mask = args[7] if len(args) > 7 else (True, True, False)
    return fwd * (int(bool(mask[0])) + int(bool(mask[1])))


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def attention_flop_mapping() -> dict:
    """`custom_mapping` for FlopCounterMode: the CPU flash-attention forward and backward ops, and grouped
    convolution backward."""
    import torch  # lazy: only the tracers (which already run torch) call this

    aten = torch.ops.aten
    mapping = {}
    for name, fn in (("_scaled_dot_product_flash_attention_for_cpu", attention_flops),
                     ("_scaled_dot_product_flash_attention_for_cpu_backward", attention_backward_flops),
                     ("convolution_backward", convolution_backward_flops)):
        op = getattr(aten, name, None)
        if op is not None:
            mapping[op] = fn
    return mapping
