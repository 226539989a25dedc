"""Communication volume per step by collective (its time: estimate.collective_time).

Volumes are the bytes of the tensor each rank passes to the collective (nccl-tests' "size"), summed over a
step.

Two views of ZeRO-1/2 gradient reduction (`comm_plan(plan, view=...)`):
- "deepspeed" (default): what DeepSpeed 0.19.8 runs. stage_1_and_2.py `average_tensor` all-reduces each
  bucket (`dist.all_reduce` via `allreduce_and_scatter`) because `zero_optimization.use_multi_rank_bucket_allreduce`
  defaults to true (runtime/zero/config.py); with it false it sends one `dist.reduce` per destination
  partition; with `reduce_scatter: false` or `contiguous_gradients: false` (`buffered_reduce_fallback`) it
  all-reduces. MoE expert params take the same path over the expert-data-parallel group (stage 2 asserts
  contiguous_gradients and reduce_scatter for MoE). So stage 2 moves 2Ψ (grads) + Ψ (params) of bus bytes,
  as many as stage 3; measured across two throttled hosts, the ZeRO-3/ZeRO-2 link share was 0.87×, not 1.5×
  (benchmarks/results/multinode_throttle_cpu_202611.md).
- "paper": the ZeRO paper's accounting (§7): reduce-scatter + all-gather = 2Ψ for stages 1/2, 3Ψ for stage 3.

No torch import.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from dstoolkit.estimate.cluster_model import ep_a2a_layer_bytes, ep_a2a_split, resolved_overlap
from dstoolkit.estimate.layout import param_layout
from dstoolkit.estimate.memory import optimizer_path, param_bytes, rank_param_groups, zero_group_sizes
from dstoolkit.estimate.pipeline_stages import moe_layers_per_stage
from dstoolkit.estimate.timeline import is_cpu_device
from dstoolkit.estimate.zero_states import hpz_group_size
from dstoolkit.runplan import RunPlan

QWZ_BYTES_PER_PARAM = 1
"""ZeRO++ qwZ: weights all-gathered in int8 (arXiv 2306.10209 §3.1), block scales ignored."""
DEEPSPEED_GATHERS_PER_LAYER = 4
"""ZeRO-3 parameter all-gathers per block and pass under DeepSpeed, which fetches each submodule's parameters
before it runs (partitioned_param_coordinator.py fetch_sub_module): the four weight matrices of a GPT block (QKV,
attention output, FC1, FC2); norms and biases under stage3_param_persistence_threshold stay resident."""
QGZ_BYTES_PER_PARAM = 0.5
"""ZeRO++ qgZ: gradients reduce-scattered in int4 via all-to-all (arXiv 2306.10209 §3.3)."""
DEEPSPEED_ZERO3_ONE_RING = True
"""Whether DeepSpeed ZeRO-3's parameter all-gathers and gradient reduce-scatters are charged one NIC's rate per
group whatever its ranks per node. Measured, cause not found: the only multi-node measurement of them here
(Narayanan et al. 2021 Table 2, DeepSpeed ZeRO-3 at tp 1 on 384-2240 A100s, 8 HDR NICs per node) falls from 144 to
44 TFLOP/s per GPU as the GPUs quadruple at one global batch, i.e. about one NIC's rate per rank; with a ring per
NIC they are predicted 36-194% too fast (published-runs MAPE 5.8% -> 9.7%). NCCL's ring count is not the suspect
(modern DeepSpeed all-gathers a flat buffer per submodule, which NCCL spreads over every NIC); DeepSpeed's 2021
per-submodule gathers without prefetch are. Not fitted: a flag, on one source's evidence; other frameworks' FSDP
(torchtitan, llm-foundry, Megatron-FSDP) get the gain (collective_time.MULTI_RING_GAIN)."""


@dataclass(frozen=True)
class CommOp:
    """One kind of collective in a step."""

    name: str
    """Key in the JSON output (zero_reduce_scatter, dp_all_reduce, ep_all_to_all, ...)."""
    collective: str
    """all_reduce | all_gather | reduce_scatter | all_to_all | p2p."""
    bytes: int
    """Per-rank message bytes summed over the step."""
    group_size: int
    """Ranks in the collective's group."""
    cross_node: bool
    """Whether the group spans nodes (uses inter-node bandwidth)."""
    calls: int
    """Collective calls in the step (for the latency term)."""
    overlappable: bool
    """Whether DeepSpeed can overlap it with compute (overlap_comm / prefetch)."""
    concurrent_groups: int = 1
    """Groups of this collective that span nodes and have a rank on one node: they run side by side and
    share that node's inter-node link(s) (1 when the group stays inside a node)."""
    hidden_fraction: float = 1.0
    """Of an overlappable collective, the fraction that can run ahead of the compute needing it; the rest waits
    in the critical path (DeepSpeed ZeRO-3 parameter gathers: `zero3_prefetch_hidden_fraction`)."""
    ranks_per_node: int = 1
    """Ranks of one group on one node (the rings NCCL can open over that node's NICs: group_inter_node_busbw)."""
    one_ring: bool = False
    """Charged one NIC's rate whatever its ranks per node (DEEPSPEED_ZERO3_ONE_RING)."""


