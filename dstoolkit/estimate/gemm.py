"""How fast one GEMM runs on a GPU (issue 16, issue 24): the large-GEMM fraction of dense peak, the fall-off in the
reduction depth k, tile and wave quantisation of the output over the SMs, the precision factor, and a block's in- and
out-projections each at its own shape. No torch import.

The step-time model (cluster_model.layer_compute_s, step_time's LM head) asks gemm_rate / projection_s; what a
whole step keeps of the kernel rate (cluster_model.FRAMEWORK_EFFICIENCY) and the attention core's rate
(cluster_model.attention_fraction) are not one GEMM's and stay there. GEMM_HALF_DIM is fitted
(benchmarks/estimator_fit.py FITTED patches it here)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from dstoolkit.hardware.table import GpuSpec

GEMM_HALF_DIM = 384
"""Fitted. At the reference ridge point (GEMM_HALF_DIM_REFERENCE_RIDGE, A100 80GB; half_depth scales it to each
GPU's). GEMM efficiency falls off as k / (k + GEMM_HALF_DIM) in the reduction depth k (gemm_shape_factor, with
the output's tile and wave quantisation beside it, issue 24); before that, and still with GEMM_WAVE_QUANTISATION
off (shape_factor), as d / (d + GEMM_HALF_DIM) in the smallest GEMM dimension d: a tile-level
occupancy form (a d-wide GEMM fills d / (d + tile-quantisation waste) of the SMs); with the Hopper large-GEMM
fraction 0.80 it gives ~0.55 of peak at d = 1024 and ~0.72 at d = 4096, the shape of published cuBLAS
bf16 sweeps (NVIDIA "Matrix Multiplication Background" guide, Fig. 2-3). Refit in issue 24 with the hop latency
removed: 256 / cluster_model.FRAMEWORK_EFFICIENCY 0.84 give 8.5% over the whole table (384 / 0.88: 8.8%).
With the wave term (grid 0/64/128/256/384 x 0.80-0.96, screened leave one source out) 256 / 0.84 stay the
in-sample best and every fold's choice. With the half depth scaled by the ridge point (half_depth) and the 129-row
table: 384 / 0.88 are the in-sample best and every fold's choice (grid 256/384/512 x 0.80-0.96)."""
DEFAULT_GEMM_FRACTION = 0.75
"""Large-GEMM fraction of dense peak for a GPU the table has no measurement for (between Hopper's 0.80 and the
MI300X's ~0.6 below)."""
FP8_GEMM_SPEEDUP = 1.45
"""FP8 over bf16 GEMM rate as training frameworks realise it (casts, amax/scale bookkeeping included): the
1.3-1.5x published end to end (torchtitan docs/performance.md: Llama 3 8B 5,762 -> 8,532 tokens/s with compile +
float8, docs/anchors.md; NVIDIA NeMo performance tables fp8 vs bf16), not the 2x peak ratio."""
FP32_GEMM_SLOWDOWN = 0.5
"""fp32 runs use TF32 tensor cores at half the bf16 peak (A100/H100 datasheets: TF32 = bf16 / 2, dense)."""
GEMM_WAVE_QUANTISATION = True
"""Whether gemm_rate charges tile and wave quantisation over the SMs (gemm_shape_factor) instead of the fall-off in
the smallest dimension (shape_factor). Issue 24, screened with the fitted constants refitted leave one source out
(the projections at their own shapes and the grouped expert GEMMs counted as one launch, both kept either way):
published runs MAPE 8.4% -> 8.1% in sample, 8.4% -> 8.2% out of source, efficiency Spearman 0.922 -> 0.928; layout
sweeps MAPE 9.3% -> 9.1%, within-group Spearman 0.416 -> 0.506, top-1 regret mean 4.7% -> 2.5%, worst 24.8% ->
15.5%. The switch stays for that comparison. What it explains: at a fixed tp a smaller micro batch shrinks m =
micro_batch x seq, and a narrow column-parallel output (h / tp) then leaves whole waves of SMs part-idle (A100,
m 2048 x n 1792: 69% of the tile slots busy; m 8192: 96%), the micro-batch dependence the old smallest-dimension
form could not have (it saw only h / tp)."""
GEMM_BACKWARD_SHAPES = False
"""Whether a linear's backward GEMMs run at their own shapes (linear_s) instead of at the forward's. For Y = X @ W
with X (m x k), W (k x n): forward (m x k) @ (k x n); dgrad dX = dY @ W^T, (m x n) @ (n x k), reduction depth n;
wgrad dW = X^T @ dY, (k x m) @ (m x n), reduction depth m, the micro batch's tokens (the chain rule of a matrix
product; Megatron's ColumnParallelLinear / RowParallelLinear backward issues exactly these two GEMMs, Shoeybi et al.
2019 §3). Off (shipped): backward = 2 x forward at the forward's shape. Issue 24, measured at 68149cc with the
shipped constants: published runs MAPE 5.4% -> 6.1% in sample, 5.4% -> 6.3% leave one source out (refitted
in-sample best moves to half-dim 512, the grid's edge), efficiency Spearman 0.961 -> 0.957: the wgrad's depth is
the tokens, deep for the MPT 125M-3B rows, whose errors rise by 2-7 points (H100: +6 -> +12%); layout sweeps
MAPE 11.7% -> 11.3%, mean within-group Spearman 0.536 -> 0.488, worst top-1 regret 15.5% -> 24.8% (at half-dim
512: 10.2%, 0.588, 24.8%). It stays off; the switch stays for that comparison."""
SMS_BY_COMPUTE_CAPABILITY = {"8.0": 108, "9.0": 132, "10.0": 148, "10.3": 148}
"""Streaming multiprocessors of the data-centre part of each generation: A100 108 SMs (NVIDIA A100 Tensor Core GPU
Architecture whitepaper, 2020, "108 SMs"), H100 / H200 / H800 SXM 132 (NVIDIA H100 Tensor Core GPU Architecture
whitepaper, 2022, "132 SMs" for SXM5), B200 / GB200 148 and B300 / GB300 148 (stas00/ml-engineering@744d01e
training/performance/README.md: "a B200 SKU also reads 148"; B300 ships as 148- and 152-SM SKUs of a 160-SM full
die, the smaller taken). Other generations (and PCIe parts with fewer SMs) get no wave term."""
GEMM_TILES = ((256, 128), (128, 256), (128, 128))
"""Output tiles (rows x columns) a CTA of a bf16 tensor-core GEMM computes; cuBLAS/CUTLASS pick per shape among
these sizes (NVIDIA "Matrix Multiplication Background User's Guide", ch. 3 "Dimension Quantization Effects": tile
sizes 256x128, 128x256, 128x128, ...)."""


GEMM_HALF_DIM_REFERENCE_RIDGE = 312e12 / 2.039e12
"""The ridge point GEMM_HALF_DIM is stated at: A100 SXM 80GB, 312 TFLOP/s dense bf16 over 2,039 GB/s HBM2e (NVIDIA
A100 datasheet), ~153 FLOPs per byte."""


def half_depth(gpu: GpuSpec) -> float:
    """The reduction depth at which one GEMM runs at half its large-GEMM rate on this GPU: GEMM_HALF_DIM scaled by
    the GPU's ridge point (dense bf16 peak / HBM bandwidth, the roofline's FLOPs per byte, Williams et al. 2009)
    over the reference one. Each output tile's epilogue writes (and its prologue loads) a fixed number of bytes
    per tile while the main loop does 2·k FLOPs per output element, so the fixed part costs k_half = c · peak / BW
    of depth: a GPU with twice the FLOPs per byte of bandwidth needs twice the depth (H100 SXM 295 vs A100 153).
    GPUs without an HBM figure keep GEMM_HALF_DIM."""
    if not gpu.hbm_bw_bytes_per_s or not gpu.peak_bf16_flops:
        return float(GEMM_HALF_DIM)
    return GEMM_HALF_DIM * (gpu.peak_bf16_flops / gpu.hbm_bw_bytes_per_s) / GEMM_HALF_DIM_REFERENCE_RIDGE


def wave_utilisation(m: float, n: float, sms: int, groups: int = 1) -> float:
    """Fraction of the SM-tile slots a GEMM's output keeps busy, the best over GEMM_TILES: ceil(m/tm)·ceil(n/tn)
    tiles (x groups for a grouped GEMM, whose experts' tiles share one launch) run in ceil(tiles/sms) waves, and
    the padded tile area and the last wave's idle SMs do no useful work (NVIDIA "Matrix Multiplication Background
    User's Guide" ch. 3: tile quantisation and wave quantisation)."""
    m, n = max(1.0, m), max(1.0, n)
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * max(1, groups)
        slots = math.ceil(tiles / sms) * sms * tm * tn
        best = max(best, m * n * max(1, groups) / slots)
    return best


def gemm_shape_factor(gpu: GpuSpec, m: float, n: float, k: float, groups: int = 1) -> float:
    """The GEMM's fraction of the large-GEMM rate by shape. With GEMM_WAVE_QUANTISATION: the fall-off in the
    reduction depth k / (k + GEMM_HALF_DIM) (each tile's prologue and epilogue amortised over its main loop of k)
    times wave_utilisation over the output m x n on this GPU's SMs (no wave term where the SM count is unknown);
    else shape_factor (the smallest of m, n, k)."""
    if not GEMM_WAVE_QUANTISATION:
        return shape_factor(m, n, k)
    kk = max(1.0, k)
    f = kk / (kk + half_depth(gpu))
    sms = SMS_BY_COMPUTE_CAPABILITY.get(str(gpu.compute_capability or ""))
    return f * wave_utilisation(m, n, sms, groups) if sms else f


def gemm_fraction(gpu: GpuSpec) -> float:
    """Large-GEMM fraction of dense bf16 peak (`GpuSpec.gemm_fraction`, else DEFAULT_GEMM_FRACTION)."""
    return gpu.gemm_fraction if gpu.gemm_fraction is not None else DEFAULT_GEMM_FRACTION


def shape_factor(m: float, n: float, k: float) -> float:
    """d / (d + GEMM_HALF_DIM) for d = the smallest of the GEMM's m, n, k (see GEMM_HALF_DIM)."""
    d = max(1.0, min(m, n, k))
    return d / (d + GEMM_HALF_DIM)


def precision_factor(precision: str, gpu: GpuSpec) -> float:
    """GEMM rate relative to bf16 for the plan's precision. fp8 (where the GPU has fp8 tensor cores):
    min(FP8_GEMM_SPEEDUP, peak_fp8_flops / peak_bf16_flops), since the realised speed-up cannot exceed the ratio of
    the two dense peaks. Every table GPU with fp8 units has ratio 2 (so FP8_GEMM_SPEEDUP), the cpu row's emulation 1;
    a stated fp8 peak below 1.45x the bf16 one now slows the step. Before, 1.45 was applied whatever the fp8 peak,
    so an fp8 GEMM could run above the fp8 peak that MFU divides by (hardware.calibration.peak_flops_per_rank) and
    MFU read 500%. With this cap an fp8 GEMM's rate is at most gemm_fraction x peak_fp8_flops."""
    if precision == "fp8" and gpu.peak_fp8_flops:
        return min(FP8_GEMM_SPEEDUP, gpu.peak_fp8_flops / gpu.peak_bf16_flops)
    if precision == "fp32":
        return FP32_GEMM_SLOWDOWN
    return 1.0


def gemm_rate(gpu: GpuSpec, precision: str, m: float, n: float, k: float, groups: int = 1) -> float:
    """Sustained FLOP/s of one (m x k) @ (k x n) GEMM on this GPU (`groups` such GEMMs in one grouped launch)."""
    return (gpu.peak_bf16_flops * gemm_fraction(gpu) * gemm_shape_factor(gpu, m, n, k, groups)
            * precision_factor(precision, gpu))


@dataclass(frozen=True)
class LinearSeconds:
    """Seconds of linear layers on one rank for one micro batch: one forward pass, and the backward (dgrad +
    wgrad)."""

    forward_s: float
    backward_s: float

    def __add__(self, other: "LinearSeconds") -> "LinearSeconds":
        return LinearSeconds(self.forward_s + other.forward_s, self.backward_s + other.backward_s)


def linear_s(gpu: GpuSpec, precision: str, work: float, m: float, n: float, k: float,
             groups: int = 1) -> LinearSeconds:
    """One linear Y = X @ W, X (m x k), W (k x n), `work` = its weights x tokens on the rank (2 FLOPs each per
    GEMM): the forward at (m, n, k) and, with GEMM_BACKWARD_SHAPES, the dgrad at (m, k, n) and the wgrad at
    (k, n, m) (gemm_rate's (rows, columns, depth) of the output and the reduction)."""
    fwd = 2.0 * work / gemm_rate(gpu, precision, m, n, k, groups)
    if not GEMM_BACKWARD_SHAPES:
        return LinearSeconds(fwd, 2.0 * fwd)
    return LinearSeconds(fwd, 2.0 * work / gemm_rate(gpu, precision, m, k, n, groups)
                         + 2.0 * work / gemm_rate(gpu, precision, k, n, m, groups))


def projection_s(gpu: GpuSpec, precision: str, work_in: float, work_out: float, m: float, n_in: float,
                 h: float, groups: int = 1) -> LinearSeconds:
    """A block's in- and out-projections on one TP rank (linear_s): the in-projection (QKV; gate + up)
    (m x h) @ (h x n_in), the out-projection (attention output; down) (m x n_in) @ (n_in x h) (Megatron column-
    then row-parallel linears, Shoeybi et al. 2019 §3; n_in is already per TP rank). work_in / work_out: their
    weights x tokens on the rank."""
    return (linear_s(gpu, precision, work_in, m, n_in, h, groups)
            + linear_s(gpu, precision, work_out, m, h, n_in, groups))
