"""The GPU cluster model (issue 16): pipeline schedules, overlap defaults, context/sequence parallelism, MoE
all-to-all and fused-kernel activations, pinned with hand-derived numbers against their papers and docs."""
import pytest

from dstoolkit.estimate import cluster_model as cm
from dstoolkit.estimate import pipeline_stages as ps
from dstoolkit.estimate.activations import layer_activation_bytes
from dstoolkit.estimate.stage_activations import activation_bytes
from dstoolkit.estimate.comm import comm_plan
from dstoolkit.estimate.core import estimate_run
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan
from dstoolkit.spec import spec_from_dict
from dstoolkit.spec.errors import SpecError


def _ds(stage=1, mb=1, ga=1, **zero):
    return {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga, "bf16": {"enabled": True},
            "zero_optimization": {"stage": stage, **zero}, "optimizer": {"type": "AdamW"}}


def _plan(preset="llama-3-8b", world=8, stage=1, mb=1, ga=1, seq=4096, zero=None, **kw):
    return RunPlan(shape=get_preset(preset), ds_config=_ds(stage, mb, ga, **(zero or {})), world_size=world,
                   gpus_per_node=8, gpu=get_gpu(kw.pop("gpu", "H100-SXM")), seq_len=seq, **kw)


# -- pipeline schedules -----------------------------------------------------------------------------------
def test_1f1b_bubble_is_p_minus_1_over_m():
    # Narayanan et al. 2021 §2.2.1: bubble time fraction (p - 1) / m
    assert ps.bubble_fraction("1f1b", 8, 32) == pytest.approx(7 / 32)


def test_interleaved_bubble_divides_by_virtual_stages():
    # Narayanan et al. 2021 §2.2.2: (p - 1) / (v · m)
    assert ps.bubble_fraction("interleaved", 8, 32, 4) == pytest.approx(7 / 128)


def test_zero_bubble_and_dualpipe():
    # ZB-H1 (Qi et al. 2023): (p-1)(F+B-2W) / (m(F+B)) with F = 1, B = 2, W = 1 -> (p-1) / (3m)
    assert ps.bubble_fraction("zero-bubble", 8, 32) == pytest.approx(7 / 96)
    # DeepSeek-V3 Table 2: (p/2 - 1)(F&B + B - 3W) / (m(F+B)), F&B = 3 -> (p - 2) / (3m)
    assert ps.bubble_fraction("dualpipe", 16, 32) == pytest.approx(14 / 96)
    assert ps.bubble_fraction("1f1b", 1, 32) == 0.0


def test_interleaved_schedule_shortens_the_step_and_multiplies_p2p():
    base = _plan("llama-3-70b", world=16, ga=8, tp=8, pp=2)
    inter = base.model_copy(update={"pipeline_schedule": "interleaved", "virtual_stages": 4})
    assert estimate_run(inter).step_time.compute_s < estimate_run(base).step_time.compute_s
    assert comm_plan(inter).by_name()["pp_p2p"] == 4 * comm_plan(base).by_name()["pp_p2p"]


def test_interleaved_keeps_more_micro_batches_in_flight():
    # Korthikanti et al. 2022 §4.2.3: x (1 + (p-1)/(p·v)) on the first stage; pp 4, v 2 -> 4 · 11/8 = 5.5
    p = _plan("llama-3-70b", world=32, ga=8, tp=8, pp=4, pipeline_schedule="interleaved", virtual_stages=2,
              framework="megatron")
    assert activation_bytes(p).in_flight_micro_batches == pytest.approx(5.5)


# -- overlap defaults per framework ---------------------------------------------------------------------
def test_deepspeed_overlap_defaults_follow_the_json():
    # DeepSpeed runtime/zero/config.py: overlap_comm false unless stage 3; stages 1/2 gather after the step
    assert cm.resolved_overlap(_plan(stage=1)) == (False, False)
    assert cm.resolved_overlap(_plan(stage=1, zero={"overlap_comm": True})) == (True, False)
    assert cm.resolved_overlap(_plan(stage=3)) == (True, True)


