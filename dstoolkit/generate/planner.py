"""The planner API of `dstoolkit.generate`: what the tuner and `dstoolkit estimate` use, and nothing else of
generate's internals. No torch import.

    candidates_for(spec, shape, strategy=None) -> Iterator[Candidate]   every layout the spec leaves open
    zero_modes(spec, strategy=None)                                     (stage, offload opt, offload param, ZeRO++)
    checkpoint_choices(spec), MICRO_BATCH_CHOICES                       recompute policies / micro-batches tried
    check_candidate(spec, shape, cand) -> RuleViolation | None          structural rules (dstoolkit.layout)
    ds_config_for(spec, shape, cand) -> dict                            the DeepSpeed JSON (generate/ds_json.py)
    validate_candidate(spec, shape, cand, cfg=None) -> list[Finding]    validate_config on that JSON
    estimate_candidate(spec, shape, cand, gpu=None, ds_config=None)     the sweep's estimate (CandidateEstimate)
    plan_for(spec, shape, cand, ds_config=None) -> RunPlan              the estimator's RunPlan for a candidate
    resolve_spec(spec, shape, targets) -> Resolution                    the sweep's best layout for a spec (per engine
                                                                        group of targets), with the values it chose
                                                                        for "auto" fields

"auto" is resolved by the sweep only (`dstoolkit.generate.sweep.run_sweep`, the path `dstoolkit generate`
takes per strategy); the DeepSpeed JSON is written by `dstoolkit.generate.ds_json` only.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterator, Optional

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.megatron_softmax import fallback_note
from dstoolkit.generate.candidate_grid import MICRO_BATCH_CHOICES, checkpoint_choices, enumerate_candidates, zero_modes
from dstoolkit.generate.candidates import Candidate, StrategyDef
from dstoolkit.generate.costing import (CandidateEstimate, EstimateInputError,
                                        estimate_candidate as _estimate_candidate, fit_verdict, run_plan_for,
                                        usable_device_bytes)
from dstoolkit.generate.ds_json import build_ds_config, is_cpu_cluster
from dstoolkit.generate.rules import RuleViolation, check_candidate
from dstoolkit.generate.sweep import error_findings, run_sweep, validate_candidate_config
from dstoolkit.generate.sweep_result import SweepResult
from dstoolkit.generate.targets import (engine_note, miss_reason, reason_without_target, refused_everywhere,
                                        spec_for_targets, target_groups, target_refusal, target_unavailable_reason,
                                        zero_gaps_note)
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.spec.target_engines import ENGINE_NAMES

GiB = 2**30

__all__ = ["MICRO_BATCH_CHOICES", "Candidate", "CandidateEstimate", "EstimateInputError", "Resolution",
           "RuleViolation", "candidates_for", "check_candidate", "checkpoint_choices", "ds_config_for",
           "error_findings", "estimate_candidate", "is_cpu_cluster", "plan_for", "resolve_spec", "usable_device_bytes",
           "validate_candidate", "zero_modes", "fit_advice"]


def candidates_for(spec: Spec, shape: ModelShape, strategy: Optional[StrategyDef] = None) -> Iterator[Candidate]:
    """Every layout the spec's "auto" fields leave open (the sweep's enumeration), restricted to `strategy`."""
    return enumerate_candidates(spec, shape, strategy)


def ds_config_for(spec: Spec, shape: ModelShape, cand: Candidate) -> dict:
    """The DeepSpeed JSON of one candidate (`dstoolkit.generate.ds_json.build_ds_config`)."""
    return build_ds_config(spec, shape, cand)


def validate_candidate(spec: Spec, shape: ModelShape, cand: Candidate, cfg: Optional[dict] = None) -> list:
    """`validate_config` findings for the candidate's DeepSpeed JSON at the spec's world size."""
    return validate_candidate_config(spec, shape, cand, cfg)


def estimate_candidate(spec: Spec, shape: ModelShape, cand: Candidate, gpu: Optional[GpuSpec] = None, *,
                       ds_config: Optional[dict] = None) -> CandidateEstimate:
    """The sweep's estimate of one candidate (`fits` includes the device headroom).

    Raises:
        EstimateInputError: the estimator refused the combination.
    """
    return _estimate_candidate(spec, shape, cand, gpu if gpu is not None else spec.cluster.gpu_spec,
                               ds_config=ds_config)


def plan_for(spec: Spec, shape: ModelShape, cand: Candidate, ds_config: Optional[dict] = None) -> RunPlan:
    """The estimator's `RunPlan` for one candidate (`dstoolkit.runplan.plan_from_spec` with its layout)."""
    return run_plan_for(spec, shape, cand, ds_config, gpu=spec.cluster.gpu_spec)


