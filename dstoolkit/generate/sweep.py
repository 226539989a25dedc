"""Sweep: enumerate ZeRO stage x offload x ZeRO++ x TP x PP x EP x micro-batch x checkpoint policy, drop the
candidates that break a rule or do not fit, rank the rest by estimated step time, and explain the winner.

No torch import. Order of checks (cheapest first): structural rules (`dstoolkit.generate.rules`), then the
memory estimate, then - only for the candidates about to be shown or generated - `validate_config` on the
DeepSpeed JSON at the spec's world size (a candidate with an error finding is dropped with that finding).
The grid: `candidate_grid`; the ranking and its explanation: `sweep_explain`; the result types: `sweep_result`.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from dstoolkit.generate.candidate_grid import enumerate_candidates
from dstoolkit.generate.candidates import Candidate, StrategyDef
from dstoolkit.generate.costing import EstimateInputError, estimate_candidate, estimator_source, usable_device_bytes
from dstoolkit.generate.ds_json import build_ds_config, param_split
from dstoolkit.generate.rules import RuleViolation, check_candidate
from dstoolkit.generate.sweep_explain import _gib, explain, headroom_note, host_memory_text, rank
from dstoolkit.generate.sweep_result import Dropped, FitsNowhere, Ranked, SweepResult
from dstoolkit.generate.targets import native_moe as target_native_moe
from dstoolkit.generate.targets import spec_for_targets, unavailable_for_all
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

MAX_NODE_SCALE = 64  # fits-nowhere advice tries up to this many times the spec's node count


def validate_candidate_config(spec: Spec, shape: ModelShape, cand: Candidate, cfg: Optional[dict] = None,
                              native_moe: bool = True) -> list:
    """`validate_config` findings for the candidate's DeepSpeed JSON at the spec's world size (the MoE rules
    only for native DeepSpeed MoE: an HF model's experts are plain modules DeepSpeed knows nothing of)."""
    from dstoolkit.validate.engine import validate_config  # schemas helper (issue #2)

    cfg = cfg if cfg is not None else build_ds_config(spec, shape, cand)
    return list(validate_config(
        cfg, source=f"{spec.name}:{cand.label}", world_size=spec.cluster.world_size,
        gpus_per_node=spec.cluster.nvlink_domain, tp=cand.tp, pp=cand.pp,
        num_experts=shape.num_experts if shape.is_moe and native_moe else None,
        ep_size=cand.ep if shape.is_moe and native_moe else None, mode="strict"))


def error_findings(findings: Sequence) -> list:
    return [f for f in findings if str(getattr(f, "severity", "")).lower().endswith("error")]


def zero_model_state_bytes(dense_params: float, expert_params: float, *, dp: int, ep: int, zero_stage: int,
                           offload_optimizer: bool = False, offload_param: bool = False,
                           weight_bytes: int = 2, optimizer_bytes: int = 12, bound: bool = False) -> float:
    """Device bytes of weights + gradients + optimizer states per rank, with gradients always partitioned (none on
    the device under optimizer offload at stages 2-3).

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
    # ZeRO-Offload / ZeRO-Infinity at stages 2 and 3: each gradient partition is copied to the host as it is reduced
    # (stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_gpu, stage3.py partition_grads ->
    # fp32_grad_partitions on the offload device), so no partition stays on the device; stage 1 keeps the full
    # gradients until the accumulation boundary (estimate.zero_states.zero12_states), at least the partition
    grads_on_device = not (offload_optimizer and zero_stage >= 2)
    grads = 0.0 if not grads_on_device else weight_bytes * (partitioned if (zero_stage >= 1 or bound) else full)
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


def accumulation_saturated(spec: Spec, cand: Candidate) -> bool:
    """Whether every memory term of the estimator that depends on gradient accumulation (ga) is at its ceiling for
    `cand`, so that at a fixed layout its memory can only grow with the micro-batch from here down to micro-batch 1:
    the gradients kept between micro steps (estimate.timeline, ga > 1), the micro batches in flight on a pipeline's
    first stage (estimate.stage_activations: min(pp, ga), DualPipe min(pp + 1, ga)), the last stage's pipe buffers
    (min(DEEPSPEED_LAST_STAGE_PIPE_BUFFERS = 2, ga)) and interleaved chunks (min((v - 1) pp + 1, ga v)). All are
    constant once ga >= max(2, pp + 1); below that a larger micro-batch (fewer micro steps) can need LESS memory
    (no accumulated gradients at ga 1; fewer micro batches in flight), so it must be estimated, not assumed."""
    return cand.grad_accum(spec.cluster.world_size, spec.training.global_batch) >= max(2, cand.pp + 1)


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


def _estimate_all(spec: Spec, shape: ModelShape, gpu: GpuSpec, cands: Iterable[Candidate], native_moe: bool = True,
                  targets: Sequence[str] = (), target_spec: Optional[Spec] = None):
    """The targets' refusals, then rules, then a model-state lower bound, then the estimator. Within one layout
    (everything but the micro-batch) memory grows with the micro-batch while gradient accumulation is saturated
    (`accumulation_saturated`), so once a micro-batch does not fit, a larger one is dropped without estimating it
    when it is saturated; one that is not (fewer micro steps: memory may fall) is estimated. `target_spec`: the spec
    as written, which `targets.target_refusal` asks the launchers' builders with (as `generate` does); `spec` is the
    engine's copy (`spec_for_targets`)."""
    fit, dropped, estimates, considered = [], [], [], 0
    too_big: dict = {}  # layout key -> (smallest micro-batch that did not fit, its bytes)
    usable = usable_device_bytes(gpu)
    ordered = sorted(cands, key=lambda c: (c.model_dump_json(exclude={"micro_batch"}), c.micro_batch))
    for cand in ordered:
        considered += 1
        # the launchers first: a layout none of them runs is dropped naming the one that does (a cp layout for the
        # deepspeed target: megatron-lm), not by a rule of the engine they pinned (LY024's "framework: megatron"); a
        # model a target cannot build drops every layout with that reason (generate writes no files for it either)
        no_target = unavailable_for_all(targets, target_spec or spec, shape, cand)
        if no_target is not None:
            dropped.append(Dropped(cand, "target", no_target))
            continue
        v: Optional[RuleViolation] = check_candidate(spec, shape, cand, native_moe, targets)
        if v is not None:
            dropped.append(Dropped(cand, v.code, v.message))
            continue
        layout = cand.model_dump_json(exclude={"micro_batch"})
        if layout in too_big and accumulation_saturated(spec, cand):
            mb, need = too_big[layout]
            dropped.append(Dropped(cand, "memory", f"micro-batch {mb} of the same layout already needs "
                                                   f"{_gib(need)} per rank > {_gib(usable)} usable"))
            continue
        lb = model_state_lower_bound_bytes(spec, shape, cand)
        if lb > usable:
            estimates.append((cand, lb, None))
            dropped.append(Dropped(cand, "memory", f"model states alone need at least {_gib(lb)} per rank > "
                                                   f"{_gib(usable)} usable on {gpu.name}"))
            continue
        try:
            est = _memo_estimate(spec, shape, cand, gpu)
        except EstimateInputError as exc:
            dropped.append(Dropped(cand, "estimate", str(exc)))
            continue
        estimates.append((cand, est.memory_per_rank_bytes, est))
        if not est.host_fits:
            dropped.append(Dropped(cand, "host-memory", host_memory_text(spec, est)))
            continue
        if not est.fits:
            too_big[layout] = (cand.micro_batch, est.memory_per_rank_bytes)
            alive = ", ".join(est.peak_alive[:4])
            dropped.append(Dropped(cand, "memory", f"peaks at {_gib(est.memory_per_rank_bytes)} per rank in "
                                                   f"{est.peak_phase} ({alive}) > {_gib(usable)} usable on {gpu.name}"))
            continue
        fit.append(Ranked(cand, est))
    return fit, dropped, estimates, considered


def run_sweep(spec: Spec, shape: ModelShape, *, top: int = 3, strategy: Optional[StrategyDef] = None,
              validate: bool = True, advise: bool = True, native_moe: bool = True,
              targets: Sequence[str] = ()) -> SweepResult:
    """Enumerate, filter and rank candidates for a spec.

    Args:
        spec: The spec ("auto" fields are enumerated; fixed fields are kept).
        shape: The resolved model shape.
        top: How many ranked candidates to return (each validated with `validate_config`).
        strategy: Restrict to one strategy family (what `dstoolkit generate` does per folder).
        validate: Run `validate_config` on the candidates returned (drop those with error findings).
        advise: When nothing fits, work out what would make it fit (re-sweeps variants of the spec).
        native_moe: MoE experts run as DeepSpeed's own MoE layer (refused at ZeRO-3); False for HF models.
        targets: Launchers the layouts are for (`dstoolkit.generate.targets`): the space is restricted to what at
            least one of them runs (code "target" for the rest), and `native_moe` follows them. Empty: every layout.

    Returns:
        A `SweepResult`: ranked (best first, at most `top`), dropped (each with its reason), the winner's
        explanation, and `fits_nowhere` when no candidate fits.
    """
    # DeepSpeed's refusal of its own MoE layer at ZeRO-3 binds where DeepSpeed runs the model; Megatron-Core
    # (Megatron FSDP shards the experts over the expert-data-parallel group) and PyTorch FSDP run their own MoE blocks.
    # The targets' engine is the framework the layouts are checked and estimated under (spec_for_targets).
    written = spec  # what the launchers' builders read (targets.target_refusal), as generate passes it
    if targets:
        native_moe = target_native_moe(targets)
        spec = spec_for_targets(spec, targets)
    native_moe = native_moe and spec.training.framework == "deepspeed"
    gpu = spec.cluster.gpu_spec
    fit, dropped, estimates, considered = _estimate_all(
        spec, shape, gpu, enumerate_candidates(spec, shape, strategy), native_moe, targets, written)
    fit = rank(fit)
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
    if chosen:
        why = (why or "") + headroom_note(spec, chosen[0], fit)
    result = SweepResult(ranked=chosen, dropped=dropped, considered=considered, winner_reason=why,
                         estimator=estimator_source(spec), all_ranked_count=len(fit))
    by_code: dict[str, int] = {}
    for d in dropped:
        by_code[d.code] = by_code.get(d.code, 0) + 1
    result.dropped_by_code = dict(sorted(by_code.items(), key=lambda kv: (-kv[1], kv[0])))
    if not fit and estimates:
        result.fits_nowhere = _fits_nowhere(estimates, gpu)
        if advise:
            result.fits_nowhere.suggestions = what_would_fit(spec, shape, strategy, targets)
    return result


def _fits_nowhere(estimates: list, gpu: GpuSpec) -> FitsNowhere:
    """What limits a sweep where nothing fits. Host RAM when some layout fits one GPU but not the node's host RAM
    (then the one needing the least host RAM per node is named), else the device: the least memory-hungry layout."""
    host_bound = [e for _, _, e in estimates if e is not None and e.device_fits and not e.host_fits]
    if host_bound:
        e = min(host_bound, key=lambda x: x.host_memory_per_node_bytes)
        cand = next(c for c, _, x in estimates if x is e)
        return FitsNowhere(needed_per_gpu_bytes=int(e.memory_per_rank_bytes), device_memory_bytes=int(gpu.memory_bytes),
                           least_memory_label=cand.label, least_memory_candidate=cand, suggestions=[],
                           host_needed_per_node_bytes=int(e.host_memory_per_node_bytes),
                           host_capacity_bytes=int(e.host_memory_node_capacity_bytes),
                           host_source=e.host_source)
    cand, need, _ = min(estimates, key=lambda ce: ce[1])
    return FitsNowhere(needed_per_gpu_bytes=int(need), device_memory_bytes=int(gpu.memory_bytes),
                       least_memory_label=cand.label, least_memory_candidate=cand, suggestions=[])


def _fits_somewhere(spec: Spec, shape: ModelShape, strategy, targets: Sequence[str] = (),
                    uses=None) -> Optional[Ranked]:
    """The best layout of `spec` that fits (None: none does); `uses(candidate)`: only among the layouts it accepts."""
    gpu = spec.cluster.gpu_spec
    native = target_native_moe(targets) if targets else True
    written, spec = spec, spec_for_targets(spec, targets)  # enumerated and estimated as the targets run it (run_sweep)
    native = native and spec.training.framework == "deepspeed"
    fit, _, _, _ = _estimate_all(spec, shape, gpu, enumerate_candidates(spec, shape, strategy), native, targets,
                                 written)
    fit = [r for r in fit if uses is None or uses(r.candidate)]
    return rank(fit)[0] if fit else None


def _variant(spec: Spec, *, training: Optional[dict] = None, cluster: Optional[dict] = None) -> Optional[Spec]:
    try:
        t = spec.training.model_copy(update=training or {})
        c = spec.cluster.model_copy(update=cluster or {})
        return Spec.model_validate({"name": spec.name, "model": spec.model.model_dump(exclude_none=True),
                                    "cluster": c.model_dump(), "training": t.model_dump()})
    except ValueError:
        return None


def what_would_fit(spec: Spec, shape: ModelShape, strategy: Optional[StrategyDef] = None,
                   targets: Sequence[str] = ()) -> list[str]:
    """Concrete changes to the spec that make at least one candidate fit, each with the layout it allows."""
    out: list[str] = []
    t = spec.training
    tries: list[tuple[str, dict]] = []
    uses: dict[str, object] = {}  # a try's text -> which layouts its example may be (one that uses the change)
    if strategy is None:
        if not t.offload:
            # offload needs ZeRO 1-3: the stage is left to the sweep too, and the text names it when it changes
            changed = "training.offload: true" + (", training.zero_stage: auto" if t.zero_stage != "auto" else "")
            text = f"allow CPU offload ({changed})"
            tries.append((text, {"offload": True, "zero_stage": "auto"}))
            uses[text] = lambda c: c.offload_optimizer  # an offload layout, not one the stage change alone allows
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
        best = _fits_somewhere(v, shape, strategy, targets, uses.get(text))
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
            best = _fits_somewhere(v, shape, strategy, targets)
            if best is not None:
                out.append(f"more GPUs: {nodes} nodes x {spec.cluster.gpus_per_node} ({world} GPUs) fit, e.g. "
                           f"{best.candidate.label} peaking at {_gib(best.estimate.memory_per_rank_bytes)} per GPU"
                           + (f" (global_batch rounded to {upd['global_batch']})" if upd else ""))
                break
        scale *= 2
    return out
