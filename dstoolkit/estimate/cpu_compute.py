"""Compute time of a training step on CPU ranks, op by op (issue 15): each linear's three GEMMs at their own
shapes, the attention core by sequence length and head dim, the elementwise rest by the bytes a block saves.
No torch import.

Why not one rate per block: on CPUs with AMX bf16 the GEMMs of a small block run at ~400 GFLOP/s while its
causal SDPA backward runs at a few GFLOP/s and its elementwise ops (norms, RoPE, SiLU, casts) are memory-bound,
so the block's FLOP rate depends on its width and head dim (benchmarks/results/cpu_block_shapes_202612.md:
+50% .. -29% off with one interpolated block rate). The rates come from the machine probe
(`dstoolkit.runtime.probe`), which fits the three forms below to its own measurements:

- GEMM: t = t_call + F / (R * d / (d + d_half)) for F = 2mnk and d = min(m, n, k): a fixed cost per call
  (oneDNN primitive setup; ~40 us for AMX bf16 here) plus a large-GEMM rate R that falls off for thin
  dimensions, the tile-occupancy form of the GPU path (`gemm.shape_factor`).
- attention core (torch SDPA on CPU, causal): seconds per query row and head, measured on a (seq, head dim)
  grid and interpolated in log space (the CPU flash kernel's cost per row grows slower than seq: blocked kernel).
- elementwise: seconds per byte the block saves for backward (`activations.layer_activation_bytes`), the
  residual of the probe's whole-block measurement after its GEMMs and attention core (`fit_elementwise`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from dstoolkit.estimate.pipeline_stages import pipeline_compute_s
from dstoolkit.estimate.flops import attention_head_dims
from dstoolkit.estimate.layout import param_layout
from dstoolkit.runplan import RunPlan

LINEAR_KINDS = ("attention", "dense_mlp", "expert", "shared_expert", "router")
"""Parameter kinds whose 2-D weights are linears (norm weights and biases are not)."""
RECOMPUTE_ELEMENTWISE_SHARE = 1.0 / 3.0
"""Share of a block's elementwise time a recomputed forward repeats: forward is one of the three passes over
each saved byte (written in forward, read in backward, its gradient written; cluster_model's roofline count)."""


@dataclass(frozen=True)
class GemmFit:
    """t = call_s + F / (rate * d / (d + half_dim)), F = 2mnk, d = min(m, n, k)."""

    rate_flops_per_s: float
    half_dim: float
    call_s: float


@dataclass(frozen=True)
class OpRates:
    """What the op-level model needs of a calibration (`op_rates`), for one precision and clock."""

    gemm: GemmFit
    attention_points: tuple
    """[seq, head_dim, fwd+bwd s per query row and head, fwd s per query row and head], a full grid."""
    elementwise_s_per_byte: float


def op_rates(cal) -> OpRates:
    """The op-level rates of a `hardware.calibration.Calibration` (which must have them: `has_op_rates`)."""
    return OpRates(GemmFit(cal.gemm_rate_flops_per_s, cal.gemm_half_dim or 0.0, cal.gemm_call_s or 0.0),
                   tuple(tuple(p) for p in cal.attention_points), cal.elementwise_s_per_byte)


@dataclass(frozen=True)
class Linear:
    """One linear of a block on one rank: a (tokens x in) @ (in x out) forward GEMM."""

    in_features: float
    out_features: float
    tokens: float
    """Tokens this linear sees per micro batch (routed experts: their share)."""


def gemm_s(fit: GemmFit, m: float, n: float, k: float) -> float:
    """Seconds of one (m x k) @ (k x n) GEMM (see GemmFit)."""
    d = max(1.0, min(m, n, k))
    return fit.call_s + 2.0 * m * n * k * (d + fit.half_dim) / (fit.rate_flops_per_s * d)


def linear_s(fit: GemmFit, lin: Linear, forward_only: bool = False) -> float:
    """Forward GEMM, and unless `forward_only` the backward's input gradient (tokens x out @ out x in) and
    weight gradient (out x tokens @ tokens x in) GEMMs of one linear."""
    t, i, o = lin.tokens, lin.in_features, lin.out_features
    s = gemm_s(fit, t, o, i)
    if not forward_only:
        s += gemm_s(fit, t, i, o) + gemm_s(fit, o, i, t)
    return s


def fit_gemm(points: Sequence[tuple[float, float, float, float]]) -> GemmFit:
    """Least-squares fit of GemmFit to measured (m, n, k, seconds), weighted by 1/seconds (relative error).

    t = c + a·F + b·F/d is linear in (c, a, b) with rate = 1/a and half_dim = b/a. A fit outside the form's
    range (negative cost or fall-off, from noisy points) is refitted with that term at zero.

    Raises:
        ValueError: fewer than two points, or no positive rate fits them.
    """
    rows = [(1.0, 2.0 * m * n * k, 2.0 * m * n * k / max(1.0, min(m, n, k)), t) for m, n, k, t in points if t > 0]
    if len(rows) < 2:
        raise ValueError(f"fit_gemm needs at least two timed GEMMs, got {len(rows)}")
    for keep in ((0, 1, 2), (1, 2), (0, 1), (1,)):
        coef = _weighted_lstsq([[r[j] for j in keep] for r in rows], [r[3] for r in rows])
        if coef is None:
            continue
        full = dict.fromkeys((0, 1, 2), 0.0)
        full.update(zip(keep, coef))
        if full[1] > 0 and full[0] >= 0 and full[2] >= 0:
            return GemmFit(rate_flops_per_s=1.0 / full[1], half_dim=full[2] / full[1], call_s=full[0])
    raise ValueError(f"no positive GEMM rate fits the timings {list(points)}")


def _weighted_lstsq(x: list[list[float]], y: list[float]) -> Optional[list[float]]:
    """Solve min sum(((x·c) - y) / y)^2 by the normal equations (a few unknowns; no numpy in the core)."""
    n = len(x[0])
    a = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for row, t in zip(x, y):
        w = 1.0 / (t * t)
        for i in range(n):
            b[i] += w * row[i] * t
            for j in range(n):
                a[i][j] += w * row[i] * row[j]
    # Gauss-Jordan with partial pivoting
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[piv][col]) < 1e-300:
            return None
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        for r in range(n):
            if r != col and a[r][col]:
                f = a[r][col] / a[col][col]
                a[r] = [u - f * v for u, v in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def attention_row_s(points: Sequence[Sequence[float]], seq: float, head_dim: float, forward_only: bool = False) -> float:
    """Seconds per query row and head of the causal attention core at (seq, head_dim): bilinear in
    (log seq, log head dim) over the probe's grid of [seq, head_dim, fwd+bwd s/row, fwd s/row] (a grid with one
    seq or one head dim interpolates along the other only). Below the grid it is clamped at the edge (a short
    row's cost is the fixed part). Above it, it grows with the row's work from the edge point: a causal query row
    scores and sums ~seq/2 keys, 2·head_dim FLOPs each in QK^T and again in PV (PaLM App. B: 12·H·Q·T per token
    with the backward), so it scales with seq and with head_dim; clamped, the attention time grew linearly in
    seq while its FLOPs grow quadratically (MFU over 100% at seq 32768)."""
    col = 3 if forward_only else 2
    seqs = sorted({p[0] for p in points})
    dims = sorted({p[1] for p in points})
    table = {(p[0], p[1]): p[col] for p in points}

    def bracket(vals: list[float], x: float) -> tuple[float, float, float]:
        x = min(max(x, vals[0]), vals[-1])
        hi = next((v for v in vals if v >= x), vals[-1])
        lo = max((v for v in vals if v <= x), default=vals[0])
        frac = 0.0 if hi == lo else (math.log(x) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return lo, hi, frac

    s0, s1, fs = bracket(seqs, seq)
    d0, d1, fd = bracket(dims, head_dim)

    def at(s: float, d: float) -> float:
        if (s, d) in table:
            return table[(s, d)]
        raise ValueError(f"attention grid has no point (seq {s}, head dim {d}): it must be a full grid")

    def lerp(u: float, v: float, f: float) -> float:
        if f <= 0.0 or u == v:
            return u
        if f >= 1.0:
            return v
        return math.exp(math.log(u) + f * (math.log(v) - math.log(u)))

    beyond = max(1.0, seq / seqs[-1]) * max(1.0, head_dim / dims[-1])
    return lerp(lerp(at(s0, d0), at(s0, d1), fd), lerp(at(s1, d0), at(s1, d1), fd), fs) * beyond


def block_linears(plan: RunPlan, i: int, tok: float) -> list[Linear]:
    """The linears of block i on one rank for `tok` tokens: attention projections, dense or shared MLP, the
    router, and each local routed expert with its share of the tokens (top-k x ep / experts, as the GPU path
    counts them). TP splits the output of column- and the input of row-parallel linears; the GEMM shapes are
    symmetric in that, so the split is taken on the output side."""
    shape = plan.shape
    h = shape.hidden_size
    out: list[Linear] = []
    expert_numel: dict[str, int] = {}
    """One routed expert's matrices by name (gate_proj, up_proj, down_proj): every expert has the same."""
    for p in param_layout(shape):
        if p.layer != i or p.kind not in LINEAR_KINDS or not p.name.endswith("weight"):
            continue
        if "norm" in p.name.rsplit(".", 2)[-2]:
            continue  # MLA's q_a / kv_a layernorms are counted under attention
        if p.kind == "expert":
            expert_numel.setdefault(p.name.split(".experts.", 1)[-1].split(".", 1)[-1], p.numel)
            continue
        out.append(Linear(h, p.numel / h / (plan.tp if plan.tp_splits(p) else 1), tok))
    if expert_numel and shape.num_experts:
        local = max(1, shape.num_experts // max(1, plan.ep))
        share = tok * max(1, shape.num_experts_per_tok) * plan.ep / shape.num_experts
        for numel in expert_numel.values():
            out.extend([Linear(h, numel / h / plan.tp, share)] * local)
    return out


def layer_s(plan: RunPlan, rates: OpRates, i: int, tok: float, batch: float, saved_bytes: float, recompute: bool) -> float:
    """Seconds of block i's forward + backward (+ a recomputed forward) for one micro batch on one CPU rank."""

    fit = rates.gemm
    lins = block_linears(plan, i, tok)
    s = sum(linear_s(fit, lin) for lin in lins)
    heads, head_dim = attention_head_dims(plan.shape)
    rows = batch * (heads / plan.tp) * plan.seq_len
    s += rows * attention_row_s(rates.attention_points, plan.seq_len, head_dim)
    s += rates.elementwise_s_per_byte * saved_bytes
    if recompute:
        s += sum(linear_s(fit, lin, forward_only=True) for lin in lins)
        s += rows * attention_row_s(rates.attention_points, plan.seq_len, head_dim, forward_only=True)
        s += RECOMPUTE_ELEMENTWISE_SHARE * rates.elementwise_s_per_byte * saved_bytes
    elif plan.checkpoint.recomputes_attention_core:
        s += rows * attention_row_s(rates.attention_points, plan.seq_len, head_dim, forward_only=True)
    return s


def cpu_compute_s(plan: RunPlan, rates: OpRates) -> float:
    """Compute seconds of one optimizer step on a CPU rank: the blocks (`layer_s`) and the LM head's GEMMs
    through the pipeline arithmetic every path shares (`pipeline_stages.pipeline_compute_s`)."""

    shape, mb = plan.shape, plan.ds.micro_batch
    tok = mb * plan.seq_len
    ckpt = plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)
    # the LM head split over tp, or whole on every DeepSpeed AutoTP rank that keeps it whole
    head = linear_s(rates.gemm, Linear(shape.hidden_size, shape.vocab_size / plan.lm_head_gemm_shards, tok))
    return pipeline_compute_s(plan, lambda i, saved: layer_s(plan, rates, i, tok, mb, saved, ckpt[i]), head)


def fit_elementwise(residual_s: Sequence[float], saved_bytes: Sequence[float]) -> float:
    """Seconds per saved byte from the probe block's residual time (measured minus its GEMMs and attention
    core) at one or more sizes: total residual over total bytes, through the origin, never below zero. No
    intercept: the residual is a difference of timings, and a line through two noisy points made its intercept
    swing by tens of milliseconds per block between probes; a fixed cost per block, where a file gives one, is
    `Calibration.per_layer_overhead_s`.

    Raises:
        ValueError: no size with saved bytes.
    """
    pts = [(b, r) for b, r in zip(saved_bytes, residual_s) if b > 0]
    if not pts:
        raise ValueError("fit_elementwise needs at least one size with saved bytes")
    return max(0.0, sum(r for _, r in pts) / sum(b for b, _ in pts))