@dataclass
class Resolution:
    """A spec resolved to one layout by the sweep."""

    candidate: Candidate
    ds_config: dict
    plan: RunPlan
    fits: bool
    """False: no layout fits; `candidate` is then the least memory-hungry one."""
    sweep: SweepResult
    assumptions: list[str] = field(default_factory=list)
    """What was chosen for each "auto" (and each allowed-but-optional) field, in spec order."""
    targets: list[str] = field(default_factory=list)
    """The requested targets these figures are for (one engine group, `targets.target_groups`); empty: none asked."""
    others: list["Resolution"] = field(default_factory=list)
    """The other engine groups' resolutions, each estimated under its own engine."""
    refused: dict[str, str] = field(default_factory=dict)
    """Requested targets that cannot run the spec, each with its reason."""


class _NoLayout(ValueError):
    """No layout survives a group's sweep (the message: its drop counts and first reason)."""

    def __init__(self, message: str, sweep: SweepResult):
        super().__init__(message)
        self.sweep = sweep


def _chosen(spec: Spec, cand: Candidate) -> list[str]:
    t = spec.training
    out = []
    for name, value in (("tp", cand.tp), ("pp", cand.pp), ("ep", cand.ep), ("zero_stage", cand.zero_stage),
                        ("micro_batch", cand.micro_batch), ("activation_checkpointing", cand.checkpoint_label)):
        if getattr(t, name) == "auto":
            out.append(f"{name}: auto -> {value}")
    if t.offload:
        out.append(f"offload -> {cand.offload_label}")
    if t.zeropp:
        out.append(f"zeropp -> {'on' if cand.zeropp else 'off'}")
    return out


def _deepspeed_runs(spec, shape: ModelShape, refused: dict) -> bool:
    """Whether --target deepspeed (not asked, so not in `refused`) runs the spec's layout as far as the target rules
    say (`target_unavailable_reason`: it refuses only sequence splits it has no launcher for): the advice a refusal
    of every asked target gives."""
    if "deepspeed" in refused:
        return False
    t = spec.training
    probe = Candidate(zero_stage=1, micro_batch=1, tp=t.tp if isinstance(t.tp, int) else 1, cp=t.cp, ulysses=t.ulysses)
    return target_unavailable_reason("deepspeed", probe, shape) is None


