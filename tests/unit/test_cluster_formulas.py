"""Formulas of the GPU cluster model added for the published-runs benchmark (issue 16), pinned with values derived
by hand from their sources: torchtitan's op-level selective activation checkpointing, Transformer Engine's FP8
cached GEMM inputs, LayerNorm's saved tensors, DeepSpeed ZeRO-3's prefetch bucket, ZeRO over dp x cp, and the
FlashAttention-2 rate on Hopper."""
import pytest

from dstoolkit.estimate import cluster_model as cm
from dstoolkit.estimate import gemm
from dstoolkit.estimate.activations import (
    layer_activation_bytes,
    op_sac_layer_bytes,
    op_sac_recomputed_weights,
    uses_op_sac,
)
from dstoolkit.estimate.comm import CommOp, CommPlan, comm_plan, largest_gathered_module_numel, \
    zero3_prefetch_hidden_fraction
from dstoolkit.estimate.flops import plan_flops_per_token
from dstoolkit.estimate.memory import deepspeed_model_states, zero_group_sizes
from dstoolkit.estimate.stage_activations import activation_bytes
from dstoolkit.estimate.step_time import DEFAULT_OVERLAP_EFFICIENCY, step_time
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan
from dstoolkit.spec.checkpoint import CheckpointPolicy

# Llama 3 8B: h 4096, 32 heads of 128, 8 KV heads, SwiGLU FFN 14336, 32 layers
H, A, D, G, I = 4096, 32, 128, 8, 14336


def _ds(stage=1, mb=1, ga=1, **zero):
    return {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga, "bf16": {"enabled": True},
            "zero_optimization": {"stage": stage, **zero}, "optimizer": {"type": "AdamW"}}


def _plan(preset="llama-3-8b", world=8, stage=1, mb=1, ga=1, seq=4096, zero=None, shape=None, **kw):
    return RunPlan(shape=shape or get_preset(preset), ds_config=_ds(stage, mb, ga, **(zero or {})),
                   world_size=world, gpus_per_node=8, gpu=get_gpu(kw.pop("gpu", "H100-SXM")), seq_len=seq, **kw)


SELECTIVE = CheckpointPolicy(kind="selective")


# -- torchtitan op-level SAC --------------------------------------------------------------------------------
def test_op_sac_applies_to_fsdp_selective_only():
    # torchtitan (framework fsdp) 'selective' = op SAC; Megatron / DeepSpeed 'selective' = attention core
    assert uses_op_sac(_plan(framework="fsdp", checkpoint=SELECTIVE))
    assert not uses_op_sac(_plan(framework="megatron", checkpoint=SELECTIVE))
    assert not uses_op_sac(_plan(framework="fsdp"))


def test_op_sac_keeps_odd_matmul_outputs_sdpa_output_and_block_input():
    # torchtitan _custom_policy: save mm outputs except every second (q, v, gate, down kept; k, o, up recomputed),
    # the SDPA output and its fp32 log-sum-exp; the checkpoint wrapper keeps the block input. Per token in bf16:
    # 2h (input) + 2·a·d (q) + 2·g·d (v) + 2i (gate) + 2h (down) + 2·a·d (SDPA out) + 4a (lse) = 63,616 bytes
    per_token = 2 * H + 2 * A * D + 2 * G * D + 2 * I + 2 * H + 2 * A * D + 4 * A
    assert per_token == 63_616
    p = _plan(framework="fsdp", checkpoint=SELECTIVE, mb=2, seq=8192, stage=3, attention_impl="sdpa")
    assert op_sac_layer_bytes(p, 0, 2) == pytest.approx(per_token * 2 * 8192)


def test_op_sac_recomputes_every_second_matmul():
    # k (h x g·d), o (a·d x h) and up (h x i) re-run in backward: 4,194,304 + 16,777,216 + 58,720,256 weights
    p = _plan(framework="fsdp", checkpoint=SELECTIVE)
    assert op_sac_recomputed_weights(p, 0) == H * G * D + A * D * H + H * I == 79_691_776


