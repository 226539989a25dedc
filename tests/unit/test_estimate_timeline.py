"""Peak memory as a peak (issue #15): the per-phase timeline, checked against values computed by hand.

The phase sums below are written out from the accounting in dstoolkit/estimate/timeline.py's docstring
(what coexists in each phase), with the model-state sizes from ZeRO §3.1/§5 and DeepSpeed's buffers,
not read back from the estimator's output.
"""
import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.estimate.stage_activations import ActivationEstimate, activation_bytes
from dstoolkit.estimate.model_states import ModelStates
from dstoolkit.estimate.timeline import (CPU_ALLOWANCE_BYTES, GPU_CONTEXT_BYTES,
                                         device_allowance_bytes, memory_timeline)
from dstoolkit.generate.costing import usable_device_bytes
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan
from dstoolkit.spec.checkpoint import CheckpointPolicy

GIB = 2**30


def _act(saved, transient=0.0):
    return ActivationEstimate(saved=saved, recompute_transient=transient, embedding_and_loss=0.0,
                              in_flight_micro_batches=1)


def _by_name(tl):
    return {p.name: p for p in tl.phases}


def test_zero12_phases_by_hand():
    ms = ModelStates(optimizer_path="zero12", params=200, master_params=400, optimizer_states=800,
                     grads_at_step=400, grads_backward_peak=100, grads_step_transient_peak=700,
                     transient_buffers=50)
    tl = memory_timeline(ms, _act(1000), zero_stage=2, offload_optimizer=False, head_activations=300)
    ph = _by_name(tl)
    # persistent: 200 + 400 + 800 = 1400
    assert ph["forward_end"].device_bytes == 1400 + 1000
    assert ph["backward_start"].device_bytes == 1400 + (1000 - 300) + 0 + 50  # head freed, bucket allocated
    assert ph["backward_end"].device_bytes == 1400 + 100 + 50  # partition grads + reduce bucket
    assert ph["optimizer_step"].device_bytes == 1400 + 400
    assert ph["optimizer_step_cast"].device_bytes == 1400 + 700
    assert "backward_recompute" not in ph and "offload_step" not in ph
    assert tl.peak_phase.name == "forward_end" and tl.peak_bytes == 2400
    # the rank whose partition holds the LM head allocates its whole partition buffer at the first bucket
    tail = ModelStates(**{**ms.__dict__, "grads_backward_start": 500})
    tl2 = memory_timeline(tail, _act(1000), zero_stage=2, offload_optimizer=False, head_activations=300)
    assert tl2.peak_phase.name == "backward_start" and tl2.peak_bytes == 1400 + 700 + 500 + 50
    # old additive total: params + max(grads) + master + states + activations + buffers
    assert tl.sum_of_parts_bytes == 200 + 700 + 400 + 800 + 1000 + 50
    assert tl.peak_phase.alive()[:2] == ["activations_saved", "optimizer_states"]


def test_zero3_recompute_and_persistent_grad_buffer_by_hand():
    ms = ModelStates(optimizer_path="zero3", params=100, master_params=200, optimizer_states=400,
                     grads_at_step=150, grads_persistent=50, grads_backward_peak=50, persistent_buffers=30,
                     transient_buffers=70)
    tl = memory_timeline(ms, _act(500, 200), zero_stage=3, offload_optimizer=False)
    ph = _by_name(tl)
    base = 100 + 200 + 400 + 30 + 50  # weights partition, master, moments, reduce bucket, grad partition buffer
    assert ph["forward_end"].device_bytes == base + 500 + 70  # + gathered params
    assert ph["backward_start"].device_bytes == base + 500 + 70  # no bucket term: stage 3's persists in base
    assert ph["backward_recompute"].device_bytes == base + 500 + 200 + 70
    assert ph["backward_end"].device_bytes == base + 0 + 70  # the grad buffer is already in base
    assert ph["optimizer_step"].device_bytes == base + 100  # fp32 copy of one sub-group; params repartitioned
    assert tl.peak_phase.name == "backward_recompute" and tl.peak_bytes == 1550


def test_offload_host_terms_live_in_every_phase():
    ms = ModelStates(optimizer_path="zero12", params=200, persistent_buffers=10, host_master_params=400,
                     host_optimizer_states=800, host_grads=400, host_buffers=100, grads_backward_peak=20,
                     transient_buffers=5)
    tl = memory_timeline(ms, _act(300), zero_stage=2, offload_optimizer=True)
    ph = _by_name(tl)
    assert all(p.host_bytes == 1700 for p in tl.phases)
    assert ph["offload_step"].device_bytes == 210
    assert ph["forward_end"].device_bytes == 510
    assert ph["backward_start"].device_bytes == 515  # + the reduce bucket
    assert tl.peak_bytes == 515 and tl.peak_with_host_bytes == 515 + 1700