@dataclass
class CommPlan:
    ops: list[CommOp] = field(default_factory=list)

    def by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.name] = out.get(op.name, 0) + int(op.bytes)
        return out


@dataclass(frozen=True)
class GroupLayout:
    """Where one kind of process group sits on the nodes."""

    cross_node: bool
    """Some group of this kind has ranks on more than one node."""
    concurrent_groups: int
    """Groups of this kind that span nodes and have a rank on the busiest node (they share its uplink)."""
    ranks_per_node: int = 1
    """Most ranks one spanning group has on one node."""


@functools.lru_cache(maxsize=4096)
def group_layout(world_size: int, gpus_per_node: int, group_size: int, stride: int) -> GroupLayout:
    """Layout of the groups whose ranks are `stride` apart (Megatron order tp, then dp/ep, then pp).

    The group holding rank r is base + i·stride (i < group_size), base = r − r mod (group_size·stride) +
    r mod stride; rank r sits on node r // gpus_per_node. A group spans nodes when its ranks are not all on
    one node. The pattern of groups over nodes repeats every lcm(group_size·stride, gpus_per_node) ranks, so
    where that period tiles the world only its nodes are read: O(period), O(world_size) otherwise (a sweep at
    8192 GPUs spent 132 of its 134 s here reading every rank).
    """
    if group_size <= 1:
        return GroupLayout(False, 1)
    block = group_size * stride
    period = math.lcm(block, gpus_per_node)
    span = period if world_size % period == 0 else world_size
    busiest = 0
    any_cross = False
    per_node = 1
    for node in range(math.ceil(span / gpus_per_node)):
        spanning = set()
        for r in range(node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node)):
            base = r - r % block + r % stride
            last = min(base + (group_size - 1) * stride, world_size - 1)
            # ranks increase along the group, so it spans nodes iff its first and last rank do
            if base // gpus_per_node != last // gpus_per_node:
                spanning.add(base)
                # ranks of this group on this node: those base + i*stride that fall in [node*gpn, (node+1)*gpn)
                lo, hi = node * gpus_per_node, min(world_size, (node + 1) * gpus_per_node)
                first = max(0, math.ceil((lo - base) / stride))
                last_i = min(group_size - 1, (hi - 1 - base) // stride)
                per_node = max(per_node, last_i - first + 1)
        any_cross = any_cross or bool(spanning)
        busiest = max(busiest, len(spanning))
    return GroupLayout(any_cross, max(1, busiest), per_node)


def zero12_grad_collective(stage: int, *, contiguous_gradients: bool, reduce_scatter: bool,
                           use_multi_rank_bucket_allreduce: bool, view: str = "deepspeed") -> tuple[str, str]:
    """(op name, collective) DeepSpeed 0.19.8 uses to reduce ZeRO-1/2 gradients for a config.

    runtime/zero/stage_1_and_2.py: `reduce_ipg_grads` -> `average_tensor` when contiguous_gradients, else
    `buffered_reduce_fallback` -> `allreduce_no_retain(rank=None)` (all-reduce). In `average_tensor`,
    reduce_scatter=false -> `gradient_reduction_w_predivide` (all-reduce); otherwise every slice goes to an
    ("allreduce", group) bucket when use_multi_rank_bucket_allreduce (default true) -> `allreduce_and_scatter`
    (`dist.all_reduce`), else to ("reduce", dst, group) -> `allreduce_no_retain(rank=dst)` (`dist.reduce`).
    view="paper": the ZeRO paper's reduce-scatter (§7).
    """
    if stage not in (1, 2):
        raise ValueError(f"zero stage {stage}: gradient reduction of stages 1/2 only")
    if view == "paper":
        return "zero_reduce_scatter", "reduce_scatter"
    if view != "deepspeed":
        raise ValueError(f"view={view!r}: use 'deepspeed' (what DeepSpeed 0.19.8 runs) or 'paper' (ZeRO §7)")
    if contiguous_gradients and reduce_scatter and not use_multi_rank_bucket_allreduce:
        return "zero_grad_reduce", "reduce"
    return "zero_grad_all_reduce", "all_reduce"


def comm_plan(plan: RunPlan, view: str = "deepspeed") -> CommPlan:
    """Collectives one rank takes part in during one optimizer step.

    Args:
        plan: the run.
        view: "deepspeed" = the collectives DeepSpeed 0.19.8 runs for this config (default); "paper" = the
            ZeRO paper's volumes (2Ψ / 2Ψ / 3Ψ for stages 1 / 2 / 3, ZeRO §7). They differ only in ZeRO-1/2
            gradient reduction (see the module docstring).
    """
    ds = plan.ds
    shape = plan.shape
    pb = param_bytes(plan.precision)
    groups = rank_param_groups(plan)
    dense = sum(groups[0])
    expert = sum(groups[1]) if len(groups) > 1 else 0
    ga = ds.grad_accum
    out = CommPlan()
    shards = plan.cp * plan.ulysses
    # gradients are reduced (and ZeRO partitions spread) over the data-parallel ranks together with the cp x
    # Ulysses ranks, which hold the same parameters (memory.zero_group_sizes); in Megatron's rank order tp, cp,
    # dp, pp that group is strided by tp
    dp, edp = zero_group_sizes(plan)
    stride = plan.tp * shards // max(1, dp // max(1, plan.dp))  # tp once the shards are in the group (GPU path)
    dp_lay = group_layout(plan.world_size, plan.gpus_per_node, dp, stride)
    edp_lay = group_layout(plan.world_size, plan.gpus_per_node, edp, stride * plan.ep)

    grad_overlap, param_overlap = resolved_overlap(plan)
    dp_cross, edp_cross = dp_lay.cross_node, edp_lay.cross_node
    nlayers = math.ceil(shape.num_hidden_layers / plan.pp)

    def add(name, coll, nbytes, n, cross, calls, overlap, concurrent=1, hidden=1.0, per_node=1, one_ring=False):
        if n > 1 and nbytes > 0:
            out.ops.append(CommOp(name, coll, int(nbytes), n, cross, int(calls), overlap,
                                  int(concurrent) if cross else 1, hidden, int(per_node) if cross else 1,
                                  one_ring))

    def add_param_gathers(name, overlap):
        # the updated low-precision parameters all-gathered after the step: dense over DP, experts over EDP
        agb = max(1, ds.allgather_bucket_size)
        add(name, "all_gather", dense * pb, dp, dp_cross, math.ceil(dense / agb), overlap,
            dp_lay.concurrent_groups, per_node=dp_lay.ranks_per_node)
        add(name + "_experts", "all_gather", expert * pb, edp, edp_cross,
            math.ceil(expert / agb) if expert else 0, overlap, edp_lay.concurrent_groups,
            per_node=edp_lay.ranks_per_node)

    bucket = max(1, ds.reduce_bucket_size)
    stage = ds.zero_stage
    if stage == 0:
        # engine.allreduce_gradients at the accumulation boundary: DP all-reduce, 2Ψ (ZeRO §7)
        add("dp_all_reduce", "all_reduce", dense * pb, dp, dp_cross, math.ceil(dense / bucket), grad_overlap,
            dp_lay.concurrent_groups, per_node=dp_lay.ranks_per_node)
        add("dp_all_reduce_experts", "all_reduce", expert * pb, edp, edp_cross,
            math.ceil(expert / bucket) if expert else 0, grad_overlap, edp_lay.concurrent_groups, per_node=edp_lay.ranks_per_node)
        if plan.framework == "deepspeed" and optimizer_path(plan) == "bf16_optimizer":
            # BF16_Optimizer partitions the fp32 master over DP (its "ZeRO-1 equivalent") and after the step
            # all-gathers the updated low-precision parameters (bf16_optimizer.py update_lp_params ->
            # runtime/utils.py all_gather_dp_groups): Ψ more, after the step, exposed
            add_param_gathers("bf16_optimizer_all_gather", False)
    elif stage in (1, 2):
        # Gradient reduction + all-gather of updated parameters. ZeRO §7 (view="paper"): reduce-scatter, 2Ψ in
        # all. DeepSpeed 0.19.8 (view="deepspeed"): an all-reduce per bucket by default (zero12_grad_collective),
        # 3Ψ in all. Stage 2 reduces in every micro step; stage 1 once per accumulation boundary.
        if plan.framework == "megatron":
            # Megatron-Core's distributed optimizer (--use-distributed-optimizer, what the megatron-lm target writes
            # for ZeRO-1 and -2) reduce-scatters its gradient buffer once per optimizer step, bucket by bucket in the
            # last micro-batch's backward (megatron/core/distributed/param_and_grad_buffer.py start_grad_sync:
            # dist_reduce_scatter_func when ddp_config.use_distributed_optimizer; earlier micro-batches run under
            # no_sync), then all-gathers the updated parameters: 2Ψ, ZeRO §7's accounting
            reps = 1
            name, coll = "zero_reduce_scatter", "reduce_scatter"
        else:
            reps = ga if stage == 2 else 1
            name, coll = zero12_grad_collective(
                stage, contiguous_gradients=ds.contiguous_gradients, reduce_scatter=ds.reduce_scatter,
                use_multi_rank_bucket_allreduce=ds.use_multi_rank_bucket_allreduce, view=view)
        # dist.reduce path: one call per destination partition in each bucket
        per_bucket = dp if coll == "reduce" else 1
        add(name, coll, dense * pb * reps, dp, dp_cross, reps * per_bucket * math.ceil(dense / bucket),
            grad_overlap, dp_lay.concurrent_groups, per_node=dp_lay.ranks_per_node)
        add(name + "_experts", coll, expert * pb * reps, edp, edp_cross,
            reps * (edp if coll == "reduce" else 1) * (math.ceil(expert / bucket) if expert else 0),
            grad_overlap, edp_lay.concurrent_groups, per_node=edp_lay.ranks_per_node)
        add_param_gathers("zero_all_gather", param_overlap)
    else:
        # ZeRO §7: stage 3 gathers parameters in forward and again in backward, and reduce-scatters grads: 3Ψ
        fwd_bytes = QWZ_BYTES_PER_PARAM if ds.zeropp_qwz else pb
        grad_bytes = QGZ_BYTES_PER_PARAM if ds.zeropp_qgz else pb
        hpz = ds.zeropp_hpz > 1
        # DeepSpeed gathers per submodule (~4 weight matrices per block); PyTorch FSDP per FSDP unit, which
        # torchtitan (fully_shard per TransformerBlock) and llm-foundry (its per-block FSDP wrap) make one block
        # Megatron-FSDP (framework megatron at stage 3) shards and gathers per transformer layer too (Megatron-Core
        # fully_shard units); the call counts only set the per-call latency (nccl_call_latency_s)
        per_layer = plan.framework != "deepspeed"
        units = 1 if per_layer else DEEPSPEED_GATHERS_PER_LAYER
        calls = ga * 2 * nlayers * units
        c = dp_lay.concurrent_groups
        hidden = zero3_prefetch_hidden_fraction(plan)
        one = DEEPSPEED_ZERO3_ONE_RING and plan.framework == "deepspeed"
        add("zero3_param_all_gather_fwd", "all_gather", dense * fwd_bytes * ga, dp, dp_cross, calls // 2,
            param_overlap, c, hidden, per_node=dp_lay.ranks_per_node, one_ring=one)
        # hpZ: backward gathers the secondary partition over its own group of consecutive ranks (ZeRO++ §3.2)
        bwd_n = hpz_group_size(plan) if hpz else dp  # zero_states' clamp, the memory term's group
        bwd_lay = group_layout(plan.world_size, plan.gpus_per_node, bwd_n, stride) if hpz else dp_lay
        add("zero3_param_all_gather_bwd", "all_gather", dense * (fwd_bytes if not hpz else pb) * ga,
            bwd_n, bwd_lay.cross_node, calls // 2, param_overlap, bwd_lay.concurrent_groups, hidden,
            per_node=bwd_lay.ranks_per_node, one_ring=one)
        add("zero3_grad_reduce_scatter" if not ds.zeropp_qgz else "zeropp_qgz_all_to_all",
            "reduce_scatter" if not ds.zeropp_qgz else "all_to_all", dense * grad_bytes * ga, dp, dp_cross,
            ga * (nlayers if per_layer else math.ceil(dense / bucket)),
            grad_overlap or plan.framework == "deepspeed", c, per_node=dp_lay.ranks_per_node, one_ring=one)
        if expert:
            # expert parameters (reachable at stage 3 only where DeepSpeed does not run the model: Megatron FSDP,
            # PyTorch FSDP) are gathered and their gradients reduce-scattered over the expert-data-parallel group
            ce = edp_lay.concurrent_groups
            add("zero3_param_all_gather_fwd_experts", "all_gather", expert * fwd_bytes * ga, edp, edp_cross,
                calls // 2, param_overlap, ce, hidden, per_node=edp_lay.ranks_per_node, one_ring=one)
            add("zero3_param_all_gather_bwd_experts", "all_gather", expert * fwd_bytes * ga, edp, edp_cross,
                calls // 2, param_overlap, ce, hidden, per_node=edp_lay.ranks_per_node, one_ring=one)
            add("zero3_grad_reduce_scatter_experts", "reduce_scatter", expert * grad_bytes * ga, edp, edp_cross,
                ga * (nlayers if per_layer else math.ceil(expert / bucket)),
                grad_overlap or plan.framework == "deepspeed", ce, per_node=edp_lay.ranks_per_node, one_ring=one)
    # Expert parallelism: dispatch + combine all-to-all in forward, and the same two in backward, per MoE layer
    # of the heaviest pipeline stage (DeepSeek-V3 at pp 16: 4 MoE layers on stages 1-15, 1 on stage 0).
    # Per TP rank: DeepSpeed drops the tokens duplicated across TP ranks before the all-to-all
    # (deepspeed/moe/mappings.py drop_tokens) and Megatron with sequence parallelism holds tokens/tp per rank.
    tok = plan.seq_len * ds.micro_batch / shards
    if shape.is_moe and plan.ep > 1:
        moe_layers = max(moe_layers_per_stage(plan))
        ep_lay = group_layout(plan.world_size, plan.gpus_per_node, plan.ep, plan.tp * shards)
        a2a_bytes, a2a_calls = ep_a2a_layer_bytes(plan) * moe_layers * ga, 4 * moe_layers * ga
        if ep_lay.cross_node and not is_cpu_device(plan.gpu):
            # GPU path: the bytes a rank sends split into what crosses InfiniBand and what stays on NVLink
            # (ep_a2a_split), each as point-to-point traffic at its link's rate; CPU estimates stay as calibrated
            inter, intra = ep_a2a_split(plan, plan.tp * shards)
            add("ep_all_to_all", "p2p", a2a_bytes * inter, plan.ep, True, a2a_calls, plan.moe_a2a_overlap,
                ep_lay.concurrent_groups)
            add("ep_all_to_all_nvlink", "p2p", a2a_bytes * intra, plan.ep, False, a2a_calls, plan.moe_a2a_overlap)
        else:
            add("ep_all_to_all", "all_to_all", a2a_bytes, plan.ep, ep_lay.cross_node, a2a_calls,
                plan.moe_a2a_overlap, ep_lay.concurrent_groups)
    # Context parallelism (Megatron-Core CP, ring attention): each of the cp-1 ring steps passes the local K and
    # V chunk forward; backward passes K, V and their gradients: 3 (cp-1) chunk transfers per layer, overlapped
    # with the attention of the chunk in hand (Megatron-Core context-parallel docs; Liu et al. 2023 ring attention)
    if plan.cp > 1:
        kv = 2 * tok * shape.kv_heads * shape.head_size * pb
        add("cp_ring_p2p", "p2p", 3 * (plan.cp - 1) * kv * nlayers * ga, plan.cp,
            plan.cp * plan.tp > plan.gpus_per_node, 3 * (plan.cp - 1) * nlayers * ga, True)
    # DeepSpeed-Ulysses (Jacobs et al. 2023 §3.1): all-to-all of q, k, v before attention and of the output after
    # it, and the same four in backward; each message is the rank's tokens x that tensor's width
    if plan.ulysses > 1:
        width = 2 * shape.num_attention_heads * shape.head_size + 2 * shape.kv_heads * shape.head_size
        add("ulysses_all_to_all", "all_to_all", 2 * tok * width * pb * nlayers * ga, plan.ulysses,
            plan.ulysses * plan.tp > plan.gpus_per_node, 8 * nlayers * ga, False)
    # Megatron TP: 2 all-reduces forward + 2 backward per layer (SP: reduce-scatter + all-gather, same bytes)
    if plan.tp > 1:
        recompute = sum(plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)[:nlayers])
        n_ar = 4 * nlayers + 2 * recompute
        # TP wider than a node (layout.degree_rules.tp_across_nodes_note): the group spans whole nodes, its ring
        # crosses them over the NICs its ranks sit next to (group_inter_node_busbw)
        tp_lay = group_layout(plan.world_size, plan.gpus_per_node, plan.tp, 1)
        add("tp_all_reduce", "all_reduce", n_ar * tok * shape.hidden_size * pb * ga, plan.tp,
            tp_lay.cross_node, n_ar * ga, plan.tp_comm_overlap, tp_lay.concurrent_groups,
            per_node=tp_lay.ranks_per_node)
        if plan.autotp is not None and plan.autotp.logits_gathered:
            # DeepSpeed AutoTP's gathered LM head (a Hugging Face tp_plan's colwise_gather_output): each micro
            # batch's [tokens, vocab/tp] logits are all-gathered into [tokens, vocab] on every TP rank before the
            # loss (deepspeed 0.19.8 module_inject/layers.py LinearLayer.forward, GatherFromTensorParallelRegion)
            add("autotp_logits_all_gather", "all_gather", tok * shape.vocab_size * pb * ga, plan.tp,
                tp_lay.cross_node, ga, False, tp_lay.concurrent_groups, per_node=tp_lay.ranks_per_node)
    # PP: activations forward and their gradients backward at each stage boundary, per micro batch
    if plan.pp > 1:
        # interleaved: a micro batch crosses v x as many stage boundaries (Narayanan et al. 2021 §2.2.2)
        v = plan.virtual_stages
        # A stage boundary that falls between nodes is crossed by every rank of the node at once (each sends its
        # activations to its peer of the next stage), so they share the node's NICs: concurrent = ranks per node.
        # Megatron-LM overlaps p2p with compute under the interleaved schedule only (arguments.py: overlap_p2p_comm
        # on by default, forced off for non-interleaved schedules: "non-interleaved schedule does not support
        # overlapping p2p communication"); DeepSpeed's PipelineEngine sends and receives blocking (pipe/p2p.py).
        cross = plan.world_size // plan.pp >= plan.gpus_per_node or plan.gpus_per_node < plan.tp * 2
        overlap = plan.framework == "megatron" and plan.pipeline_schedule == "interleaved"
        act = tok * shape.hidden_size * pb  # one micro batch's activations (or their gradient) at a boundary
        concurrent = min(plan.gpus_per_node, plan.world_size // plan.pp) if cross else 1
        if plan.framework == "deepspeed" and plan.tp > 1:
            # DeepSpeed's PipelineEngine with model parallelism: each TP rank sends only its 1/tp slice of the
            # activations (pipeline.pipe_partitioned) and of their gradients (grad_partitioned), both default
            # true, and the receiving stage all-gathers the slices over its TP group (runtime/pipe/engine.py
            # is_pipe_partitioned / is_grad_partitioned, PartitionedTensor.full())
            parts = [ds.pipe_partitioned, ds.grad_partitioned]
            sent = sum(act / plan.tp if part else act for part in parts)
            add("pp_p2p", "p2p", v * sent * ga, 2, cross, 2 * v * ga, overlap, concurrent)
            gathers = sum(parts)
            tp_lay = group_layout(plan.world_size, plan.gpus_per_node, plan.tp, 1)
            add("pp_partition_all_gather", "all_gather", gathers * v * act * ga, plan.tp, tp_lay.cross_node,
                gathers * v * ga, False, tp_lay.concurrent_groups, per_node=tp_lay.ranks_per_node)
        else:
            add("pp_p2p", "p2p", 2 * v * act // (plan.tp if plan.sequence_parallel else 1) * ga,
                2, cross, 2 * v * ga, overlap, concurrent)
        if shape.tie_word_embeddings and plan.pipeline_schedule != "dualpipe":
            # tied input embedding and LM head on the first and last stage: their gradients are all-reduced
            # between the two once per step, after backward and before the optimizer (DeepSpeed PipelineEngine
            # _exec_reduce_tied_grads; Megatron-LM _allreduce_embedding_grads / finalize_model_grads), each TP rank
            # its vocab/tp rows; every rank of the first stage at once (concurrent as the stage-boundary p2p).
            # DualPipe keeps both ends on one rank.
            add("pp_tied_embedding_all_reduce", "all_reduce", shape.vocab_size * shape.hidden_size // plan.tp * pb,
                2, cross, 1, False, concurrent)
    return out


def largest_gathered_module_numel(plan: RunPlan) -> int:
    """Elements of the largest parameter tensor inside the blocks on one TP rank (the unit a ZeRO-3 gather
    fetches: DeepSpeed gathers each submodule's parameters before it runs)."""
    return max((e.numel // (plan.tp if e.tp_split else 1) for e in param_layout(plan.shape) if e.layer >= 0),
               default=1)


def zero3_prefetch_hidden_fraction(plan: RunPlan) -> float:
    """Fraction of a ZeRO-3 parameter gather that can run ahead of the submodule needing it.

    DeepSpeed: the coordinator prefetches upcoming submodules' parameters only while the prefetched elements stay
    under `stage3_prefetch_bucket_size` (runtime/zero/partitioned_param_coordinator.py `fetch_sub_module`,
    `__prefetch_bucket_sz`; docs: "smaller values use less memory, but can increase stalls due to
    communication"), so of a submodule with n > bucket elements only `bucket` elements are gathered during the
    previous submodule's compute: bucket / n of the largest one. PyTorch FSDP (framework fsdp) prefetches the next
    whole FSDP unit (forward_prefetch / BACKWARD_PRE, FSDP2's default implicit prefetch), so all of it: 1.
    """
    if plan.framework != "deepspeed":
        return 1.0
    return min(1.0, max(0, plan.ds.prefetch_bucket_size) / max(1, largest_gathered_module_numel(plan)))


def zeropp_cross_node_bytes(psi: int, *, qwz: bool, hpz: bool, qgz: bool, weight_bytes: int = 2) -> float:
    """Cross-node ZeRO-3 volume per step (ZeRO++ §3, Fig. 1): 3M baseline (M = model bytes in fp16) →
    0.75M with qwZ (fwd gather in int8: 0.5M), hpZ (bwd gather inside the node: 0) and qgZ (int4: 0.25M)."""
    m = psi * weight_bytes
    fwd = m * (QWZ_BYTES_PER_PARAM / weight_bytes if qwz else 1.0)
    bwd = 0.0 if hpz else fwd
    grad = m * (QGZ_BYTES_PER_PARAM / weight_bytes if qgz else 1.0)
    return fwd + bwd + grad
