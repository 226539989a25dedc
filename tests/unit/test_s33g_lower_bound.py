"""The sweep's model-state lower bound never exceeds the full estimate (s33 estimator finding 5).

Before: `zero_model_state_bytes` counted device gradient partitions under ZeRO-2/3 with optimizer offload, where
DeepSpeed copies each partition to the host as it is reduced; llama-3.1-405b at tp8 with ZeRO-3 + offload on one
H100 node got "model states alone need at least 94.5 GiB per rank" (a hard drop) for a layout the estimator puts
at 18.7 GiB.
"""
from __future__ import annotations

import itertools

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import EstimateInputError, estimate_candidate
from dstoolkit.generate.rules import check_candidate
from dstoolkit.generate.sweep import model_state_lower_bound_bytes, run_sweep
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy

OFFLOADS = ((False, False), (True, False), (True, True))  # none, optimizer, optimizer + parameters


def _spec(preset: str, nodes: int, precision: str, framework: str, gpu: str = "H200") -> Spec:
    return Spec.model_validate({
        "name": "lb", "model": {"preset": preset}, "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu": gpu},
        "training": {"seq_len": 1024, "global_batch": 64, "micro_batch": 1, "precision": precision,
                     "optimizer": "adamw", "activation_checkpointing": "full", "tp": "auto", "pp": "auto",
                     "zero_stage": "auto", "offload": True, "framework": framework}})


@pytest.mark.parametrize("preset,nodes,eps", [("llama-3-8b", 1, (1,)), ("mixtral-8x7b", 2, (1, 8))])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("framework", ["deepspeed", "megatron"])
def test_lower_bound_is_below_the_full_estimate(preset, nodes, eps, precision, framework):
    spec = _spec(preset, nodes, precision, framework)
    shape = resolve_spec_model(spec)
    checked = 0
    for stage, (oo, op), tp, ep, pp in itertools.product((0, 1, 2, 3), OFFLOADS, (1, 2, 8), eps, (1, 2)):
        if (oo and stage == 0) or (op and stage < 3):
            continue
        cand = Candidate(zero_stage=stage, offload_optimizer=oo, offload_param=op, tp=tp, pp=pp, ep=ep,
                         micro_batch=1, checkpoint=CheckpointPolicy(kind="full"))
        if check_candidate(spec, shape, cand, framework == "deepspeed", ()) is not None:
            continue
        try:
            est = estimate_candidate(spec, shape, cand, spec.cluster.gpu_spec)
        except EstimateInputError:
            continue
        checked += 1
        assert model_state_lower_bound_bytes(spec, shape, cand) <= est.memory_per_rank_bytes, cand.label
    assert checked >= 20


def test_zero_infinity_405b_on_one_node_is_estimated_not_dropped_by_the_bound():
    spec = Spec.model_validate({
        "name": "lb405", "model": {"preset": "llama-3.1-405b"},
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "host_memory_per_node_gib": 12000},
        "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "full", "tp": 8, "pp": 1, "zero_stage": 3, "offload": True}})
    res = run_sweep(spec, resolve_spec_model(spec), advise=False)
    assert res.winner is not None and res.fits_nowhere is None
    assert res.winner.candidate.label == "zero3 offload=opt+param tp8 pp1 mb1 ckpt=full"