def resolve_spec(spec: Spec, shape: ModelShape, targets=()) -> Resolution:
    """Resolve a spec's "auto" fields with the sweep (`run_sweep`, validated like `dstoolkit generate`) and
    build the winner's DeepSpeed JSON and `RunPlan`.

    When nothing fits, the least memory-hungry layout the sweep estimated is returned with `fits=False`.
    `targets`: only the layouts these launchers run (`dstoolkit.generate.targets`; `dstoolkit estimate --target`),
    resolved per engine group as `generate` resolves them (`targets.target_groups`), each under the engine its files
    run. The figures returned are the first group's that fits (else the first group's that has a layout), with
    `targets` naming the targets they are for, `others` the other groups' resolutions and `refused` each requested
    target that cannot run the spec with its reason; the assumptions say so where several groups were asked or a
    target was refused.

    Raises:
        ValueError: no layout survives the structural rules and the estimator for any requested target (the
            message gives the sweep's drop counts and the first reason; with several groups, each target's reason).
    """
    targets = tuple(dict.fromkeys(targets))
    groups = [tuple(g) for g in target_groups(targets)] or [()]
    done: list[Resolution] = []
    refused: dict[str, str] = {}
    everywhere: set[str] = set()  # targets that run no layout of the spec (refused_everywhere)
    for g in groups:
        try:
            r = _resolve_group(spec, shape, g)
        except _NoLayout as exc:
            # a target that runs none of the layouts (a model Megatron cannot build) is refused with its reason
            # (targets.target_refusal, the rule generate asks); a group that only lacks a fitting layout is an error
            whys = {t: refused_everywhere(t, exc.sweep, spec, shape) for t in g}
            if len(groups) == 1 and not (g and all(whys.values())):  # no target asked: the sweep's own reason
                raise ValueError(str(exc)) from None
            refused.update({t: reason_without_target(t, whys[t] or miss_reason(t, exc.sweep, shape, spec)) for t in g})
            everywhere.update(t for t in g if whys[t])
            continue
        # the group's layout runs on at least one of its targets (the sweep drops the rest); the others cannot run it
        for t in g:
            if (why := target_refusal(t, spec, shape, r.candidate)) is not None:
                refused[t] = _refused_at(spec, shape, t, r.candidate.label, reason_without_target(t, why))
        r.targets = [t for t in g if t not in refused]
        done.append(r)
    if not done and set(refused) <= everywhere:
        raise ValueError(f"{spec.name} is not estimated for any requested target: "
                         + "; ".join(f"--target {t}: {why}" for t, why in refused.items())
                         + " (generate writes no files for them either: ask a target that runs this spec"
                         + (", e.g. --target deepspeed)" if _deepspeed_runs(spec, shape, refused) else ")"))
    if not done:
        raise ValueError(f"no valid layout for {spec.name} on any requested target: "
                         + "; ".join(f"{t}: {why}" for t, why in refused.items()))
    main = next((r for r in done if r.fits), done[0])
    main.others = [r for r in done if r is not main]
    main.refused = {t: refused[t] for t in targets if t in refused}  # in the order asked
    if len(groups) > 1 or refused:
        lead, *rest = _targets_notes(main)
        main.assumptions = [lead, *main.assumptions, *rest]
    return main


def _refused_at(spec: Spec, shape: ModelShape, target: str, label: str, why: str) -> str:
    """Why `target` has no figures when it cannot run its group's layout (`label`): its reason alone where it runs
    no layout of the spec (a model it cannot build: a sweep for it alone drops every layout as 'target', cheaply,
    before any estimate), else the reason for this layout and where its own layouts are ranked."""
    alone = run_sweep(spec, shape, top=1, validate=False, advise=False, targets=(target,))
    if refused_everywhere(target, alone, spec, shape):
        return why
    return (f"it cannot run {label}, the layout of its group: {why}; `dstoolkit estimate --target {target}` "
            "estimates the layouts it runs")


def _engine_name(r: Resolution) -> str:
    return ENGINE_NAMES[r.plan.framework]


def _targets_notes(main: Resolution) -> list[str]:
    """Which requested targets the figures are for, the other groups' figures in one line each, and each refused
    target with its reason."""
    notes = [f"figures for --target {' / '.join(main.targets)} (estimated under {_engine_name(main)})"]
    for o in main.others:
        label = o.candidate.label
        if o.sweep.winner is not None and o.fits:
            e = o.sweep.winner.estimate
            figures = f"{label}, {e.step_time_s:.4g} s/step, {e.memory_per_rank_bytes / GiB:.1f} GiB per rank"
        else:
            figures = f"{label}, does not fit"
        notes.append(f"--target {' / '.join(o.targets)} (estimated under {_engine_name(o)}): {figures}; "
                     f"`dstoolkit estimate --target {o.targets[0]}` shows its figures")
    notes += [f"--target {t}: not estimated: {why}" for t, why in main.refused.items()]
    return notes


