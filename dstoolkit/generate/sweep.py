"""Sweep: enumerate ZeRO stage x offload x ZeRO++ x TP x PP x EP x micro-batch x checkpoint policy, drop the
candidates that break a rule or do not fit, rank the rest by estimated step time, and explain the winner.

No torch import. Order of checks (cheapest first): structural rules (`dstoolkit.generate.rules`), then the
memory estimate, then - only for the candidates about to be shown or generated - `validate_config` on the
DeepSpeed JSON at the spec's world size (a candidate with an error finding is dropped with that finding).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

from dstoolkit.generate.candidates import Candidate, StrategyDef
from dstoolkit.generate.costing import (CandidateEstimate, EstimateInputError, allowance_text,
                                        estimate_candidate, estimator_source, usable_device_bytes)
from dstoolkit.generate.ds_json import build_ds_config, param_split
from dstoolkit.generate.rules import RuleViolation, check_candidate
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.spec import Spec

GiB = 2**30
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)  # micro-batches tried when training.micro_batch is "auto"
AUTO_CHECKPOINT_POLICIES = (CheckpointPolicy(kind="none"), CheckpointPolicy(kind="selective"),
                            CheckpointPolicy(kind="full"))  # tried when activation_checkpointing is "auto"
MAX_NODE_SCALE = 64  # fits-nowhere advice tries up to this many times the spec's node count


@dataclass(frozen=True)
class Ranked:
    """A candidate that fits, with its estimate and why it sits where it does."""

    candidate: Candidate
    estimate: CandidateEstimate
    reason: str = ""
    findings: tuple = ()
    """validate_config findings (warnings/info) on its DeepSpeed JSON; empty until validated."""


@dataclass(frozen=True)
class Dropped:
    """A candidate left out, with the rule (code) and the message."""

    candidate: Candidate
    code: str
    reason: str


@dataclass
class FitsNowhere:
    """A model that fits no candidate: what it needs and what would make it fit."""

    needed_per_gpu_bytes: int
    device_memory_bytes: int
    least_memory_label: str
    suggestions: list[str]
    least_memory_candidate: Optional[Candidate] = None
    """The layout behind `least_memory_label` (what `dstoolkit estimate` shows when nothing fits)."""

    def message(self, spec: Spec, gpu: GpuSpec, model_name: str) -> str:
        lines = [
            f"{model_name} fits nowhere on {spec.cluster.nodes} x {spec.cluster.gpus_per_node} {gpu.name}: the "
            f"least memory-hungry layout ({self.least_memory_label}) still needs at least "
            f"{self.needed_per_gpu_bytes / GiB:.1f} GiB per GPU at its peak, and one GPU has "
            f"{self.device_memory_bytes / GiB:.1f} GiB ({usable_device_bytes(gpu) / GiB:.1f} GiB usable for tensors "
            f"after {allowance_text(gpu)}).",
        ]
        if self.suggestions:
            lines.append("What would make it fit:")
            lines += [f"  - {s}" for s in self.suggestions]
        else:
            lines.append("Nothing tried here makes it fit (more GPUs, offload, TP/PP, recompute, micro-batch 1).")
        return "\n".join(lines)


@dataclass
class SweepResult:
    """Everything a sweep found."""

    ranked: list[Ranked]
    dropped: list[Dropped]
    considered: int
    estimator: str
    winner_reason: Optional[str] = None
    fits_nowhere: Optional[FitsNowhere] = None
    all_ranked_count: int = 0
    dropped_by_code: dict = field(default_factory=dict)

    @property
    def winner(self) -> Optional[Ranked]:
        return self.ranked[0] if self.ranked else None


# ----------------------------------------------------------------------------------------------------------
# enumeration
# ----------------------------------------------------------------------------------------------------------

def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the parallel degrees and micro-batches the sweep (and the tuner) try."""
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def zero_modes(spec: Spec, strategy: Optional[StrategyDef]) -> list[tuple[int, bool, bool, bool]]:
    """(stage, offload_optimizer, offload_param, zeropp) combinations the spec (or the strategy) allows."""
    if strategy is not None:
        return [(strategy.zero_stage, strategy.offload_optimizer, strategy.offload_param, strategy.zeropp)]
    t = spec.training
    stages = [0, 1, 2, 3] if t.zero_stage == "auto" else [int(t.zero_stage)]
    modes = []
    for s in stages:
        modes.append((s, False, False, False))
        if t.offload and s in (1, 2):
            modes.append((s, True, False, False))
        if t.offload and s == 3:
            modes += [(s, True, False, False), (s, True, True, False)]
        if t.zeropp and s == 3:
            modes.append((s, False, False, True))
    return modes