def test_op_sac_saves_less_than_attention_core_selective_and_costs_the_recomputed_matmuls():
    kw = dict(mb=2, seq=8192, stage=3, attention_impl="sdpa", checkpoint=SELECTIVE)
    fsdp, ds = _plan(framework="fsdp", **kw), _plan(framework="deepspeed", **kw)
    assert activation_bytes(fsdp).saved < 0.5 * activation_bytes(ds).saved
    # the recompute shows up in the step (2 FLOPs per recomputed weight and token), the attention core does not
    from dstoolkit.estimate.core import estimate_run

    assert estimate_run(fsdp).step_time.compute_s > estimate_run(
        fsdp.model_copy(update={"checkpoint": CheckpointPolicy(kind="none")})).step_time.compute_s


# -- Transformer Engine FP8 cached GEMM inputs ------------------------------------------------------------
def test_te_fp8_keeps_gemm_inputs_in_one_byte():
    # per token, fused (te) Llama block, t = 1: norms 2·((p + pl)·h + 4), q/k/v p·(a + 2g)·d, attention output
    # p·a·d (+ its FP8 copy pl·a·d for the out-projection), lse 4a, FFN (2p + pl)·i
    bf16 = 2 * (4 * H + 4) + 2 * (A + 2 * G) * D + 2 * A * D + 4 * A + 6 * I
    fp8 = 2 * (3 * H + 4) + 2 * (A + 2 * G) * D + 2 * A * D + A * D + 4 * A + 5 * I
    assert (bf16, fp8) == (139_400, 120_968)
    tok = 4096
    assert layer_activation_bytes(_plan(attention_impl="te"), 0, 1).full == pytest.approx(bf16 * tok)
    assert layer_activation_bytes(_plan(attention_impl="te", precision="fp8"), 0, 1).full == pytest.approx(fp8 * tok)


# -- LayerNorm saves its low-precision input (GPU path) ---------------------------------------------------
def test_layernorm_keeps_bf16_input_and_fp32_stats_on_gpu_only():
    # aten native_layer_norm saves input, mean, rstd: p·h + 8 per token instead of the RMSNorm fp32 upcast
    # (4 + p)·h + 4; two norms per block -> 2·(4h - 4) bytes per token less, on the GPU path only
    ln = get_preset("llama-3-8b").model_copy(update={"norm_type": "layernorm"})
    tok = 4096
    gpu = layer_activation_bytes(_plan(), 0, 1).full - layer_activation_bytes(_plan(shape=ln), 0, 1).full
    assert gpu == pytest.approx(2 * (4 * H - 4) * tok)
    cpu = layer_activation_bytes(_plan(gpu="cpu"), 0, 1).full - layer_activation_bytes(
        _plan(shape=ln, gpu="cpu"), 0, 1).full
    assert cpu == 0


# -- DeepSpeed ZeRO-3 prefetch bucket ---------------------------------------------------------------------
def test_zero3_prefetch_hides_bucket_over_largest_module():
    # DeepSpeed prefetches at most stage3_prefetch_bucket_size elements ahead: 5e7 of the 58,720,256-element
    # FFN matrices of Llama 3 8B; PyTorch FSDP prefetches whole units
    p = _plan(stage=3, zero={"stage3_prefetch_bucket_size": 50_000_000})
    assert largest_gathered_module_numel(p) == H * I
    assert zero3_prefetch_hidden_fraction(p) == pytest.approx(50_000_000 / (H * I))
    assert zero3_prefetch_hidden_fraction(p.model_copy(update={"framework": "fsdp"})) == 1.0
    ops = {op.name: op.hidden_fraction for op in comm_plan(p).ops}
    assert ops["zero3_param_all_gather_fwd"] == pytest.approx(50_000_000 / (H * I))
    assert ops["zero3_grad_reduce_scatter"] == 1.0