def _tiny_plan(stage, *, precision="fp32", world=2, gpu="cpu", ckpt="none", seq=32, mb=2):
    shape = ModelShape(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=128, vocab_size=100)
    cfg = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"torch_adam": True}},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 500_000}}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return RunPlan(shape=shape, ds_config=cfg, world_size=world, gpus_per_node=world, gpu=get_gpu(gpu),
                   seq_len=seq, precision=precision, checkpoint=CheckpointPolicy(kind=ckpt))


# Ψ of the tiny shape, by hand: per layer q,k,v,o 4·64·64 + gated MLP 3·64·128 + two norms 2·64 = 41,088;
# two layers, embedding 100·64, untied LM head 100·64, final norm 64.
PSI = 2 * (4 * 64 * 64 + 3 * 64 * 128 + 2 * 64) + 2 * 100 * 64 + 64


def test_stage0_fp32_peak_is_backward_end_by_hand():
    plan = _tiny_plan(0)
    est = estimate_run(plan)
    a = activation_bytes(plan)
    ph = {p.name: p.device_bytes for p in est.memory.timeline.phases}
    # fp32 weights 4Ψ + Adam moments 8Ψ (no separate master in fp32); Ψ < reduce_bucket_size
    assert ph["forward_end"] == 12 * PSI + int(a.saved)
    assert ph["backward_end"] == 12 * PSI + 4 * PSI + 4 * PSI  # .grad + the flattened all-reduce bucket
    # + torch AdamW's for-loop temporaries: 2 fp32 copies of the largest parameter (the MLP's 64 x 128)
    assert ph["optimizer_step"] == 16 * PSI + 2 * 4 * 64 * 128
    head_numel = 100 * 64 + 64  # LM head + final norm: their gradients exist when backward reaches the last block
    head_act = a.embedding_and_loss - 8 * 32 * 2  # all but the ids the embedding keeps (8 bytes x seq x mb)
    assert ph["backward_start"] == 12 * PSI + int(a.saved - head_act) + 4 * head_numel
    logits = 64 * 100  # tokens (seq 32 x mb 2) x vocab
    assert ph["forward_loss"] == 12 * PSI + int(a.saved) + 4 * logits  # fp32 logits beside the log-probs
    assert ph["backward_loss"] == 12 * PSI + int(a.saved) + 2 * 4 * logits  # log_softmax backward's in/out
    peak = max(12 * PSI + int(a.saved) + 8 * logits, 20 * PSI, 16 * PSI + 2 * 4 * 64 * 128,
               12 * PSI + int(a.saved - head_act) + 4 * head_numel)
    assert est.memory.total == peak and est.to_json()["memory_per_rank_bytes"]["peak"] == peak
    assert est.memory.sum_of_parts_bytes == 4 * PSI + 4 * PSI + 8 * PSI + int(a.peak) + 4 * PSI + 2 * 4 * 64 * 128
    assert est.memory.sum_of_parts_bytes > est.memory.total


def test_stage2_bf16_forward_end_by_hand():
    plan = _tiny_plan(2, precision="bf16")
    est = estimate_run(plan, rank=0)
    a = activation_bytes(plan)
    padded = -(-PSI // 4) * 4  # flat buffer padded to a multiple of 2·N = 4 elements
    part = padded // 2
    ph = {p.name: p.device_bytes for p in est.memory.timeline.phases}
    # bf16 flat weights 2Ψ', fp32 master partition 4Ψ'/N, Adam moments 8Ψ'/N, no grads between steps
    assert ph["forward_end"] == 2 * padded + 4 * part + 8 * part + int(a.saved)


def test_allowance_gpu_and_cpu():
    h100 = get_gpu("H100-SXM")
    # no fragmentation allowance (no published figure): the context and NCCL buffers only, whatever the peak
    assert device_allowance_bytes(h100, 40 * GIB) == device_allowance_bytes(h100, 70 * GIB) == GPU_CONTEXT_BYTES
    assert device_allowance_bytes(get_gpu("cpu"), 40 * GIB) == CPU_ALLOWANCE_BYTES == 0
    # usable_device_bytes is the largest peak that passes peak + allowance <= memory
    u = usable_device_bytes(h100)
    assert u + device_allowance_bytes(h100, u) <= h100.memory_bytes
    assert (u + 2) + device_allowance_bytes(h100, u + 2) > h100.memory_bytes
    assert usable_device_bytes(get_gpu("cpu")) == get_gpu("cpu").memory_bytes


def test_fits_uses_peak_plus_allowance():
    plan = _tiny_plan(1, precision="bf16", gpu="H100-SXM")
    est = estimate_run(plan)
    m = est.memory
    assert m.allowance_bytes == GPU_CONTEXT_BYTES
    assert m.required_bytes == m.total + m.allowance_bytes and est.fits
    assert "CUDA context" in m.allowance_source


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_peak_never_exceeds_sum_of_parts(stage):
    for ckpt in ("none", "full"):
        est = estimate_run(_tiny_plan(stage, precision="bf16", ckpt=ckpt))
        assert 0 < est.memory.total <= est.memory.sum_of_parts_bytes
        assert est.memory.peak_phase in {p.name for p in est.memory.timeline.phases}
