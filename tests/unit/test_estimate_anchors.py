"""Published anchors the estimators must reproduce (docs/anchors.md)."""
import pytest

from dstoolkit.estimate import (
    busbw_factor,
    comm_plan,
    estimate_run,
    flops_per_token,
    korthikanti_layer_bytes,
    mfu,
    paper_model_states,
    zeropp_cross_node_bytes,
)
from dstoolkit.estimate.layout import param_totals
from dstoolkit.runplan import RunPlan
from dstoolkit.models import count_params, get_preset
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.hardware.table import get_gpu

GB = 1e9


# --- ZeRO §3.1: Ψ = 7.5B on N = 64 -> 120, 31.4, 16.6, 1.88 GB ---------------------------------------------
@pytest.mark.parametrize("field,published_gb", [
    ("baseline_bytes", 120.0), ("zero1_bytes", 31.4), ("zero2_bytes", 16.6), ("zero3_bytes", 1.88),
])
def test_zero_paper_7_5b_on_64_gpus(field, published_gb):
    view = paper_model_states(7_500_000_000, 64)
    assert getattr(view, field) / GB == pytest.approx(published_gb, rel=0.01)


def test_paper_view_is_reported_separately_from_deepspeed_allocation():
    # ZeRO-1 in the paper keeps full 2Ψ fp16 grads; DeepSpeed 0.19.8's stage 1 (shared stage-2 code)
    # does not keep them at the optimizer step, so the two views must differ and both be present.
    shape = get_preset("llama-3-8b")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW"}}
    est = estimate_run(RunPlan(shape=shape, ds_config=ds, world_size=64, gpus_per_node=8,
                               gpu=get_gpu("H100-SXM"), seq_len=4096))
    psi = count_params(shape).total
    assert est.paper_view.stage_bytes == pytest.approx(4 * psi + 12 * psi / 64, rel=1e-6)
    assert est.memory.model_states_at_step < est.paper_view.stage_bytes


# --- Korthikanti et al. 2022, eq. 1 and Table 2 --------------------------------------------------------------
S, B, H, A, T = 2048, 1, 12288, 96, 8  # GPT-3 175B layer at the paper's TP=8


def test_korthikanti_no_parallelism():
    assert korthikanti_layer_bytes(S, B, H, A) == pytest.approx(S * B * H * (34 + 5 * A * S / H))


def test_korthikanti_tp():
    assert korthikanti_layer_bytes(S, B, H, A, T) == pytest.approx(S * B * H * (10 + 24 / T + 5 * A * S / (H * T)))


def test_korthikanti_tp_sp():
    got = korthikanti_layer_bytes(S, B, H, A, T, sequence_parallel=True)
    assert got == pytest.approx(S * B * H * (34 + 5 * A * S / H) / T)


def test_korthikanti_tp_selective():
    assert korthikanti_layer_bytes(S, B, H, A, T, recompute="selective") == pytest.approx(S * B * H * (10 + 24 / T))


def test_korthikanti_tp_sp_selective():
    got = korthikanti_layer_bytes(S, B, H, A, T, sequence_parallel=True, recompute="selective")
    assert got == pytest.approx(34 * S * B * H / T)


def test_korthikanti_full_recompute_keeps_layer_input_only():
    assert korthikanti_layer_bytes(S, B, H, A, T, recompute="full") == pytest.approx(2 * S * B * H)


def test_flash_attention_removes_the_score_term():
    plain = korthikanti_layer_bytes(S, B, H, A)
    flash = korthikanti_layer_bytes(S, B, H, A, flash_attention=True)
    assert plain - flash == pytest.approx(5 * A * S * S * B)
    assert flash == korthikanti_layer_bytes(S, B, H, A, recompute="selective")


def test_korthikanti_rejects_zero_sequence():
    with pytest.raises(ValueError, match="must be > 0"):
        korthikanti_layer_bytes(0, 1, 128, 2)


# --- FLOPs ----------------------------------------------------------------------------------------------------
def test_llama3_8b_flops_per_token_is_6n_plus_attention_term():
    shape = get_preset("llama-3-8b")
    seq = 8192
    f = flops_per_token(shape, seq)
    pc = count_params(shape)
    # PaLM App. B: 12·L·H·Q·T with L=32, H=32, Q=128
    attention = 12 * 32 * 32 * 128 * seq
    assert f.attention == attention
    # Kaplan's N counts matmul parameters: everything but the input-embedding lookup and the norms
    n_matmul = pc.total - pc.embedding - pc.norms
    assert f.model == pytest.approx(6 * n_matmul + attention, rel=1e-9)
    # and with N = 8.03B total (docs/anchors.md) it agrees within the embedding share (6.5%)
    assert f.model == pytest.approx(6 * 8.03e9 + attention, rel=0.07)