def test_hidden_fraction_exposes_the_rest_of_an_overlappable_op():
    # an overlappable all-gather of t seconds with ample compute: exposed = (1 - f)·t + f·t·(1 - eta)
    p = _plan(stage=3, mb=4, seq=4096)
    fpt = plan_flops_per_token(p)
    nbytes, n = 10 * 2**30, 8
    # bytes at the NVLink busbw plus one call's NCCL latency: 8.4 us + 7 ring steps x 3.4 us (collective_time.nccl_call_latency_s)
    t = nbytes * (n - 1) / n / p.gpu.intra_node_bw_bytes_per_s + 8.4e-6 + 7 * 3.4e-6

    def exposed(f):
        op = CommOp("zero3_param_all_gather_fwd", "all_gather", nbytes, n, False, 1, True, 1, f)
        return step_time(p, fpt, CommPlan([op]), 1, 4 * 4096).comm_exposed_s

    eta = DEFAULT_OVERLAP_EFFICIENCY
    assert exposed(1.0) == pytest.approx(t * (1 - eta))
    assert exposed(0.25) == pytest.approx(0.75 * t + 0.25 * t * (1 - eta))


def test_overlap_contention_slows_compute_not_the_collective():
    # eta is the compute's speed while collectives run beside it: compute-bound, the step pays (1 - eta) x comm;
    # comm-bound, the slowed compute finishes under the collectives and the step pays only the overflow;
    # eta 0 (nothing overlaps) is the sum, eta 1 the longer of the two
    from dstoolkit.estimate.step_time import overlapped_exposed_s

    assert overlapped_exposed_s(4.0, 4.0, 0.8) == pytest.approx(0.8)  # 4 s of comm inside 10 s of compute
    assert overlapped_exposed_s(17.0, 13.0, 0.8) == pytest.approx(4.0)  # comm-bound: max(17 - 13, 0.2 x 17)
    assert overlapped_exposed_s(11.0, 10.0, 0.8) == pytest.approx(2.2)  # compute still the longer: 0.2 x 11
    assert overlapped_exposed_s(6.0, 4.0, 0.0) == pytest.approx(6.0)  # sequential: all of it
    assert overlapped_exposed_s(6.0, 4.0, 1.0) == pytest.approx(2.0)  # perfect overlap: max(comm, compute)


def test_comm_bound_zero3_step_is_the_collectives_time():
    # a ZeRO-3 gather far longer than the step's compute: the step takes the gather's time plus the compute it
    # cannot hide behind, not the gather plus (1 - eta) x the compute on top (the additive charge it replaced)
    p = _plan(stage=3, mb=1, seq=512)
    fpt = plan_flops_per_token(p)
    nbytes, n = 400 * 2**30, 8
    op = CommOp("zero3_param_all_gather_fwd", "all_gather", nbytes, n, False, 1, True, 1, 1.0)
    st = step_time(p, fpt, CommPlan([op]), 1, 512)
    t = st.comm_total_s
    assert t > 2 * st.compute_s
    assert st.comm_exposed_s == pytest.approx(t - st.compute_s)
    assert st.compute_s + st.comm_exposed_s == pytest.approx(t)


# -- ZeRO over the data-parallel ranks with context parallelism -------------------------------------------
def test_zero_partitions_over_dp_times_cp():
    # Megatron-Core's distributed optimizer uses the data-parallel group with context parallelism: 16 GPUs,
    # tp 2, cp 2 -> dp 4, ZeRO over 8 ranks
    p = _plan(world=16, tp=2, cp=2, stage=1, mb=1, ga=4, framework="megatron")
    assert p.dp == 4
    assert zero_group_sizes(p) == (8, 8)
    no_cp = _plan(world=16, tp=2, stage=1, mb=1, ga=4, framework="megatron")
    half = deepspeed_model_states(no_cp).master_params
    # the same parameters (tp 2) over 8 ZeRO ranks in both: dp 8 without cp, dp 4 x cp 2 with it
    assert deepspeed_model_states(p).master_params == half
    assert {op.group_size for op in comm_plan(p).ops if op.name.startswith("zero")} == {8}


