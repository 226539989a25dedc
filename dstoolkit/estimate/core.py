"""`estimate_run(plan) -> Estimate`: memory per rank, FLOPs, communication, step time and MFU for one run.

No torch import.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from dstoolkit.estimate.cluster_model import attention_work_fraction
from dstoolkit.estimate.comm import comm_plan
from dstoolkit.estimate.flops import mfu, plan_flops_per_token, tokens_per_step
from dstoolkit.estimate.layout import param_totals
from dstoolkit.estimate.memory import (
    deepspeed_model_states,
    fp8_weight_cache_bytes,
    paper_model_states,
    rank_param_groups,
    zero_group_sizes,
)
from dstoolkit.estimate.stage_activations import activation_bytes
from dstoolkit.estimate.step_time import step_time
from dstoolkit.estimate.te_userbuffers import tp_overlap_buffer_bytes
from dstoolkit.estimate.timeline import allowance_source, device_allowance_bytes, is_cpu_device, memory_timeline
from dstoolkit.hardware.calibration import peak_flops_per_rank
from dstoolkit.runplan import RunPlan


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamCounts(_Frozen):
    total: int
    """All parameters of the model."""
    active: int
    """Parameters one token uses (MoE: top-k routed experts)."""
    per_rank: int
    """Parameters this rank holds before ZeRO partitioning (after TP, PP and EP sharding)."""


class TermOut(_Frozen):
    name: str
    bytes: int
    where: str
    """device | host."""
    source: str


class PhaseOut(_Frozen):
    """What is alive on one rank in one phase of a steady-state step (`dstoolkit.estimate.timeline`)."""

    name: str
    """forward_end | forward_loss | backward_loss | backward_start | backward_recompute | backward_end | grad_norm |
    optimizer_step | optimizer_step_cast | offload_step."""
    device_bytes: int
    host_bytes: int
    terms: list[TermOut]


class TimelineOut(_Frozen):
    phases: list[PhaseOut]
    peak_bytes: int
    """Max over phases of device bytes."""
    peak_phase: str
    peak_with_host_bytes: int
    """Max over phases of device + host bytes (one RAM on a CPU-only machine)."""
    sum_of_parts_bytes: int


def upper_bound_exceeds(sum_of_parts_bytes: int, allowance_bytes: int, device_bytes: int) -> bool:
    """Whether the sum of parts + allowance is over the device: the peak may fit, but a caching allocator that keeps
    each phase's blocks for the next (PyTorch's CUDA allocator without expandable segments) can hold up to the sum of
    parts. Measured on a real cluster: benchmarks/layout_sweeps.py memory_check against the device memory the BLOOM
    logbook reports per layout (benchmarks/results/layout_sweeps_*.md, "Device memory vs what the source reports")."""
    return sum_of_parts_bytes + allowance_bytes > device_bytes


class MemoryBreakdown(_Frozen):
    """Device bytes per rank. `total` is the peak: the maximum over the phases of a step of what is alive together
    (`timeline`). The five parts are each at their own maximum; their sum is `sum_of_parts_bytes`, an upper bound."""

    params: int
    """Working (model-dtype) parameters, incl. ZeRO flat-buffer padding; stage 3: partition + persistent, + the
    ZeRO++ hpZ secondary partition (`hpz_secondary_params`)."""
    grads: int
    """Gradient bytes at their peak (end of backward for stage 0/1, the step for stage 2/3)."""
    optimizer: int
    """fp32 master weights + optimizer moments on the device (0 when offloaded)."""
    activations: int
    """Saved activations + the transient of one recomputed block."""
    buffers: int
    """Reduce/all-gather buckets, stage-3 live parameters, offload staging, fp8 weight cache, TP comm-overlap
    userbuffers (`tp_overlap_buffers`)."""
    temporaries: int = 0
    """The largest short-lived temporary of a step on the device: the inner optimizer's (per implementation,
    `optimizer_impl`), the ZeRO-1/2 gradient norm's fp64 copy, or the loss's logits copies (step_temporaries.py,
    stage_activations.py)."""
    optimizer_temporaries: int = 0
    """The inner optimizer's step() temporaries on the device (0 for fused / DeepSpeed FusedAdam / CPU Adam)."""
    optimizer_impl: str = ""
    """The Adam implementation the estimate assumes (step_temporaries.IMPLEMENTATIONS key)."""
    total: int
    """Peak device bytes per rank: max over phases (== peak_bytes). Before issue #15 this was the sum of parts."""
    peak_phase: str
    """The phase where the peak occurs."""
    peak_pipeline_stage: Optional[Literal["first", "last"]] = None
    """With a pipeline, the stage whose timeline peaks: the first (most micro batches in flight) or the last (the LM
    head and loss, stage_activations.activation_bytes stage="last"); None without one. The other fields describe it."""
    peak_alive: list[str]
    """What is alive at the peak, largest first (terms >= 1% of it)."""
    sum_of_parts_bytes: int
    """params + grads + optimizer + activations + buffers + temporaries, each at its own maximum: an upper bound,
    not a peak."""
    allowance_bytes: int
    """What the rank needs beyond its tensors (GPU: CUDA context + NCCL + allocator fragmentation; CPU: 0)."""
    allowance_source: str
    required_bytes: int
    """peak + allowance: what `fits` compares with the device memory."""
    timeline: TimelineOut
    # -- details --
    master_params: int
    optimizer_states: int
    grads_at_step: int
    grads_backward_peak: int
    model_states_at_step: int
    """params + master + optimizer states + grads at step + persistent buffers (what the fidelity benchmark measures)."""
    activations_saved: int
    activations_recompute_transient: int
    fp8_weight_cache: int
    hpz_secondary_params: int = 0
    """ZeRO++ hpZ secondary parameter partition on the device at the step (zero_states._hpz_secondary)."""
    tp_overlap_buffers: int = 0
    """Transformer Engine TP comm-overlap userbuffers (te_userbuffers.tp_overlap_buffer_bytes), in every phase."""
    optimizer_path: str
    """DeepSpeed class holding the states: basic | fp16_fused | fp16_unfused | bf16_optimizer | zero12 | zero3."""


