"""Peak memory per rank as a peak: what is alive in each phase of a training step, and the maximum over phases.

The model-state terms come from `dstoolkit.estimate.memory.deepspeed_model_states` (DeepSpeed 0.19.8 as it
allocates), the activation terms from `dstoolkit.estimate.stage_activations.activation_bytes`. This module only
decides *which of them coexist*. Steady state (step >= 2: Adam's moments are created lazily in the first
`step()` and then kept, ZeRO §3.1's K·Ψ term):

* ``forward_end`` - everything that persists across steps (working weights ZeRO §5.3 P_p partitions them,
  fp32 master weights and moments §5.1 P_os, persistent buffers) + every saved activation
  (Korthikanti et al. §4) + at ZeRO-3 the parameters gathered around the running module (bounded by
  ``stage3_max_live_parameters``/prefetch, partitioned_param_coordinator.py) and, since a parameter is not
  released while it recurs within ``stage3_max_reuse_distance`` elements of the trace, the last R/2 elements of
  the model (all of it below 5e8 elements per rank at the 1e9 default), and the small persistent parameters
  (``param_persistence_threshold``) kept whole. No gradient exists yet: the engine's
  ``zero_grad`` (engine.py `zero_grad(set_to_none=True)`; stage_1_and_2.py `zero_grad`, stage3.py `zero_grad`)
  dropped them after the last step.
* ``forward_loss`` - ``forward_end`` + the loss's temporaries: the logits (and their ``.float()`` copy) beside
  the fp32 log-probabilities (stage_activations.py ``loss_forward_transient``); measured as the forward's maximum.
* ``backward_loss`` - ``forward_end`` + log_softmax backward's two fp32 [tokens, vocab] tensors, while every
  saved activation is alive (stage_activations.py ``loss_backward_transient``); measured as backward's maximum.
* ``backward_start`` - backward reaches the last block: the LM head's and loss's saved tensors are freed, the
  head's gradients exist (stage 0/1), the reduce buckets are allocated (stage 1/2), and at stage 2 the rank
  whose partition holds the head has its whole ``grads_in_partition`` buffer (stage_1_and_2.py
  `copy_grads_in_partition` allocates it on the first copy).
* ``backward_recompute`` - with checkpointed blocks: ``backward_start`` + one block re-run (its full
  activations).
* ``backward_end`` - activations freed; gradients at their backward peak (§5.2 P_g: full gradients at stage 0/1,
  the partition buffer ``grads_in_partition`` at stage 2, stage_1_and_2.py `copy_grads_in_partition`), the
  reduce buckets (``ipg_buckets``, 2 with ``overlap_comm``; the DDP path's flattened all-reduce bucket, engine.py
  `buffered_allreduce_fallback`), and at ZeRO-3 the gathered parameters of the first blocks.
* ``optimizer_step`` - model states inside the inner optimizer's ``step()``: fp32 gradient partitions or flat
  copies, stage 3's persistent ``grad_partitions_flat_buffer`` (stage3.py), params repartitioned first
  (stage3.py `step` -> `_partition_all_parameters`), + the inner optimizer's temporaries per implementation
  (step_temporaries.py: torch AdamW's for-loop holds 2 fp32 copies of the largest tensor it steps, which under
  ZeRO-1/2 is the whole flat partition; foreach 1 copy of a group; fused, DeepSpeed FusedAdam and DeepSpeedCPUAdam
  none). Without the temporaries this is the point benchmarks/memory_fidelity.py measures.
* ``grad_norm`` - ZeRO-1/2: the global norm walks the partition's gradients, one fp64 copy at a time
  (stage_1_and_2.py `get_grad_norm_direct`), with ``grads_in_partition`` alive.
* ``optimizer_step_cast`` - ZeRO-1/2: the short peak while one param group's gradients are flattened in model
  dtype and cast to fp32 (stage_1_and_2.py `step`: `flatten(...)` then `.to(fp32)`, the flat copy freed after).
* ``offload_step`` - optimizer offload: the CPU optimizer steps host-resident fp32 partitions while the device
  holds only the working weights and its staging buffer (stage_1_and_2.py `temp_grad_buffer_for_gpu_offload`).

Two terms cut across the phases: Transformer Engine's TP comm-overlap userbuffers (te_userbuffers.py) are held in
every phase; ZeRO++ hpZ's secondary parameter partition (zero_states._hpz_secondary) grows as forward and backward
release parameters and is whole at the step, after which DeepSpeed drops it.

Host (offload) terms are listed in every phase with ``where="host"``; they persist across the step.
`sum_of_parts_bytes` (each category at its own maximum, the pre-issue-#15 "total") is kept as an upper bound.

`device_allowance_bytes` is what a layout must leave free beyond its tensors: the CUDA context and NCCL
communicator buffers (GPU_CONTEXT_BYTES). No caching-allocator fragmentation allowance is added: no published
figure for one was found (PyTorch's CUDA-semantics notes describe fragmentation and the expandable_segments setting
that reduces it, without a fraction), and the 5% this module assumed before made the estimator refuse layouts the
published sources ran (benchmarks/results/published_runs_202612.md, issue 16).

No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate.step_temporaries import IMPLEMENTATIONS

GiB = 2**30

GPU_CONTEXT_BYTES = GiB
"""CUDA context, kernel images and NCCL communicators per GPU process: 1 GiB. A PyTorch process holds ~0.75 GiB of
device memory after CUDA initialisation before any tensor (pytorch/pytorch#34323 reports 781 MB in nvidia-smi
for an otherwise empty process; lazy module loading, CUDA_MODULE_LOADING=LAZY, lowers it), and each NCCL
communicator allocates NCCL_BUFFSIZE (default 4 MiB, NCCL environment-variable docs) per channel and peer for
send and receive: with 2 peers x up to 32 channels ~0.25 GiB for the data-parallel communicator. Not measured
here (no GPU in this project's CI)."""
CPU_ALLOWANCE_BYTES = 0
"""CPU ranks: 0. There is no device context, and glibc returns the large tensor buffers (above its 128 KiB
mmap threshold) to the OS on free, so there is no caching-allocator slack to plan for; the interpreter and
libraries' own resident memory is not tensor memory and is not what `fits` compares (the peak-memory
benchmark measures tensor storages only)."""


@dataclass(frozen=True)
class Term:
    """Bytes of one thing alive in a phase."""

    name: str
    bytes: int
    source: str
    """Where the term comes from (paper section or DeepSpeed 0.19.8 source)."""
    where: str = "device"
    """device | host (offloaded)."""


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]

    @property
    def device_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.where == "device")

    @property
    def host_bytes(self) -> int:
        return sum(t.bytes for t in self.terms if t.where == "host")

    def alive(self, min_fraction: float = 0.0) -> list[str]:
        """Names of the device terms, largest first (terms under `min_fraction` of the phase are left out)."""
        total = max(1, self.device_bytes)
        ts = sorted((t for t in self.terms if t.where == "device" and t.bytes > 0), key=lambda t: -t.bytes)
        return [t.name for t in ts if t.bytes / total >= min_fraction]