def test_deepspeed_pipeline_engine_reduces_gradients_after_the_flush():
    # deepspeed/runtime/pipe/schedule.py TrainSchedule: one ReduceGrads after the last BackwardPass, so the DP
    # reduction is exposed under the PipelineEngine even with overlap_comm (and with an explicit override)
    piped = _plan("llama-3-70b", world=32, tp=8, pp=2, ga=8, zero={"overlap_comm": True})
    assert cm.pipeline_reduces_after_flush(piped)
    assert cm.resolved_overlap(piped) == (False, False)
    assert cm.resolved_overlap(piped.model_copy(update={"overlap_grad_reduce": True})) == (False, False)
    ops = {op.name: op.overlappable for op in comm_plan(piped).ops}
    assert ops["zero_grad_all_reduce"] is False
    flat = _plan("llama-3-70b", world=32, tp=8, ga=8, zero={"overlap_comm": True})
    assert not cm.pipeline_reduces_after_flush(flat) and cm.resolved_overlap(flat) == (True, False)
    # Megatron's own pipeline schedules are not DeepSpeed's engine: its --overlap-grad-reduce still applies
    mega = piped.model_copy(update={"framework": "megatron", "overlap_grad_reduce": True})
    assert cm.resolved_overlap(mega)[0] is True
    # nothing of the step's communication hides any more: every collective is in the critical path
    st = estimate_run(piped).step_time
    assert st.comm_exposed_s == pytest.approx(st.comm_total_s, rel=1e-12) and st.comm_total_s > 0
    assert estimate_run(flat).step_time.comm_exposed_s < estimate_run(flat).step_time.comm_total_s


def test_megatron_and_fsdp_defaults_and_overrides():
    # Megatron-LM arguments.py: --overlap-grad-reduce / --overlap-param-gather default off; FSDP overlaps by design
    assert cm.resolved_overlap(_plan(framework="megatron")) == (False, False)
    assert cm.resolved_overlap(_plan(framework="fsdp")) == (True, True)
    assert cm.resolved_overlap(_plan(framework="megatron", overlap_grad_reduce=True,
                                     overlap_param_gather=True)) == (True, True)


def test_overlap_flags_reach_the_collectives():
    p = _plan(world=16, tp=2, framework="megatron", overlap_grad_reduce=True, overlap_param_gather=True,
              tp_comm_overlap=True)
    ops = {op.name: op.overlappable for op in comm_plan(p).ops}
    assert ops["zero_reduce_scatter"] and ops["zero_all_gather"] and ops["tp_all_reduce"]
    q = _plan(world=16, tp=2, framework="megatron")
    ops = {op.name: op.overlappable for op in comm_plan(q).ops}
    assert not ops["zero_reduce_scatter"] and not ops["zero_all_gather"] and not ops["tp_all_reduce"]
    assert estimate_run(p).step_time.comm_exposed_s < estimate_run(q).step_time.comm_exposed_s