class PaperViewOut(_Frozen):
    """ZeRO §3.1 accounting (2Ψ + 2Ψ + 12Ψ), a separate view from DeepSpeed's real allocation."""

    psi: int
    dp: int
    baseline_bytes: int
    zero1_bytes: int
    zero2_bytes: int
    zero3_bytes: int
    stage_bytes: int


class StepTimeOut(_Frozen):
    compute_s: float
    comm_total_s: float
    comm_exposed_s: float
    optimizer_s: float
    memory_s: float
    offload_s: float
    overhead_s: float
    overlap_efficiency: float
    total_s: float


class Estimate(_Frozen):
    """Everything estimated for one run."""

    params: ParamCounts
    memory: MemoryBreakdown
    host_memory_per_rank_bytes: int
    flops_per_token: float
    """Model FLOPs per token, 6N + 12·L·H·Q·T."""
    hardware_flops_per_token: float
    """Including recompute (HFU numerator)."""
    flops_per_step: float
    """Model FLOPs per optimizer step over the whole job."""
    tokens_per_step: int
    comm_bytes_per_step: dict[str, int]
    """Per-rank bytes per step by collective, as DeepSpeed 0.19.8 runs them (ZeRO-1/2: zero_grad_all_reduce)."""
    comm_bytes_per_step_paper: dict[str, int]
    """The same in the ZeRO paper's accounting (ZeRO-1/2: zero_reduce_scatter, 2Ψ; ZeRO §7)."""
    step_time_s: float
    step_time: StepTimeOut
    mfu: float
    """Model FLOPs utilisation: tokens/s x (6N + 12LHQT) / (peak x GPUs), peak = mfu_peak_flops_per_gpu."""
    mfu_peak_flops_per_gpu: float = 0.0
    """The MFU denominator per GPU (peak_flops_per_rank: the fp8 peak for fp8 runs where the GPU has one)."""
    mfu_peak: str = ""
    """What that peak is (hardware.calibration.peak_flops_per_rank), e.g. "H800 fp8 peak (hardware table)"."""
    hfu: float
    """Hardware FLOPs utilisation: as MFU, counting the recomputed forward too."""
    fits: bool
    """peak device bytes + allowance (memory.required_bytes) <= the GPU's memory."""
    gpu_memory_bytes: int
    paper_view: PaperViewOut
    dp: int
    micro_batch: int
    grad_accum: int
    zero_stage: int

    def to_json(self) -> dict:
        """The stable JSON shape (issue #4 contract), plus extra fields."""
        m = self.memory
        return {
            "params": {"total": self.params.total, "active": self.params.active, "per_rank": self.params.per_rank},
            "memory_per_rank_bytes": {
                "params": m.params, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations,
                "buffers": m.buffers, "temporaries": m.temporaries, "total": m.total,
                "optimizer_temporaries": m.optimizer_temporaries, "optimizer_impl": m.optimizer_impl,
                "peak": m.total, "peak_phase": m.peak_phase, "peak_alive": list(m.peak_alive),
                "sum_of_parts_bytes": m.sum_of_parts_bytes, "allowance_bytes": m.allowance_bytes,
                "allowance_source": m.allowance_source, "required_bytes": m.required_bytes,
                "timeline": [{"phase": p.name, "device_bytes": p.device_bytes, "host_bytes": p.host_bytes,
                              "terms": {f"{t.where}:{t.name}" if t.where != "device" else t.name: t.bytes
                                        for t in p.terms}} for p in m.timeline.phases],
                "timeline_sources": {t.name: t.source for p in m.timeline.phases for t in p.terms},
                "detail": {
                    "master_params": m.master_params, "optimizer_states": m.optimizer_states,
                    "grads_at_step": m.grads_at_step, "grads_backward_peak": m.grads_backward_peak,
                    "model_states_at_step": m.model_states_at_step, "activations_saved": m.activations_saved,
                    "activations_recompute_transient": m.activations_recompute_transient,
                    "fp8_weight_cache": m.fp8_weight_cache, "hpz_secondary_params": m.hpz_secondary_params,
                    "tp_overlap_buffers": m.tp_overlap_buffers, "optimizer_path": m.optimizer_path,
                },
            },
            "host_memory_per_rank_bytes": self.host_memory_per_rank_bytes,
            "flops_per_step": self.flops_per_step,
            "flops_per_token": self.flops_per_token,
            "hardware_flops_per_token": self.hardware_flops_per_token,
            "tokens_per_step": self.tokens_per_step,
            "comm_bytes_per_step": dict(self.comm_bytes_per_step),
            "comm_bytes_per_step_paper": dict(self.comm_bytes_per_step_paper),
            "step_time_s": self.step_time_s,
            "step_time_breakdown_s": self.step_time.model_dump(),
            "mfu": self.mfu,
            "mfu_peak_flops_per_gpu": self.mfu_peak_flops_per_gpu,
            "mfu_peak": self.mfu_peak,
            "hfu": self.hfu,
            "fits": self.fits,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "paper_view": self.paper_view.model_dump(),
            "parallel": {"dp": self.dp, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                         "zero_stage": self.zero_stage},
        }


