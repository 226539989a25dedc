"""Communication model fixes measured across two throttled hosts (issue #9, benchmarks/multinode_throttle.py):
DeepSpeed 0.19.8's ZeRO-1/2 gradient all-reduce, the inter-node rate of a calibrated plan, and groups that
share a node's link."""
import pytest

from dstoolkit.estimate import Calibration, estimate_run
from dstoolkit.runplan import RunPlan
from dstoolkit.estimate.collective_time import busbw_factor, op_time_s
from dstoolkit.estimate.comm import CommOp, comm_plan, group_layout, zero12_grad_collective
from dstoolkit.models import get_preset
from dstoolkit.hardware.table import get_gpu

INTRA, INTER = 4e8, 2.5e7  # bytes/s; 2.5e7 = the 200 Mbit/s throttle of the measurement
CAL = dict(matmul_flops_per_s=1e10, mem_bw_bytes_per_s=1e9, comm_busbw_bytes_per_s=INTRA, comm_latency_s=1e-3)


def _plan(stage=2, preset="tiny", world=4, gpn=2, ep=1, cal=None, gpu="cpu", **z):
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": stage, **z}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=get_preset(preset), ds_config=ds, world_size=world, gpus_per_node=gpn, gpu=get_gpu(gpu),
                   seq_len=32, ep=ep, calibration=cal)


def _bus(op):
    return op.bytes * busbw_factor(op.collective, op.group_size)


# --- 1. ZeRO-1/2 gradient reduction as DeepSpeed 0.19.8 runs it ------------------------------------------------
@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_grads_are_all_reduced_twice_the_reduce_scatter_bus_bytes(stage):
    ds_ops = {op.name: op for op in comm_plan(_plan(stage)).ops}
    paper = {op.name: op for op in comm_plan(_plan(stage), view="paper").ops}
    ar, rs = ds_ops["zero_grad_all_reduce"], paper["zero_reduce_scatter"]
    assert (ar.collective, rs.collective) == ("all_reduce", "reduce_scatter")
    assert ar.bytes == rs.bytes  # the same bucket is handed to the collective ...
    assert _bus(ar) == pytest.approx(2 * _bus(rs))  # ... but an all-reduce moves 2(n-1)/n of it, not (n-1)/n
    assert "zero_reduce_scatter" not in ds_ops and "zero_grad_all_reduce" not in paper
    assert ds_ops["zero_all_gather"] == paper["zero_all_gather"]


@pytest.mark.parametrize("z,name,coll", [
    ({}, "zero_grad_all_reduce", "all_reduce"),  # use_multi_rank_bucket_allreduce defaults to true
    ({"use_multi_rank_bucket_allreduce": False}, "zero_grad_reduce", "reduce"),  # one dist.reduce per partition
    ({"use_multi_rank_bucket_allreduce": False, "reduce_scatter": False}, "zero_grad_all_reduce", "all_reduce"),
    ({"use_multi_rank_bucket_allreduce": False, "contiguous_gradients": False}, "zero_grad_all_reduce",
     "all_reduce"),  # buffered_reduce_fallback
])
def test_grad_collective_follows_the_config(z, name, coll):
    ops = {op.name: op for op in comm_plan(_plan(2, **z)).ops}
    assert ops[name].collective == coll
    if coll == "reduce":
        assert ops[name].calls == 4  # dp destinations x 1 bucket
        assert _bus(ops[name]) == ops[name].bytes


def test_zero12_grad_collective_rejects_unknown_view():
    with pytest.raises(ValueError, match="view='megatron'"):
        zero12_grad_collective(2, contiguous_gradients=True, reduce_scatter=True,
                               use_multi_rank_bucket_allreduce=True, view="megatron")


def test_moe_expert_grads_are_all_reduced_over_the_expert_data_parallel_group():
    ops = {op.name: op for op in comm_plan(_plan(2, preset="tiny-moe", ep=2)).ops}
    exp = ops["zero_grad_all_reduce_experts"]
    assert exp.collective == "all_reduce" and exp.group_size == 2  # edp = dp / ep = 4 / 2
    est = estimate_run(_plan(2, preset="tiny-moe", ep=2))
    assert "zero_grad_all_reduce_experts" in est.comm_bytes_per_step
    assert "zero_reduce_scatter_experts" in est.comm_bytes_per_step_paper