def test_full_recompute_costs_one_more_forward():
    shape = get_preset("llama-3-8b")
    L = shape.num_hidden_layers
    plain = flops_per_token(shape, 4096)
    full = flops_per_token(shape, 4096, checkpointed_layers=[True] * L)
    # 8N/6N: one extra forward of every block (the LM head is not recomputed: slightly under 4/3)
    assert full.hardware / plain.model == pytest.approx(8 / 6, rel=0.02)
    assert full.model == plain.model  # MFU does not count recompute; HFU does


def test_hfu_counts_the_attention_a_causal_fused_kernel_runs():
    # a causal flash / SDPA kernel skips the masked half of the 12·H·Q·T term (FlashAttention-2 §3.1.1), the
    # recomputed one too; PaLM's count (hardware) keeps it whole. At seq 131072 the term is most of a block, and
    # HFU over the whole count went past 100% (1.09 on a 61-layer, head-dim-256 llama under ZeRO-3 on one A100)
    shape = get_preset("llama-3-8b")
    L = shape.num_hidden_layers
    f = flops_per_token(shape, 131072, checkpointed_layers=[True] * L)
    quadratic = f.attention - f.scan + f.recompute_attention
    assert f.recompute_attention == pytest.approx(f.attention / 3)  # one more forward: 1/3 of fwd + bwd
    assert f.executed(1.0) == f.hardware
    assert f.executed(0.5) == pytest.approx(f.hardware - 0.5 * quadratic)
    assert f.executed(0.5) < f.hardware


def test_deepseek_v3_active_params():
    totals = param_totals(get_preset("deepseek-v3"))
    assert totals.active == pytest.approx(37e9, rel=0.02)  # arXiv 2412.19437: 37B activated
    assert totals.total == pytest.approx(671e9, rel=0.005)  # 671B, MTP excluded


def test_layout_counts_match_the_models_package_exactly():
    for name in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b", "mixtral-8x7b", "deepseek-v3", "tiny", "tiny-moe"):
        shape = get_preset(name)
        assert param_totals(shape).total == count_params(shape).total, name
        assert param_totals(shape).active == count_params(shape).active, name


def test_mfu_definition_torchtitan_llama3_8b():
    # torchtitan Llama3-8B on 8xH100 bf16 FSDP: 5,762 tokens/s/GPU (docs/anchors.md); MFU = tokens/s x FLOPs/token / peak
    f = flops_per_token(get_preset("llama-3-8b"), 8192).model
    got = mfu(5762 * 8, f, 989e12, 8)
    assert got == pytest.approx(5762 * f / 989e12)
    # HFU counts the recomputed forward as well: with full recompute it is 4/3 of MFU
    full = flops_per_token(get_preset("llama-3-8b"), 8192, checkpointed_layers=[True] * 32).hardware
    assert mfu(5762 * 8, full, 989e12, 8) / got == pytest.approx(4 / 3, rel=0.02)


# --- Communication --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("coll,n,factor", [
    ("all_reduce", 8, 2 * 7 / 8), ("all_gather", 8, 7 / 8), ("reduce_scatter", 8, 7 / 8), ("all_to_all", 8, 7 / 8),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0),
])
def test_nccl_tests_busbw_factors(coll, n, factor):
    assert busbw_factor(coll, n) == pytest.approx(factor)


def _plan(stage, world=64, **z):
    shape = get_preset("llama-3-8b")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "fp16": {"enabled": True},
          "zero_optimization": {"stage": stage, **z}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=shape, ds_config=ds, world_size=world, gpus_per_node=8, gpu=get_gpu("H100-SXM"),
                   seq_len=4096, precision="fp16")


def _bus_volume_in_psi(plan, view="paper"):
    psi = count_params(plan.shape).total
    n = plan.dp
    vol = sum(op.bytes * busbw_factor(op.collective, op.group_size) for op in comm_plan(plan, view=view).ops)
    # ZeRO §7 counts elements moved per rank in units of Ψ at large N ((n-1)/n -> 1); bytes are fp16 (2/elem)
    return vol / 2 / psi / ((n - 1) / n)