def stage_timelines(plan: RunPlan, ms, fp8_cache: int) -> dict:
    """The memory timeline of each pipeline stage that can peak, keyed None (no pipeline, or DualPipe, which feeds
    both ends alike so its first stage stands for both) or "first" / "last": the first stage holds the most micro
    batches in flight, the last the LM head and the loss's [tokens, vocab] tensors (stage_activations.activation_bytes).
    Both take the heaviest stage's model states `ms` (rank_param_groups), an upper bound for either.

    Returns: {stage: (ActivationEstimate, Timeline)}."""
    ds = plan.ds
    # The gradients earlier micro steps leave alive (ModelStates.grads_between_micro_steps) are DeepSpeed's engine's
    # (measured: benchmarks/results/pipeline_memory_cpu_*.md, no-pipeline cell). Megatron's and FSDP's runs are
    # modelled with DeepSpeed's classes as a stand-in whose step transients their own buffers do not have; the term
    # waits for their own gradient buffers to be modelled (Megatron allocates its grad buffer up front).
    kw = dict(zero_stage=ds.zero_stage, offload_optimizer=bool(ds.offload_optimizer), fp8_cache=fp8_cache,
              accumulating=ds.grad_accum > 1 and plan.framework == "deepspeed",
              tp_overlap_buffers=tp_overlap_buffer_bytes(plan))
    act = activation_bytes(plan)
    # stage_activations.py: embedding_and_loss = the ids the embedding keeps (8 bytes/token) + at pp = 1 the final norm,
    # LM head and loss tensors, which backward frees before it reaches the last block
    head = max(0.0, act.embedding_and_loss - 8 * plan.seq_len * ds.micro_batch) if plan.pp == 1 else 0.0
    first = (act, memory_timeline(ms, act, head_activations=head, **kw))
    if plan.pp == 1 or plan.pipeline_schedule == "dualpipe":
        return {None: first}
    last = activation_bytes(plan, stage="last")
    return {"first": first, "last": (last, memory_timeline(ms, last, head_activations=last.embedding_and_loss, **kw))}