def _resolve_group(spec: Spec, shape: ModelShape, targets: tuple[str, ...]) -> Resolution:
    """`resolve_spec` for one engine group of targets (or none)."""
    res = run_sweep(spec, shape, top=1, validate=True, advise=False, targets=targets)
    if res.winner is not None:
        cand, fits = res.winner.candidate, True
    elif res.fits_nowhere is not None and res.fits_nowhere.least_memory_candidate is not None:
        cand, fits = res.fits_nowhere.least_memory_candidate, False
    else:
        codes = ", ".join(f"{k}: {v}" for k, v in res.dropped_by_code.items())
        first = f"; e.g. {res.dropped[0].candidate.label}: {res.dropped[0].reason}" if res.dropped else ""
        raise _NoLayout(f"no valid layout for {spec.name}: {res.considered} tried, dropped by {codes}{first}", res)
    # the plan of the engine the targets run (spec_for_targets), as the sweep estimated it
    engine_spec = spec_for_targets(spec, targets)
    cfg = ds_config_for(spec, shape, cand)
    notes = _chosen(spec, cand)
    from dstoolkit.layout.degree_rules import tp_across_nodes_note  # TP wider than a node: allowed, with a warning

    tp_note = tp_across_nodes_note(cand.tp, spec.cluster.nvlink_domain)
    if notes:
        lead = "layout chosen by the sweep (dstoolkit sweep)" if fits else "least memory-hungry layout of the sweep"
        notes.insert(0, f"{lead}: {cand.label}")
    if tp_note:
        notes.append(tp_note)
    if engine_spec is not spec and (note := engine_note(spec, targets)):
        notes.append(note)
    if gaps_note := zero_gaps_note(spec, targets):  # parameter offload / ZeRO++ the targets' files lack
        notes.append(gaps_note)
    plan = plan_for(engine_spec, shape, cand, cfg)
    if softmax_note := fallback_note(plan):
        notes.append(softmax_note)
    if not fits:
        gpu = spec.cluster.gpu_spec
        nowhere = res.fits_nowhere
        if nowhere is not None and nowhere.host_limited:
            notes.append(f"nothing fits: the layouts that fit in {gpu.memory_bytes / GiB:.0f} GiB need more host RAM "
                         f"per node than {nowhere.host_capacity_bytes / GiB:.1f} GiB ({nowhere.host_source}): showing "
                         "the one that needs the least host RAM")
        else:
            notes.append(f"nothing fits in {gpu.memory_bytes / GiB:.0f} GiB "
                         f"({usable_device_bytes(gpu) / GiB:.1f} GiB usable): showing the smallest-memory candidate")
    return Resolution(candidate=cand, ds_config=cfg, plan=plan, fits=fits, sweep=res, assumptions=notes,
                      targets=list(targets))


MAX_WORLD_SCALE = 64
"""`fit_advice` tries up to this many times the plan's world size (as the sweep's fits-nowhere advice does)."""


def _plan_variant(plan: RunPlan, ds_update=None, **fields) -> Optional[RunPlan]:
    """The plan with some DeepSpeed JSON sections / RunPlan fields replaced (None when it is not a valid plan)."""

    cfg = copy.deepcopy(plan.ds_config)
    for path, value in (ds_update or {}).items():
        node = cfg
        *parents, leaf = path.split("/")
        for p in parents:
            if node.get(p) is None:  # absent, or an explicit null (validate refuses that; never index into it)
                node[p] = {}
            elif not isinstance(node[p], dict):  # e.g. the legacy "zero_optimization": true
                return None
            node = node[p]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    try:
        return RunPlan(**{**{k: getattr(plan, k) for k in RunPlan.model_fields}, "ds_config": cfg, **fields})
    except ValueError:
        return None