# -- context and sequence parallelism -------------------------------------------------------------------
def test_context_parallel_ring_bytes():
    # Megatron-Core CP (ring attention): 3 (cp-1) K/V-chunk transfers per layer (fwd K,V; bwd K,V and dK,dV);
    # chunk = 2 (K and V) x s/cp tokens x kv_heads x head_dim x 2 bytes. Llama 3 8B: 32 layers, 8 kv heads x 128
    p = _plan(world=8, seq=8192, ga=1, cp=2, framework="megatron")
    chunk = 2 * (8192 // 2) * 8 * 128 * 2
    assert comm_plan(p).by_name()["cp_ring_p2p"] == 3 * 1 * chunk * 32
    assert p.dp == 4  # cp ranks come out of the data-parallel ones


def test_ulysses_all_to_all_bytes():
    # Jacobs et al. 2023 §3.1: q, k, v and out all-to-alls, fwd and bwd: 2 x s/u x (2·a·d + 2·g·d) x 2 bytes/layer
    p = _plan(world=8, seq=8192, ulysses=4)
    width = 2 * 32 * 128 + 2 * 8 * 128
    assert comm_plan(p).by_name()["ulysses_all_to_all"] == 2 * (8192 // 4) * width * 2 * 32


def test_sequence_sharding_divides_activations():
    full = layer_activation_bytes(_plan(seq=8192, attention_impl="te"), 0, 1).full
    half = layer_activation_bytes(_plan(seq=8192, cp=2, attention_impl="te", framework="megatron"), 0, 1).full
    assert half == pytest.approx(full / 2)


def test_megatron_sp_shards_the_norm_region():
    # Korthikanti 2022 Table 2: SP divides the non-TP (norm / dropout) activations by t too
    no_sp = layer_activation_bytes(_plan(world=8, tp=8, attention_impl="te"), 0, 1)
    sp = layer_activation_bytes(_plan(world=8, tp=8, sequence_parallel=True, attention_impl="te"), 0, 1)
    outside = 2 * (2 * 2 * 4096 + 4) * 4096
    assert no_sp.full - sp.full == pytest.approx(outside * (1 - 1 / 8))


# -- fused kernels ---------------------------------------------------------------------------------------
def test_te_activations_per_token_hidden():
    # Llama 3 8B, TE: norms 2(2·2h + 4), q + k + v = 2(32 + 16)·128, out 2·32·128, lse 4·32, MLP 3·2·14336
    per_tok = 2 * (2 * 2 * 4096 + 4) + 2 * 48 * 128 + 2 * 32 * 128 + 4 * 32 + 3 * 2 * 14336
    la = layer_activation_bytes(_plan(seq=4096, attention_impl="te"), 0, 1)
    assert la.full == pytest.approx(per_tok * 4096)
    assert per_tok / 4096 == pytest.approx(34.0, abs=0.1)
    eager = layer_activation_bytes(_plan(seq=4096, attention_impl="sdpa"), 0, 1).full
    assert eager / 4096 / 4096 > 40  # the Hugging Face itemisation keeps fp32 norm copies and repeated K/V


# -- MoE -------------------------------------------------------------------------------------------------
def test_moe_layers_counted_on_the_heaviest_stage():
    # DeepSeek-V3: 61 layers, the first 3 dense, over pp 16. Megatron: 4 blocks on stages 0-14, the 1 left on the
    # last stage (--decoder-last-pipeline-num-layers 1): stage 0 holds blocks 0-3 (1 MoE), stage 15 block 60
    meg = ps.moe_layers_per_stage(_plan("deepseek-v3", world=16, pp=16, framework="megatron"))
    assert meg == [1] + [4] * 14 + [1]
    # DeepSpeed's PipelineModule (partition_uniform): 61 = 16 x 3 + 13, so stages 0-12 take 4 blocks, 13-15 take 3
    ds = ps.moe_layers_per_stage(_plan("deepseek-v3", world=16, pp=16, framework="deepspeed"))
    assert ds == [1] + [4] * 12 + [3] * 3


def test_megatron_dropless_all_to_all_per_tp_rank():
    # Megatron-Core alltoall dispatcher: tokens x top-k x h x 2 bytes, / tp (SP), x 4 (dispatch + combine, fwd+bwd);
    # inside one node (world 8) it is one all-to-all over the EP group
    p = _plan("mixtral-8x7b", world=8, tp=2, ep=4, framework="megatron", sequence_parallel=True)
    assert comm_plan(p).by_name()["ep_all_to_all"] == 4 * 4096 * 2 * 4096 * 2 // 2 * 32


def test_cross_node_all_to_all_splits_by_link():
    # ep 8 at stride tp 2 over 2 nodes: G = 4 EP ranks per node. alltoall sends (ep - G)/ep = 1/2 of its routed copies
    # over InfiniBand and (G - 1)/ep = 3/8 to peers on its node (the rest stays on the rank)
    p = _plan("mixtral-8x7b", world=16, tp=2, ep=8, framework="megatron", sequence_parallel=True)
    total = 4 * 4096 * 2 * 4096 * 2 // 2 * 32
    ops = {op.name: op for op in comm_plan(p).ops}
    assert ops["ep_all_to_all"].cross_node and not ops["ep_all_to_all_nvlink"].cross_node
    assert ops["ep_all_to_all"].bytes == pytest.approx(total / 2, rel=1e-9)
    assert ops["ep_all_to_all_nvlink"].bytes == pytest.approx(total * 3 / 8, rel=1e-9)


def test_deepep_crosses_infiniband_once_per_remote_node():
    # DeepSeek-V3 §3.2.2 / DeepEP: a token crosses IB once per remote node holding one of its top-k experts.
    # E 128, k 8 (Qwen3-235B's routing) at ep 16, stride 2: G = 4 ranks and E_n = 32 experts per node, N = 4 nodes;
    # P(node hit) = 1 - prod_{i<8} (96 - i)/(128 - i) = 0.90725, so (N - 1) x 0.90725 / 8 = 0.34022 of the copies'
    # bytes cross IB (alltoall: 12/16 = 0.75); NVLink carries (G - 1)/G = 3/4 (alltoall: 3/16)
    from dstoolkit.estimate.cluster_model import ep_a2a_split

    shape = get_preset("mixtral-8x7b").model_copy(update={"num_experts": 128, "num_experts_per_tok": 8})
    deep = RunPlan(shape=shape, ds_config=_ds(), world_size=32, gpus_per_node=8, gpu=get_gpu("H100-SXM"),
                   seq_len=4096, tp=2, ep=16, framework="megatron", moe_dispatcher="deepep")
    inter, intra = ep_a2a_split(deep, 2)
    assert inter == pytest.approx(0.34022, abs=1e-5) and intra == pytest.approx(0.75)
    a2a = deep.model_copy(update={"moe_dispatcher": "alltoall"})
    assert ep_a2a_split(a2a, 2) == pytest.approx((0.75, 3 / 16))
    # an EP group inside one node (ep 4 at stride 2): nothing crosses IB, (ep - 1)/ep goes to NVLink peers
    assert ep_a2a_split(deep.model_copy(update={"ep": 4}), 2) == pytest.approx((0.0, 0.75))


def test_moe_a2a_overlap_flag():
    p = _plan("mixtral-8x7b", world=16, tp=2, ep=8, moe_a2a_overlap=True)
    assert {op.name: op.overlappable for op in comm_plan(p).ops}["ep_all_to_all"]


def test_layer_weights_split_routed_and_shared():
    shape = get_preset("deepseek-v3")
    w = cm.layer_weights(shape, 5)
    assert w.routed_one == 3 * 7168 * 2048  # one routed expert
    assert w.shared == 3 * 7168 * 2048  # one shared expert of the same width
    assert w.dense_mlp == 0
    assert cm.layer_weights(shape, 0).dense_mlp == 3 * 7168 * 18432


# -- compute efficiency (one GEMM's rate: test_estimate_gemm.py) -----------------------------------
def test_hbm_bandwidth_comes_from_the_table():
    assert get_gpu("H200").hbm_bw_bytes_per_s == pytest.approx(4.8e12)
    assert get_gpu("A100-80G").hbm_bw_bytes_per_s == pytest.approx(2.039e12)


# -- spec fields -----------------------------------------------------------------------------------------
def _spec(**training):
    return spec_from_dict({"model": {"preset": "llama-3-8b"},
                           "training": {"seq_len": 4096, "global_batch": 64, **training}})


def test_spec_fields_validate():
    s = _spec(cp=2, pp=2, pipeline_schedule="interleaved", virtual_stages=2, framework="megatron", attention_impl="te")
    assert (s.training.cp, s.training.virtual_stages, s.training.framework) == (2, 2, "megatron")
    with pytest.raises((SpecError, ValueError)):
        _spec(virtual_stages=2)  # needs the interleaved schedule
    with pytest.raises((SpecError, ValueError)):
        _spec(cp=2, ulysses=2)


def test_flash_attention_v1_runs_at_the_fraction_the_fa2_paper_gives_it():
    """flash1 (flash-attn 1.x): 0.30 of the A100 peak (FA2 paper abstract: FA1 reaches 25-40%); on Hopper the
    same ratio to FA2 as on A100; the causal triangle is skipped as by FA2."""
    a100, h100 = get_gpu("A100-80G"), get_gpu("H100-SXM")
    assert cm.attention_fraction(a100, "flash1") == 0.30
    assert cm.attention_fraction(a100, "flash") == 0.55
    assert cm.attention_fraction(h100, "flash1") == pytest.approx(0.35 * 0.30 / 0.55)
    assert 0.25 <= cm.ATTENTION_FRACTION["flash1"] <= 0.40
    shape = get_preset("llama-3-8b")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True}}

    def core_s(impl):
        plan = RunPlan(shape=shape, ds_config=ds, world_size=8, gpus_per_node=8, gpu=a100, seq_len=8192,
                       precision="bf16", framework="fsdp", attention_impl=impl)
        return cm.layer_compute_s(plan, 0, 8192.0, 0.0, a100.hbm_bw_bytes_per_s)

    # the attention core alone differs: 12·H·Q·S·T/2 FLOPs at 0.30 vs 0.55 of peak, both at the occupancy of
    # 32 heads x 64 query blocks = 2048 thread blocks in 19 waves over 108 SMs (cm.attention_occupancy)
    h, q = shape.num_attention_heads, shape.head_size
    work = 12 * h * q * 8192 * 8192 * cm.CAUSAL_ATTENTION_WORK
    occ = 2048 / (19 * 108)
    assert core_s("flash1") - core_s("flash") == pytest.approx(
        work / a100.peak_bf16_flops * (1 / 0.30 - 1 / 0.55) / occ)


