"""The sweep's micro-batch shortcut prunes only where memory grows with the micro-batch (s33 estimator finding 4).

Before: once a micro-batch of a layout did not fit, every larger one was dropped unestimated ("micro-batch 8 of the
same layout already needs 69.9 GiB"), but at a fixed global batch a larger micro-batch means fewer micro steps: at
gradient accumulation 1 the accumulated gradients go away, and on a pipeline fewer micro batches are in flight. On
mixtral-8x7b, 2 x 8 GPUs of 68 GiB, ZeRO-1 + offload, ep4: mb8 69.9 GiB (over), mb16 65.9 GiB (fits, fastest) was
dropped. Now `sweep.accumulation_saturated` states when the shortcut holds; elsewhere the micro-batch is estimated.
"""
from __future__ import annotations

import itertools

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import EstimateInputError, estimate_candidate
from dstoolkit.generate.rules import check_candidate
from dstoolkit.generate.sweep import accumulation_saturated, run_sweep
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy

GPU_68G = {"name": "H100-68G", "memory_bytes": 73014444032, "peak_bf16_flops": 989000000000000,
           "peak_fp8_flops": 1979000000000000, "intra_node_bw_bytes_per_s": 365000000000,
           "inter_node_bw_bytes_per_s": 45000000000}


def _prune_spec() -> Spec:
    return Spec.model_validate({
        "name": "prune", "model": {"preset": "mixtral-8x7b"},
        "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": GPU_68G},
        "training": {"seq_len": 4096, "global_batch": 256, "micro_batch": "auto", "precision": "bf16",
                     "optimizer": "adamw", "activation_checkpointing": "full", "tp": 1, "pp": 1, "ep": 4,
                     "zero_stage": 1, "offload": True}})


def test_a_larger_micro_batch_that_fits_is_not_pruned():
    spec = _prune_spec()
    res = run_sweep(spec, resolve_spec_model(spec), top=10, advise=False)
    labels = [r.candidate.label for r in res.ranked]
    assert "zero1 offload=opt tp1 pp1 ep4 mb16 ckpt=full" in labels
    assert not any("mb16" in d.candidate.label and "already needs" in d.reason for d in res.dropped)


def _mem(spec, shape, cand):
    try:
        return estimate_candidate(spec, shape, cand, spec.cluster.gpu_spec).memory_per_rank_bytes
    except EstimateInputError:
        return None


def test_memory_grows_with_the_micro_batch_where_accumulation_is_saturated():
    """Where the shortcut prunes (the larger micro-batch's accumulation saturated), the full estimate agrees:
    memory at 2 x mb >= memory at mb, over ZeRO stages x offload x tp x pp x frameworks."""
    checked = 0
    for preset, nodes, fw in (("llama-3-8b", 1, "deepspeed"), ("llama-3-8b", 1, "megatron"),
                              ("mixtral-8x7b", 2, "deepspeed")):
        spec = Spec.model_validate({
            "name": "mono", "model": {"preset": preset}, "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu": "H200"},
            "training": {"seq_len": 2048, "global_batch": 512, "micro_batch": "auto", "precision": "bf16",
                         "optimizer": "adamw", "activation_checkpointing": "auto", "tp": "auto", "pp": "auto",
                         "zero_stage": "auto", "offload": True, "framework": fw}})
        shape = resolve_spec_model(spec)
        for stage, oo, tp, pp, ckpt in itertools.product((0, 1, 2, 3), (False, True), (1, 2), (1, 2, 4),
                                                         ("none", "full")):
            if oo and stage == 0:
                continue
            prev = None
            for mb in (1, 2, 4, 8, 16):
                cand = Candidate(zero_stage=stage, offload_optimizer=oo, tp=tp, pp=pp, micro_batch=mb,
                                 checkpoint=CheckpointPolicy(kind=ckpt))
                if check_candidate(spec, shape, cand, fw == "deepspeed", ()) is not None:
                    prev = None
                    continue
                m = _mem(spec, shape, cand)
                if prev is not None and m is not None and accumulation_saturated(spec, cand):
                    assert m >= prev, (preset, fw, cand.label)
                    checked += 1
                prev = m
    assert checked >= 50


def test_the_condition_is_needed_memory_falls_when_accumulation_reaches_one():
    spec = _prune_spec()
    shape = resolve_spec_model(spec)
    mb8, mb16 = (Candidate(zero_stage=1, offload_optimizer=True, ep=4, micro_batch=mb,
                           checkpoint=CheckpointPolicy(kind="full")) for mb in (8, 16))
    assert _mem(spec, shape, mb16) < _mem(spec, shape, mb8)
    assert not accumulation_saturated(spec, mb16)  # ga 1: estimated, not pruned