# --- 2. Calibrated plans time cross-node groups at the inter-node rate --------------------------------------
def test_group_spans_nodes_when_its_ranks_are_not_on_one_node():
    assert group_layout(4, 2, 4, 1).cross_node  # dp over 2 nodes x 2
    assert not group_layout(4, 2, 2, 1).cross_node  # ep=2 groups {0,1}, {2,3}
    assert group_layout(4, 2, 2, 2).cross_node  # expert-dp groups {0,2}, {1,3}
    assert not group_layout(8, 8, 8, 1).cross_node


def test_cross_node_group_uses_the_inter_node_busbw_and_latency():
    cal = Calibration(**CAL, inter_node_busbw_bytes_per_s=INTER, inter_node_latency_s=5e-3)
    plan = _plan(2, cal=cal)  # 2 nodes x 2 ranks: every ZeRO group spans nodes
    ops = comm_plan(plan).ops
    assert ops and all(op.cross_node for op in ops)
    want = sum(_bus(op) / INTER + op.calls * 5e-3 for op in ops)
    assert estimate_run(plan).step_time.comm_total_s == pytest.approx(want)
    # without the inter-node rate the calibration's single busbw times them (the old behaviour)
    old = estimate_run(_plan(2, cal=Calibration(**CAL))).step_time.comm_total_s
    assert old == pytest.approx(sum(_bus(op) / INTRA + op.calls * 1e-3 for op in ops))
    # one node: the inter-node rate is not used
    one = _plan(2, gpn=4, cal=cal)
    assert estimate_run(one).step_time.comm_total_s == pytest.approx(
        sum(_bus(op) / INTRA + op.calls * 1e-3 for op in comm_plan(one).ops))


# --- 3. Groups side by side share the node's link ---------------------------------------------------------
def test_two_concurrent_groups_halve_the_link_rate():
    assert group_layout(4, 2, 2, 2).concurrent_groups == 2  # ep=2 expert-dp groups both cross node 0's link
    assert group_layout(4, 2, 4, 1).concurrent_groups == 1  # one ring over all 4 ranks
    one = CommOp("x", "all_reduce", 10**6, 2, True, 1, False, concurrent_groups=1)
    two = CommOp("x", "all_reduce", 10**6, 2, True, 1, False, concurrent_groups=2)
    assert op_time_s(two, INTRA, INTER, links_per_node=1) == pytest.approx(2 * op_time_s(one, INTRA, INTER, links_per_node=1))
    # two links per node (e.g. one NIC per GPU): no sharing
    assert op_time_s(two, INTRA, INTER, links_per_node=2) == pytest.approx(op_time_s(one, INTRA, INTER, links_per_node=2))


def test_calibrated_ep_plan_shares_the_link_between_expert_groups():
    cal = Calibration(**CAL, inter_node_busbw_bytes_per_s=INTER)
    plan = _plan(2, preset="tiny-moe", ep=2, cal=cal)
    ops = {op.name: op for op in comm_plan(plan).ops}
    exp = ops["zero_grad_all_reduce_experts"]
    assert exp.cross_node and exp.concurrent_groups == 2
    assert ops["zero_grad_all_reduce"].concurrent_groups == 1
    assert not ops["ep_all_to_all"].cross_node  # ep groups {0,1}, {2,3} stay inside a node
    want = sum(_bus(op) / (INTER / op.concurrent_groups if op.cross_node else INTRA) + op.calls * 1e-3
               for op in ops.values())
    assert estimate_run(plan).step_time.comm_total_s == pytest.approx(want)


# --- busbw factor at one rank ------------------------------------------------------------------------------------
@pytest.mark.parametrize("coll,factor", [("all_reduce", 0.0), ("all_gather", 0.0), ("reduce_scatter", 0.0),
                                         ("all_to_all", 0.0), ("broadcast", 1.0), ("reduce", 1.0)])
def test_busbw_factor_at_one_rank_is_the_nccl_tests_formula(coll, factor):
    # docs/anchors.md 'Collective bandwidth (nccl-tests)': 2(n-1)/n, (n-1)/n, 1, evaluated at n = 1
    assert busbw_factor(coll, 1) == factor


def test_busbw_factor_rejects_an_empty_group():
    with pytest.raises(ValueError, match="at least one rank"):
        busbw_factor("all_reduce", 0)


