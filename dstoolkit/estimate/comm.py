"""Communication volume per step by collective, and its time under the nccl-tests bus-bandwidth model.

Volumes are the bytes of the tensor each rank passes to the collective (nccl-tests' "size"), summed over a
step. Time = size × busbw factor ÷ busbw (nccl-tests doc/PERFORMANCE.md; anchors.md "Collective bandwidth").
No torch import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from dstoolkit.estimate.memory import param_bytes, rank_param_groups
from dstoolkit.estimate.plan import RunPlan

QWZ_BYTES_PER_PARAM = 1
"""ZeRO++ qwZ: weights all-gathered in int8 (arXiv 2306.10209 §3.1), block scales ignored."""
QGZ_BYTES_PER_PARAM = 0.5
"""ZeRO++ qgZ: gradients reduce-scattered in int4 via all-to-all (arXiv 2306.10209 §3.3)."""


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor (doc/PERFORMANCE.md)."""
    if n <= 1:
        return 0.0
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "p2p"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


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


@dataclass
class CommPlan:
    ops: list[CommOp] = field(default_factory=list)

    def by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for op in self.ops:
            out[op.name] = out.get(op.name, 0) + int(op.bytes)
        return out


def _group_cross_node(plan: RunPlan, group_size: int, stride: int) -> bool:
    """Ranks of a group are `stride` apart (Megatron order tp, then dp/ep, then pp); it spans nodes when
    its extent exceeds one node."""
    return group_size * stride > plan.gpus_per_node


