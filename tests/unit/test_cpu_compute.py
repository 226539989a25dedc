"""The op-level CPU compute model (dstoolkit.estimate.cpu_compute) and the calibration fields behind it."""
import math

import pytest

from dstoolkit.common.cpu_env import CPU_RANK_ENV, cpu_rank_env, shell_exports
from dstoolkit.estimate import Calibration, estimate_run
from dstoolkit.estimate import cpu_compute as cc
from dstoolkit.hardware.calibration import calibration_from_raw
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan
from dstoolkit.spec.checkpoint import CheckpointPolicy

FIT = cc.GemmFit(rate_flops_per_s=4e11, half_dim=100.0, call_s=4e-5)
GRID = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 64, 512), (512, 512, 64), (512, 512, 512))
ATT = ((128, 32, 4e-6, 1e-6), (128, 128, 8e-6, 2e-6), (512, 32, 6e-6, 1.5e-6), (512, 128, 16e-6, 4e-6))
BASE = dict(matmul_flops_per_s=5e10, mem_bw_bytes_per_s=3e9, comm_busbw_bytes_per_s=1e9, comm_latency_s=5e-4,
            step_overhead_s=0.02)
OPS = dict(gemm_rate_flops_per_s=FIT.rate_flops_per_s, gemm_half_dim=FIT.half_dim, gemm_call_s=FIT.call_s,
           attention_points=[list(p) for p in ATT], elementwise_s_per_byte=2e-9, per_layer_overhead_s=1e-3)


def _plan(cal, shape="tiny", ckpt="none", mb=4, stage=2, prec="bf16", world=2, ep=1):
    ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "bf16": {"enabled": prec == "bf16"},
          "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=get_preset(shape), ds_config=ds, world_size=world, gpus_per_node=world, gpu=get_gpu("cpu"),
                   seq_len=128, checkpoint=CheckpointPolicy(kind=ckpt), precision=prec, calibration=cal, ep=ep)


def test_gemm_time_is_call_cost_plus_flops_at_the_thin_dimension_rate():
    # d = min(m, n, k) = 64: rate 4e11 * 64 / 164
    assert cc.gemm_s(FIT, 512, 64, 512) == pytest.approx(4e-5 + 2 * 512 * 64 * 512 * 164 / (4e11 * 64))
    lin = cc.Linear(in_features=256, out_features=688, tokens=512)
    assert cc.linear_s(FIT, lin, forward_only=True) == cc.gemm_s(FIT, 512, 688, 256)
    assert cc.linear_s(FIT, lin) == pytest.approx(
        cc.gemm_s(FIT, 512, 688, 256) + cc.gemm_s(FIT, 512, 256, 688) + cc.gemm_s(FIT, 688, 256, 512))


def test_fit_gemm_recovers_the_form_it_fits():
    pts = [(m, n, k, cc.gemm_s(FIT, m, n, k)) for m, n, k in GRID]
    got = cc.fit_gemm(pts)
    assert got.rate_flops_per_s == pytest.approx(FIT.rate_flops_per_s, rel=1e-9)
    assert got.half_dim == pytest.approx(FIT.half_dim, rel=1e-9)
    assert got.call_s == pytest.approx(FIT.call_s, rel=1e-9)


def test_fit_gemm_drops_a_term_that_comes_out_negative():
    # a rate with no thin-dimension fall-off and no call cost, timed with a faster thin GEMM (noise):
    # the full fit would give a negative half-dimension, so the fit keeps only what stays in range
    flat = cc.GemmFit(1e11, 0.0, 0.0)
    pts = [(m, n, k, cc.gemm_s(flat, m, n, k)) for m, n, k in GRID]
    pts[3] = (512, 64, 512, pts[3][3] * 0.7)
    got = cc.fit_gemm(pts)
    assert got.rate_flops_per_s > 0 and got.half_dim >= 0 and got.call_s >= 0
    with pytest.raises(ValueError, match="at least two"):
        cc.fit_gemm(pts[:1])


def test_attention_rows_are_exact_on_the_grid_log_interpolated_between_clamped_below_and_scaled_above():
    assert cc.attention_row_s(ATT, 128, 32) == 4e-6
    assert cc.attention_row_s(ATT, 512, 128, forward_only=True) == 4e-6
    # head dim 64 is halfway between 32 and 128 in log space: geometric mean
    assert cc.attention_row_s(ATT, 128, 64) == pytest.approx(math.sqrt(4e-6 * 8e-6))
    # above the grid a row's work grows with the keys it attends (seq) and with the head dim: 8 x 2 from the edge
    assert cc.attention_row_s(ATT, 4096, 256) == pytest.approx(16 * cc.attention_row_s(ATT, 512, 128))
    assert cc.attention_row_s(ATT, 1024, 128, forward_only=True) == pytest.approx(2 * 4e-6)
    assert cc.attention_row_s(ATT, 16, 8) == 4e-6  # below it: clamped at the edge
    with pytest.raises(ValueError, match="full grid"):
        cc.attention_row_s(ATT[:3], 300, 64)


