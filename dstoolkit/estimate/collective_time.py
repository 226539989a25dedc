"""How long one collective takes (split from estimate.comm, which counts the bytes): the nccl-tests bus-bandwidth
model, time = size x busbw factor / busbw (nccl-tests doc/PERFORMANCE.md; docs/anchors.md "Collective
bandwidth"), the bandwidth a group gets across nodes, and NCCL's fixed cost per call.

Links shared by groups side by side: when several groups of one collective (e.g. the ep expert-data-parallel
groups) each cross the same node's uplink at once, they split it. `CommOp.concurrent_groups` counts the
spanning groups with a rank on one node; `op_time_s` divides the inter-node busbw by
ceil(concurrent_groups / links_per_node). Assumption: the inter-node busbw is what ONE group's ring gets
over one link (a ring crosses each node boundary once per direction, whatever its ranks per node), and
concurrent groups share it fairly. Measured: ZeRO-2 + ep=2 on 2 hosts x 2 ranks took 1.39 s of link time
where one 2-rank group at the full rate predicts 0.79 s, two at half rate 1.26 s (multinode_throttle_cpu_202611.md).
That is the CPU (gloo, calibrated) path. On GPUs NCCL runs a ring per NIC, so a group gets as many NICs as it has
ranks on the node, shared with the groups crossing beside it (`group_inter_node_busbw`, issue 24).
No torch import.
"""
from __future__ import annotations

import math

from dstoolkit.estimate.comm import CommOp


