"""Memory and step-time numbers the sweep ranks by, behind one function: `estimate_candidate`.

`estimate_candidate` uses `dstoolkit.estimate.estimate_run` (the estimators issue, #4) when that package
provides it, and otherwise the documented rule below (`fallback_estimate`). Both return a
`CandidateEstimate`, so the sweep, `generate` and their summaries never see the difference except in
`CandidateEstimate.source`.

The fallback rule (ranking only; the estimators issue owns the measured model):
- model states per rank: ZeRO §3.1 accounting (2 bytes weights + 2 bytes grads + 12 bytes Adam state per
  parameter in mixed precision; 4 + 4 + 8 in fp32), dense parameters split over TP x PP, expert parameters
  over TP x PP x EP, then partitioned over the (expert-)data-parallel group by stage;
- activations: Korthikanti et al. eq. 1 / Table 2 per layer, x layers per pipeline stage, x the pp
  micro-batches in flight at the first 1F1B stage, plus fp32 logits;
- DeepSpeed buffers: the reduce / all-gather buckets (stage 1-2) or prefetch bucket + live params (stage 3);
- step time: 6N + attention FLOPs (Kaplan; PaLM App. B) / (peak x efficiency), pipeline bubble (p-1)/m,
  plus communication volume / bus bandwidth, with a fixed exposed share.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.models.shape import ModelShape
from dstoolkit.schemas.spec import GpuSpec, Spec

GiB = 2**30

# --- fallback constants (each documented; used only while dstoolkit.estimate is absent) ---------------------
ADAM_STATE_BYTES_PER_PARAM_MIXED = 12  # ZeRO §3.1: fp32 master weights + momentum + variance (K = 12)
ADAM_STATE_BYTES_PER_PARAM_FP32 = 8  # fp32 training: momentum + variance only; the weights are the master copy
SGD_STATE_BYTES_PER_PARAM = 4  # momentum buffer (fp32)
ACT_TERM_NO_TP = 34  # Korthikanti eq. 1: s*b*h*(34 + 5*a*s/h) bytes per layer (16-bit activations)
ACT_TERM_TP_REPLICATED = 10  # Korthikanti Table 2 (TP): 10 sbh replicated across the TP group ...
ACT_TERM_TP_SPLIT = 24  # ... and 24 sbh split over t
ACT_SCORE_COEFF = 5  # the 5*a*s/h attention-score term (removed by flash attention or selective recompute)
ACT_FULL_RECOMPUTE_TERM = 2  # Korthikanti Table 2: full recompute keeps only the 2*s*b*h layer input
ACT_MLP_SHARE = 19 / 34  # Korthikanti §4.1: of the 34 sbh, 19 are the MLP (2 input + 8 + 8 + 1 mask), 15 attention
LOGITS_BYTES_PER_ELEMENT = 8  # fp32 logits and their gradient (4 + 4 bytes) on the last stage
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed default reduce_bucket_size / allgather_bucket_size (5e8)
RUNTIME_RESERVE_BYTES = 3 * GiB  # CUDA context + NCCL buffers + allocator fragmentation (order of magnitude)
CPU_RUNTIME_RESERVE_BYTES = 512 * 2**20  # a CPU rank: Python + torch + DeepSpeed resident set
COMPUTE_EFFICIENCY = 0.45  # achieved / peak matmul rate; Megatron reports 0.51-0.56 MFU at scale (anchors.md)
EXPOSED_COMM_SHARE_OVERLAPPED = 0.5  # share of ZeRO comm left exposed when overlap_comm is on (assumption)
OFFLOAD_PCIE_BYTES_PER_S = 25e9  # PCIe Gen4 x16 achievable host<->device copy rate
CPU_ADAM_BYTES_PER_S = 10e9  # host memory traffic of a CPU Adam step per rank (~16 B/param read+write)
FALLBACK_SOURCE = "fallback rule (ZeRO §3.1 model states + Korthikanti activations; dstoolkit.generate.costing)"


@dataclass(frozen=True)
class CandidateEstimate:
    """What the sweep needs from an estimate (per rank, worst pipeline stage)."""

    memory_per_rank_bytes: int
    """Peak device bytes per rank (total of the breakdown)."""
    memory_breakdown_bytes: dict[str, int]
    """params / grads / optimizer / activations / buffers / reserve, bytes per rank."""
    host_memory_per_rank_bytes: int
    """Host bytes per rank for offloaded states (0 without offload)."""
    device_memory_bytes: int
    """Capacity of one device, from the hardware table."""
    step_time_s: float
    """Estimated seconds per optimizer step."""
    mfu: float
    """Model FLOPs utilisation: useful FLOPs / (step time x world x peak)."""
    fits: bool
    """Whether memory_per_rank_bytes <= device_memory_bytes."""
    source: str
    """Which estimator produced the numbers."""
    extras: dict = field(default_factory=dict)
    """Estimator-specific figures (flops, comm bytes) shown in summaries."""


@dataclass(frozen=True)
class ParamSplit:
    """Parameters split into the part every data-parallel rank holds and the expert part sharded over EP."""

    total: int
    active: int
    expert: int
    """Routed-expert parameters (sharded over the expert-parallel group)."""

    @property
    def dense(self) -> int:
        return self.total - self.expert


@functools.lru_cache(maxsize=64)
def param_split(shape: ModelShape) -> ParamSplit:
    """Total/active parameters and the routed-expert share, from `dstoolkit.models.count_params`."""
    from dstoolkit.models import count_params

    counts = count_params(shape)
    return ParamSplit(total=counts.total, active=counts.active, expert=counts.routed_experts)


def attention_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """PaLM App. B: 12 * L * H * Q * T training FLOPs per token for the attention scores and values."""
    head_dim = shape.head_size
    if shape.is_mla and shape.qk_nope_head_dim:
        head_dim = shape.qk_nope_head_dim + (shape.qk_rope_head_dim or 0)
    return 12.0 * shape.num_hidden_layers * shape.num_attention_heads * head_dim * seq_len


def layers_per_stage(num_layers: int, pp: int) -> int:
    """Layers on the fullest pipeline stage: ceil(L / pp) (uneven splits put the remainder on stage 0)."""
    return -(-num_layers // pp)


def _activation_bytes_per_layer(spec: Spec, shape: ModelShape, cand: Candidate, recompute_full: bool) -> float:
    t = spec.training
    s, b, h, a = t.seq_len, cand.micro_batch, shape.hidden_size, shape.num_attention_heads
    tp = cand.tp
    if recompute_full:
        return ACT_FULL_RECOMPUTE_TERM * s * b * h / (tp if cand.sequence_parallel else 1)  # Korthikanti Table 2
    score = 0.0 if (t.flash_attention or cand.checkpoint.recomputes_attention_core) else ACT_SCORE_COEFF * a * s / h
    # MoE: the MLP share of activations is produced once per routed expert a token visits (top-k).
    mlp_scale = 1.0
    if shape.is_moe:
        mlp_scale = max(1, shape.num_experts_per_tok) * shape.expert_ffn_size / max(1, shape.intermediate_size)
    base = ACT_TERM_NO_TP * ((1 - ACT_MLP_SHARE) + ACT_MLP_SHARE * mlp_scale)
    if tp == 1:
        per = s * b * h * (base + score)  # Korthikanti eq. 1
    elif cand.sequence_parallel:
        per = s * b * h * (base + score) / tp  # Korthikanti Table 2, TP + SP
    else:
        split = ACT_TERM_TP_SPLIT * base / ACT_TERM_NO_TP
        per = s * b * h * (ACT_TERM_TP_REPLICATED + split / tp + score / tp)  # Korthikanti Table 2, TP
    return per


def fallback_estimate(spec: Spec, shape: ModelShape, cand: Candidate, gpu: GpuSpec) -> CandidateEstimate:
    """The documented ranking rule used until `dstoolkit.estimate` lands (see the module docstring)."""
    t = spec.training
    world = spec.cluster.world_size
    dp = cand.dp(world)
    gas = cand.grad_accum(world, t.global_batch)
    split = param_split(shape)
    model_parallel = cand.tp * cand.pp
    dense_rank = split.dense / model_parallel
    expert_rank = split.expert / (model_parallel * cand.ep)
    expert_dp = max(1, dp // cand.ep)
    elem = 4 if t.precision == "fp32" else 2
    opt_per_param = {"sgd": SGD_STATE_BYTES_PER_PARAM}.get(
        t.optimizer, ADAM_STATE_BYTES_PER_PARAM_FP32 if t.precision == "fp32" else ADAM_STATE_BYTES_PER_PARAM_MIXED)

    def shard(n_dense: float, n_expert: float, partitioned: bool) -> float:
        return (n_dense / dp + n_expert / expert_dp) if partitioned else (n_dense + n_expert)

    params_b = elem * shard(dense_rank, expert_rank, cand.zero_stage >= 3)  # ZeRO §3.1 P_os+g+p
    grads_b = elem * shard(dense_rank, expert_rank, cand.zero_stage >= 2)  # ZeRO §3.1 P_os+g
    optim_b = opt_per_param * shard(dense_rank, expert_rank, cand.zero_stage >= 1)  # ZeRO §3.1 P_os
    host_b = 0.0
    offloaded_optim_b = 0.0
    if cand.offload_optimizer:
        offloaded_optim_b = optim_b
        host_b += optim_b
        optim_b = 0.0
    if cand.offload_param:
        host_b += params_b
        params_b = 0.0

    n_layers = layers_per_stage(shape.num_hidden_layers, cand.pp)
    flags = cand.checkpoint.checkpointed_layers(n_layers)
    act_full = _activation_bytes_per_layer(spec, shape, cand, recompute_full=False)
    act_ckpt = _activation_bytes_per_layer(spec, shape, cand, recompute_full=True)
    per_microbatch = sum(act_ckpt if f else act_full for f in flags)
    if any(flags):
        per_microbatch += act_full  # the one layer being recomputed holds its full working set
    in_flight = min(cand.pp, gas)  # 1F1B: stage 0 holds pp micro-batches (Narayanan et al. 2021 §2.2)
    if t.precision == "fp32":
        per_microbatch *= 2  # Korthikanti counts 16-bit activations
    logits = LOGITS_BYTES_PER_ELEMENT * t.seq_len * cand.micro_batch * shape.vocab_size / cand.tp
    activations_b = per_microbatch * in_flight + logits

    if cand.zero_stage in (1, 2):
        buffers_b = 2 * elem * min(DEEPSPEED_BUCKET_ELEMENTS, dense_rank + expert_rank)
    elif cand.zero_stage == 3:
        largest_layer = (dense_rank + expert_rank) / max(1, n_layers)
        buffers_b = 2 * elem * min(DEEPSPEED_BUCKET_ELEMENTS, largest_layer * 2)
    else:
        buffers_b = 0.0
    reserve_b = CPU_RUNTIME_RESERVE_BYTES if gpu.name == "cpu" else RUNTIME_RESERVE_BYTES
    breakdown = {"params": int(params_b), "grads": int(grads_b), "optimizer": int(optim_b),
                 "activations": int(activations_b), "buffers": int(buffers_b), "reserve": int(reserve_b)}
    total = sum(breakdown.values())

    # ---- step time -------------------------------------------------------------------------------------
    tokens = t.global_batch * t.seq_len
    flops_per_token = 6.0 * split.active + attention_flops_per_token(shape, t.seq_len)  # Kaplan 6N + PaLM App. B
    useful_flops = flops_per_token * tokens
    recompute = 0.0
    if cand.checkpoint.kind != "none":
        frac = sum(flags) / n_layers
        recompute = frac * 2.0 / 6.0  # one extra forward (2N of 6N) for recomputed layers (anchors.md)
        if cand.checkpoint.recomputes_attention_core:
            recompute = attention_flops_per_token(shape, t.seq_len) / 3.0 / flops_per_token
    peak = gpu.peak_fp8_flops if (t.precision == "fp8" and gpu.peak_fp8_flops) else gpu.peak_bf16_flops
    compute_s = useful_flops * (1 + recompute) / (world * peak * COMPUTE_EFFICIENCY)
    bubble_s = compute_s * (cand.pp - 1) / max(1, gas)  # 1F1B bubble fraction (p-1)/m (Narayanan et al.)

    bw_dp = gpu.inter_node_bw_bytes_per_s if spec.cluster.nodes > 1 and dp > 1 else gpu.intra_node_bw_bytes_per_s
    state_bytes = elem * (dense_rank + expert_rank)
    ring = (dp - 1) / dp if dp > 1 else 0.0
    if cand.zero_stage <= 1:
        zero_comm = 2 * state_bytes * ring  # ZeRO §7: all-reduce (or reduce-scatter + all-gather) = 2 psi
    elif cand.zero_stage == 2:
        zero_comm = state_bytes * ring * (gas + 1)  # reduce-scatter every micro-step + one parameter all-gather
    else:
        zero_comm = 3 * state_bytes * ring * gas  # ZeRO §7: 3 psi per pass, gathers repeat per micro-step
        if cand.zeropp:
            zero_comm /= 4  # ZeRO++ §3: qwZ + hpZ + qgZ cut cross-node volume 3M -> 0.75M
    exposed = EXPOSED_COMM_SHARE_OVERLAPPED if cand.zero_stage >= 2 else 1.0
    comm_s = zero_comm / bw_dp * exposed
    if cand.tp > 1:  # Megatron TP: 4 all-reduces of s*b*h per layer per micro-batch (2 fwd, 2 bwd)
        tp_bytes = 4 * n_layers * t.seq_len * cand.micro_batch * shape.hidden_size * elem * gas
        comm_s += tp_bytes * 2 * (cand.tp - 1) / cand.tp / gpu.intra_node_bw_bytes_per_s
    if cand.ep > 1 and shape.is_moe:  # dispatch + combine, forward and backward, top-k copies per token
        moe_layers_stage = math.ceil(shape.num_moe_layers / cand.pp)
        a2a = 4 * moe_layers_stage * t.seq_len * cand.micro_batch * max(1, shape.num_experts_per_tok) \
            * shape.hidden_size * elem * gas * (cand.ep - 1) / cand.ep
        bw_ep = gpu.inter_node_bw_bytes_per_s if cand.ep * model_parallel > spec.cluster.gpus_per_node \
            else gpu.intra_node_bw_bytes_per_s
        comm_s += a2a / bw_ep
    offload_s = 0.0
    if cand.offload_optimizer:
        offload_s += offloaded_optim_b / CPU_ADAM_BYTES_PER_S
        offload_s += 2 * elem * (dense_rank + expert_rank) / max(1, dp) / OFFLOAD_PCIE_BYTES_PER_S
    if cand.offload_param:
        offload_s += 2 * elem * (dense_rank + expert_rank) * gas / OFFLOAD_PCIE_BYTES_PER_S
    step_s = compute_s + bubble_s + comm_s + offload_s
    mfu = useful_flops / (step_s * world * peak) if step_s > 0 else 0.0
    return CandidateEstimate(
        memory_per_rank_bytes=int(total), memory_breakdown_bytes=breakdown, host_memory_per_rank_bytes=int(host_b),
        device_memory_bytes=int(gpu.memory_bytes), step_time_s=step_s, mfu=mfu, fits=total <= gpu.memory_bytes,
        source=FALLBACK_SOURCE,
        extras={"flops_per_step": useful_flops * (1 + recompute), "compute_s": compute_s, "bubble_s": bubble_s,
                "comm_s": comm_s, "offload_s": offload_s})


_ESTIMATE_RUN = None
_ESTIMATE_TRIED = False


def _real_estimator():
    """`dstoolkit.estimate`'s (RunPlan, estimate_run) when that package provides them, else None."""
    global _ESTIMATE_RUN, _ESTIMATE_TRIED
    if not _ESTIMATE_TRIED:
        _ESTIMATE_TRIED = True
        try:
            from dstoolkit.estimate import RunPlan, estimate_run  # issue #4

            _ESTIMATE_RUN = (RunPlan, estimate_run)
        except ImportError:
            _ESTIMATE_RUN = None
    return _ESTIMATE_RUN


