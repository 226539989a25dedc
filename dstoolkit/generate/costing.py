"""Memory and step-time numbers the sweep ranks by, behind one function: `estimate_candidate`.

It builds the estimators' `RunPlan` from a candidate and its DeepSpeed JSON and calls
`dstoolkit.estimate.estimate_run` (issue #4), whose memory model is checked against real DeepSpeed
allocations. Memory is the *peak* over the phases of a step (`dstoolkit.estimate.timeline`, issue #15), and a
candidate fits when peak + allowance (CUDA context, NCCL buffers, allocator fragmentation on GPUs; nothing on
CPU ranks: `timeline.device_allowance_bytes`) is at most the device memory.
No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.core import upper_bound_exceeds
from dstoolkit.estimate.timeline import GPU_CONTEXT_BYTES, allowance_source, is_cpu_device
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.generate.hf_targets import HF_TARGETS
from dstoolkit.hardware.calibration import calibration_for_spec, calibration_label
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan, plan_from_spec
from dstoolkit.spec import Spec
from dstoolkit.spec.cluster_fields import host_memory_per_node_bytes, host_memory_source, memory_headroom_fraction
from dstoolkit.spec.model import BatchRampSpec

GiB = 2**30


def usable_device_bytes(gpu: GpuSpec) -> int:
    """The largest tensor peak that fits one device: memory - GPU_CONTEXT_BYTES on GPUs, memory_bytes on CPU
    ranks; `peak <= usable_device_bytes(gpu)` is the same test as `peak + device_allowance_bytes(gpu, peak) <=
    memory_bytes` (no fragmentation share: `dstoolkit.estimate.timeline` says why)."""
    if is_cpu_device(gpu):
        return int(gpu.memory_bytes)
    return max(0, int(gpu.memory_bytes - GPU_CONTEXT_BYTES))


@dataclass(frozen=True)
class FitVerdict:
    """Whether one layout fits: its device peak on one GPU AND its offloaded states on one node's host RAM. The one
    fit test `estimate_candidate` (sweep, generate) and `dstoolkit estimate` (spec and --config forms) apply."""

    device_fits: bool
    """peak <= usable_device_bytes(gpu) (peak + allowance <= device memory)."""
    host_node_bytes: int
    """Offloaded bytes of one node: host bytes per rank x ranks per node."""
    host_capacity_bytes: int
    """Host RAM of one node (`dstoolkit.spec.cluster_fields.host_memory_per_node_bytes`)."""
    host_source: str
    """Where host_capacity_bytes comes from (a spec field, or the default and what would set it)."""

    @property
    def host_fits(self) -> bool:
        return self.host_node_bytes <= self.host_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.device_fits and self.host_fits

    def host_reason(self, ranks_per_node: int) -> str:
        """'host RAM X GiB per node > Y GiB' with the figures behind it and the fix (empty when host RAM fits)."""
        if self.host_fits:
            return ""
        return (f"host RAM {self.host_node_bytes / GiB:.1f} GiB per node ({self.host_node_bytes / ranks_per_node / GiB:.1f}"
                f" GiB of offloaded states per rank x {ranks_per_node} ranks) > {self.host_capacity_bytes / GiB:.1f} GiB"
                f" ({self.host_source}); fix: offload less (training.offload / the offload_optimizer and offload_param "
                "devices), spread the states over more nodes, or set cluster.host_memory_per_node_gib to the nodes' "
                "real host RAM if it is larger")


def fit_verdict(peak_bytes: int, gpu: GpuSpec, host_per_rank_bytes: int, ranks_per_node: int, cluster,
                source_note: str = "") -> FitVerdict:
    """The fit test of one layout (`FitVerdict`): `peak_bytes` against `usable_device_bytes(gpu)`, the node's
    offloaded states (`host_per_rank_bytes` x `ranks_per_node`) against `cluster`'s host RAM
    (`host_memory_per_node_bytes`: its host_memory_per_node_gib, else the default for its gpu; `source_note` is
    added to where that figure comes from)."""
    return FitVerdict(device_fits=int(peak_bytes) <= usable_device_bytes(gpu),
                      host_node_bytes=int(host_per_rank_bytes) * int(ranks_per_node),
                      host_capacity_bytes=host_memory_per_node_bytes(cluster),
                      host_source=host_memory_source(cluster) + source_note)


def allowance_text(gpu: GpuSpec) -> str:
    """One line for messages: what is kept free beyond the tensor peak, and why."""
    return allowance_source(gpu)


@dataclass(frozen=True)
class CandidateEstimate:
    """What the sweep needs from an estimate (per rank, worst pipeline stage)."""

    memory_per_rank_bytes: int
    """Peak device bytes per rank: the maximum over the phases of a step (`estimate.memory.total`)."""
    memory_breakdown_bytes: dict[str, int]
    """params / grads / optimizer / activations / buffers, bytes per rank, each at its own maximum (they are not
    alive together: their sum is `sum_of_parts_bytes`, an upper bound)."""
    host_memory_per_rank_bytes: int
    """Host bytes per rank for offloaded states (0 without offload)."""
    device_memory_bytes: int
    """Capacity of one device, from the hardware table."""
    step_time_s: float
    """Estimated seconds per optimizer step."""
    mfu: float
    """Model FLOPs utilisation: useful FLOPs / (step time x world x peak)."""
    fits: bool
    """Whether peak + allowance <= device memory (memory_per_rank_bytes <= usable_device_bytes) AND the node's
    offloaded states fit its host RAM (`fit_verdict`, the test `dstoolkit estimate` applies too)."""
    source: str
    """Which estimator produced the numbers."""
    extras: dict = field(default_factory=dict)
    """Estimator-specific figures (flops, comm bytes) shown in summaries."""
    peak_phase: str = ""
    """Phase of the step where the peak occurs (forward_end, backward_end, optimizer_step, ...)."""
    peak_alive: tuple = ()
    """What is alive at the peak, largest first."""
    sum_of_parts_bytes: int = 0
    """Every category at its own maximum, added: an upper bound (the pre-issue-#15 'total')."""
    allowance_bytes: int = 0
    """Kept free beyond the peak: CUDA context + NCCL + fragmentation on GPUs, 0 on CPU ranks."""
    tp_overlap_buffer_bytes: int = 0
    """Transformer Engine userbuffers for TP comm overlap (training.tp_comm_overlap, tp > 1), included in
    memory_per_rank_bytes by the estimator's timeline (`dstoolkit.estimate.te_userbuffers`)."""
    host_memory_per_node_bytes: int = 0
    """Host bytes of one node: host_memory_per_rank_bytes x ranks per node."""
    host_memory_node_capacity_bytes: int = 0
    """Host RAM of one node (`dstoolkit.spec.cluster_fields.host_memory_per_node_bytes`)."""
    host_fits: bool = True
    """host_memory_per_node_bytes <= host_memory_node_capacity_bytes (part of `fits`)."""
    device_fits: bool = True
    """memory_per_rank_bytes <= usable_device_bytes (the other part of `fits`; `fit_verdict`)."""
    host_source: str = ""
    """Where host_memory_node_capacity_bytes comes from (`spec.cluster_fields.host_memory_source`)."""
    headroom_bytes: int = 0
    """Device bytes a pick should leave free (cluster.memory_headroom_fraction x device memory)."""
    within_headroom: bool = True
    """peak + allowance + headroom <= device memory: the ranking prefers these layouts."""


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

    return f"{PACKAGE_SOURCE}, step times from {calibration_label(spec)}"


def run_plan_for(spec: Spec, shape: ModelShape, cand: Candidate, ds_config: Optional[dict] = None, *,
                 gpu: Optional[GpuSpec] = None, calibration=None) -> RunPlan:
    """The estimator's `RunPlan` for one candidate: `dstoolkit.runplan.plan_from_spec` with the candidate's
    layout (degrees, recompute, sequence parallelism) and its DeepSpeed JSON (`build_ds_config` when None).

    Raises:
        ValueError: the layout or the JSON is refused (a `dstoolkit.layout` constraint, `read_ds_config`).
    """
    cfg = build_ds_config(spec, shape, cand) if ds_config is None else ds_config
    extra = {} if calibration is None else {"calibration": calibration}
    return plan_from_spec(spec, cfg, shape, tp=cand.tp, pp=cand.pp, ep=cand.ep, checkpoint=cand.checkpoint,
                          sequence_parallel=cand.sequence_parallel, gpu=gpu, **extra)


def batch_ramp_of_targets(spec: Spec, targets) -> Optional[BatchRampSpec]:
    """The batch ramp the files of `targets` train with: training.batch_ramp, or None when every target is HF Trainer /
    Accelerate, which cannot ramp (`hf_targets.hf_batch_ramp_note`) and train at training.global_batch from step 0.
    A --tokens plan counts its ramp steps from this (generate per strategy, sweep per engine group, estimate),
    so it counts the steps those files run. No targets (training.framework's trainer): the spec's ramp."""
    targets = list(targets or ())
    if targets and all(t in HF_TARGETS for t in targets):
        return None
    return spec.training.batch_ramp


def only_peak_fits(est: "CandidateEstimate", gpu: GpuSpec) -> bool:
    """Whether a GPU candidate fits by its peak but not by the sum of parts (estimate.core.upper_bound_exceeds): a
    caching allocator that keeps each phase's blocks can hold that much. Never on CPU ranks (host RAM, no caching
    allocator between phases)."""
    return (est.fits and not is_cpu_device(gpu)
            and upper_bound_exceeds(est.sum_of_parts_bytes, est.allowance_bytes, est.device_memory_bytes))


def peak_only_caution(est: "CandidateEstimate") -> str:
    """The caution for a candidate `only_peak_fits` marks, with its figures."""
    return (f"the peak fits, but the sum of parts + allowance ({(est.sum_of_parts_bytes + est.allowance_bytes) / GiB:.1f}"
            f" GiB) is over the {est.device_memory_bytes / GiB:.0f} GiB device: a caching allocator that keeps each "
            "phase's blocks can hold that much; leave room or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


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
        A `CandidateEstimate`; `fits` is `fit_verdict`: peak + allowance <= device memory and host RAM per node.

    Raises:
        EstimateInputError: The estimator refused the combination (message says why).
        SpecError: cluster.calibration names an unusable file.
    """
    ds_config = build_ds_config(spec, shape, cand) if ds_config is None else ds_config
    # outside the try: an unusable cluster.calibration is the spec's error (SpecError at its YAML line), not
    # a refusal of this one candidate
    calibration = calibration_for_spec(spec)
    try:
        est = estimate_run(run_plan_for(spec, shape, cand, ds_config, gpu=gpu, calibration=calibration))
    except ValueError as exc:
        raise EstimateInputError(" ".join(str(exc).split())) from None
    mem = est.memory
    breakdown = {k: int(getattr(mem, k)) for k in ("params", "grads", "optimizer", "activations", "buffers")}
    ub = int(mem.tp_overlap_buffers)  # in mem.total and mem.buffers already (estimate.te_userbuffers)
    peak = int(mem.total)
    host_rank = int(est.host_memory_per_rank_bytes)
    verdict = fit_verdict(peak, gpu, host_rank, spec.cluster.gpus_per_node, spec.cluster)
    headroom = int(memory_headroom_fraction(spec.cluster) * gpu.memory_bytes)
    return CandidateEstimate(
        memory_per_rank_bytes=peak, memory_breakdown_bytes=breakdown,
        host_memory_per_rank_bytes=host_rank, device_memory_bytes=int(gpu.memory_bytes),
        step_time_s=float(est.step_time_s), mfu=float(est.mfu), fits=verdict.fits,
        tp_overlap_buffer_bytes=ub, host_memory_per_node_bytes=verdict.host_node_bytes,
        host_memory_node_capacity_bytes=verdict.host_capacity_bytes, host_fits=verdict.host_fits,
        headroom_bytes=headroom, device_fits=verdict.device_fits, host_source=verdict.host_source,
        within_headroom=peak + headroom <= usable_device_bytes(gpu),
        source=estimator_source(spec),
        extras={"flops_per_step": float(est.flops_per_step), "comm_bytes_per_step": dict(est.comm_bytes_per_step)},
        peak_phase=mem.peak_phase + (" on the last pipeline stage" if mem.peak_pipeline_stage == "last" else ""),
        peak_alive=tuple(mem.peak_alive), sum_of_parts_bytes=int(mem.sum_of_parts_bytes),
        allowance_bytes=int(mem.allowance_bytes))