def test_gemm_half_depth_follows_the_gpu_ridge_point():
    """k_half = GEMM_HALF_DIM x (peak / HBM bandwidth) / the A100 80GB ridge: the H100 SXM (989 TFLOP/s over
    3.35 TB/s) needs 1.93x the depth of the A100 80GB (312 over 2.039); a GPU without an HBM figure keeps
    GEMM_HALF_DIM; the fall-off at depth k is k / (k + k_half)."""
    from dstoolkit.estimate import gemm

    a100, h100, a100_40 = get_gpu("A100-80G"), get_gpu("H100-SXM"), get_gpu("A100-40G")
    assert gemm.half_depth(a100) == pytest.approx(gemm.GEMM_HALF_DIM)
    assert gemm.half_depth(h100) == pytest.approx(gemm.GEMM_HALF_DIM * (989 / 3.35) / (312 / 2.039))
    assert gemm.half_depth(a100_40) == pytest.approx(gemm.GEMM_HALF_DIM * 2.039 / 1.555)
    assert gemm.half_depth(get_gpu("cpu")) == gemm.GEMM_HALF_DIM  # no HBM figure
    # one wave-perfect shape (m, n multiples of every tile and of the SM count's tiles): only the k term differs
    m, n, k = 256 * 132 * 4, 256 * 108, 1536.0
    for gpu in (a100, h100):
        f = gemm.gemm_shape_factor(gpu, m, n, k) / gemm.wave_utilisation(m, n, gemm.SMS_BY_COMPUTE_CAPABILITY[
            gpu.compute_capability])
        assert f == pytest.approx(k / (k + gemm.half_depth(gpu)))