def _fits(plan: Optional[RunPlan], cluster=None):
    """The plan's estimate when it fits (`costing.fit_verdict`: the device peak, and host RAM per node against
    `cluster`'s when given), else None."""
    if plan is None:
        return None
    try:
        e = estimate_run(plan)
    except ValueError:
        return None
    if cluster is None:
        return e if e.fits else None
    v = fit_verdict(e.memory.total, plan.gpu, e.host_memory_per_rank_bytes, plan.gpus_per_node, cluster)
    return e if v.fits else None


def fit_advice(plan: RunPlan, cluster=None) -> list[str]:
    """What would make a plan that does not fit fit, each with the peak it reaches: single changes first (a higher
    ZeRO stage, CPU offload, full recompute, micro-batch 1), then, when none is enough, those changes together, then
    more GPUs at the same global batch (with them). What `dstoolkit estimate --config` prints for a config that does
    not fit (a spec gets the sweep's advice, `sweep.what_would_fit`). `cluster`: whose host RAM per node the
    variants must fit too (`costing.fit_verdict`; None: the device alone)."""

    ds = plan.ds
    tb = ds.micro_batch * ds.grad_accum * plan.dp
    steps: list[tuple[str, dict, dict]] = []  # (text, ds_update, RunPlan fields)
    if ds.zero_stage < 3:
        steps.append(("ZeRO stage 3 (zero_optimization.stage: 3)", {"zero_optimization/stage": 3}, {}))
    if not ds.offload_optimizer or not ds.offload_param:
        steps.append(("ZeRO-3 with optimizer and parameter offload (offload_optimizer / offload_param device: cpu)",
                      {"zero_optimization/stage": 3, "zero_optimization/offload_optimizer": {"device": "cpu"},
                       "zero_optimization/offload_param": {"device": "cpu"}}, {}))
    if plan.checkpoint.kind != "full":
        steps.append(("full activation recompute (--checkpoint full)", {}, {"checkpoint": CheckpointPolicy(kind="full")}))
    if ds.micro_batch > 1:
        steps.append((f"micro-batch 1 (train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: {tb // plan.dp})",
                      {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": tb // plan.dp}, {}))
    out: list[str] = []
    for text, upd, fields in steps:
        e = _fits(_plan_variant(plan, upd, **fields), cluster)
        if e is not None:
            out.append(f"{text}: peaks at {e.memory.total / GiB:.1f} GiB per rank")
    base, base_text = plan, ""
    if not out and len(steps) > 1:
        upd_all: dict = {}
        fields_all: dict = {}
        texts = []
        for text, upd, fields in steps:
            upd_all.update(upd)
            fields_all.update(fields)
            texts.append(text)
            v = _plan_variant(plan, upd_all, **fields_all)
            e = _fits(v, cluster)
            if e is not None:
                out.append(f"together: {'; '.join(texts)}: peaks at {e.memory.total / GiB:.1f} GiB per rank")
                break
        else:
            base, base_text = _plan_variant(plan, upd_all, **fields_all) or plan, " with " + "; ".join(texts)
    micro = base.ds.micro_batch
    scale = 2
    while scale <= MAX_WORLD_SCALE:
        world, dp = plan.world_size * scale, plan.dp * scale
        if tb % (micro * dp) == 0:
            e = _fits(_plan_variant(base, {"gradient_accumulation_steps": tb // (micro * dp)}, world_size=world),
                      cluster)
            if e is not None:
                out.append(f"more GPUs: world size {world} at the same global batch {tb} (gradient_accumulation_steps: "
                           f"{tb // (micro * dp)}){base_text}: peaks at {e.memory.total / GiB:.1f} GiB per rank")
                break
        scale *= 2
    return out