def test_zero_communication_volumes_2psi_2psi_3psi():
    assert _bus_volume_in_psi(_plan(0)) == pytest.approx(2.0, rel=1e-6)  # DP all-reduce
    assert _bus_volume_in_psi(_plan(1)) == pytest.approx(2.0, rel=1e-6)  # reduce-scatter + all-gather
    assert _bus_volume_in_psi(_plan(2)) == pytest.approx(2.0, rel=1e-6)
    assert _bus_volume_in_psi(_plan(3)) == pytest.approx(3.0, rel=1e-6)  # + the backward parameter gather


def test_deepspeed_view_all_reduces_zero12_grads_3psi():
    # DeepSpeed 0.19.8 all-reduces ZeRO-1/2 gradient buckets (use_multi_rank_bucket_allreduce defaults to true):
    # 2Ψ grads + Ψ param all-gather = 3Ψ, as much as stage 3 (measured link share ZeRO-3/ZeRO-2 0.87x,
    # benchmarks/results/multinode_throttle_cpu_202611.md)
    assert _bus_volume_in_psi(_plan(1), "deepspeed") == pytest.approx(3.0, rel=1e-6)
    assert _bus_volume_in_psi(_plan(2), "deepspeed") == pytest.approx(3.0, rel=1e-6)
    assert _bus_volume_in_psi(_plan(3), "deepspeed") == pytest.approx(3.0, rel=1e-6)


def test_zeropp_cuts_cross_node_volume_4x():
    psi = 7_500_000_000
    base = zeropp_cross_node_bytes(psi, qwz=False, hpz=False, qgz=False)
    pp = zeropp_cross_node_bytes(psi, qwz=True, hpz=True, qgz=True)
    assert base == pytest.approx(3 * 2 * psi)  # 3M, M = model bytes in fp16
    assert base / pp == pytest.approx(4.0)  # 3M -> 0.75M (ZeRO++ §3)


def test_zeropp_config_switches_stage3_collectives():
    plain = comm_plan(_plan(3)).by_name()
    pp = comm_plan(_plan(3, zero_quantized_weights=True, zero_quantized_gradients=True,
                         zero_hpz_partition_size=8)).by_name()
    assert pp["zero3_param_all_gather_fwd"] == plain["zero3_param_all_gather_fwd"] // 2  # int8 instead of fp16
    assert pp["zeropp_qgz_all_to_all"] == plain["zero3_grad_reduce_scatter"] // 4  # int4 instead of fp16
    hpz_op = next(op for op in comm_plan(_plan(3, zero_hpz_partition_size=8)).ops if op.name == "zero3_param_all_gather_bwd")
    assert hpz_op.group_size == 8 and not hpz_op.cross_node  # hpZ: backward gather stays inside the node


def test_ep_all_to_all_and_tp_all_reduce_present():
    shape = get_preset("mixtral-8x7b")
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW"}}
    plan = RunPlan(shape=shape, ds_config=ds, world_size=16, gpus_per_node=8, gpu=get_gpu("H100-SXM"),
                   seq_len=4096, tp=2, ep=8, checkpoint=CheckpointPolicy(kind="full"))
    by = comm_plan(plan).by_name()
    tok = 4096
    # dispatch + combine, forward and backward, per MoE layer: 4 all-to-alls of the (E, C, h) buffer, each TP rank
    # sending its 1/tp share (DeepSpeed drops the tokens duplicated across TP ranks: deepspeed/moe/mappings.py)
    cap = -(-tok * 2 // 8)  # top-2, capacity factor 1
    routed = 4 * 8 * cap * 4096 * 2 * 32 // 2
    # the EP group (8 ranks at stride tp 2) spans 2 nodes, 4 of its ranks on each: of the routed copies a rank sends,
    # (ep - 4)/ep go over InfiniBand and 3/ep to its node's peers over NVLink (comm.ep_a2a_split, GPU path)
    assert by["ep_all_to_all"] == routed * 4 // 8
    assert by["ep_all_to_all_nvlink"] == routed * 3 // 8
    # Megatron: 2 all-reduces forward + 2 backward per layer, + 2 for the recomputed forward
    assert by["tp_all_reduce"] == (4 * 32 + 2 * 32) * tok * 4096 * 2