# -- NCCL per-call latency (src/graph/tuning.cc ncclTopoTuneModel, ring / Simple) ------------------------
def test_nccl_call_latency_follows_nccls_ring_model():
    from dstoolkit.estimate.collective_time import nccl_call_latency_s

    us = 1e-6
    # all-reduce inside a node of 8: baseLat 8.4 + 2·7 NVLink steps x 3.4
    ar = CommOp("tp_all_reduce", "all_reduce", 1, 8, False, 1, False)
    assert nccl_call_latency_s(ar) == pytest.approx((8.4 + 14 * 3.4) * us)
    # all-gather over 1536 ranks, 8 per node (192 nodes): 1535 steps, 191 of them over the network (9.6 us)
    ag = CommOp("zero3_param_all_gather_fwd", "all_gather", 1, 1536, True, 1, True, 1, 1.0, 8)
    assert nccl_call_latency_s(ag) == pytest.approx((8.4 + (1535 - 191) * 3.4 + 191 * 9.6) * us)
    # one rank per node (tp 8 x dp 4): every step crosses the network
    rs = CommOp("zero_grad_reduce_scatter", "reduce_scatter", 1, 4, True, 1, False)
    assert nccl_call_latency_s(rs) == pytest.approx((8.4 + 3 * 9.6) * us)
    # a point-to-point send between pipeline stages on two nodes: one network step
    pp = CommOp("pp_p2p", "p2p", 1, 2, True, 1, False, 8)
    assert nccl_call_latency_s(pp) == pytest.approx((8.4 + 9.6) * us)


def test_gpu_step_time_charges_each_call_its_latency():
    from dstoolkit.estimate import collective_time as ct
    from dstoolkit.estimate.core import estimate_run

    plan = _plan_for_latency()
    ops = comm_plan(plan).ops
    with_lat = estimate_run(plan).step_time.comm_total_s
    old = ct.NCCL_CALL_LATENCY
    try:
        ct.NCCL_CALL_LATENCY = False
        without = estimate_run(plan).step_time.comm_total_s
    finally:
        ct.NCCL_CALL_LATENCY = old
    assert with_lat - without == pytest.approx(sum(op.calls * ct.nccl_call_latency_s(op) for op in ops), rel=1e-9)
    # Megatron-FSDP reduce-scatters once per layer and micro batch (not per DeepSpeed reduce bucket)
    mega = plan.model_copy(update={"framework": "megatron"})
    rs = {op.name: op.calls for op in comm_plan(mega).ops}["zero3_grad_reduce_scatter"]
    assert rs == mega.ds.grad_accum * mega.shape.num_hidden_layers


def _plan_for_latency():
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models import get_preset
    from dstoolkit.runplan import RunPlan

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=get_preset("llama-3-8b"), ds_config=ds, world_size=16, gpus_per_node=8,
                   gpu=get_gpu("H100-SXM"), seq_len=4096, tp=2)


@pytest.mark.parametrize("stage", [1, 2])
def test_megatron_distributed_optimizer_reduce_scatters_once_per_step(stage):
    """Megatron-Core's distributed optimizer (what megatron-lm files write for ZeRO-1 and -2) reduce-scatters the
    gradient buffer once per optimizer step (param_and_grad_buffer.py start_grad_sync), whatever the accumulation:
    not DeepSpeed's per-bucket all-reduce, and not once per micro-step at stage 2."""
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "bf16": {"enabled": True},
          "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW"}}
    kw = dict(shape=get_preset("tiny"), ds_config=ds, world_size=4, gpus_per_node=2, gpu=get_gpu("cpu"), seq_len=32)
    mg = {op.name: op for op in comm_plan(RunPlan(framework="megatron", **kw)).ops}
    ds_ops = {op.name: op for op in comm_plan(RunPlan(**kw)).ops}
    rs, ar = mg["zero_reduce_scatter"], ds_ops["zero_grad_all_reduce"]
    assert rs.collective == "reduce_scatter" and "zero_grad_all_reduce" not in mg
    reps = 4 if stage == 2 else 1  # DeepSpeed's stage 2 reduces in every micro-step
    assert ar.bytes == reps * rs.bytes
    assert mg["zero_all_gather"].bytes == ds_ops["zero_all_gather"].bytes