@dataclass(frozen=True)
class Timeline:
    phases: tuple[Phase, ...]
    sum_of_parts_bytes: int
    """Upper bound: every category at its own maximum, added (not a peak)."""

    @property
    def peak_phase(self) -> Phase:
        """The phase with the most device bytes (host bytes break ties)."""
        return max(self.phases, key=lambda p: (p.device_bytes, p.host_bytes))

    @property
    def peak_bytes(self) -> int:
        """Peak device bytes per rank: max over phases."""
        return self.peak_phase.device_bytes

    @property
    def peak_with_host_bytes(self) -> int:
        """Max over phases of device + host bytes (one RAM on a CPU-only machine)."""
        return max(p.device_bytes + p.host_bytes for p in self.phases)


S_PARAMS = "ZeRO §5.3 (P_p); memory.py deepspeed_model_states: flat low-precision buffer (stage_1_and_2.py / bf16_optimizer.py, padded to 2·N) or stage-3 partitions (partition_parameters.py _aligned_size)"
S_MASTER = "ZeRO §3.1/§5.1 (P_os): fp32 master weights, full or the rank's partition (stage_1_and_2.py single_partition_of_fp32_groups, stage3.py fp32_partitioned_groups_flat)"
S_STATES = "ZeRO §3.1 K·Ψ (Adam exp_avg + exp_avg_sq, fp32), created at the first step() and kept"
S_PERSIST = "stage3.py _setup_for_real_optimizer ipg bucket (reduce_bucket_size); stage_1_and_2.py temp_grad_buffer_for_gpu_offload (largest param, offload)"
S_GRAD_BUF = "stage3.py grad_partitions_flat_buffer (sum of partition numels, allocated once)"
S_FP8 = "Transformer Engine fp8 weight copies (memory.py fp8_weight_cache_bytes)"
S_ACT = "stage_activations.py activation_bytes (Korthikanti et al. §4 reasoning, itemised for the block as implemented)"
S_RECOMP = "activations.py: the full activations of one checkpointed block while it re-runs in backward"
S_GATHER = "stage3.py partitioned_param_coordinator: gathered params (<= stage3_max_live_parameters, prefetch bucket, one layer) + params <= param_persistence_threshold kept whole"
S_KEPT = "partitioned_param_coordinator.py __params_to_release: params that recur within stage3_max_reuse_distance (default 1e9 elements) are not released after forward; ~the last R/2 elements of the model stay gathered into backward"
S_GRADS_START = "the LM head's .grad (stage 0/1); stage 2: grads_in_partition, allocated whole at the first copy (stage_1_and_2.py copy_grads_in_partition) on the rank owning the tail partition"
S_GRADS_BWD = "ZeRO §5.2 (P_g); stage 0/1: full .grad tensors until reduction; stage 2: grads_in_partition (stage_1_and_2.py copy_grads_in_partition); bf16_optimizer.py fp32_groups_gradients_flat"
S_GRADS_ACC = "gradient accumulation: earlier micro steps' gradients (stage 0/1: full .grad until the boundary, engine.py allreduce_gradients; stage 2: grads_in_partition; BF16_Optimizer: the kept bf16 .grad)"
S_BUCKETS = "stage_1_and_2.py ipg_buckets (reduce_bucket_size, x2 with overlap_comm); engine.py buffered_allreduce_fallback flatten (stage 0)"
S_GRADS_STEP = "stage_1_and_2.py step: fp32 copy of one group's gradient partition (single_grad_partition) + grads_in_partition while a later group still holds views; stage3.py: fp32 copy of one sub_group; fused/unfused_optimizer.py fp32 grads"
S_CAST = "stage_1_and_2.py step: flatten(averaged_gradients) in model dtype, then .to(fp32); both alive for one line"
S_LOSS_FWD = "stage_activations.py loss_forward_transient: logits + their fp32 copy beside the fp32 log-softmax output (F.cross_entropy(logits.float()))"
S_LOSS_BWD = "stage_activations.py loss_backward_transient: log_softmax backward's fp32 grad_output and grad_input [tokens, vocab/tp]"
S_OPT_TMP = "step_temporaries.py: the inner optimizer's temporaries per implementation (torch/optim/adam.py _single_tensor_adam: 2 fp32 copies of the largest stepped tensor, e.g. ZeRO-1/2's flat partition; _multi_tensor_adam: 1 copy of a group; fused / DeepSpeed FusedAdam / DeepSpeedCPUAdam: none)"
S_NORM = "stage_1_and_2.py get_grad_norm_direct: fp64 copy (zero/utils.py get_norm_dtype) of the largest partition gradient, with grads_in_partition alive"
S_PIPE = "stage_activations.py deepspeed_pipe_logits: the last stage's pipe buffers keep the logits of its last 2 micro batches (pipe/engine.py _exec_backward_pass returns before releasing them)"
S_HPZ = ("ZeRO++ hpZ (arXiv 2306.10209 §3.2) secondary partition: partition_parameters.py _partition_param_sec "
         "(_aligned_size // num_ranks_in_param_group, model dtype), made as params are partitioned, dropped after "
         "each step (stage3.py _post_step -> invalidate_secondary_tensor)")
