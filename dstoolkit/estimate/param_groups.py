"""Which parameters a rank holds (after TP, PP, EP), how DeepSpeed groups and partitions them, and the fp8
weight cache. Moved out of memory.py (re-exported there). No torch import.
"""
from __future__ import annotations

import math
from functools import lru_cache

from dstoolkit.estimate.layout import ParamEntry, param_layout
from dstoolkit.layout import pipeline_split, stage_layer_range, stage_layers
from dstoolkit.models.measured import TOKEN_EMBEDDING_NAME
from dstoolkit.runplan import AutoTp, RunPlan, tp_splits

NCCL_START_ALIGNMENT_FACTOR = 2
"""stage_1_and_2.py / bf16_optimizer.py: flat buffers are padded to a multiple of 2 * dp elements."""
FP8_WEIGHT_CACHE_BYTES_PER_PARAM = 2
"""Transformer Engine keeps an fp8 copy of each GEMM weight and (Hopper) its transpose for dgrad: 1 + 1 bytes."""


# ---------------------------------------------------------------------------------------------------------
# Which parameters a rank holds (after TP, PP, EP) and how DeepSpeed groups them.
# ---------------------------------------------------------------------------------------------------------


def rank_param_groups(plan: RunPlan, pp_stage: int | None = None) -> list[list[int]]:
    """Parameter numels a rank holds, split into DeepSpeed optimizer param groups, in registration order.

    Group 0 is every non-expert parameter; for MoE models group 1 holds the local experts (E/ep per MoE
    layer), as `deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer` builds them.
    TP shards what `RunPlan.tp_splits` says it splits (Megatron: the matrices and the vocab; DeepSpeed AutoTP:
    the blocks' matrices, the embedding and the LM head as `plan.autotp` says); PP keeps the layers of one stage
    (the heaviest stage when `pp_stage` is None: embedding and a multimodal model's towers on the first, final norm +
    LM head on the last).
    """
    return [list(g) for g in _rank_param_groups(plan.shape, plan.tp, plan.pp, plan.ep, pp_stage,
                                                pipeline_split(plan.framework), plan.autotp)]


@lru_cache(maxsize=256)
def _rank_param_groups(shape, tp: int, pp: int, ep: int, pp_stage: int | None,
                       split: str = "megatron", autotp: AutoTp | None = None) -> tuple[tuple[int, ...], ...]:
    layout = param_layout(shape)
    stages = [pp_stage] if pp_stage is not None else list(range(pp))
    best: tuple[tuple[int, ...], ...] = ()
    best_total = -1
    local_experts = shape.num_experts // ep if shape.is_moe else 0
    for st in stages:
        layers = set(stage_layer_range(shape.num_hidden_layers, pp, st, split))
        dense: list[int] = []
        experts: list[int] = []
        for p in layout:
            if p.layer >= 0 and p.layer not in layers:
                continue
            if p.layer < 0:
                first, last = st == 0, st == pp - 1
                if p.kind in ("embedding", "tower") and not first and not (last and _tied_head(shape, p)):
                    continue  # towers feed the first stage's embeddings; a tied LM head is the embedding's copy
                if p.kind in ("lm_head", "norm") and not last:
                    continue
            numel = p.numel // tp if (tp_splits(p, autotp) and tp > 1) else p.numel
            if p.kind == "expert":
                if _expert_index(p) >= local_experts:
                    continue
                experts.append(numel)
            else:
                dense.append(numel)
        groups = (tuple(dense),) + ((tuple(experts),) if shape.is_moe else ())
        total = sum(sum(g) for g in groups)
        if total > best_total:
            best, best_total = groups, total
    return best


def _tied_head(shape, p: ParamEntry) -> bool:
    """`p` is the token embedding a tied LM head reuses: at pp > 1 the last stage holds its own copy, trained,
    saved and all-reduced with the first stage's (Megatron-LM `shared_embedding_or_output_weight`, its
    `_allreduce_embedding_grads`; DeepSpeed PipelineModule's TiedLayerSpec builds the tied module on every stage
    that uses it, pipe/module.py `_build` / `_index_tied_modules`)."""
    return shape.tie_word_embeddings and p.name == TOKEN_EMBEDDING_NAME


def head_grad_numel(plan: RunPlan) -> int:
    """Elements of the parameters whose gradients backward produces first: final norm + LM head (TP-sharded where
    `RunPlan.tp_splits` says so), on the last pipeline stage; 0 on other stages."""
    n = 0
    for p in param_layout(plan.shape):
        if p.layer < 0 and p.kind in ("lm_head", "norm"):
            n += p.numel // plan.tp if (plan.tp_splits(p) and plan.tp > 1) else p.numel
    return n


def _expert_index(p: ParamEntry) -> int:
    """Expert number encoded in the name: blocks.<i>.mlp.experts.<e>.<...>."""
    return int(p.name.split(".experts.")[1].split(".")[0])


def _padded(numel: int, align: int) -> int:
    return int(math.ceil(numel / align)) * align


def _partition_grad_numels(group: list[int], dp: int) -> list[int]:
    """stage_1_and_2.py `copy_grads_in_partition`: per rank, the sum of numels of every parameter that
    intersects the rank's partition of the flat buffer (a parameter straddling a boundary counts whole)."""
    padded = _padded(sum(group), NCCL_START_ALIGNMENT_FACTOR * dp)
    part = padded // dp
    out = [0] * dp
    offset = 0
    for n in group:
        if n == 0:
            continue
        first = offset // part
        last = min(dp - 1, (offset + n - 1) // part)
        for r in range(first, last + 1):
            out[r] += n
        offset += n
    return out


def fp8_weight_cache_bytes(plan: RunPlan) -> int:
    """FP8 storage: the cast weight copies Transformer Engine keeps (only for fp8 precision; with an FP8 selection,
    RunPlan.fp8_selection, only for the swapped share of each block's weights: a layer kept in bf16 has none)."""
    if plan.precision != "fp8":
        return 0
    layout = param_layout(plan.shape)
    local = 0
    split = pipeline_split(plan.framework)
    counts = stage_layers(plan.shape.num_hidden_layers, plan.pp, split)
    layers = set(stage_layer_range(plan.shape.num_hidden_layers, plan.pp, counts.index(max(counts)), split))
    local_experts = plan.shape.num_experts // plan.ep if plan.shape.is_moe else 0
    for p in layout:
        if p.kind not in ("attention", "dense_mlp", "expert", "shared_expert") or p.layer not in layers:
            continue
        if p.kind == "expert" and _expert_index(p) >= local_experts:
            continue
        numel = p.numel // plan.tp if plan.tp_splits(p) else p.numel
        local += numel if plan.fp8_selection is None else int(numel * plan.fp8_share(p.layer))
    return local * FP8_WEIGHT_CACHE_BYTES_PER_PARAM
