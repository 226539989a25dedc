"""ZeRO's partitioned model states: what DeepSpeed 0.19.8's DeepSpeedZeroOptimizer (stage 1 and 2,
runtime/zero/stage_1_and_2.py) and DeepSpeedZeroOptimizer_Stage3 (runtime/zero/stage3.py,
partition_parameters.py, partitioned_param_coordinator.py) allocate on one rank, with and without offload.
`memory.deepspeed_model_states` picks the path (memory.optimizer_path) and adds the step's temporaries; the
unpartitioned paths (the engine's own, FP16_Optimizer, BF16_Optimizer) stay there. No torch import.
"""
from __future__ import annotations

from dstoolkit.estimate.dtype_bytes import FP32_BYTES
from dstoolkit.estimate.model_states import ModelStates
from dstoolkit.estimate.param_groups import NCCL_START_ALIGNMENT_FACTOR, _padded, _partition_grad_numels
from dstoolkit.runplan import RunPlan


def zero12_states(plan: RunPlan, ms: ModelStates, groups: list[list[int]], group_dp: list[int], pb: int, sb: float,
                  largest: int, rank: int | None) -> ModelStates:
    """Fill `ms` with what DeepSpeedZeroOptimizer (stage 1 and 2) allocates for the rank's param `groups`, each
    partitioned over its data-parallel size in `group_dp` (`pb` bytes per model-dtype element, `sb` optimizer-state
    bytes per parameter, `largest` the largest parameter's elements, `rank` None for the worst rank)."""
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
        # stage 2: a gradient lives in the reduce (ipg) buckets it is copied into (reduce_independent_p_g_buckets_
        # and_remove_grads: param.grad becomes a view of the bucket), which transient_buffers counts, then goes to
        # the host; beside them only the one autograd just produced (or an oversized one that bypasses the bucket)
        ms.grads_backward_peak = largest * pb if ds.zero_stage == 2 else full_grads
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