# -- FlashAttention-2 on Hopper ---------------------------------------------------------------------------
def test_fa2_attention_fraction_on_hopper():
    # FlashAttention-3 (Shah et al. 2024), abstract: FA2 reaches ~35% of H100 peak; A100 figures unchanged
    assert cm.attention_fraction(get_gpu("H100-SXM"), "sdpa") == 0.35
    assert cm.attention_fraction(get_gpu("H100-SXM"), "flash") == 0.35
    assert cm.attention_fraction(get_gpu("H100-SXM"), "te") == cm.ATTENTION_FRACTION["te"]
    assert cm.attention_fraction(get_gpu("A100-80G"), "sdpa") == cm.ATTENTION_FRACTION["sdpa"]


def test_blackwell_ultra_attention_speedup():
    """B300 / GB300 (compute capability 10.3) run the fused attention kernels BLACKWELL_ULTRA_ATTENTION_SPEEDUP
    faster than Blackwell at the same peak; B200 / GB200 (10.0) and the eager core keep their figures."""
    for name in ("B300", "GB300"):
        assert cm.attention_fraction(get_gpu(name), "te") == pytest.approx(cm.ATTENTION_FRACTION["te"] * 1.35)
        assert cm.attention_fraction(get_gpu(name), "eager") == cm.ATTENTION_FRACTION["eager"]
    for name in ("B200", "GB200"):
        assert cm.attention_fraction(get_gpu(name), "te") == cm.ATTENTION_FRACTION["te"]
        assert cm.attention_fraction(get_gpu(name), "sdpa") == cm.ATTENTION_FRACTION["sdpa"]


def test_fsdp_gathers_per_block_deepspeed_per_submodule():
    # PyTorch FSDP units are blocks (torchtitan fully_shard per TransformerBlock): 1 gather per block and pass,
    # 1 reduce-scatter per block; DeepSpeed fetches each of the ~4 weight matrices of a block
    from dstoolkit.estimate.comm import DEEPSPEED_GATHERS_PER_LAYER

    ds = {op.name: op.calls for op in comm_plan(_plan(stage=3, ga=2)).ops}
    fs = {op.name: op.calls for op in comm_plan(_plan(stage=3, ga=2, framework="fsdp")).ops}
    assert fs["zero3_param_all_gather_fwd"] == 2 * 32 and fs["zero3_grad_reduce_scatter"] == 2 * 32
    assert ds["zero3_param_all_gather_fwd"] == 2 * 32 * DEEPSPEED_GATHERS_PER_LAYER


# -- Megatron gradient-accumulation fusion --------------------------------------------------------------
def test_megatron_grad_handling_does_not_grow_with_micro_steps():
    # the weight-gradient GEMM accumulates into main_grad (--gradient-accumulation-fusion): going from 1 to 8
    # micro steps adds only the fp32 loss passes over 7 more micro batches' logits, 6 x 4 bytes x tokens x V / t;
    # DeepSpeed also re-handles every local gradient element 6 times per micro step
    from dstoolkit.estimate.core import estimate_run
    from dstoolkit.estimate.step_time import GRAD_HANDLING_PASSES, LOSS_FP32_PASSES

    seq, v, t, hbm = 4096, 128256, 8, 3.35e12
    mem = {ga: estimate_run(_plan(tp=8, ga=ga, framework="megatron")).step_time.memory_s for ga in (1, 8)}
    ds = {ga: estimate_run(_plan(tp=8, ga=ga)) for ga in (1, 8)}
    loss = LOSS_FP32_PASSES * 4 * 7 * seq * v / t / hbm
    assert mem[8] - mem[1] == pytest.approx(loss)
    local = ds[1].params.per_rank
    assert ds[8].step_time.memory_s - ds[1].step_time.memory_s == pytest.approx(
        loss + local * 2 * GRAD_HANDLING_PASSES * 7 / hbm)