def test_block_linears_of_a_dense_and_a_moe_block():
    cal = Calibration(**BASE, **OPS)
    dense = cc.block_linears(_plan(cal), 0, 512)
    # q, k, v, o (GQA: k and v are 128 wide), gate, up, down
    assert [(lin.in_features, lin.out_features) for lin in dense] == [
        (256, 256), (256, 128), (256, 128), (256, 256), (256, 688), (256, 688), (256, 688)]
    assert {lin.tokens for lin in dense} == {512}
    moe = cc.block_linears(_plan(cal, shape="tiny-moe"), 0, 512)
    assert len([lin for lin in moe if lin.out_features == 4]) == 1  # the router
    experts = moe[5:]
    # 4 local experts x 3 matrices, each seeing top-2 / 4 experts of the tokens
    assert len(moe) == 4 + 1 + 12 and {lin.tokens for lin in experts} == {512 * 2 / 4}
    # ep 2: 2 local experts, each receiving top-2 x ep 2 / 4 experts of the tokens
    moe_ep = cc.block_linears(_plan(cal, shape="tiny-moe", ep=2), 0, 512)
    assert len(moe_ep) == 4 + 1 + 6 and {lin.tokens for lin in moe_ep[5:]} == {512 * 2 * 2 / 4}


def test_layer_time_sums_gemms_attention_and_elementwise_and_recompute_adds_a_forward():
    cal = Calibration(**BASE, **OPS)
    rates = cc.op_rates(cal)
    plan = _plan(cal)
    lins = cc.block_linears(plan, 0, 512)
    rows = 4 * 8 * 128  # micro batch x heads x seq
    row_fb, row_f = cc.attention_row_s(ATT, 128, 32), cc.attention_row_s(ATT, 128, 32, forward_only=True)
    base = sum(cc.linear_s(FIT, lin) for lin in lins) + rows * row_fb + 2e-9 * 1e6
    assert cc.layer_s(plan, rates, 0, 512, 4, 1e6, recompute=False) == pytest.approx(base)
    fwd = sum(cc.linear_s(FIT, lin, forward_only=True) for lin in lins) + rows * row_f + 2e-9 * 1e6 / 3
    assert cc.layer_s(plan, rates, 0, 512, 4, 1e6, recompute=True) == pytest.approx(base + fwd)


def test_fit_elementwise_is_total_residual_over_total_bytes_and_never_negative():
    assert cc.fit_elementwise([0.003, 0.009], [1e6, 4e6]) == pytest.approx(0.012 / 5e6)
    assert cc.fit_elementwise([-0.001, 0.0005], [1e6, 4e6]) == 0.0
    with pytest.raises(ValueError, match="saved bytes"):
        cc.fit_elementwise([0.1], [0])


def test_step_time_uses_the_op_level_model_when_the_calibration_has_it():
    block = Calibration(**BASE)
    ops = Calibration(**BASE, **OPS)
    assert not block.has_op_rates and ops.has_op_rates
    st_block = estimate_run(_plan(block)).step_time
    st_ops = estimate_run(_plan(ops)).step_time
    assert st_ops.compute_s != st_block.compute_s
    shape = get_preset("tiny")
    assert st_ops.compute_s == pytest.approx(cc.cpu_compute_s(_plan(ops), cc.op_rates(ops)))
    assert st_ops.overhead_s == pytest.approx(BASE["step_overhead_s"] + 1e-3 * shape.num_hidden_layers)


def test_grad_path_rate_replaces_memory_bandwidth_for_gradient_traffic_only():
    slow = estimate_run(_plan(Calibration(**BASE, **OPS))).step_time
    fast = estimate_run(_plan(Calibration(**BASE, **OPS, grad_bw_bytes_per_s=3e12))).step_time
    assert fast.memory_s < slow.memory_s
    assert (fast.compute_s, fast.optimizer_s) == (slow.compute_s, slow.optimizer_s)


def test_per_precision_fields_are_read_for_the_run_precision():
    raw = {**BASE, "_source": "x.json",
           **{f"{k}_bf16": v for k, v in OPS.items()}, "gemm_rate_flops_per_s_fp32": 9e10,
           "gemm_half_dim_fp32": 10.0, "grad_bw_bytes_per_s_bf16": 2e9}
    bf16 = calibration_from_raw(raw, "bf16")
    assert bf16.gemm_rate_flops_per_s == OPS["gemm_rate_flops_per_s"] and bf16.has_op_rates
    assert bf16.attention_points == [tuple(p) for p in ATT] and bf16.grad_bw_bytes_per_s == 2e9
    fp32 = calibration_from_raw(raw, "fp32")
    assert fp32.gemm_rate_flops_per_s == 9e10 and not fp32.has_op_rates  # no fp32 attention grid in the file
    assert calibration_from_raw(raw, "fp16").gemm_rate_flops_per_s == OPS["gemm_rate_flops_per_s"]


def test_cpu_rank_env_fills_defaults_and_keeps_the_users_values():
    env = cpu_rank_env({"OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/bin"
    assert all(env[k] == v for k, v in CPU_RANK_ENV.items() if k != "OMP_NUM_THREADS")
    assert shell_exports()[0] == 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"'
    assert len(shell_exports()) == len(CPU_RANK_ENV)