def stage3_sub_group_numels(groups: list[list[int]], group_dp: list[int], sub_group_size: int) -> list[int]:
    """Elements of each optimizer sub-group DeepSpeed 0.19.8's stage 3 steps (one fp32 flat partition per
    sub-group, `fp32_partitioned_groups_flat`), in order, for the rank's param `groups` partitioned over `group_dp`.

    stage3.py `_create_fp16_sub_groups` splits each param group by whole parameters, never inside one: it appends
    parameters to the current sub-group and closes it once the sum of their `partition_numel()` reaches
    `sub_group_size` (`>=`) or at the group's last parameter; a group of at most `sub_group_size` elements stays one
    sub-group. So a sub-group can exceed `sub_group_size` by up to one parameter's partition, and sub_group_size 0
    or 1 gives one sub-group per parameter. `_create_fp16_partitions_with_defragmentation` records each one's
    `sum(p.partition_numel() for p in sub_group)`; a parameter's partition is partition_parameters.py
    `_aligned_size(param) // world`: its numel padded to a multiple of the partition world size, divided by it.
    O(number of parameters): nothing here walks elements or sub_group_size chunks."""
    out: list[int] = []
    for g, dp in zip(groups, group_dp):
        parts = [_padded(n, dp) // dp for n in g]
        if sum(parts) <= sub_group_size:
            if parts:
                out.append(sum(parts))
            continue
        acc = 0
        for p in parts:
            acc += p
            if acc >= sub_group_size:
                out.append(acc)
                acc = 0
        if acc:
            out.append(acc)  # the group's last parameter closes the sub-group it is in
    return out


DS_STAGE3_MAX_REUSE_DISTANCE = 1_000_000_000
"""deepspeed/runtime/zero/config.py: stage3_max_reuse_distance default (elements)."""


def _stage3_max_reuse_distance(plan: RunPlan) -> int:
    z = (plan.ds_config or {}).get("zero_optimization") or {}
    v = z.get("stage3_max_reuse_distance", z.get("max_reuse_distance", DS_STAGE3_MAX_REUSE_DISTANCE))
    return int(v) if isinstance(v, (int, float)) else DS_STAGE3_MAX_REUSE_DISTANCE


def zero3_states(plan: RunPlan, ms: ModelStates, groups: list[list[int]], group_dp: list[int], pb: int, sb: float,
                 rank: int | None) -> ModelStates:
    """Fill `ms` with what DeepSpeedZeroOptimizer_Stage3 allocates for the rank's param `groups` (arguments as
    zero12_states; every rank's partition is the same size, so `rank` does not change it)."""
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
        # stage3.py _prepare_fp32_grad_for_sub_group: the fp32 gradient of one sub-group at a time
        # (_release_sub_group drops it before the next), so the largest sub-group's
        sub = max(stage3_sub_group_numels(groups, group_dp, ds.sub_group_size), default=0)
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
    kept_numel = int(max(live, min(total_local - persist_numel, reuse // 2)))
    ms.gathered_forward_end = (persist_numel + kept_numel) * pb
    _hpz_secondary(plan, ms, groups, group_dp, pb, kept_numel)
    return ms


def hpz_group_size(plan: RunPlan) -> int:
    """Ranks one ZeRO++ hpZ secondary partition is split over: zero_hpz_partition_size, at most the world size
    (utils/groups.py _create_zero_param_parallel_group: min(group_size, world_size)); 1 without hpZ."""
    hpz = plan.ds.zeropp_hpz
    return min(hpz, plan.world_size) if hpz > 1 and plan.ds.zero_stage == 3 else 1


def _hpz_secondary(plan: RunPlan, ms: ModelStates, groups: list[list[int]], group_dp: list[int], pb: int,
                   kept_numel: int) -> None:
    """ZeRO++ hpZ (Wang et al. 2023, arXiv 2306.10209 §3.2): a secondary copy of the parameters partitioned over the
    hpZ group, from which backward gathers inside the node. DeepSpeed 0.19.8, runtime/zero/partition_parameters.py:
    whenever zero_hpz_partition_size > 1 (Init.__init__ builds zero_param_process_group, ~l.1118), `_partition`
    (~l.1765) calls `_partition_param_sec` (~l.1900) for every parameter it partitions, which allocates
    `torch.empty(_aligned_size(param) // num_ranks_in_param_group, dtype=param.dtype, device=self.remote_device)`
    (the model dtype; the host under offload_param; also when the hpZ group is the whole dp group, as a second copy
    of the primary partition). stage3.py `_post_step` (~l.2846) -> `invalidate_secondary_tensor` (~l.755) drops
    them all after every optimizer step, so within a step they exist for the parameters partitioned so far:
    forward's releases (partitioned_param_coordinator.py __release_param, not the ds_persist ones nor those kept
    for reuse in backward), then backward's, then at step() `_partition_all_parameters` the persistent ones too.
    With gradient accumulation the secondaries of the earlier micro steps stay until the step. qwZ and qgZ
    allocate nothing that persists (their int8 gather buffer and scales, partition_parameters.py
    _all_gather_coalesced, and stage3.py all_to_all_quant_reduce, live only while the collective runs)."""
    hpz = hpz_group_size(plan)
    if hpz <= 1:
        return
    ds = plan.ds
    persist = other = 0
    for g, dp in zip(groups, group_dp):
        for n in g:
            sec = _padded(n, dp) // hpz  # _aligned_size pads to the partition world size, // num_ranks_in_param_group
            if n <= ds.param_persistence_threshold:
                persist += sec
            else:
                other += sec
    kept = min(other, kept_numel // hpz) if ds.grad_accum == 1 else 0
    if ds.offload_param:
        ms.host_hpz_secondary_params = (persist + other) * pb
        return
    ms.hpz_secondary_params = (persist + other) * pb
    ms.hpz_secondary_backward = other * pb
    ms.hpz_secondary_forward_end = (other - kept) * pb
