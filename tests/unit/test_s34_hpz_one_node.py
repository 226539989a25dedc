"""s34: ZeRO++ hpZ where the data-parallel group fits in one node, and hpZ groups larger than a node.

DeepSpeed 0.19.8 builds the hpZ secondary partition for any zero_hpz_partition_size > 1 (partition_parameters.py
Init.__init__: zero_param_process_group; the secondary holds tensor_size // num_ranks_in_param_group elements).
Before, `generate` wrote zero_hpz_partition_size = gpus_per_node / tp on one node, where the hpZ group is the whole
data-parallel group: a second copy of the primary partition (memory) for no cross-node saving; its HF config wrote
the NVLink domain instead (two owners of one fact, different values on tp > 1). And the comm model charged the
backward gather of an hpZ group larger than a node at intra-node rates.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.comm import comm_plan
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import run_plan_for
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.generate.hf_targets import build_hf_ds_config
from dstoolkit.hardware.table import get_gpu
from dstoolkit.layout.dims import hpz_partition
from dstoolkit.models.presets import get_preset
from dstoolkit.runplan import RunPlan
from dstoolkit.spec.checkpoint import CheckpointPolicy

SPEC = """\
name: zpp
model: {{preset: llama-3-8b}}
cluster: {{nodes: {nodes}, gpus_per_node: 8, gpu: H100-SXM}}
training: {{seq_len: 4096, global_batch: 64, micro_batch: 1, precision: bf16, optimizer: adamw,
           activation_checkpointing: full, tp: {tp}, pp: 1, zero_stage: 3, offload: false, zeropp: true}}
"""


@pytest.mark.parametrize("gpn, world, tp, dp, want", [
    (8, 8, 1, 8, 1),      # one node: the DP group is the node, no hierarchy
    (8, 16, 1, 16, 8),    # two nodes: the node's 8 DP ranks
    (8, 32, 2, 16, 4),    # tp 2: 4 DP ranks per node
    (8, 16, 2, 8, 4),     # tp 2 on two nodes: dp 8 spans them
    (8, 8, 2, 4, 1),      # tp 2 on one node: dp 4 inside it
    (72, 72, 1, 72, 1),   # an NVLink domain taken as the node
])
def test_hpz_partition(gpn, world, tp, dp, want):
    assert hpz_partition(gpn, world, tp, dp) == want


def _generated(tmp_path, nodes, tp):
    from dstoolkit.generate.io import load_spec_and_shape

    p = tmp_path / f"zpp_{nodes}_{tp}.yaml"
    p.write_text(SPEC.format(nodes=nodes, tp=tp))
    spec, shape = load_spec_and_shape(p)
    cand = Candidate(zero_stage=3, zeropp=True, micro_batch=1, tp=tp, checkpoint=CheckpointPolicy(kind="full"))
    return spec, shape, cand


@pytest.mark.parametrize("nodes, tp, want", [(1, 1, 1), (1, 2, 1), (2, 1, 8), (4, 2, 4)])
def test_generated_hpz_is_one_fact_in_both_configs(tmp_path, nodes, tp, want):
    spec, shape, cand = _generated(tmp_path, nodes, tp)
    ds = build_ds_config(spec, shape, cand)["zero_optimization"]
    assert ds["zero_hpz_partition_size"] == want
    if tp > 1:  # no HF form of AutoTP at ZeRO-3 (s37: transformers' ZeRO-3 loader refuses it, HF_ZERO3_AUTOTP_NOTE)
        with pytest.raises(ValueError, match="at ZeRO stage 3: transformers 5 loads"):
            build_hf_ds_config(spec, shape, cand)
        cand = Candidate(zero_stage=3, zeropp=True, micro_batch=1, tp=1, checkpoint=CheckpointPolicy(kind="full"))
        want = build_ds_config(spec, shape, cand)["zero_optimization"]["zero_hpz_partition_size"]
        ds = build_ds_config(spec, shape, cand)["zero_optimization"]
    hf = build_hf_ds_config(spec, shape, cand)["zero_optimization"]
    assert ds["zero_hpz_partition_size"] == hf["zero_hpz_partition_size"] == want
    assert ds["zero_quantized_weights"] and ds["zero_quantized_gradients"]  # qwZ / qgZ stay on


def test_one_node_zeropp_carries_no_secondary_copy(tmp_path):
    spec, shape, cand = _generated(tmp_path, 1, 1)
    cfg = build_ds_config(spec, shape, cand)
    est = estimate_run(run_plan_for(spec, shape, cand, cfg))
    assert est.memory.hpz_secondary_params == 0
    # what the old value (8 = the whole DP group) cost: a second copy of the primary partition
    cfg8 = json.loads(json.dumps(cfg))
    cfg8["zero_optimization"]["zero_hpz_partition_size"] = 8
    old = estimate_run(run_plan_for(spec, shape, cand, cfg8))
    assert old.memory.hpz_secondary_params > 0
    assert old.memory.total > est.memory.total


def _plan(world, hpz):
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 3, "zero_hpz_partition_size": hpz}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=get_preset("llama-3-8b"), ds_config=ds, world_size=world, gpus_per_node=8,
                   gpu=get_gpu("H100-SXM"), seq_len=4096)


def _bwd(plan):
    return next(op for op in comm_plan(plan).ops if op.name == "zero3_param_all_gather_bwd")


def test_hpz_group_larger_than_a_node_crosses_nodes():
    inside = _bwd(_plan(32, 8))
    assert (inside.group_size, inside.cross_node) == (8, False)
    across = _bwd(_plan(32, 16))  # a hand-written 16 on 8-GPU nodes: each hpZ group holds two nodes
    assert (across.group_size, across.cross_node, across.ranks_per_node) == (16, True, 8)
    # and its backward gather is no longer free of the network: it costs more time than the node-local one
    t_in = estimate_run(_plan(32, 8)).step_time.comm_total_s
    t_across = estimate_run(_plan(32, 16)).step_time.comm_total_s
    assert t_across > t_in