def test_gpu_only_revisions_leave_cpu_ranks_alone():
    # CPU estimates stay what the calibrated CPU benchmarks measure: no op-SAC, ZeRO over dp alone
    p = _plan(gpu="cpu", world=4, ulysses=2, framework="fsdp", checkpoint=SELECTIVE)
    assert not uses_op_sac(p)
    assert zero_group_sizes(p) == (p.dp, p.edp) == (2, 2)


def test_megatron_lm_head_stays_bf16_under_fp8():
    # Megatron-Core's output layer is not a Transformer Engine module (no FP8); torchtitan's Float8 converter
    # takes every Linear (filter_fqns empty by default). One micro batch, tp 1: the difference is the head alone.
    from dstoolkit.estimate.core import estimate_run

    kw = dict(precision="fp8", attention_impl="te", seq=4096)
    meg, ds = _plan(framework="megatron", **kw), _plan(framework="deepspeed", **kw)
    gpu, tok, v = meg.gpu, 4096, 128256
    head = 6 * v * H * tok
    want = head * (1 / gemm.gemm_rate(gpu, "bf16", tok, v, H) - 1 / gemm.gemm_rate(gpu, "fp8", tok, v, H))
    got = estimate_run(meg).step_time.compute_s - estimate_run(ds).step_time.compute_s
    assert got == pytest.approx(want / cm.FRAMEWORK_EFFICIENCY)


# -- Megatron recompute modules, MoE host syncs, ZeRO-3 experts (issue 16, published-runs revision) -------
MIX_H, MIX_I, TOK = 4096, 14336, 4096  # Mixtral 8x7B: h 4096, expert FFN 14336, top-2; one micro batch of 4096


def _moe(mods=(), **kw):
    kw.setdefault("framework", "megatron")
    kw.setdefault("attention_impl", "te")
    return _plan("mixtral-8x7b", world=8, ep=8, recompute_modules=tuple(mods), **kw)


def test_recompute_modules_drop_what_megatron_documents():
    # Megatron-Core --recompute-modules (TE fused block, bf16 p = pl = 2): layernorm drops the two norm outputs
    # (2 x pl x h per token); moe_act drops each routed copy's FC2 input (k x pl x i); moe drops the whole MoE
    # layer's saved tensors: fp32 router logits and probabilities (2 x 4 x E) + per copy FC1 input and FC2 output
    # (2 x 2h) + FC1 output and FC2 input (2 x 2i + 2i)
    full = layer_activation_bytes(_moe(), 0, 1).full
    assert full - layer_activation_bytes(_moe(["layernorm"]), 0, 1).full == 2 * 2 * MIX_H * TOK
    assert full - layer_activation_bytes(_moe(["moe_act"]), 0, 1).full == 2 * 2 * MIX_I * TOK
    moe = 2 * 4 * 8 * TOK + 2 * TOK * ((2 + 2) * MIX_H + (2 * 2 + 2) * MIX_I)
    assert full - layer_activation_bytes(_moe(["moe"]), 0, 1).full == moe


def test_mla_up_proj_recompute_drops_q_k_v_and_reruns_the_up_projections():
    # DeepSeek-V3: 128 heads, qk 128 + 64 rope, v 128; q_lora 1536, kv_lora 512. The up-projected q, k, v
    # (2 bytes x tok x 128 x (2 x 192 + 128)) are re-made from the latents (DeepSeek-V3 §3.2.3)
    shape = get_preset("deepseek-v3")
    base = dict(shape=shape, world=64, ep=64, framework="megatron", attention_impl="te")
    keep = layer_activation_bytes(_plan(**base), 5, 1).full
    drop = layer_activation_bytes(_plan(recompute_modules=("mla_up_proj",), **base), 5, 1).full
    assert keep - drop == 2 * TOK * 128 * (2 * 192 + 128)
    # W^UQ + W^QR: 1536 x 128 x 192; W^UK + W^UV: 512 x 128 x (128 + 128) (DeepSeek-V2 §2.1.2)
    assert cm.mla_up_proj_weights(shape) == 1536 * 128 * 192 + 512 * 128 * 256