def comm_plan(plan: RunPlan) -> CommPlan:
    """Collectives one rank takes part in during one optimizer step."""
    ds = plan.ds
    shape = plan.shape
    pb = param_bytes(plan.precision)
    groups = rank_param_groups(plan)
    dense = sum(groups[0])
    expert = sum(groups[1]) if len(groups) > 1 else 0
    ga = ds.grad_accum
    out = CommPlan()
    dp, edp = plan.dp, plan.edp
    dp_cross = _group_cross_node(plan, dp, plan.tp)
    edp_cross = _group_cross_node(plan, edp, plan.tp * plan.ep)
    nlayers = math.ceil(shape.num_hidden_layers / plan.pp)

    def add(name, coll, nbytes, n, cross, calls, overlap):
        if n > 1 and nbytes > 0:
            out.ops.append(CommOp(name, coll, int(nbytes), n, cross, int(calls), overlap))

    bucket = max(1, ds.reduce_bucket_size)
    stage = ds.zero_stage
    if stage == 0:
        # engine.allreduce_gradients at the accumulation boundary: DP all-reduce, 2Ψ (ZeRO §7)
        add("dp_all_reduce", "all_reduce", dense * pb, dp, dp_cross, math.ceil(dense / bucket), False)
        add("dp_all_reduce_experts", "all_reduce", expert * pb, edp, edp_cross, math.ceil(expert / bucket) if expert else 0, False)
    elif stage in (1, 2):
        # ZeRO §7: reduce-scatter of gradients + all-gather of updated parameters = 2Ψ.
        # Stage 2 reduces in every micro step; stage 1 once per accumulation boundary.
        reps = ga if stage == 2 else 1
        add("zero_reduce_scatter", "reduce_scatter", dense * pb * reps, dp, dp_cross,
            reps * math.ceil(dense / bucket), ds.overlap_comm)
        add("zero_reduce_scatter_experts", "reduce_scatter", expert * pb * reps, edp, edp_cross,
            reps * (math.ceil(expert / bucket) if expert else 0), ds.overlap_comm)
        agb = max(1, ds.allgather_bucket_size)
        add("zero_all_gather", "all_gather", dense * pb, dp, dp_cross, math.ceil(dense / agb), False)
        add("zero_all_gather_experts", "all_gather", expert * pb, edp, edp_cross,
            math.ceil(expert / agb) if expert else 0, False)
    else:
        # ZeRO §7: stage 3 gathers parameters in forward and again in backward, and reduce-scatters grads: 3Ψ
        fwd_bytes = QWZ_BYTES_PER_PARAM if ds.zeropp_qwz else pb
        grad_bytes = QGZ_BYTES_PER_PARAM if ds.zeropp_qgz else pb
        hpz = ds.zeropp_hpz > 1
        calls = ga * 2 * nlayers * 4
        add("zero3_param_all_gather_fwd", "all_gather", dense * fwd_bytes * ga, dp, dp_cross, calls // 2, True)
        # hpZ: the backward gather reads the secondary partition inside the node (ZeRO++ §3.2)
        add("zero3_param_all_gather_bwd", "all_gather", dense * (fwd_bytes if not hpz else pb) * ga,
            ds.zeropp_hpz if hpz else dp, False if hpz else dp_cross, calls // 2, True)
        add("zero3_grad_reduce_scatter" if not ds.zeropp_qgz else "zeropp_qgz_all_to_all",
            "reduce_scatter" if not ds.zeropp_qgz else "all_to_all", dense * grad_bytes * ga, dp, dp_cross,
            ga * math.ceil(dense / bucket), True)
    # Expert parallelism: dispatch + combine all-to-all in forward, and the same two in backward, per MoE layer
    if shape.is_moe and plan.ep > 1:
        from dstoolkit.estimate.activations import moe_capacity

        tok = plan.seq_len * ds.micro_batch
        moe_layers = sum(shape.is_moe_layer(i) for i in range(nlayers))
        cap = moe_capacity(plan, tok)
        per_a2a = shape.num_experts * cap * shape.hidden_size * pb  # the capacity-padded (E, C, h) buffer
        add("ep_all_to_all", "all_to_all", 4 * per_a2a * moe_layers * ga, plan.ep,
            _group_cross_node(plan, plan.ep, plan.tp), 4 * moe_layers * ga, False)
    # Megatron TP: 2 all-reduces forward + 2 backward per layer (SP: reduce-scatter + all-gather, same bytes)
    if plan.tp > 1:
        tok = plan.seq_len * ds.micro_batch
        recompute = sum(plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)[:nlayers])
        n_ar = 4 * nlayers + 2 * recompute
        add("tp_all_reduce", "all_reduce", n_ar * tok * shape.hidden_size * pb * ga, plan.tp,
            plan.tp > plan.gpus_per_node, n_ar * ga, False)
    # PP: activations forward and their gradients backward at each stage boundary, per micro batch
    if plan.pp > 1:
        tok = plan.seq_len * ds.micro_batch
        add("pp_p2p", "p2p", 2 * tok * shape.hidden_size * pb // (plan.tp if plan.sequence_parallel else 1) * ga,
            2, plan.world_size // plan.pp > plan.gpus_per_node or plan.gpus_per_node < plan.tp * 2, 2 * ga, False)
    return out


def zeropp_cross_node_bytes(psi: int, *, qwz: bool, hpz: bool, qgz: bool, weight_bytes: int = 2) -> float:
    """Cross-node ZeRO-3 volume per step (ZeRO++ §3, Fig. 1): 3M baseline (M = model bytes in fp16) →
    0.75M with qwZ (fwd gather in int8: 0.5M), hpZ (bwd gather inside the node: 0) and qgZ (int4: 0.25M)."""
    m = psi * weight_bytes
    fwd = m * (QWZ_BYTES_PER_PARAM / weight_bytes if qwz else 1.0)
    bwd = 0.0 if hpz else fwd
    grad = m * (QGZ_BYTES_PER_PARAM / weight_bytes if qgz else 1.0)
    return fwd + bwd + grad


def op_time_s(op: CommOp, intra_busbw: float, inter_busbw: float, latency_s: float = 0.0) -> float:
    """nccl-tests model: size × busbw factor ÷ busbw, plus a fixed latency per call."""
    bw = inter_busbw if op.cross_node else intra_busbw
    return op.bytes * busbw_factor(op.collective, op.group_size) / bw + op.calls * latency_s
