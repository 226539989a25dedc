"""s36 finding 3: a custom GPU's fp8 peak. The step-time model applied FP8_GEMM_SPEEDUP (1.45) whenever
peak_fp8_flops was set, whatever its value, while MFU divided by that stated peak: `cluster.gpu` with
peak_fp8_flops 100e12 against peak_bf16_flops 989e12 printed "MFU 500.2% of 100 TFLOP/s", and the step time was
15.17 s for any fp8 peak from 100e12 to 4000e12. Now the fp8 GEMM rate is the bf16 one x min(1.45, fp8 / bf16
peak) (estimate.gemm.precision_factor), and an fp8 peak below the bf16 one is refused naming both."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.estimate import gemm
from dstoolkit.hardware.table import GPU_TABLE, GpuSpec

SPEC = """\
name: s
model: {{preset: llama-3-8b}}
cluster:
  nodes: 1
  gpus_per_node: 8
  gpu:
    name: myH100
    memory_bytes: 85899345920
    peak_bf16_flops: 989.0e12
    peak_fp8_flops: {fp8}
    compute_capability: '9.0'
    intra_node_bw_bytes_per_s: 450.0e9
    inter_node_bw_bytes_per_s: 50.0e9
training:
  seq_len: 2048
  global_batch: 64
  micro_batch: 1
  precision: fp8
"""


def _gpu(fp8: float) -> GpuSpec:
    return GpuSpec(name="g", memory_bytes=80 * 2**30, peak_bf16_flops=989e12, peak_fp8_flops=fp8,
                   intra_node_bw_bytes_per_s=450e9, inter_node_bw_bytes_per_s=50e9, compute_capability="9.0")


def _estimate(tmp_path, capsys, fp8: str) -> tuple[int, str, str]:
    p = tmp_path / "s.yaml"
    p.write_text(SPEC.format(fp8=fp8))
    rc = main(["estimate", str(p), "--format", "json"])
    out, err = capsys.readouterr()
    return rc, out, err.replace(str(p), "s.yaml")


@pytest.mark.parametrize("fp8,factor", [(989e12, 1.0), (1200e12, 1200 / 989), (1434.05e12, 1.45),
                                        (1979e12, 1.45), (4000e12, 1.45)])
def test_fp8_gemm_speedup_is_capped_by_the_peak_ratio(fp8, factor):
    """Before: 1.45 at every fp8 peak."""
    assert gemm.precision_factor("fp8", _gpu(fp8)) == pytest.approx(factor, rel=1e-12)


def test_an_fp8_gemm_never_runs_above_the_fp8_peak():
    """The MFU denominator of an fp8 run is peak_fp8_flops (hardware.calibration.peak_flops_per_rank); a GEMM's rate
    is at most gemm_fraction of it. Before: at fp8 = bf16 peak the largest GEMM ran at 1.45 x 0.75 x 0.99 of it."""
    for fp8 in (989e12, 1100e12, 1434e12, 1979e12):
        gpu = _gpu(fp8)
        rate = gemm.gemm_rate(gpu, "fp8", 65536, 65536, 65536)
        assert rate <= gemm.gemm_fraction(gpu) * fp8


def test_table_gpus_keep_their_fp8_speedup():
    """Every table row with fp8 tensor cores has fp8 = 2x bf16 peak, so their estimates do not change; the cpu row's
    fp8 is emulated at the bf16 rate (its comment: no speed-up), and now gets none (before: 1.45)."""
    factors = {name: gemm.precision_factor("fp8", g) for name, g in GPU_TABLE.items() if g.peak_fp8_flops}
    assert factors == {"H100-SXM": 1.45, "H200": 1.45, "H800": 1.45, "B200": 1.45, "B300": 1.45, "GB200": 1.45,
                       "GB300": 1.45, "L40S": 1.45, "MI300X": 1.45, "cpu": 1.0}


def test_step_time_follows_the_fp8_peak_up_to_the_cap(tmp_path, capsys):
    """Before: the same compute time at every fp8 peak."""
    compute = {}
    for fp8 in ("1.0e15", "1.2e15", "1.979e15", "4.0e15"):
        rc, out, _ = _estimate(tmp_path, capsys, fp8)
        assert rc == 0
        compute[fp8] = json.loads(out)["step_time_breakdown_s"]["compute_s"]
    assert compute["1.0e15"] > compute["1.2e15"] > compute["1.979e15"]
    assert compute["1.979e15"] == compute["4.0e15"]  # both past the 1.45 cap


def test_fp8_peak_below_bf16_is_refused_naming_both(tmp_path, capsys):
    """Before: exit 0 and "MFU 500.2% of 100 TFLOP/s per rank, the myH100 fp8 peak"."""
    rc, out, err = _estimate(tmp_path, capsys, "100.0e12")
    assert (rc, out) == (2, "")
    assert err == (
        "dstoolkit estimate: error: s.yaml:10:21: cluster.gpu.peak_fp8_flops: peak_fp8_flops=1e+14 FLOP/s is below "
        "peak_bf16_flops=9.89e+14 FLOP/s, and no GPU's dense fp8 peak is below its bf16 one (H100-SXM: 1979e12 vs "
        "989e12); state the dense fp8 peak, or leave peak_fp8_flops out for a GPU without fp8 tensor cores "
        "(expected: Dense fp8 peak FLOP/s per GPU; None when the GPU has no fp8 tensor cores.)\n")


def test_fp8_peak_equal_to_bf16_is_accepted_and_mfu_stays_below_one(tmp_path, capsys):
    """The cpu row states fp8 = bf16 (emulation): equal peaks are a real case. MFU stays <= 1."""
    rc, out, _ = _estimate(tmp_path, capsys, "989.0e12")
    doc = json.loads(out)
    assert rc == 0 and doc["mfu_peak_flops_per_gpu"] == 989e12 and 0 < doc["mfu"] <= 1
