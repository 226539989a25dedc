"""Per-rank memory: model states as DeepSpeed 0.19.8 really allocates them, the ZeRO paper's 16Ψ view, and buffers.

Two accountings live here, deliberately separate:

* `paper_model_states` (paper_view.py) — ZeRO §3.1: 2Ψ weights + 2Ψ grads + KΨ optimizer (K = 12), divided by N per stage.
* `deepspeed_model_states` — what DeepSpeed 0.19.8's code allocates, read from its source
  (runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/bf16_optimizer.py,
  runtime/fp16/fused_optimizer.py, runtime/fp16/unfused_optimizer.py, runtime/engine.py):
  - stage 1 shares stage 2's class (DeepSpeedZeroOptimizer): fp32 master *partition* (4Ψ/N, a clone even in
    fp32 training), gradients reduced into a partition buffer `grads_in_partition` (params intersecting the
    partition, model dtype) and, at step, an fp32 flat copy per param group;
  - the flat low-precision parameter buffer is padded to a multiple of 2·N elements per param group;
  - optimizer state is created lazily at the first `step()` (Adam: exp_avg + exp_avg_sq, fp32);
  - bf16 at stage 0 uses FP16_Optimizer / FP16_UnfusedOptimizer (full fp32 master, engine.py
    `_do_optimizer_sanity_check` → DDP_BFLOAT16) unless data_types.grad_accum_dtype = fp32, which selects
    BF16_Optimizer (full fp32 gradient buffer + fp32 master partition); the same for stage 1 + bf16 + fp32
    gradient accumulation without offload;
  - stage 3: every parameter padded to a multiple of N and partitioned, small params (≤ param_persistence_
    threshold) kept whole on every rank, a persistent flat gradient-partition buffer, a persistent reduce
    bucket, and gathered ("live") parameters during forward/backward;
  - MoE: expert parameters sit in their own param group, partitioned over the expert-data-parallel group
    (dp / ep); with ZeRO-2 their gradients are reduced over that group as well (DeepSpeed issue #7156).

No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dstoolkit.estimate.dtype_bytes import (  # noqa: F401 - re-exported
    FP32_BYTES, OPTIMIZER_STATE_BYTES_PER_PARAM, optimizer_state_bytes_per_param, param_bytes)
from dstoolkit.estimate.paper_view import (  # noqa: F401 - re-exported (moved out to keep this file short)
    ZERO_PAPER_GRAD_BYTES, ZERO_PAPER_K, ZERO_PAPER_WEIGHT_BYTES, PaperView, paper_model_states)
from dstoolkit.estimate.param_groups import (  # noqa: F401 - re-exported (moved out to keep this file short)
    FP8_WEIGHT_CACHE_BYTES_PER_PARAM, NCCL_START_ALIGNMENT_FACTOR, ParamEntry, _expert_index, _padded,
    _partition_grad_numels, fp8_weight_cache_bytes, head_grad_numel, rank_param_groups)
from dstoolkit.estimate.step_temporaries import (
    grad_norm_temporary_bytes, optimizer_implementation, optimizer_temporary_bytes)
from dstoolkit.runplan import RunPlan


# ---------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------


@dataclass
class ModelStates:
    """Model-state bytes on one rank (device unless named host_*), split the way DeepSpeed allocates them."""

    optimizer_path: str
    """Which DeepSpeed class holds the states: basic, fp16_fused, fp16_unfused, bf16_optimizer, zero12, zero3."""
    params: int = 0
    """Working (model-dtype) parameters on the device (flat buffer incl. padding; stage 3: partition + persistent)."""
    master_params: int = 0
    """fp32 master weights (full or partition)."""
    optimizer_states: int = 0
    """Optimizer moments (created lazily at the first step)."""
    grads_at_step: int = 0
    """Gradient bytes alive while the inner optimizer steps (partition buffer + fp32 flat copy)."""
    grads_backward_peak: int = 0
    """Gradient bytes at the end of backward, before reduction / partitioning (full grads at stage 0/1)."""
    grads_backward_start: int = 0
    """Gradient bytes alive when backward reaches the last block (the LM head's gradients exist): its .grad at
    stage 0/1; at stage 2 the partition buffer grads_in_partition on the rank whose partition holds the
    last-registered parameters (stage_1_and_2.py copy_grads_in_partition allocates it on the first copy); 0 at
    stage 3 (its gradient buffers persist)."""
    grads_step_transient_peak: int = 0
    """Gradient bytes at their short peak inside step() (partition buffer + flat copy + fp32 copy)."""
    grads_between_micro_steps: int = 0
    """Gradient bytes the earlier micro steps of an accumulation leave alive while a later one runs its forward
    and backward (beyond grads_persistent): the full .grad tensors at stage 0/1 and under the fp16 optimizers,
    which reduce only at the accumulation boundary (engine.py allreduce_gradients: "Communicate only at gradient
    accumulation boundaries"); stage 2's partition buffer grads_in_partition, filled every micro step; the bf16
    .grad tensors BF16_Optimizer keeps (bf16.immediate_grad_update false); 0 at stage 3 and with offloaded stage 2
    (host buffers). Counted only when the plan accumulates (memory_timeline accumulating)."""
    grads_persistent: int = 0
    """Part of the gradient bytes allocated once and kept across steps (stage 3's grad_partitions_flat_buffer);
    included in grads_at_step and grads_backward_peak."""
    persistent_buffers: int = 0
    """Buffers that stay allocated across steps (stage-3 reduce bucket, offload staging buffers)."""
    transient_buffers: int = 0
    """Peak buffers that exist only inside backward/step (ZeRO-1/2 reduce buckets, DDP all-reduce flatten; stage 3:
    the parameters gathered around the running module, plus the persistent small ones)."""
    gathered_forward_end: int = 0
    """Stage 3: parameters still gathered at the end of forward (kept for reuse in backward)."""
    host_params: int = 0
    host_master_params: int = 0
    host_optimizer_states: int = 0
    host_grads: int = 0
    host_buffers: int = 0
    optimizer_impl: str = ""
    """The Adam implementation the inner optimizer steps with (step_temporaries.IMPLEMENTATIONS)."""
    optimizer_temporaries: int = 0
    """Peak temporaries inside the inner optimizer's step() on the device (step_temporaries.py)."""
    host_optimizer_temporaries: int = 0
    """The same on the host, when the optimizer steps offloaded tensors."""
    grad_norm_temporaries: int = 0
    """ZeRO-1/2: the fp64 copy of the largest partition gradient while the global norm is computed."""
    grads_at_norm: int = 0
    """Gradient bytes alive while ZeRO-1/2 computes the norm (the partition buffer grads_in_partition)."""
    notes: list[str] = field(default_factory=list)

    @property
    def device_at_step(self) -> int:
        """Device model-state bytes alive during the optimizer step (what the fidelity benchmark measures)."""
        return self.params + self.master_params + self.optimizer_states + self.grads_at_step + self.persistent_buffers

    @property
    def host_total(self) -> int:
        return self.host_params + self.host_master_params + self.host_optimizer_states + self.host_grads + self.host_buffers

    @property
    def all_at_step(self) -> int:
        """Device + host model-state bytes at the step (on a CPU-only machine both are the same RAM)."""
        return self.device_at_step + self.host_total


def zero_group_sizes(plan: RunPlan) -> tuple[int, int]:
    """(dense, expert) group sizes ZeRO partitions over and reduces gradients across: the data-parallel ranks
    times the ranks one sequence is sharded over (cp x Ulysses), which hold the same parameters. Megatron-Core's
    distributed optimizer and gradient buffers use the data-parallel group *with* context parallelism
    (parallel_state.get_data_parallel_group(with_context_parallel=True)); DeepSpeed-Ulysses partitions ZeRO over
    the sequence-data-parallel group (Jacobs et al. 2023, §3.3: ZeRO-3 across data and sequence parallel ranks)."""
    cpu = str(getattr(plan.gpu, "name", "")).lower().startswith("cpu")
    shards = 1 if cpu else plan.cp * plan.ulysses  # GPU path only: CPU estimates stay as calibrated
    return plan.dp * shards, plan.edp * shards


def _accumulates_in_fp32(ds) -> bool:
    """data_types.grad_accum_dtype asks for fp32 gradient accumulation."""
    return ds.grad_accum_dtype in ("fp32", "float32", "float")


def optimizer_path(plan: RunPlan) -> str:
    """The DeepSpeed class that holds the plan's optimizer states (ModelStates.optimizer_path), as DeepSpeed
    0.19.8's engine picks it (engine.py _do_optimizer_sanity_check / _configure_optimizer)."""
    ds = plan.ds
    p = plan.precision
    lowp = p in ("bf16", "fp16", "fp8")
    grad_fp32 = _accumulates_in_fp32(ds)
    if ds.zero_stage == 3:
        return "zero3"
    if ds.zero_stage in (1, 2):
        # engine.py _do_optimizer_sanity_check: bf16 + fp32 grad accumulation at stage 1 (no offload) -> BF16_Optimizer
        if ds.zero_stage == 1 and p in ("bf16", "fp8") and grad_fp32 and not ds.offload_optimizer:
            return "bf16_optimizer"
        return "zero12"
    if not lowp:
        return "basic"
    # engine.py at stage 0: bf16 with the pipeline engine -> BF16_Optimizer (bf16 accumulation); a grad_accum_dtype
    # other than the model's raises NotImplementedError (rule DS229), which this path does not model
    if p in ("bf16", "fp8") and (grad_fp32 or plan.pp > 1):
        return "bf16_optimizer"
    fused = ds.optimizer_type in ("adam", "adamw", "fusedadam") and not ds.torch_adam
    return "fp16_fused" if fused else "fp16_unfused"


def deepspeed_model_states(plan: RunPlan, rank: int | None = None) -> ModelStates:
    """Model-state bytes on one rank as DeepSpeed 0.19.8 allocates them, with the step's temporaries
    (`step_temporaries.py`: the inner optimizer per implementation, the ZeRO-1/2 gradient norm).

    Args:
        plan: the run.
        rank: data-parallel rank to account for exactly (partition boundaries differ per rank);
            None gives the worst rank.

    Returns:
        ModelStates with device and host parts.
    """
    ms = _model_states(plan, rank)
    _add_step_temporaries(plan, ms, rank)
    return ms


DDP_ALLREDUCE_BUCKET_NUMEL = 500_000_000
"""engine.py MEMORY_OPT_ALLREDUCE_SIZE: `allreduce_gradients()` is called from `engine.backward` without a
bucket size, so the stage-0 path (`buffered_allreduce_fallback` -> `allreduce_no_retain`) flattens up to 5e8
elements per dtype whatever reduce_bucket_size says (a bucket closes once it holds more than that)."""


def _ddp_bucket_numel(numels: list[int]) -> int:
    """engine.py allreduce_no_retain: the largest flattened bucket (tensors appended until numel > 5e8)."""
    best = cur = 0
    for n in numels:
        cur += n
        if cur > DDP_ALLREDUCE_BUCKET_NUMEL:
            best, cur = max(best, cur), 0
    return max(best, cur)


def _stepped_numels(plan: RunPlan, path: str, groups: list[list[int]], group_dp: list[int]) -> list[list[int]]:
    """The fp32 tensors the inner optimizer updates, per step() call (see step_temporaries.py)."""
    ds = plan.ds
    if path in ("basic", "fp16_unfused"):
        return [list(g) for g in groups]  # every parameter (its fp32 copy), one param group per call
    if path == "fp16_fused":
        return [[sum(g)] for g in groups]  # fused_optimizer.py fp32_groups_flat: one flat master per group
    if path in ("bf16_optimizer", "zero12"):
        # one flat fp32 partition per group (bf16_optimizer.py fp32_groups_flat_partition; stage_1_and_2.py
        # single_partition_of_fp32_groups, stepped one group at a time by _optimizer_step)
        return [[_padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp) // dp] for g, dp in zip(groups, group_dp)]
    # stage 3: stage3.py fp32_partitioned_groups_flat, one sub-group (<= sub_group_size elements) per call
    out = []
    for g, dp in zip(groups, group_dp):
        part = sum(_padded(n, dp) // dp for n in g)
        while part > 0:
            out.append([min(part, ds.sub_group_size)])
            part -= ds.sub_group_size
    return out


def _add_step_temporaries(plan: RunPlan, ms: ModelStates, rank: int | None) -> None:
    ds = plan.ds
    on_cpu = str(getattr(plan.gpu, "name", "")).lower().startswith("cpu")
    offload = bool(ds.offload_optimizer) and ms.optimizer_path in ("zero12", "zero3")
    impl = optimizer_implementation(ds.optimizer_type, ds.torch_adam, ds.torch_adam_foreach, ds.torch_adam_fused,
                                    offload, on_cpu or offload)
    groups = rank_param_groups(plan)
    group_dp = list(zero_group_sizes(plan))[:len(groups)]
    temp = optimizer_temporary_bytes(impl, _stepped_numels(plan, ms.optimizer_path, groups, group_dp),
                                     ds.adam_l2_weight_decay)
    ms.optimizer_impl = impl
    if offload:
        ms.host_optimizer_temporaries = temp
    else:
        ms.optimizer_temporaries = temp
    if ms.optimizer_path == "zero12" and not ds.offload_optimizer:
        # get_grad_norm_direct walks averaged_gradients (the rank's slices of grads_in_partition)
        largest = 0
        for g, dp in zip(groups, group_dp):
            part = _padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp) // dp
            largest = max(largest, min(part, max(g, default=0)))
        ms.grad_norm_temporaries = grad_norm_temporary_bytes(largest)


def _model_states(plan: RunPlan, rank: int | None) -> ModelStates:
    ds = plan.ds
    pb = param_bytes(plan.precision)
    sb = optimizer_state_bytes_per_param(ds.optimizer_type)
    groups = rank_param_groups(plan)
    group_dp = list(zero_group_sizes(plan))[:len(groups)]
    path = optimizer_path(plan)
    ms = ModelStates(optimizer_path=path)
    largest = max((n for g in groups for n in g), default=0)
    raw = sum(sum(g) for g in groups)
    ms.grads_backward_start = head_grad_numel(plan) * pb if ds.zero_stage < 2 else 0

    if path == "basic":
        ms.params = raw * pb
        ms.grads_at_step = raw * pb
        ms.grads_backward_peak = raw * pb
        ms.grads_between_micro_steps = raw * pb
        ms.optimizer_states = raw * sb
        # engine.allreduce_gradients -> buffered_allreduce_fallback flattens up to 5e8 elements per bucket
        ms.transient_buffers = _ddp_bucket_numel([n for g in groups for n in g]) * pb
        return ms

    if path in ("fp16_fused", "fp16_unfused"):
        ms.params = raw * pb
        ms.master_params = raw * FP32_BYTES
        ms.optimizer_states = raw * sb
        ms.grads_backward_peak = raw * pb
        ms.grads_between_micro_steps = raw * pb
        if path == "fp16_fused":
            # fused_optimizer.py step: grads flattened into an fp32 flat buffer, low-precision grads freed
            ms.grads_at_step = raw * FP32_BYTES
        else:
            # unfused_optimizer.py step: fp32 copy of every grad, low-precision grads kept until zero_grad
            ms.grads_at_step = raw * (pb + FP32_BYTES)
        # engine.allreduce_gradients -> buffered_allreduce_fallback flattens up to 5e8 elements per bucket
        ms.transient_buffers = _ddp_bucket_numel([n for g in groups for n in g]) * pb
        return ms

    if path == "bf16_optimizer":
        # bf16_optimizer.py: fp32_groups_gradients_flat is a full-size buffer of grad_acc_dtype
        # (`torch.zeros_like(bf16_groups_flat[i], dtype=self.grad_acc_dtype)`), which the engine passes as
        # data_types.grad_accum_dtype, else the model dtype (engine.get_data_types): fp32 only when asked for.
        # Megatron-LM (this path's stand-in for its non-distributed optimizer) always accumulates bf16 gradients
        # in an fp32 main_grad buffer (arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be
        # done in fp32", accumulate_allreduce_grads_in_fp32 forced on)
        acc = FP32_BYTES if _accumulates_in_fp32(ds) or plan.framework != "deepspeed" else pb
        for g, dp in zip(groups, group_dp):
            padded = _padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp)
            part = padded // dp
            ms.params += padded * pb
            ms.master_params += part * FP32_BYTES
            ms.optimizer_states += part * sb
            ms.grads_at_step += padded * acc
            ms.grads_persistent += padded * acc  # allocated in __init__, kept
        if not ds.bf16_immediate_grad_update:
            # backward_epilogue(clear_lp_grads=False): the bf16 .grad tensors live until clear_lp_grads() at the
            # end of step() (bf16.immediate_grad_update=false, the default)
            ms.grads_at_step += raw * pb
            ms.grads_between_micro_steps = raw * pb
        ms.grads_backward_peak = ms.grads_at_step
        return ms

    if path == "zero12":
        return _zero12(plan, ms, groups, group_dp, pb, sb, largest, rank)
    return _zero3(plan, ms, groups, group_dp, pb, sb, rank)


def _zero12(plan, ms, groups, group_dp, pb, sb, largest, rank) -> ModelStates:
    ds = plan.ds
    grad_dtype_bytes = pb
    grads_in_partition = 0
    fp32_parts: list[int] = []
    flat_peak = 0
    for g, dp in zip(groups, group_dp):
        padded = _padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp)
        part = padded // dp
        ms.params += padded * pb
        per_rank = _partition_grad_numels(g, dp)
        r = per_rank[rank % dp] if rank is not None else max(per_rank)
        if ds.offload_optimizer:
            ms.host_master_params += part * FP32_BYTES
            ms.host_optimizer_states += part * sb
            # initialize_optimizer_states: the fp32 grad partition stays allocated (pinned) under offload
            ms.host_grads += part * FP32_BYTES
            # param_buffer_of_bit16_for_cpu_offload_groups: model-dtype staging copy of the partition
            ms.host_buffers += part * pb
        else:
            ms.master_params += part * FP32_BYTES
            ms.optimizer_states += part * sb
            grads_in_partition += r
            fp32_parts.append(part * FP32_BYTES)
            # step(): flatten(averaged_gradients) makes a model-dtype flat copy, then `.to(fp32)`; in fp32
            # training `.to` returns the flat copy itself.
            flat_peak = max(flat_peak, part * pb if pb != FP32_BYTES else 0)
    bucket_count = 2 if ds.overlap_comm else 1
    buckets = bucket_count * ds.reduce_bucket_size * pb if ds.contiguous_gradients else 0
    full_grads = sum(sum(g) for g in groups) * pb
    if ds.offload_optimizer:
        # temp_grad_buffer_for_cpu_offload (host) and temp_grad_buffer_for_gpu_offload (device): largest param
        ms.host_buffers += largest * pb
        ms.persistent_buffers += largest * pb
        ms.grads_at_step = 0
        ms.grads_backward_peak = buckets if ds.zero_stage == 2 else full_grads
        ms.grads_between_micro_steps = 0 if ds.zero_stage == 2 else full_grads
    else:
        gip = grads_in_partition * grad_dtype_bytes
        # step() handles one param group at a time: it frees group i's low-precision grads before the inner
        # optimizer step, but the shared grads_in_partition storage stays alive while a later group still
        # holds views of it. So during group i's inner step: fp32 copy of group i (+ the buffer if i < last).
        last = len(fp32_parts) - 1
        ms.grads_at_step = max(f + (gip if i < last else 0) for i, f in enumerate(fp32_parts))
        # the short-lived peak while group i is flattened and cast: buffer + flat copy + fp32 copy
        ms.grads_step_transient_peak = gip + flat_peak + max(fp32_parts)
        ms.grads_between_micro_steps = gip if ds.zero_stage == 2 else full_grads
        if ds.zero_stage == 2:
            ms.grads_backward_peak = gip
            if rank is None or rank % group_dp[0] == group_dp[0] - 1:
                ms.grads_backward_start = gip  # this rank's partition holds the LM head: allocated at once
        else:
            # stage 1 keeps full gradients until reduce_gradients() at the accumulation boundary, which walks the
            # parameters in registration order (stage_1_and_2.py reduce_gradients ->
            # reduce_ready_partitions_and_remove_grads, freeing each .grad once reduced) and allocates
            # grads_in_partition at the first copy into this rank's partition (copy_grads_in_partition): the
            # gradients still alive then are those from the partition's start on.
            before = _numel_before_partition(groups[0], group_dp[0], rank)
            ms.grads_backward_peak = full_grads - before * pb + gip
        ms.grads_at_norm = gip
    ms.transient_buffers = buckets
    return ms


def _numel_before_partition(group: list[int], dp: int, rank: int | None) -> int:
    """Elements of the parameters lying wholly before `rank`'s partition of the flat buffer (0 for rank 0 and for
    the worst rank, None)."""
    if rank is None or dp <= 1:
        return 0
    part = _padded(sum(group), NCCL_START_ALIGNMENT_FACTOR * dp) // dp
    start = (rank % dp) * part
    out = offset = 0
    for n in group:
        if offset + n <= start:
            out += n
        offset += n
    return out


DS_STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
"""deepspeed/runtime/zero/config.py: stage3_max_reuse_distance default (elements)."""


def _stage3_max_reuse_distance(plan: RunPlan) -> int:
    z = (plan.ds_config or {}).get("zero_optimization") or {}
    v = z.get("stage3_max_reuse_distance", z.get("max_reuse_distance", DS_STAGE3_MAX_REUSE_DISTANCE))
    return int(v) if isinstance(v, (int, float)) else DS_STAGE3_MAX_REUSE_DISTANCE


def _zero3(plan, ms, groups, group_dp, pb, sb, rank) -> ModelStates:
    ds = plan.ds
    persist_numel = 0
    part_numel = 0
    for g, dp in zip(groups, group_dp):
        for n in g:
            # partition_parameters.py _aligned_size: each param padded to a multiple of the partition world size
            part_numel += _padded(n, dp) // dp
            if n <= ds.param_persistence_threshold:
                persist_numel += n
    if ds.offload_param:
        ms.host_params = part_numel * pb
    else:
        ms.params = part_numel * pb
    # Persistent (small) params are whole on every rank during forward/backward, but stage3.py step() calls
    # _partition_all_parameters() first, so at the optimizer step only partitions remain: count the whole
    # copies with the live (gathered) parameters.
    if ds.offload_optimizer:
        ms.host_master_params = part_numel * FP32_BYTES
        ms.host_optimizer_states = part_numel * sb
        # stage3.py initialize_optimizer_states: per-subgroup fp32 gradient buffer kept under offload, and the
        # flat grad-partition buffer lives on the offload device
        ms.host_grads = part_numel * FP32_BYTES + part_numel * pb
    else:
        ms.master_params = part_numel * FP32_BYTES
        ms.optimizer_states = part_numel * sb
        sub = min(part_numel, ds.sub_group_size)
        # grad_partitions_flat_buffer (model dtype, persistent) + fp32 flat copy of one sub-group at step
        ms.grads_at_step = part_numel * pb + sub * FP32_BYTES
        ms.grads_persistent = part_numel * pb
    ms.grads_backward_peak = part_numel * pb if not ds.offload_optimizer else 0
    # stage3.py _setup_for_real_optimizer: one reduce bucket per comm dtype, allocated once and kept
    if ds.contiguous_gradients:
        ms.persistent_buffers += ds.reduce_bucket_size * pb
    # gathered parameters while a module runs: bounded by max_live_parameters, at least the largest layer
    total_local = sum(sum(g) for g in groups)
    layer_numel = total_local / max(1, plan.shape.num_hidden_layers // plan.pp)
    live = min(ds.max_live_parameters, max(ds.prefetch_bucket_size + layer_numel, layer_numel), total_local)
    ms.transient_buffers = int(live) * pb + persist_numel * pb
    # partitioned_param_coordinator.py __params_to_release: a param recurring within stage3_max_reuse_distance (R)
    # elements of the trace is not released; at forward position x it recurs after ~2(P - x): the last R/2 stay.
    reuse = _stage3_max_reuse_distance(plan)
    ms.gathered_forward_end = (persist_numel + int(max(live, min(total_local - persist_numel, reuse // 2)))) * pb
    return ms


__all__ = [
    "ModelStates", "PaperView", "deepspeed_model_states", "paper_model_states", "rank_param_groups",
    "optimizer_state_bytes_per_param", "param_bytes", "fp8_weight_cache_bytes", "ParamEntry",
]