def busbw_factor(collective: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw × factor (doc/PERFORMANCE.md; docs/anchors.md
    'Collective bandwidth (nccl-tests doc/PERFORMANCE.md)').

    all_reduce 2(n−1)/n; all_gather, reduce_scatter, all_to_all (n−1)/n; broadcast, reduce 1 (p2p, nccl-tests'
    sendrecv, also 1). The formulas hold at n = 1 as written, as nccl-tests applies them for one rank: 0 for
    the reduce/gather/all-to-all family (no byte crosses a bus), 1 for broadcast/reduce. The one definition:
    the bench (dstoolkit.runtime.bench.comm) imports it. `comm_plan` never emits a group of one rank.
    """
    if n < 1:
        raise ValueError(f"group size {n}: a collective needs at least one rank")
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "p2p"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def link_share(op: CommOp, links_per_node: int) -> int:
    """How many ways a cross-node op's per-link bandwidth is split: ceil(concurrent groups / links per node)."""
    if not op.cross_node:
        return 1
    return max(1, math.ceil(op.concurrent_groups / max(1, links_per_node)))


# A fitted per-hop latency of cross-node GPU collectives (INTER_NODE_HOP_LATENCY_S, 7.5 us, with NCCL's ring / tree
# step counts) was removed in issue 24: leave-one-source-out showed it helps only in sample (published-runs MAPE out
# of source 8.9% with it, 8.5% without; benchmarks/results/published_runs_202612.md, "Does each fitted constant help
# out of source?"). Only the Narayanan et al. Table 2 ZeRO-3 rows wanted it.


def group_inter_node_busbw(nic_busbw: float, nics_per_node: int, ranks_per_node: int, concurrent_groups: int,
                           intra_busbw: float, nics_per_group: int | None = None) -> float:
    """Bus bandwidth of a collective group that spans nodes, on NVIDIA GPUs with NCCL.

    NCCL builds one ring (channel) per NIC the group's GPUs can reach and spreads the message over them (NCCL
    environment docs, NCCL_CROSS_NIC / NCCL_MIN_NCHANNELS; on rail-optimised DGX systems each GPU drives the NIC
    beside it): a group with r ranks on a node crosses its boundary over up to r NICs, and the groups that cross
    side by side (concurrent_groups) share the node's nics_per_node fairly. So the group gets
    nic_busbw x min(r, nics / concurrent): a data-parallel group holding all 8 ranks of every DGX node (tp 1)
    gets the node's whole injection bandwidth (8 x 400 Gb/s on DGX H100), one with a rank per node (tp 8) one
    NIC's. Its ring also runs over NVLink inside the node, so it is never faster than intra_busbw. A cluster whose
    NCCL keeps a group's rings on fewer devices states it (GpuSpec.nics_per_group): the group gets at most that many.
    """
    rings = min(max(1, ranks_per_node), max(1, nics_per_node) / max(1, concurrent_groups))
    cap = nics_per_group if MULTI_RING_GAIN else 1  # the switch off: one NIC per group everywhere
    if cap is not None:
        rings = min(rings, cap)
    return min(intra_busbw, nic_busbw * rings)


MULTI_RING_GAIN = True
"""Whether a group with r > 1 ranks on a node gets r NICs (the ring-per-NIC gain above). On since the vTrain
multi-node sweep joined benchmarks/data/layout_sweeps.yaml (Bang et al., MICRO'24; Megatron-DeepSpeed GPT 3.6-175B on
64-512 A100s, 4 x 200 Gb/s per node): its 3.6B model at TP 16 over two nodes (8 ranks per node in each TP group)
measured 10.6-13.5 s per step; with one NIC per group the estimate said 26.7-28.9 s (2.5x too slow), with a ring per
NIC 9.7-11.9 s (estimator at dad0aed, that table's first reading: framework megatron, 150 GB/s inside the node).
Earlier in issue 24 the gain was off because it broke the DeepSpeed ZeRO-3 rows of Narayanan et al. 2021 Table 2;
those keep one ring (comm.DEEPSPEED_ZERO3_ONE_RING). The switch stays for the comparison
(benchmarks/results/layout_sweeps_202612_multiring.md and _baseline.md are the earlier runs with it on and off)."""

NCCL_BASE_LATENCY_S = 8.4e-6
"""Fixed cost of one NCCL ring collective call, Simple protocol (the one large messages use): NCCL's own tuning
model, src/graph/tuning.cc `baseLat` Ring/Simple = 8.4 us (the stored NVIDIA/nccl revision 01afd20a)."""
NCCL_NVLINK_STEP_LATENCY_S = 3.4e-6
"""Per ring step between two GPUs of one node over NVLink: tuning.cc `hwLat[NCCL_HW_NVLINK]` Ring/Simple = 3.4 us."""
NCCL_NET_STEP_LATENCY_S = 9.6e-6
"""Per ring step that crosses the network: tuning.cc `hwLat[NCCL_HW_NET]` Ring/Simple = 9.6 us."""
NCCL_CALL_LATENCY = True
"""Whether the GPU step time charges each collective call NCCL's latency (nccl_call_latency_s; CPU ranks keep their
calibration's measured latency). Issue 24, screened with the fitted constants refitted leave one source out (after
the wave-quantisation GEMM term): published runs MAPE 8.1% -> 7.5% in sample, 8.2% -> 8.0% out of source,
efficiency Spearman 0.928 -> 0.927; layout sweeps MAPE 9.1% -> 8.1% (out of source 9.2% -> 8.3%), within-group
Spearman 0.506 -> 0.509. Cited, not fitted: unlike the fitted per-hop INTER_NODE_HOP_LATENCY_S removed earlier in
issue 24 (which helped only in sample), no fold can choose it."""


def nccl_call_latency_s(op: CommOp) -> float:
    """Latency of one call of `op` in NCCL's tuning model (src/graph/tuning.cc ncclTopoTuneModel, ring): baseLat +
    (nsteps - nInterSteps) x the intra-node step + nInterSteps x the network step, with nsteps = 2(n-1) for an
    all-reduce and n-1 for an all-gather / reduce-scatter, nInterSteps = 2(nodes-1) and nodes-1 (nodes: the
    nodes the group spans). Point-to-point sends and the all-to-all's concurrent sends: one step (over the
    network when the op crosses nodes). A pure function of the op's group; no fitted number."""
    n = max(1, op.group_size)
    nodes = math.ceil(n / max(1, op.ranks_per_node)) if op.cross_node else 1
    nodes = min(nodes, n)
    if op.collective == "all_reduce":
        steps, inter = 2 * (n - 1), 2 * (nodes - 1)
    elif op.collective in ("all_gather", "reduce_scatter"):
        steps, inter = n - 1, nodes - 1
    else:
        steps, inter = 1, 1 if op.cross_node else 0
    return NCCL_BASE_LATENCY_S + (steps - inter) * NCCL_NVLINK_STEP_LATENCY_S + inter * NCCL_NET_STEP_LATENCY_S


def op_time_s(op: CommOp, intra_busbw: float, inter_busbw: float, latency_s: float = 0.0,
              inter_latency_s: float | None = None, links_per_node: int | None = None,
              nics_per_node: int | None = None, nics_per_group: int | None = None) -> float:
    """nccl-tests model: size × busbw factor ÷ busbw, plus a fixed latency per call.

    Args:
        op: the collective.
        intra_busbw: busbw of groups inside one node, bytes/s.
        inter_busbw: busbw one group gets over a node's inter-node link, bytes/s.
        latency_s: fixed cost per call inside a node.
        inter_latency_s: fixed cost per call of a group spanning nodes (None: latency_s).
        links_per_node: independent inter-node links per node; groups crossing side by side beyond it share
            a link (`link_share`). None: no sharing (the caller's inter_busbw already is the per-group rate).
        nics_per_node: GPU path: inter_busbw is one NIC's and a group uses as many NICs as it has ranks on the
            node, shared among concurrent groups (`group_inter_node_busbw`); replaces links_per_node.
        nics_per_group: GPU path: the cluster's cap on the NICs one group uses (GpuSpec.nics_per_group).
    """
    if op.cross_node:
        if nics_per_node is not None:
            bw = group_inter_node_busbw(inter_busbw, nics_per_node, 1 if op.one_ring else op.ranks_per_node,
                                        op.concurrent_groups, intra_busbw, nics_per_group)
        else:
            share = 1 if links_per_node is None else link_share(op, links_per_node)
            bw = inter_busbw / share
        lat = latency_s if inter_latency_s is None else inter_latency_s
    else:
        bw, lat = intra_busbw, latency_s
    return op.bytes * busbw_factor(op.collective, op.group_size) / bw + op.calls * lat