def estimator_source(force_fallback: bool = False) -> str:
    """Which estimator `estimate_candidate` uses right now (for summaries)."""
    return FALLBACK_SOURCE if force_fallback or _real_estimator() is None else PACKAGE_SOURCE


PACKAGE_SOURCE = "dstoolkit.estimate.estimate_run"


class EstimateInputError(ValueError):
    """The estimator refused the candidate (an impossible combination it checks itself)."""


def estimate_candidate(spec: Spec, shape: ModelShape, cand: Candidate, gpu: GpuSpec,
                       *, ds_config: Optional[dict] = None, force_fallback: bool = False) -> CandidateEstimate:
    """Estimate one candidate: `dstoolkit.estimate.estimate_run` when available, else `fallback_estimate`.

    Args:
        spec: The spec (its training/cluster sections; auto fields are taken from `cand`).
        shape: The resolved model shape.
        cand: The concrete layout.
        gpu: Hardware facts of one device.
        ds_config: The DeepSpeed JSON for `cand` (built with `build_ds_config` when None).
        force_fallback: Use the fallback rule even when the estimator package is present.

    Returns:
        A `CandidateEstimate`.

    Raises:
        EstimateInputError: The estimator refused the combination (message says why).
    """
    real = None if force_fallback else _real_estimator()
    if real is None:
        return fallback_estimate(spec, shape, cand, gpu)
    if ds_config is None:
        from dstoolkit.generate.ds_json import build_ds_config

        ds_config = build_ds_config(spec, shape, cand)
    run_plan_cls, estimate_run = real
    t = spec.training
    try:
        plan = run_plan_cls(
            shape=shape, ds_config=ds_config, world_size=spec.cluster.world_size,
            gpus_per_node=spec.cluster.gpus_per_node, gpu=gpu, seq_len=t.seq_len, tp=cand.tp, pp=cand.pp,
            ep=cand.ep, checkpoint=cand.checkpoint, flash_attention=t.flash_attention,
            sequence_parallel=cand.sequence_parallel, precision=t.precision)
        est = estimate_run(plan)
    except ValueError as exc:
        raise EstimateInputError(str(exc).splitlines()[-1] if "validation error" in str(exc) else str(exc)) from None
    mem = est.memory
    breakdown = {k: int(getattr(mem, k)) for k in ("params", "grads", "optimizer", "activations", "buffers")
                 if hasattr(mem, k)}
    total = int(mem.total)
    extras = {}
    for key in ("flops_per_step", "comm_bytes_per_step"):
        if hasattr(est, key):
            extras[key] = getattr(est, key)
    return CandidateEstimate(
        memory_per_rank_bytes=total, memory_breakdown_bytes=breakdown,
        host_memory_per_rank_bytes=int(getattr(est, "host_memory_per_rank_bytes", 0) or 0),
        device_memory_bytes=int(gpu.memory_bytes), step_time_s=float(est.step_time_s), mfu=float(est.mfu),
        fits=bool(getattr(est, "fits", total <= gpu.memory_bytes)), source=PACKAGE_SOURCE, extras=extras)


def best_case_needed_bytes(estimates: list[CandidateEstimate]) -> Optional[int]:
    """The smallest per-rank memory over all estimated candidates (what the best layout still needs)."""
    return min((e.memory_per_rank_bytes for e in estimates), default=None)
