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

from dstoolkit.estimate.dtype_bytes import (  # noqa: F401 - re-exported
    FP32_BYTES, OPTIMIZER_STATE_BYTES_PER_PARAM, optimizer_state_bytes_per_param, param_bytes)
from dstoolkit.estimate.paper_view import (  # noqa: F401 - re-exported (moved out to keep this file short)
    ZERO_PAPER_GRAD_BYTES, ZERO_PAPER_K, ZERO_PAPER_WEIGHT_BYTES, PaperView, paper_model_states)
from dstoolkit.estimate.param_groups import (  # noqa: F401 - re-exported (moved out to keep this file short)
    FP8_WEIGHT_CACHE_BYTES_PER_PARAM, NCCL_START_ALIGNMENT_FACTOR, ParamEntry, _expert_index, _padded,
    fp8_weight_cache_bytes, head_grad_numel, rank_param_groups)
from dstoolkit.estimate.model_states import ModelStates
from dstoolkit.estimate.step_temporaries import (
    grad_norm_temporary_bytes, optimizer_implementation, optimizer_temporary_bytes)
from dstoolkit.estimate.zero_states import stage3_sub_group_numels, zero12_states, zero3_states
from dstoolkit.runplan import RunPlan


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
    # stage 3: stage3.py fp32_partitioned_groups_flat, one flat sub-group per call (whole parameters)
    return [[n] for n in stage3_sub_group_numels(groups, group_dp, ds.sub_group_size)]


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
        return zero12_states(plan, ms, groups, group_dp, pb, sb, largest, rank)
    return zero3_states(plan, ms, groups, group_dp, pb, sb, rank)


__all__ = [
    "ModelStates", "PaperView", "deepspeed_model_states", "paper_model_states", "rank_param_groups",
    "optimizer_state_bytes_per_param", "param_bytes", "fp8_weight_cache_bytes", "ParamEntry",
]
