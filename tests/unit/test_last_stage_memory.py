"""The last pipeline stage's memory: one micro batch in flight under 1F1B (Megatron's interleaved warm-up count
under interleaving) but the final norm, LM head and the loss's [tokens, vocab] tensors, which the first stage never
holds. The estimate peaks on whichever stage's timeline is higher and says which."""
from __future__ import annotations

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.activations import activation_bytes, last_stage_in_flight
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import run_plan_for
from dstoolkit.models import resolve_model
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy


def _plan(preset="llama-3-8b", pp=2, tp=1, mb=1, ck="full", schedule=None, vpp=1, gbs=64):
    training = {"seq_len": 8192, "global_batch": gbs, "micro_batch": mb, "precision": "bf16", "tp": tp, "pp": pp,
                "zero_stage": 1, "activation_checkpointing": ck, "framework": "megatron", "offload": False,
                "zeropp": False}
    if schedule:
        training.update(pipeline_schedule=schedule, virtual_stages=vpp)
    spec = Spec.model_validate({"name": "x", "model": {"preset": preset},
                                "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM"}, "training": training})
    cand = Candidate(zero_stage=1, tp=tp, pp=pp, micro_batch=mb, checkpoint=CheckpointPolicy(kind=ck))
    return run_plan_for(spec, resolve_model(spec.model), cand)


def test_last_stage_holds_the_head_and_one_micro_batch():
    plan = _plan(pp=2, mb=2)
    first, last = activation_bytes(plan), activation_bytes(plan, stage="last")
    single = activation_bytes(_plan(pp=1, mb=2))  # the same micro batch with the head on the one stage
    assert first.in_flight_micro_batches == 2 and last.in_flight_micro_batches == 1
    assert first.loss_backward_transient == first.loss_forward_transient == 0.0
    # the loss tensors are the single-stage run's: tokens x vocab / tp, fp32 log-softmax and its backward copies
    assert last.loss_backward_transient == single.loss_backward_transient > 0
    assert last.loss_forward_transient == single.loss_forward_transient > 0
    tok = 8192 * 2
    # the head tensors the single stage keeps, less the embedding's ids (8 bytes a token) only the first stage has
    assert last.embedding_and_loss == pytest.approx(single.embedding_and_loss - 8 * tok)
    with pytest.raises(ValueError, match="stage='middle'"):
        activation_bytes(plan, stage="middle")


def test_interleaved_last_stage_keeps_megatrons_warm_up_chunks():
    # Megatron-LM interleaved 1F1B, last rank: (v - 1) x pp warm-up chunks + 1, each 1/v of the stage
    plan = _plan(pp=4, schedule="interleaved", vpp=2, gbs=256)
    assert last_stage_in_flight(plan) == pytest.approx(((2 - 1) * 4 + 1) / 2)
    assert last_stage_in_flight(_plan(pp=4)) == 1.0


def test_estimate_peaks_on_the_stage_whose_timeline_is_higher():
    # Llama 3 8B, pp 2, tp 1, micro batch 2 of 8192 tokens: the loss over 128,256 logits outweighs the first stage's
    # second micro batch of checkpointed blocks
    e = estimate_run(_plan(pp=2, mb=2))
    assert e.memory.peak_pipeline_stage == "last" and e.memory.peak_phase == "backward_loss"
    # 70B at tp 4 x pp 4: the first stage's four micro batches of blocks win
    e70 = estimate_run(_plan(preset="llama-3-70b", pp=4, tp=4))
    assert e70.memory.peak_pipeline_stage == "first"
    assert estimate_run(_plan(pp=1)).memory.peak_pipeline_stage is None
