"""FLOP formulas `torch.utils.flop_counter` lacks or gets wrong, shared by the tracers (no torch import at
module level).

`torch.utils.flop_counter.FlopCounterMode` counts matmuls, convolutions and the CUDA attention kernels, but:

- the CPU flash-attention kernel that `F.scaled_dot_product_attention` picks on the host has no formula
  there and would count as zero (on the meta device sdpa decomposes into bmm and is counted without this);
- its `convolution_backward` formula (torch 2.13) ignores `groups`: the depthwise causal conv1d of Mamba and
  gated-DeltaNet layers (groups = channels) is charged channels x its real cost in backward, 549M FLOPs
  per token for one Qwen3-Next linear-attention layer whose forward conv is 67K. Counted here as the
  forward convolution once per gradient asked for (input, weight), as for a matmul.

It also holds the forward FLOPs of the token mixers whose cost is not in 6N and not in PaLM's 12·L·H·Q·T
(`gated_delta_chunk_flops`, `mamba2_ssd_chunk_flops`, `dsa_indexer_score_flops`), written from the torch code
transformers runs for them, so that the estimator (`dstoolkit.estimate.flops`) and the tests share one formula.
"""
from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class ScanForwardFlops:
    """Forward FLOPs of one layer's chunked scan over one sequence, split by the op that computes them."""

    matmul: int
    """Dense matmuls / einsums (what torch.utils.flop_counter counts: 2 FLOPs per multiply-add)."""
    triangular_solve: int = 0
    """Unit-triangular solves (torch.linalg.solve_triangular: no formula in torch.utils.flop_counter)."""

    @property
    def total(self) -> int:
        return self.matmul + self.triangular_solve


def _chunks(seq_len: int, chunk: int) -> int:
    if seq_len <= 0 or chunk <= 0:
        raise ValueError(f"seq_len={seq_len}, chunk={chunk}: both must be > 0")
    return -(-seq_len // chunk)  # the sequence is zero-padded to a multiple of the chunk


def gated_delta_chunk_flops(seq_len: int, heads: int, k_dim: int, v_dim: int, chunk: int) -> ScanForwardFlops:
    """Forward FLOPs of the chunked gated delta rule of one linear-attention layer over one sequence.

    As transformers 5.x computes it (models/qwen3_next/modeling_qwen3_next.py, `torch_chunk_gated_delta_rule`,
    also used by Qwen3.5; the chunked form of Yang et al. 2024, "Gated Delta Networks", §3.3 / the UT
    transform of DeltaNet's chunkwise algorithm). The T tokens are zero-padded to n = ceil(T / C) chunks of
    C; q and k are repeated to the `heads` value heads (grouped value attention). Per chunk and head:

    - intra-chunk: k_beta·kᵀ and q·kᵀ (C x dk x C each): 2·2·C²·dk;
    - two unit-lower-triangular solves against that C x C system, for v_beta (C x dv) and the decayed
      k_beta (C x dk): C·(C-1)·(dv + dk) (C(C-1)/2 multiply-adds per right-hand column);
    - the scan over chunks: k_cumdecay·S and q·S (C x dk x dv each), attn·v_new (C x C x dv) and the state
      update kᵀ·v_new (dk x C x dv): 3·2·C·dk·dv + 2·C²·dv.

    Per token that is constant in T (up to the padding of the last chunk): 4·C·dk + 2·C·dv + 6·dk·dv +
    (C-1)(dk+dv) per head.
    """
    n, C, dk, dv = _chunks(seq_len, chunk), chunk, k_dim, v_dim
    matmul = heads * n * (2 * 2 * C * C * dk + 3 * 2 * C * dk * dv + 2 * C * C * dv)
    solve = heads * n * C * (C - 1) * (dv + dk)
    return ScanForwardFlops(matmul=matmul, triangular_solve=solve)


def mamba2_ssd_chunk_flops(seq_len: int, heads: int, head_dim: int, state: int, chunk: int) -> ScanForwardFlops:
    """Forward FLOPs of the Mamba-2 SSD chunked scan of one Mamba layer over one sequence.

    As transformers 5.x computes it (models/nemotron_h/modeling_nemotron_h.py, `mamba2_chunk_scan`, the torch
    path of `NemotronHMamba2Mixer`; Dao & Gu 2024, "Transformers are SSMs", §6 / Listing 1 `ssd_minimal`).
    T is zero-padded to n = ceil(T / C) chunks (C: the config's chunk_size); B and C are repeated from the
    groups to the `heads` heads. Per chunk and head (P = head_dim, N = state):

    - G = C·Bᵀ (C x N x C) and Y_diag = (G∘L)·x (C x C x P): 2·C²·N + 2·C²·P;
    - chunk states Bᵀ·x (N x C x P) and the state read C·S (C x N x P): 2·2·C·P·N;

    and once per head, the inter-chunk recurrence, an einsum over the n + 1 chunk boundaries (the initial
    state included): 2·(n+1)²·P·N. That last term grows with T (about 2·T·P·N / C² per token); the rest is
    constant per token.
    """
    n, C, P, N = _chunks(seq_len, chunk), chunk, head_dim, state
    per_chunk = 2 * C * C * N + 2 * C * C * P + 2 * 2 * C * P * N
    return ScanForwardFlops(matmul=heads * (n * per_chunk + 2 * (n + 1) ** 2 * P * N))


def dsa_indexer_score_flops(seq_len: int, heads: int, head_dim: int) -> int:
    """Forward FLOPs of the DeepSeek-V3.2 lightning indexer's scores over one sequence (one layer).

    DeepSeek-V3.2 report §2.1 eq. (1): I_t,s = Σ_j w_t,j · ReLU(q_t,j · k_s), H_I heads of width D_I, one
    key per token shared by the heads; transformers 5.x (models/deepseek_v32/modeling_deepseek_v32.py,
    `DeepseekV32Indexer.forward`) scores every (query, key) pair: q·kᵀ (H_I x T x D_I x T) and the head
    weighting w·scores (1 x H_I x T per query): 2·H_I·T²·(D_I + 1). Its projections (wq_b, wk,
    weights_proj) are linears, already in 6N.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be > 0")
    return 2 * heads * seq_len * seq_len * (head_dim + 1)
