"""Memory and step-time numbers the sweep ranks by, behind one function: `estimate_candidate`.

It builds the estimators' `RunPlan` from a candidate and its DeepSpeed JSON and calls
`dstoolkit.estimate.estimate_run` (issue #4), whose memory model is checked against real DeepSpeed
allocations. The sweep applies `DEVICE_HEADROOM_FRACTION` on top of its `fits`.
No torch import.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.models.shape import ModelShape
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.spec import Spec

GiB = 2**30

DEVICE_HEADROOM_FRACTION = 0.05
"""Share of device memory a layout may not plan for: the CUDA context (~0.5 GiB), NCCL communicator buffers and
PyTorch caching-allocator fragmentation. Our assumption (no published figure); the estimator itself counts
only tensors and DeepSpeed buffers."""


def usable_device_bytes(gpu: GpuSpec) -> int:
    """Device bytes a layout may fill: memory_bytes x (1 - DEVICE_HEADROOM_FRACTION)."""
    return int(gpu.memory_bytes * (1 - DEVICE_HEADROOM_FRACTION))


@dataclass(frozen=True)
class CandidateEstimate:
    """What the sweep needs from an estimate (per rank, worst pipeline stage)."""

    memory_per_rank_bytes: int
    """Peak device bytes per rank (total of the breakdown)."""
    memory_breakdown_bytes: dict[str, int]
    """params / grads / optimizer / activations / buffers, bytes per rank."""
    host_memory_per_rank_bytes: int
    """Host bytes per rank for offloaded states (0 without offload)."""
    device_memory_bytes: int
    """Capacity of one device, from the hardware table."""
    step_time_s: float
    """Estimated seconds per optimizer step."""
    mfu: float
    """Model FLOPs utilisation: useful FLOPs / (step time x world x peak)."""
    fits: bool
    """Whether memory_per_rank_bytes <= usable_device_bytes (device memory less DEVICE_HEADROOM_FRACTION)."""
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


def layers_per_stage(num_layers: int, pp: int) -> int:
    """Layers on the fullest pipeline stage: ceil(L / pp) (uneven splits put the remainder on stage 0)."""
    return -(-num_layers // pp)


PACKAGE_SOURCE = "dstoolkit.estimate.estimate_run"


class EstimateInputError(ValueError):
    """The estimator refused the candidate (an impossible combination it checks itself)."""


def estimator_source(spec: Optional[Spec] = None) -> str:
    """Which estimator `estimate_candidate` uses, and with which calibration when `spec` is given (for summaries)."""
    if spec is None:
        return PACKAGE_SOURCE
    from dstoolkit.hardware.calibration import calibration_label

    return f"{PACKAGE_SOURCE}, step times from {calibration_label(spec)}"


def estimate_candidate(spec: Spec, shape: ModelShape, cand: Candidate, gpu: GpuSpec,
                       *, ds_config: Optional[dict] = None) -> CandidateEstimate:
    """Estimate one candidate with `dstoolkit.estimate.estimate_run`.

    Args:
        spec: The spec (its training/cluster sections; auto fields are taken from `cand`).
        shape: The resolved model shape.
        cand: The concrete layout.
        gpu: Hardware facts of one device.
        ds_config: The DeepSpeed JSON for `cand` (built with `build_ds_config` when None).

    Returns:
        A `CandidateEstimate`; `fits` includes `DEVICE_HEADROOM_FRACTION`.

    Raises:
        EstimateInputError: The estimator refused the combination (message says why).
        SpecError: cluster.calibration names an unusable file.
    """
    from dstoolkit.estimate import RunPlan, estimate_run  # issue #4
    from dstoolkit.hardware.calibration import calibration_for_spec

    if ds_config is None:
        from dstoolkit.generate.ds_json import build_ds_config

        ds_config = build_ds_config(spec, shape, cand)
    t = spec.training
    # outside the try: an unusable cluster.calibration is the spec's error (SpecError at its YAML line), not
    # a refusal of this one candidate
    calibration = calibration_for_spec(spec)
    try:
        plan = RunPlan(
            shape=shape, ds_config=ds_config, world_size=spec.cluster.world_size,
            gpus_per_node=spec.cluster.gpus_per_node, gpu=gpu, seq_len=t.seq_len, tp=cand.tp, pp=cand.pp,
            ep=cand.ep, checkpoint=cand.checkpoint, flash_attention=t.flash_attention,
            sequence_parallel=cand.sequence_parallel, precision=t.precision, calibration=calibration)
        est = estimate_run(plan)
    except ValueError as exc:
        raise EstimateInputError(" ".join(str(exc).split())) from None
    mem = est.memory
    breakdown = {k: int(getattr(mem, k)) for k in ("params", "grads", "optimizer", "activations", "buffers")}
    total = int(mem.total)
    return CandidateEstimate(
        memory_per_rank_bytes=total, memory_breakdown_bytes=breakdown,
        host_memory_per_rank_bytes=int(est.host_memory_per_rank_bytes), device_memory_bytes=int(gpu.memory_bytes),
        step_time_s=float(est.step_time_s), mfu=float(est.mfu), fits=total <= usable_device_bytes(gpu),
        source=estimator_source(spec),
        extras={"flops_per_step": float(est.flops_per_step), "comm_bytes_per_step": dict(est.comm_bytes_per_step)})