def _degrees(value, choices: Iterable[int]) -> list[int]:
    return list(choices) if value == "auto" else [int(value)]


def checkpoint_choices(spec: Spec) -> list[CheckpointPolicy]:
    """The recompute policies to try: the spec's, or none/selective/full for "auto"."""
    t = spec.training
    if t.activation_checkpointing == "auto":
        return list(AUTO_CHECKPOINT_POLICIES)
    return [t.checkpoint_policy()]


def enumerate_candidates(spec: Spec, shape: ModelShape, strategy: Optional[StrategyDef] = None) -> Iterator[Candidate]:
    """Every combination the spec leaves open ("auto" fields), restricted to `strategy` when given."""
    t, c = spec.training, spec.cluster
    tps = _degrees(t.tp, pow2_upto(c.gpus_per_node))
    pps = _degrees(t.pp, [p for p in pow2_upto(min(c.world_size, shape.num_hidden_layers))])
    if shape.is_moe:
        eps = _degrees(t.ep, [e for e in pow2_upto(min(shape.num_experts, c.world_size))
                              if shape.num_experts % e == 0])
    else:
        eps = _degrees(t.ep, [1])
    if strategy is not None:
        eps = [e for e in eps if (e > 1) == strategy.expert_parallel]
    mbs = _degrees(t.micro_batch, MICRO_BATCH_CHOICES)
    policies = checkpoint_choices(spec)
    for (stage, off_opt, off_par, zpp), tp, pp, ep, mb, ck in itertools.product(
            zero_modes(spec, strategy), tps, pps, eps, mbs, policies):
        yield Candidate(zero_stage=stage, offload_optimizer=off_opt, offload_param=off_par, zeropp=zpp, tp=tp,
                        pp=pp, ep=ep, micro_batch=mb, checkpoint=ck,
                        sequence_parallel=bool(t.sequence_parallel and tp > 1))


# ----------------------------------------------------------------------------------------------------------
# validation of the emitted JSON
# ----------------------------------------------------------------------------------------------------------

def validate_candidate_config(spec: Spec, shape: ModelShape, cand: Candidate, cfg: Optional[dict] = None,
                              native_moe: bool = True) -> list:
    """`validate_config` findings for the candidate's DeepSpeed JSON at the spec's world size (the MoE rules
    only for native DeepSpeed MoE: an HF model's experts are plain modules DeepSpeed knows nothing of)."""
    from dstoolkit.validate.engine import validate_config  # schemas helper (issue #2)

    cfg = cfg if cfg is not None else build_ds_config(spec, shape, cand)
    return list(validate_config(
        cfg, source=f"{spec.name}:{cand.label}", world_size=spec.cluster.world_size,
        gpus_per_node=spec.cluster.gpus_per_node, tp=cand.tp, pp=cand.pp,
        num_experts=shape.num_experts if shape.is_moe and native_moe else None,
        ep_size=cand.ep if shape.is_moe and native_moe else None, mode="strict"))


def error_findings(findings: Sequence) -> list:
    return [f for f in findings if str(getattr(f, "severity", "")).lower().endswith("error")]


# ----------------------------------------------------------------------------------------------------------
# ranking and explanation
# ----------------------------------------------------------------------------------------------------------

STEP_TIME_TIE_DIGITS = 3  # step times equal to 3 significant digits tie (estimates are not finer than that)