S_UB = ("Transformer Engine TP comm-overlap userbuffers (te_userbuffers.py: transformer_engine/pytorch/module/base.py "
        "initialize_ub), allocated at start-up and held")
S_HOST = "offload: host fp32 master + moments + fp32 grad partition + staging (stage_1_and_2.py / stage3.py offload_optimizer)"


def _t(name: str, n: float, src: str, where: str = "device") -> Term:
    return Term(name, int(n), src, where)


def memory_timeline(ms, act, *, zero_stage: int, offload_optimizer: bool, fp8_cache: int = 0,
                    head_activations: float = 0.0, accumulating: bool = False,
                    tp_overlap_buffers: int = 0) -> Timeline:
    """Phases of one steady-state training step on one rank (see the module docstring).

    Args:
        ms: `memory.ModelStates` for the rank.
        act: `stage_activations.ActivationEstimate` for the rank.
        zero_stage: the plan's ZeRO stage.
        offload_optimizer: optimizer states on the host.
        fp8_cache: fp8 weight copies (Transformer Engine), bytes.
        head_activations: saved bytes of the final norm, LM head and loss (freed before the first block's
            backward, so not alive while a checkpointed block re-runs).
        accumulating: the step runs several micro steps: the forward and backward phases are those of the last
            one, with the gradients the earlier ones left (`ModelStates.grads_between_micro_steps`).
        tp_overlap_buffers: Transformer Engine's TP comm-overlap userbuffers (te_userbuffers.py), bytes, alive in
            every phase.

    Returns:
        The Timeline; `peak_bytes` is the max over phases, `sum_of_parts_bytes` the old additive total.
    """
    grad_buf = getattr(ms, "grads_persistent", 0)
    base = [_t("params", ms.params, S_PARAMS), _t("master_params", ms.master_params, S_MASTER),
            _t("optimizer_states", ms.optimizer_states, S_STATES)]
    if ms.persistent_buffers:
        base.append(_t("persistent_buffers", ms.persistent_buffers, S_PERSIST))
    if grad_buf:
        base.append(_t("grad_partition_buffer", grad_buf, S_GRAD_BUF))
    if fp8_cache:
        base.append(_t("fp8_weight_cache", fp8_cache, S_FP8))
    if tp_overlap_buffers:
        base.append(_t("tp_overlap_userbuffers", tp_overlap_buffers, S_UB))
    if getattr(act, "pipe_buffers", 0):
        base.append(_t("pipe_buffers", act.pipe_buffers, S_PIPE))
    host = [_t(n, v, S_HOST, "host") for n, v in (
        ("host_params", ms.host_params), ("host_master_params", ms.host_master_params),
        ("host_optimizer_states", ms.host_optimizer_states), ("host_grads", ms.host_grads),
        ("host_buffers", ms.host_buffers)) if v]
    if getattr(ms, "host_hpz_secondary_params", 0):
        host.append(_t("host_hpz_secondary_params", ms.host_hpz_secondary_params, S_HPZ, "host"))

    def hpz(n: int) -> list:
        """The hpZ secondary partition alive in a phase (`n` bytes; nothing without hpZ)."""
        return [_t("hpz_secondary_params", n, S_HPZ)] if n else []
    hpz_fwd = hpz(getattr(ms, "hpz_secondary_forward_end", 0))
    hpz_bwd = hpz(getattr(ms, "hpz_secondary_backward", 0))
    hpz_step = hpz(getattr(ms, "hpz_secondary_params", 0))
    gathered = [_t("gathered_stage3_params", ms.transient_buffers, S_GATHER)] if zero_stage == 3 else []
    kept = [_t("gathered_stage3_params", max(ms.gathered_forward_end, ms.transient_buffers), S_KEPT)] \
        if zero_stage == 3 else []
    saved = _t("activations_saved", act.saved, S_ACT)
    between = getattr(ms, "grads_between_micro_steps", 0) if accumulating else 0
    acc = [_t("grads_accumulated", between, S_GRADS_ACC)] if between else []
    phases = [Phase("forward_end", tuple(base + [saved] + acc + kept + hpz_fwd + host))]
    loss_fwd = getattr(act, "loss_forward_transient", 0.0)
    if loss_fwd > 0:
        phases.append(Phase("forward_loss", tuple(base + [saved, _t("loss_temporaries", loss_fwd, S_LOSS_FWD)]
                                                  + acc + kept + hpz_fwd + host)))
    loss_bwd = getattr(act, "loss_backward_transient", 0.0)
    if loss_bwd > 0:
        phases.append(Phase("backward_loss", tuple(base + [saved, _t("loss_temporaries", loss_bwd, S_LOSS_BWD)]
                                                   + acc + kept + hpz_fwd + host)))
    buckets = [] if zero_stage == 3 else [_t("reduce_buckets", ms.transient_buffers, S_BUCKETS)]
    # the last block's backward: head/loss activations freed, the head's gradients (and stage 1/2 buckets) exist
    start = base + [_t("activations_saved", max(0.0, act.saved - head_activations), S_ACT),
                    _t("grads", max(ms.grads_backward_start, between), S_GRADS_START)] + \
        (buckets if zero_stage in (1, 2) else []) + kept + hpz_fwd
    phases.append(Phase("backward_start", tuple(start + host)))
    if act.recompute_transient > 0:
        phases.append(Phase("backward_recompute", tuple(
            start + [_t("recompute_block", act.recompute_transient, S_RECOMP)] + host)))
    grads_bwd = max(0, ms.grads_backward_peak - grad_buf)
    phases.append(Phase("backward_end", tuple(
        base + [_t("grads", grads_bwd, S_GRADS_BWD)] + buckets + gathered + hpz_bwd + host)))
    grads_step = max(0, ms.grads_at_step - grad_buf)
    norm_tmp = getattr(ms, "grad_norm_temporaries", 0)
    if norm_tmp:
        phases.append(Phase("grad_norm", tuple(base + [_t("grads", ms.grads_at_norm, S_GRADS_BWD),
                                                      _t("grad_norm_temporaries", norm_tmp, S_NORM)] + hpz_step
                                               + host)))
    opt_src = f"{IMPLEMENTATIONS.get(getattr(ms, 'optimizer_impl', ''), 'inner optimizer')}: {S_OPT_TMP}"
    opt_tmp = [_t("optimizer_temporaries", ms.optimizer_temporaries, opt_src)] \
        if getattr(ms, "optimizer_temporaries", 0) else []
    phases.append(Phase("optimizer_step", tuple(
        base + [_t("grads_at_step", grads_step, S_GRADS_STEP)] + opt_tmp + hpz_step + host)))
    if ms.grads_step_transient_peak > ms.grads_at_step:
        phases.append(Phase("optimizer_step_cast", tuple(
            base + [_t("grads_cast", ms.grads_step_transient_peak - grad_buf, S_CAST)] + hpz_step + host)))
    if offload_optimizer:
        dev = [t for t in base if t.name in ("params", "persistent_buffers", "fp8_weight_cache",
                                             "grad_partition_buffer", "pipe_buffers", "tp_overlap_userbuffers")]
        dev += hpz_step
        host_tmp = [_t("host_optimizer_temporaries", ms.host_optimizer_temporaries, opt_src, "host")] \
            if getattr(ms, "host_optimizer_temporaries", 0) else []
        phases.append(Phase("offload_step", tuple(dev + host + host_tmp)))
    grads_max = max(ms.grads_at_step, ms.grads_backward_peak, ms.grads_step_transient_peak)
    sum_parts = (ms.params + grads_max + ms.master_params + ms.optimizer_states + int(act.peak)
                 + ms.persistent_buffers + ms.transient_buffers + fp8_cache + tp_overlap_buffers
                 + getattr(ms, "hpz_secondary_params", 0)
                 + max(getattr(ms, "optimizer_temporaries", 0), norm_tmp, loss_fwd, loss_bwd))  # step temporaries
    return Timeline(tuple(phases), int(sum_parts))