def test_recompute_modules_spec_rules():
    from dstoolkit.spec import spec_from_dict
    from dstoolkit.spec.errors import SpecError

    def spec(**t):
        return spec_from_dict({"model": {"preset": "mixtral-8x7b"},
                               "training": {"seq_len": 4096, "global_batch": 64, **t}})

    assert spec(framework="megatron", recompute_modules=["layernorm", "moe_act"]).training.recompute_modules == [
        "layernorm", "moe_act"]
    with pytest.raises((SpecError, ValueError), match="recompute-modules"):
        spec(recompute_modules=["layernorm"])  # framework deepspeed: no such switch
    with pytest.raises((SpecError, ValueError), match="full recompute already"):
        spec(framework="megatron", activation_checkpointing="full", recompute_modules=["moe_act"])


def test_megatron_moe_host_sync_hides_behind_an_exposed_all_to_all():
    from dstoolkit.estimate.cluster_model import ep_a2a_layer_s

    tok = float(TOK)
    with_overlap = _moe(moe_a2a_overlap=True)
    ds_run = _moe(framework="deepspeed", moe_a2a_overlap=True)
    s_mg = cm.layer_compute_s(with_overlap, 0, tok, 0.0, 3.35e12)
    s_ds = cm.layer_compute_s(ds_run, 0, tok, 0.0, 3.35e12)
    assert s_mg - s_ds == pytest.approx(cm.MEGATRON_MOE_HOST_SYNC_S)
    no_overlap = _moe()
    hidden = max(0.0, cm.MEGATRON_MOE_HOST_SYNC_S - ep_a2a_layer_s(no_overlap))
    assert cm.layer_compute_s(no_overlap, 0, tok, 0.0, 3.35e12) - s_ds == pytest.approx(hidden)
    # the all-to-all inside one node: 4 x tok x top-2 x h x 2 bytes x (ep - 1)/ep at the NVLink busbw
    assert ep_a2a_layer_s(no_overlap) == pytest.approx(
        4 * TOK * 2 * MIX_H * 2 * 7 / 8 / get_gpu("H100-SXM").intra_node_bw_bytes_per_s)


def test_zero3_gathers_expert_parameters_over_the_expert_data_parallel_group():
    # reachable where DeepSpeed does not run the model (Megatron FSDP): the experts' gathers and gradient
    # reduce-scatter run over edp = dp / ep, like the dense ones over dp (ZeRO §7: 3 x the partitioned bytes)
    p = _plan("mixtral-8x7b", world=16, stage=3, ep=2, framework="megatron")
    expert = _expert_numel(p)
    ops = {op.name: op for op in comm_plan(p).ops}
    for name in ("zero3_param_all_gather_fwd_experts", "zero3_param_all_gather_bwd_experts",
                 "zero3_grad_reduce_scatter_experts"):
        assert ops[name].group_size == 8 and ops[name].bytes == expert * 2


def _expert_numel(plan):
    from dstoolkit.estimate.memory import rank_param_groups

    return sum(rank_param_groups(plan)[1])


def test_megatron_moe_may_run_zero3_deepspeed_may_not():
    from dstoolkit.generate.sweep import run_sweep
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import spec_from_dict

    def sweep(framework):
        spec = spec_from_dict({"model": {"preset": "mixtral-8x7b"},
                               "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "H100-SXM"},
                               "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "ep": 8,
                                            "tp": 1, "pp": 1, "zero_stage": 3, "framework": framework,
                                            "activation_checkpointing": "full"}})
        return run_sweep(spec, resolve_model(spec.model), top=1, advise=False)

    assert sweep("megatron").ranked
    assert not sweep("deepspeed").ranked  # DeepSpeed refuses its native MoE at ZeRO-3 (layout rule LY010)