def _rank_key(r: Ranked):
    """Fastest first. On a tie (equal to STEP_TIME_TIE_DIGITS significant digits) the simpler layout wins:
    no offload, then the larger micro-batch (fewer micro-steps: "the largest that fits"), the lower ZeRO stage,
    no ZeRO++, less model parallelism, less memory, and the label for a stable order."""
    c = r.candidate
    step = float(f"{r.estimate.step_time_s:.{STEP_TIME_TIE_DIGITS}g}")
    return (step, int(c.offload_optimizer) + int(c.offload_param), -c.micro_batch, c.zero_stage, int(c.zeropp),
            c.tp * c.pp, r.estimate.memory_per_rank_bytes, c.label)


def _gap_text(e0: CandidateEstimate, e: CandidateEstimate) -> str:
    gap = (e.step_time_s / e0.step_time_s - 1) * 100 if e0.step_time_s > 0 else 0.0
    if abs(gap) < 10 ** (1 - STEP_TIME_TIE_DIGITS) * 100 / 2:
        return f"same estimated step time as #1 ({e.step_time_s:.4g} s; ties go to the simpler layout)"
    return f"{gap:+.1f}% step time vs #1 ({e.step_time_s:.4g} s)"


def _difference_notes(a: Candidate, b: Candidate) -> list[str]:
    """What `b` does differently from `a`, phrased as the cost it brings (estimator-independent)."""
    notes = []
    if b.zero_stage != a.zero_stage or b.zeropp != a.zeropp:
        if b.zero_stage > a.zero_stage:
            cost = {1: "a parameter all-gather after each step", 2: "a gradient reduce-scatter every micro-step",
                    3: "parameter all-gathers every micro-step"}[b.zero_stage]
            notes.append(f"ZeRO-{b.zero_stage} instead of ZeRO-{a.zero_stage} (more communication: {cost})")
        elif b.zero_stage < a.zero_stage:
            notes.append(f"ZeRO-{b.zero_stage} instead of ZeRO-{a.zero_stage} (more memory per rank)")
        if b.zeropp != a.zeropp:
            notes.append("ZeRO++ quantized collectives" if b.zeropp else "no ZeRO++")
    if (b.offload_optimizer, b.offload_param) != (a.offload_optimizer, a.offload_param):
        notes.append(f"offload {b.offload_label} instead of {a.offload_label}"
                     + (" (CPU optimizer step and PCIe copies)" if b.offload_optimizer else ""))
    if b.tp != a.tp:
        notes.append(f"tp {b.tp} instead of {a.tp}" + (" (TP all-reduces in every layer)" if b.tp > a.tp else ""))
    if b.pp != a.pp:
        notes.append(f"pp {b.pp} instead of {a.pp}" + (" (pipeline bubble)" if b.pp > a.pp else ""))
    if b.ep != a.ep:
        notes.append(f"ep {b.ep} instead of {a.ep}" + (" (more all-to-all)" if b.ep > a.ep else ""))
    if b.micro_batch != a.micro_batch:
        notes.append(f"micro-batch {b.micro_batch} instead of {a.micro_batch}"
                     + (" (more, smaller micro-steps)" if b.micro_batch < a.micro_batch else ""))
    if b.checkpoint != a.checkpoint:
        notes.append(f"recompute {b.checkpoint_label} instead of {a.checkpoint_label}")
    return notes


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def explain(ranked: list[Ranked], gpu: GpuSpec, all_fit: Sequence[Ranked] = (),
            compare_stages: bool = True) -> tuple[list[Ranked], Optional[str]]:
    """Attach a reason to each ranked candidate and build the "why the first wins" text.

    `all_fit` (every candidate that fits, any order) lets the text say whether a lower ZeRO stage fits at all.
    """
    if not ranked:
        return ranked, None
    first = ranked[0]
    e0 = first.estimate
    out = [Ranked(first.candidate, e0, reason=(
        f"fastest estimated step {e0.step_time_s:.4g} s (MFU {e0.mfu * 100:.1f}%), "
        f"{_gib(e0.memory_per_rank_bytes)} of {_gib(e0.device_memory_bytes)} per rank"), findings=first.findings)]
    for r in ranked[1:]:
        e = r.estimate
        diff = _difference_notes(first.candidate, r.candidate)
        reason = (f"{_gap_text(e0, e)}, {_gib(e.memory_per_rank_bytes)} per rank"
                  + (f"; differs by: {', '.join(diff)}" if diff else ""))
        out.append(Ranked(r.candidate, e, reason=reason, findings=r.findings))
    why = f"{first.candidate.label} wins: {out[0].reason}."
    if len(out) > 1:
        second = out[1]
        diff = _difference_notes(first.candidate, second.candidate)
        why += (f" The runner-up ({second.candidate.label}): {_gap_text(e0, second.estimate)}"
                + (f"; it uses {', '.join(diff)}" if diff else "") + ".")
    pool = list(all_fit) or out
    if compare_stages and first.candidate.zero_stage > 0:
        lower = [r for r in pool if r.candidate.zero_stage < first.candidate.zero_stage]
        if not lower:
            why += f" No lower ZeRO stage fits in {_gib(e0.device_memory_bytes)}."
        else:
            best_lower = min(lower, key=_rank_key)
            why += (f" The best lower-stage layout ({best_lower.candidate.label}) fits too: "
                    f"{_gap_text(e0, best_lower.estimate)}.")
    return out, why