def estimate_run(plan: RunPlan, *, rank: Optional[int] = None) -> Estimate:
    """Estimate memory, FLOPs, communication, step time and MFU for one run.

    Args:
        plan: the run (see `RunPlan`).
        rank: data-parallel rank for exact per-rank ZeRO partition boundaries; None = the worst rank.

    Returns:
        Estimate (JSON via `Estimate.to_json()`).

    Raises:
        ValueError: impossible inputs (also raised when the RunPlan is built).
    """
    ds = plan.ds
    totals = param_totals(plan.shape)
    groups = rank_param_groups(plan)
    per_rank = sum(sum(g) for g in groups)
    ms = deepspeed_model_states(plan, rank=rank)
    fp8_cache = fp8_weight_cache_bytes(plan)
    ub = tp_overlap_buffer_bytes(plan)
    timelines = stage_timelines(plan, ms, fp8_cache)
    stage = max(timelines, key=lambda k: timelines[k][1].peak_bytes)  # ties: the first stage
    act, tl = timelines[stage]
    grads = max(ms.grads_at_step, ms.grads_backward_peak, ms.grads_step_transient_peak)
    optimizer = ms.master_params + ms.optimizer_states
    activations = int(act.peak)
    buffers = ms.persistent_buffers + ms.transient_buffers + fp8_cache + ub
    peak = tl.peak_phase
    total = tl.peak_bytes
    allowance = device_allowance_bytes(plan.gpu, total)
    timeline = TimelineOut(
        phases=[PhaseOut(name=p.name, device_bytes=p.device_bytes, host_bytes=p.host_bytes,
                         terms=[TermOut(name=t.name, bytes=t.bytes, where=t.where, source=t.source) for t in p.terms])
                for p in tl.phases],
        peak_bytes=total, peak_phase=peak.name, peak_with_host_bytes=tl.peak_with_host_bytes,
        sum_of_parts_bytes=tl.sum_of_parts_bytes)
    memory = MemoryBreakdown(
        params=ms.params + ms.hpz_secondary_params, grads=grads, optimizer=optimizer, activations=activations,
        buffers=buffers, total=total,
        peak_phase=peak.name, peak_pipeline_stage=stage, peak_alive=peak.alive(0.01),
        sum_of_parts_bytes=tl.sum_of_parts_bytes,
        allowance_bytes=allowance, allowance_source=allowance_source(plan.gpu), required_bytes=total + allowance,
        timeline=timeline,
        master_params=ms.master_params, optimizer_states=ms.optimizer_states, grads_at_step=ms.grads_at_step,
        grads_backward_peak=ms.grads_backward_peak, model_states_at_step=ms.device_at_step,
        activations_saved=int(act.saved), activations_recompute_transient=int(act.recompute_transient),
        fp8_weight_cache=fp8_cache, hpz_secondary_params=ms.hpz_secondary_params, tp_overlap_buffers=ub,
        optimizer_path=ms.optimizer_path,
        temporaries=int(max(ms.optimizer_temporaries, ms.grad_norm_temporaries, act.loss_forward_transient,
                            act.loss_backward_transient)),
        optimizer_temporaries=ms.optimizer_temporaries, optimizer_impl=ms.optimizer_impl,
    )
    fpt = plan_flops_per_token(plan)
    # HFU counts what the kernels run: a causal fused kernel on a GPU skips the masked half of the attention term
    # (the CPU ranks' SDPA is measured as it runs, cpu_compute)
    executed_attention = 1.0 if is_cpu_device(plan.gpu) else attention_work_fraction(plan)
    tps = tokens_per_step(plan)
    comm = comm_plan(plan)
    if ms.optimizer_path in ("zero12", "zero3", "bf16_optimizer"):
        part = sum(-(-sum(g) // d) for g, d in zip(groups, zero_group_sizes(plan)))
    else:
        part = per_rank
    tokens_per_replica = ds.micro_batch * ds.grad_accum * plan.seq_len
    st = step_time(plan, fpt, comm, part, tokens_per_replica, local_numel=per_rank)
    step_s = st.total_s
    achieved_tokens_per_s = tps / step_s if step_s > 0 else 0.0
    peak, peak_what = peak_flops_per_rank(plan.gpu, plan.precision, plan.calibration)  # step_time.peak_flops
    paper = paper_model_states(per_rank, plan.dp, ds.zero_stage)
    return Estimate(
        params=ParamCounts(total=totals.total, active=totals.active, per_rank=per_rank),
        memory=memory,
        host_memory_per_rank_bytes=ms.host_total,
        flops_per_token=fpt.model,
        hardware_flops_per_token=fpt.hardware,
        flops_per_step=fpt.model * tps,
        tokens_per_step=tps,
        comm_bytes_per_step=comm.by_name(),
        comm_bytes_per_step_paper=comm_plan(plan, view="paper").by_name(),
        step_time_s=step_s,
        step_time=StepTimeOut(**{k: getattr(st, k) for k in ("compute_s", "comm_total_s", "comm_exposed_s",
                                                              "optimizer_s", "memory_s", "offload_s", "overhead_s",
                                                              "overlap_efficiency")}, total_s=step_s),
        mfu=mfu(achieved_tokens_per_s, fpt.model, peak, plan.world_size),
        mfu_peak_flops_per_gpu=peak, mfu_peak=peak_what,
        hfu=mfu(achieved_tokens_per_s, fpt.executed(executed_attention), peak, plan.world_size),
        fits=total + allowance <= plan.gpu.memory_bytes,
        gpu_memory_bytes=plan.gpu.memory_bytes,
        paper_view=PaperViewOut(psi=paper.psi, dp=paper.dp, baseline_bytes=paper.baseline_bytes,
                                zero1_bytes=paper.zero1_bytes, zero2_bytes=paper.zero2_bytes,
                                zero3_bytes=paper.zero3_bytes, stage_bytes=paper.stage_bytes),
        dp=plan.dp, micro_batch=ds.micro_batch, grad_accum=ds.grad_accum, zero_stage=ds.zero_stage,
    )
