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
    resolve_spec(spec, shape) -> Resolution                             the sweep's best layout for a spec, with
                                                                        the values it chose for "auto" fields

"auto" is resolved by the sweep only (`dstoolkit.generate.sweep.run_sweep`, the path `dstoolkit generate`
takes per strategy); the DeepSpeed JSON is written by `dstoolkit.generate.ds_json` only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

from dstoolkit.generate.candidates import Candidate, StrategyDef
from dstoolkit.generate.costing import (CandidateEstimate, EstimateInputError, run_plan_for,
                                        usable_device_bytes)
from dstoolkit.generate.costing import estimate_candidate as _estimate_candidate
from dstoolkit.generate.ds_json import build_ds_config, is_cpu_cluster
from dstoolkit.generate.rules import RuleViolation, check_candidate
from dstoolkit.generate.sweep import (MICRO_BATCH_CHOICES, SweepResult, checkpoint_choices, enumerate_candidates,
                                      error_findings, run_sweep, validate_candidate_config, zero_modes)
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan
from dstoolkit.spec import Spec

GiB = 2**30

__all__ = ["MICRO_BATCH_CHOICES", "Candidate", "CandidateEstimate", "EstimateInputError", "Resolution",
           "RuleViolation", "candidates_for", "check_candidate", "checkpoint_choices", "ds_config_for",
           "error_findings", "estimate_candidate", "is_cpu_cluster", "plan_for", "resolve_spec", "usable_device_bytes",
           "validate_candidate", "zero_modes"]


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


def resolve_spec(spec: Spec, shape: ModelShape) -> Resolution:
    """Resolve a spec's "auto" fields with the sweep (`run_sweep`, validated like `dstoolkit generate`) and
    build the winner's DeepSpeed JSON and `RunPlan`.

    When nothing fits, the least memory-hungry layout the sweep estimated is returned with `fits=False`.

    Raises:
        ValueError: no layout survives the structural rules and the estimator (the message gives the sweep's
            drop counts and the first reason).
    """
    res = run_sweep(spec, shape, top=1, validate=True, advise=False)
    if res.winner is not None:
        cand, fits = res.winner.candidate, True
    elif res.fits_nowhere is not None and res.fits_nowhere.least_memory_candidate is not None:
        cand, fits = res.fits_nowhere.least_memory_candidate, False
    else:
        codes = ", ".join(f"{k}: {v}" for k, v in res.dropped_by_code.items())
        first = f"; e.g. {res.dropped[0].candidate.label}: {res.dropped[0].reason}" if res.dropped else ""
        raise ValueError(f"no valid layout for {spec.name}: {res.considered} tried, dropped by {codes}{first}")
    cfg = ds_config_for(spec, shape, cand)
    notes = _chosen(spec, cand)
    if notes:
        lead = "layout chosen by the sweep (dstoolkit sweep)" if fits else "least memory-hungry layout of the sweep"
        notes.insert(0, f"{lead}: {cand.label}")
    if not fits:
        gpu = spec.cluster.gpu_spec
        notes.append(f"nothing fits in {gpu.memory_bytes / GiB:.0f} GiB "
                     f"({usable_device_bytes(gpu) / GiB:.1f} GiB usable): showing the smallest-memory candidate")
    return Resolution(candidate=cand, ds_config=cfg, plan=plan_for(spec, shape, cand, cfg), fits=fits, sweep=res,
                      assumptions=notes)