# ----------------------------------------------------------------------------------------------------------
# the sweep
# ----------------------------------------------------------------------------------------------------------

def zero_model_state_bytes(dense_params: float, expert_params: float, *, dp: int, ep: int, zero_stage: int,
                           offload_optimizer: bool = False, offload_param: bool = False,
                           weight_bytes: int = 2, optimizer_bytes: int = 12, bound: bool = False) -> float:
    """Device bytes of weights + gradients + optimizer states per rank, with gradients always partitioned.

    ZeRO §3.1 accounting (2 + 2 + K=12 bytes per parameter in mixed precision), except that gradients are
    counted partitioned at every stage >= 1, as DeepSpeed's stage 1 shares stage 2's code and partitions them
    too. With `bound=True` (what the sweep uses) gradients and optimizer states are counted partitioned at
    stage 0 as well: DeepSpeed's bf16 path at stage 0 (BF16_Optimizer) shards the fp32 states over data
    parallel ranks, and a lower bound must hold for it. Dense parameters are
    partitioned over dp ranks, expert parameters over the dp/ep expert-data-parallel ranks. Args are the
    parameters one model-parallel rank holds.
    """
    edp = max(1, dp // ep)
    partitioned = dense_params / dp + expert_params / edp
    full = dense_params + expert_params
    weights = 0.0 if offload_param else weight_bytes * (partitioned if zero_stage >= 3 else full)
    grads = weight_bytes * (partitioned if (zero_stage >= 1 or bound) else full)
    optim = 0.0 if offload_optimizer else optimizer_bytes * (partitioned if (zero_stage >= 1 or bound) else full)
    return weights + grads + optim


def model_state_lower_bound_bytes(spec: Spec, shape: ModelShape, cand: Candidate) -> int:
    """A cheap lower bound on device bytes per rank (`zero_model_state_bytes` for the candidate). Any real
    allocation is at least this, so a candidate above the device is dropped without the full estimator."""
    split = param_split(shape)
    mp = cand.tp * cand.pp
    fp32 = spec.training.precision == "fp32"
    return int(zero_model_state_bytes(
        split.dense / mp, split.expert / (mp * cand.ep), dp=cand.dp(spec.cluster.world_size), ep=cand.ep,
        zero_stage=cand.zero_stage, offload_optimizer=cand.offload_optimizer, offload_param=cand.offload_param,
        weight_bytes=4 if fp32 else 2, optimizer_bytes=8 if fp32 else 12, bound=True))


_ESTIMATE_MEMO: dict = {}


def _memo_estimate(spec: Spec, shape: ModelShape, cand: Candidate, gpu: GpuSpec):
    key = (spec.model_dump_json(), str(spec.base_dir), shape.model_dump_json(), cand.model_dump_json())
    if key not in _ESTIMATE_MEMO:
        try:
            _ESTIMATE_MEMO[key] = estimate_candidate(spec, shape, cand, gpu)
        except EstimateInputError as exc:
            _ESTIMATE_MEMO[key] = exc
    got = _ESTIMATE_MEMO[key]
    if isinstance(got, EstimateInputError):
        raise got
    return got


def _estimate_all(spec: Spec, shape: ModelShape, gpu: GpuSpec, cands: Iterable[Candidate], native_moe: bool = True):
    """Rules, then a model-state lower bound, then the estimator. Within one layout (everything but the
    micro-batch) memory grows with the micro-batch, so once a micro-batch does not fit, larger ones are
    dropped without estimating them."""
    fit, dropped, estimates, considered = [], [], [], 0
    too_big: dict = {}  # layout key -> (smallest micro-batch that did not fit, its bytes)
    usable = usable_device_bytes(gpu)
    ordered = sorted(cands, key=lambda c: (c.model_dump_json(exclude={"micro_batch"}), c.micro_batch))
    for cand in ordered:
        considered += 1
        v: Optional[RuleViolation] = check_candidate(spec, shape, cand, native_moe)
        if v is not None:
            dropped.append(Dropped(cand, v.code, v.message))
            continue
        layout = cand.model_dump_json(exclude={"micro_batch"})
        if layout in too_big:
            mb, need = too_big[layout]
            dropped.append(Dropped(cand, "memory", f"micro-batch {mb} of the same layout already needs "
                                                   f"{_gib(need)} per rank > {_gib(usable)} usable"))
            continue
        lb = model_state_lower_bound_bytes(spec, shape, cand)
        if lb > usable:
            estimates.append((cand, lb))
            dropped.append(Dropped(cand, "memory", f"model states alone need at least {_gib(lb)} per rank > "
                                                   f"{_gib(usable)} usable on {gpu.name}"))
            continue
        try:
            est = _memo_estimate(spec, shape, cand, gpu)
        except EstimateInputError as exc:
            dropped.append(Dropped(cand, "estimate", str(exc)))
            continue
        estimates.append((cand, est.memory_per_rank_bytes))
        if not est.fits:
            too_big[layout] = (cand.micro_batch, est.memory_per_rank_bytes)
            alive = ", ".join(est.peak_alive[:4])
            dropped.append(Dropped(cand, "memory", f"peaks at {_gib(est.memory_per_rank_bytes)} per rank in "
                                                   f"{est.peak_phase} ({alive}) > {_gib(usable)} usable on {gpu.name}"))
            continue
        fit.append(Ranked(cand, est))
    return fit, dropped, estimates, considered


def run_sweep(spec: Spec, shape: ModelShape, *, top: int = 3, strategy: Optional[StrategyDef] = None,
              validate: bool = True, advise: bool = True, native_moe: bool = True) -> SweepResult:
    """Enumerate, filter and rank candidates for a spec.

    Args:
        spec: The spec ("auto" fields are enumerated; fixed fields are kept).
        shape: The resolved model shape.
        top: How many ranked candidates to return (each validated with `validate_config`).
        strategy: Restrict to one strategy family (what `dstoolkit generate` does per folder).
        validate: Run `validate_config` on the candidates returned (drop those with error findings).
        advise: When nothing fits, work out what would make it fit (re-sweeps variants of the spec).
        native_moe: MoE experts run as DeepSpeed's own MoE layer (refused at ZeRO-3); False for HF models.

    Returns:
        A `SweepResult`: ranked (best first, at most `top`), dropped (each with its reason), the winner's
        explanation, and `fits_nowhere` when no candidate fits.
    """
    # DeepSpeed's refusal of its own MoE layer at ZeRO-3 binds where DeepSpeed runs the model; Megatron-Core
    # (Megatron FSDP shards the experts over the expert-data-parallel group) and PyTorch FSDP run their own MoE blocks
    native_moe = native_moe and spec.training.framework == "deepspeed"
    gpu = spec.cluster.gpu_spec
    fit, dropped, estimates, considered = _estimate_all(
        spec, shape, gpu, enumerate_candidates(spec, shape, strategy), native_moe)
    fit.sort(key=_rank_key)
    chosen: list[Ranked] = []
    for r in fit:
        if len(chosen) >= top:
            break
        findings: tuple = ()
        if validate:
            findings = tuple(validate_candidate_config(spec, shape, r.candidate, native_moe=native_moe))
            errs = error_findings(findings)
            if errs:
                f = errs[0]
                dropped.append(Dropped(r.candidate, "validate", f"validate_config: {f.code} at {f.pointer}: {f.message}"))
                continue
        chosen.append(Ranked(r.candidate, r.estimate, findings=findings))
    chosen, why = explain(chosen, gpu, fit, compare_stages=strategy is None)
    result = SweepResult(ranked=chosen, dropped=dropped, considered=considered, winner_reason=why,
                         estimator=estimator_source(spec), all_ranked_count=len(fit))
    by_code: dict[str, int] = {}
    for d in dropped:
        by_code[d.code] = by_code.get(d.code, 0) + 1
    result.dropped_by_code = dict(sorted(by_code.items(), key=lambda kv: (-kv[1], kv[0])))
    if not fit and estimates:
        least = min(estimates, key=lambda ce: ce[1])
        result.fits_nowhere = FitsNowhere(
            needed_per_gpu_bytes=int(least[1]), device_memory_bytes=int(gpu.memory_bytes),
            least_memory_label=least[0].label, least_memory_candidate=least[0],
            suggestions=what_would_fit(spec, shape, strategy) if advise else [])
    return result


def _fits_somewhere(spec: Spec, shape: ModelShape, strategy) -> Optional[Ranked]:
    gpu = spec.cluster.gpu_spec
    fit, _, _, _ = _estimate_all(spec, shape, gpu, enumerate_candidates(spec, shape, strategy))
    return min(fit, key=_rank_key) if fit else None


def _variant(spec: Spec, *, training: Optional[dict] = None, cluster: Optional[dict] = None) -> Optional[Spec]:
    try:
        t = spec.training.model_copy(update=training or {})
        c = spec.cluster.model_copy(update=cluster or {})
        return Spec.model_validate({"name": spec.name, "model": spec.model.model_dump(exclude_none=True),
                                    "cluster": c.model_dump(), "training": t.model_dump()})
    except ValueError:
        return None


def what_would_fit(spec: Spec, shape: ModelShape, strategy: Optional[StrategyDef] = None) -> list[str]:
    """Concrete changes to the spec that make at least one candidate fit, each with the layout it allows."""
    out: list[str] = []
    t = spec.training
    tries: list[tuple[str, dict]] = []
    if strategy is None:
        if not t.offload:
            tries.append(("allow CPU offload (training.offload: true)", {"offload": True, "zero_stage": "auto"}))
        if t.zero_stage != "auto":
            tries.append(("let the sweep choose the ZeRO stage (training.zero_stage: auto)", {"zero_stage": "auto"}))
    if t.tp != "auto" or t.pp != "auto":
        tries.append(("let the sweep choose TP and PP (training.tp: auto, training.pp: auto)",
                      {"tp": "auto", "pp": "auto"}))
    if t.micro_batch != "auto" or t.activation_checkpointing != "auto":
        tries.append(("let the sweep choose micro-batch and recompute (micro_batch: auto, "
                      "activation_checkpointing: auto)", {"micro_batch": "auto", "activation_checkpointing": "auto",
                                                          "checkpoint_every_k": 1, "checkpoint_ratio": 1.0}))
    for text, upd in tries:
        v = _variant(spec, training=upd)
        if v is None:
            continue
        best = _fits_somewhere(v, shape, strategy)
        if best is not None:
            out.append(f"{text}: e.g. {best.candidate.label} peaks at {_gib(best.estimate.memory_per_rank_bytes)} per GPU")
    scale = 2
    while scale <= MAX_NODE_SCALE:
        nodes = spec.cluster.nodes * scale
        gb = t.global_batch
        world = nodes * spec.cluster.gpus_per_node
        upd = {} if gb % world == 0 else {"global_batch": -(-gb // world) * world}
        v = _variant(spec, cluster={"nodes": nodes}, training=upd)
        if v is not None:
            best = _fits_somewhere(v, shape, strategy)
            if best is not None:
                out.append(f"more GPUs: {nodes} nodes x {spec.cluster.gpus_per_node} ({world} GPUs) fit, e.g. "
                           f"{best.candidate.label} peaking at {_gib(best.estimate.memory_per_rank_bytes)} per GPU"
                           + (f" (global_batch rounded to {upd['global_batch']})" if upd else ""))
                break
        scale *= 2
    return out
