"""Memory across micro steps and pipeline stages. The last pipeline stage: one micro batch in flight under 1F1B
(Megatron's interleaved warm-up count under interleaving) but the final norm, LM head and the loss's [tokens, vocab]
tensors, which the first stage never holds; the estimate peaks on whichever stage's timeline is higher and says
which. Gradient accumulation: a later micro step runs beside the gradients the earlier ones left."""
from __future__ import annotations

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.stage_activations import activation_bytes, last_stage_in_flight
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


def _dense_plan(ga: int, stage: int = 1, framework: str = "deepspeed", pp: int = 1):
    from dstoolkit.estimate import RunPlan
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models.shape import ModelShape

    shape = ModelShape(name="acc", model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=688, vocab_size=32768)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": ga, "train_batch_size": 4 * ga // pp,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 500_000, "allgather_bucket_size": 500_000}}
    return RunPlan(shape=shape, ds_config=cfg, world_size=2, gpus_per_node=2, gpu=get_gpu("cpu"), seq_len=128,
                   precision="fp32", framework=framework, pp=pp)


def _term(est, phase: str, name: str) -> int:
    ph = next(p for p in est.memory.timeline.phases if p.name == phase)
    return sum(t.bytes for t in ph.terms if t.name == name)


def test_accumulation_keeps_earlier_micro_steps_gradients_alive():
    """ZeRO 1 reduces only at the accumulation boundary: a later micro step's forward runs beside the full .grad
    tensors (measured within 0.5% on 2 ranks: benchmarks/results/pipeline_memory_cpu_*.md, no-pipeline cell);
    ZeRO 2 beside its partition buffer; one micro step, or a framework modelled with DeepSpeed's classes as a
    stand-in (Megatron), adds nothing."""
    from dstoolkit.estimate.memory import deepspeed_model_states
    from dstoolkit.estimate.param_groups import rank_param_groups

    one, four = estimate_run(_dense_plan(1)), estimate_run(_dense_plan(4))
    full = deepspeed_model_states(_dense_plan(4)).grads_backward_peak
    assert _term(one, "forward_end", "grads_accumulated") == 0
    # fp32: 4 bytes for every parameter the rank holds
    assert _term(four, "forward_end", "grads_accumulated") == sum(sum(g) for g in rank_param_groups(_dense_plan(4))) * 4
    assert four.memory.total > one.memory.total
    z2 = deepspeed_model_states(_dense_plan(4, stage=2))
    assert z2.grads_between_micro_steps == z2.grads_backward_peak  # grads_in_partition
    assert full >= _term(four, "forward_end", "grads_accumulated") > 0
    assert _term(estimate_run(_dense_plan(4, framework="megatron")), "forward_end", "grads_accumulated") == 0


def test_deepspeed_last_stage_pipe_buffers_keep_two_micro_batches_of_logits():
    """DeepSpeed's PipelineEngine returns from the last stage's backward before releasing the output buffer, so its
    two pipe buffers keep the logits of the last two micro batches through every phase, the optimizer step too
    (measured within 1% on 2 ranks: benchmarks/results/pipeline_memory_cpu_*.md); Megatron frees its outputs."""
    from dataclasses import replace

    from dstoolkit.estimate.stage_activations import deepspeed_pipe_logits

    def piped(ga, framework="deepspeed"):
        return _dense_plan(ga, framework=framework, pp=2)

    logits_bytes = 4 * 2 * 128 * 32768  # fp32, micro batch 2 x 128 tokens x vocab 32768
    assert deepspeed_pipe_logits(piped(4)) == 2 * logits_bytes
    assert deepspeed_pipe_logits(piped(1)) == logits_bytes  # one micro batch: one buffer ever written
    assert deepspeed_pipe_logits(piped(4, "megatron")) == 0.0
    assert deepspeed_pipe_logits(_dense_plan(4)) == 0.0  # no pipeline
    last = activation_bytes(piped(4), stage="last")
    assert last.pipe_buffers == 2 * logits_bytes
    assert activation_bytes(piped(4)).pipe_buffers == 0.0  # the first stage's outputs are freed in backward
    # fp32: the loss forward adds no copy of the logits the buffer already holds
    assert last.loss_forward_transient == 0.0
    assert last.peak == last.saved + last.recompute_transient + 2 * logits_bytes
    est = estimate_run(piped(4))
    tls = {p.name: p for p in est.memory.timeline.phases}
    assert est.memory.peak_pipeline_stage == "last"
    for phase in ("forward_end", "backward_end", "optimizer_step"):
        assert sum(t.bytes for t in tls[phase].terms if t.name == "pipe_buffers") == 2 * logits_bytes
    # the buffers are outside the saved activations: the last stage's saved bytes drop by the one copy they held
    assert replace(last, pipe_buffers=0.0).peak == last.saved + last.recompute_transient
