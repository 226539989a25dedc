"""How fast one GEMM runs (estimate.gemm): the k fall-off, tile and wave quantisation over the SMs, the precision
factor and the projections at their own shapes, pinned with hand-derived numbers (NVIDIA "Matrix Multiplication
Background" guide, the GPUs' datasheets)."""
import pytest

from dstoolkit.estimate import gemm
from dstoolkit.hardware.table import get_gpu


def test_gemm_rate_by_shape_precision_and_generation():
    h100, a100 = get_gpu("H100-SXM"), get_gpu("A100-80G")
    assert gemm.shape_factor(gemm.GEMM_HALF_DIM, 1e6, 1e6) == pytest.approx(0.5)
    big = gemm.gemm_rate(h100, "bf16", 1e9, 1e9, 1e9)
    assert big == pytest.approx(989e12 * 0.80, rel=1e-3)
    assert gemm.gemm_rate(h100, "fp8", 8192, 8192, 8192) == pytest.approx(
        gemm.FP8_GEMM_SPEEDUP * gemm.gemm_rate(h100, "bf16", 8192, 8192, 8192))
    assert gemm.gemm_rate(a100, "fp8", 8192, 8192, 8192) == gemm.gemm_rate(a100, "bf16", 8192, 8192, 8192)
    # the reduction depth k falls off as k / (k + half_depth): GEMM_HALF_DIM scaled by the GPU's ridge point;
    # a small output leaves SMs idle
    assert gemm.gemm_rate(h100, "bf16", 8192, 8192, gemm.half_depth(h100)) == pytest.approx(
        0.5 * gemm.gemm_rate(h100, "bf16", 8192, 8192, 1e12), rel=1e-6)
    assert gemm.gemm_rate(h100, "bf16", 256, 256, 8192) < 0.05 * gemm.gemm_rate(h100, "bf16", 8192, 8192, 8192)
    assert 1.3 <= gemm.FP8_GEMM_SPEEDUP <= 1.5


def test_wave_utilisation_counts_tiles_and_waves():
    # NVIDIA "Matrix Multiplication Background" ch. 3. A100 (108 SMs), a BLOOM tp8 out-projection-sized output
    # m 2048 x n 1792: 256x128 and 128x256 tiles give 112 tiles = 2 waves (2048·1792 / (2·108·256·128) = 0.519);
    # 128x128 tiles give 224 = 3 waves: 2048·1792 / (3·108·128·128) = 0.691, the best
    assert gemm.wave_utilisation(2048, 1792, 108) == pytest.approx(2048 * 1792 / (3 * 108 * 128 * 128))
    # twice the micro batch: 448 tiles of 128x128 = 4.15 -> 5 waves, 224 of 256x128 = 2.07 -> 3 waves (0.691);
    # 128x128 gives 4096·1792 / (5·108·128·128) = 0.830
    assert gemm.wave_utilisation(4096, 1792, 108) == pytest.approx(4096 * 1792 / (5 * 108 * 128 * 128))
    # a grouped GEMM's experts share the launch: 4 tiles of one 256x256 output fill 4 of 132 SMs, 33 such fill all
    assert gemm.wave_utilisation(256, 256, 132) == pytest.approx(4 / 132)
    assert gemm.wave_utilisation(256, 256, 132, groups=33) == pytest.approx(1.0)


def test_gemm_shape_factor_by_generation_and_switch():
    a100, l40s = get_gpu("A100-80G"), get_gpu("L40S")
    k = gemm.GEMM_HALF_DIM
    assert gemm.gemm_shape_factor(a100, 2048, 1792, k) == pytest.approx(0.5 * gemm.wave_utilisation(2048, 1792, 108))
    # no SM count for this generation in SMS_BY_COMPUTE_CAPABILITY: only the k fall-off, at this GPU's half depth
    assert gemm.gemm_shape_factor(l40s, 2048, 1792, gemm.half_depth(l40s)) == pytest.approx(0.5)
    old = gemm.GEMM_WAVE_QUANTISATION
    try:
        gemm.GEMM_WAVE_QUANTISATION = False
        assert gemm.gemm_shape_factor(a100, 2048, 1792, 4 * k) == gemm.shape_factor(2048, 1792, 4 * k)
    finally:
        gemm.GEMM_WAVE_QUANTISATION = old


def test_projections_run_at_their_own_shapes():
    # column-parallel in-projection (m x h) @ (h x n), row-parallel out-projection (m x n) @ (n x h)
    a100 = get_gpu("A100-80G")
    got = gemm.projection_s(a100, "bf16", 3.0, 1.0, 2048, 1792, 14336).forward_s
    want = 2 * (3.0 / gemm.gemm_rate(a100, "bf16", 2048, 1792, 14336)
                + 1.0 / gemm.gemm_rate(a100, "bf16", 2048, 14336, 1792))
    assert got == pytest.approx(want, rel=1e-12)
    # the out-projection's short k (h / tp) falls off, the in-projection's narrow output wastes SM waves
    assert gemm.gemm_rate(a100, "bf16", 2048, 14336, 1792) == pytest.approx(
        312e12 * 0.87 * 1792 / (1792 + gemm.GEMM_HALF_DIM) * gemm.wave_utilisation(2048, 14336, 108), rel=1e-9)
    assert gemm.gemm_rate(a100, "bf16", 2048, 1792, 14336) == pytest.approx(
        312e12 * 0.87 * 14336 / (14336 + gemm.GEMM_HALF_DIM) * gemm.wave_utilisation(2048, 1792, 108), rel=1e-9)


def test_linear_backward_passes_at_their_own_shapes():
    # Y = X @ W, X (m x k), W (k x n): dgrad (m x n) @ (n x k), wgrad (k x m) @ (m x n); off: 2 x the forward
    a100 = get_gpu("A100-80G")
    m, n, k, work = 2048.0, 1792.0, 14336.0, 5.0
    fwd = 2 * work / gemm.gemm_rate(a100, "bf16", m, n, k)
    old = gemm.GEMM_BACKWARD_SHAPES
    try:
        gemm.GEMM_BACKWARD_SHAPES = True
        on = gemm.linear_s(a100, "bf16", work, m, n, k)
        assert on.forward_s == pytest.approx(fwd, rel=1e-12)
        assert on.backward_s == pytest.approx(2 * work / gemm.gemm_rate(a100, "bf16", m, k, n)
                                              + 2 * work / gemm.gemm_rate(a100, "bf16", k, n, m), rel=1e-12)
        # the wgrad reduces over the tokens: a 4x larger micro batch is a deeper, faster wgrad per token
        big = gemm.linear_s(a100, "bf16", 4 * work, 4 * m, n, k)
        assert big.backward_s < 4 * on.backward_s and big.forward_s == pytest.approx(4 * on.forward_s, rel=0.05)
        gemm.GEMM_BACKWARD_SHAPES = False
        off = gemm.linear_s(a100, "bf16", work, m, n, k)
        assert (off.forward_s, off.backward_s) == (pytest.approx(fwd, rel=1e-12), pytest.approx(2 * fwd, rel=1e-12))
        both = gemm.projection_s(a100, "bf16", 3.0, 1.0, m, n, k)
        assert both.forward_s == pytest.approx(gemm.linear_s(a100, "bf16", 3.0, m, n, k).forward_s
                                               + gemm.linear_s(a100, "bf16", 1.0, m, k, n).forward_s, rel=1e-12)
    finally:
        gemm.GEMM_BACKWARD_SHAPES = old