def test_attention_occupancy_counts_blocks_over_the_sms():
    # flash-style kernels: micro batch x the rank's heads x 128-row query blocks, in waves over the SMs
    # (A100: 108 SMs). Llama-3-8B (32 heads) at tp 8, mb 1, seq 2048: 1 x 4 x 16 = 64 blocks -> 64 / 108
    p = _plan(world=8, tp=8, seq=2048, gpu="A100-80G", attention_impl="flash")
    assert cm.attention_occupancy(p) == pytest.approx(64 / 108)
    # mb 4: 256 blocks in 3 waves of 108
    p4 = _plan(world=8, tp=8, mb=4, seq=2048, gpu="A100-80G", attention_impl="flash")
    assert cm.attention_occupancy(p4) == pytest.approx(256 / 324)
    # H100 (132 SMs), tp 1, seq 8192: 32 x 64 = 2048 blocks in 16 waves
    assert cm.attention_occupancy(_plan(seq=8192, attention_impl="flash")) == pytest.approx(2048 / (16 * 132))
    # eager attention is batched GEMMs over the whole score matrix: no such term
    assert cm.attention_occupancy(_plan(world=8, tp=8, seq=2048, gpu="A100-80G", attention_impl="eager")) == 1.0
    # and it slows the attention core only: the block at tp 8 mb 1 is slower than with the term off
    on = cm.layer_compute_s(p, 0, 2048, 0.0, 2.0e12)
    try:
        cm.ATTENTION_OCCUPANCY = False
        off = cm.layer_compute_s(p, 0, 2048, 0.0, 2.0e12)
    finally:
        cm.ATTENTION_OCCUPANCY = True
    assert on > off


def test_cuda_launch_blocking_adds_the_host_time_to_the_gpu_time():
    # host ahead of the GPU: a stage's micro batch takes max(GPU, host); CUDA_LAUNCH_BLOCKING=1: their sum
    base = _plan("llama-3-8b", world=16, ga=8, tp=8, pp=2, framework="megatron")
    blocking = base.model_copy(update={"cuda_launch_blocking": True})
    gpu = lambda i, saved: 1.0  # noqa: E731 - one second of GPU work per block and micro batch
    host = lambda i: 0.25  # noqa: E731
    stage = 16  # 32 blocks over pp 2
    bubble = 1.0 + ps.bubble_fraction("1f1b", 2, 8)
    assert ps.pipeline_compute_s(base, gpu, 0.0, host, 0.5) == pytest.approx(stage * 1.0 * 8 * bubble)
    assert ps.pipeline_compute_s(blocking, gpu, 0.0, host, 0.5) == pytest.approx((stage * 1.25 + 0.5) * 8 * bubble)


def test_hfu_stays_under_one_at_long_sequences_with_a_causal_fused_kernel():
    # the time model runs half the attention square on a causal fused kernel (CAUSAL_ATTENTION_WORK); HFU divides
    # the FLOPs those kernels run, not PaLM's whole count, by the time (it read 1.09 on such a run before)
    for impl in ("flash", "sdpa", "te"):
        est = estimate_run(_plan(seq=131072, attention_impl=impl))
        assert est.hfu < 1.0 and est.hfu < est.hardware_flops_per_token / est.flops_per_token * est.mfu
    eager = estimate_run(_plan(seq=8192, attention_impl="eager"))
    assert eager.hfu == pytest.approx(eager.mfu * eager.hardware_flops_per_token / eager.flops_per_token)