def is_cpu_device(gpu) -> bool:
    """The hardware table's CPU rows (name "cpu..."): ranks whose 'device' memory is host RAM."""
    return str(getattr(gpu, "name", "")).lower().startswith("cpu")


def device_allowance_bytes(gpu, peak_bytes: int) -> int:
    """Bytes a rank needs beyond its tensor peak: GPU_CONTEXT_BYTES on GPUs, CPU_ALLOWANCE_BYTES on CPU ranks (see
    those constants for the sources; no fragmentation allowance, see the module docstring). `peak_bytes` is kept
    for callers: the allowance does not depend on it."""
    del peak_bytes
    if is_cpu_device(gpu):
        return CPU_ALLOWANCE_BYTES
    return int(GPU_CONTEXT_BYTES)


def allowance_source(gpu) -> str:
    if is_cpu_device(gpu):
        return "CPU rank: no device context or caching allocator (timeline.CPU_ALLOWANCE_BYTES)"
    return f"CUDA context + NCCL buffers {GPU_CONTEXT_BYTES / GiB:.2f} GiB (timeline.GPU_CONTEXT_BYTES)"


__all__ = ["Term", "Phase", "Timeline", "memory_timeline", "device_allowance_bytes", "allowance_source",
           "is_cpu_device", "GPU_CONTEXT_BYTES", "CPU_ALLOWANCE_BYTES"]
