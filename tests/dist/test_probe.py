"""The real machine probe (dstoolkit.runtime.probe) on 2 gloo ranks: it writes a calibration the estimator
reads, and the cache answers the second time without probing."""
from __future__ import annotations

import json

import pytest

from dstoolkit.hardware import calibration as cal
from dstoolkit.hardware import machine_calibration as machine

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_probe_writes_a_usable_calibration_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTOOLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("DSTOOLKIT_CALIBRATION", raising=False)
    said = []
    path = machine.machine_calibration_path(announce=said.append)
    assert path.parent == tmp_path / "calibration" and len(said) == 1
    rec = json.loads(path.read_text())
    assert rec["machine"] == machine.machine_key()
    for clock in ("wall", "cpu"):
        c = rec["calibration"][clock]
        assert all(c[f"matmul_flops_per_s_{p}{s}"] > 0 for p in ("fp32", "bf16") for s in ("", "_large"))
        assert c["comm_busbw_bytes_per_s"] > 0 and c["mem_bw_bytes_per_s"] > 0 and c["step_overhead_s"] > 0
        assert all(c[f"gemm_peak_flops_per_s_{p}"] > 0 for p in ("fp32", "bf16"))
        for p in ("fp32", "bf16"):  # the op-level model's rates: GEMM fit, a full attention grid, elementwise
            assert c[f"gemm_rate_flops_per_s_{p}"] > 0 and c[f"gemm_half_dim_{p}"] >= 0 and c[f"gemm_call_s_{p}"] >= 0
            grid = c[f"attention_points_{p}"]
            assert len({(s_, d) for s_, d, _, _ in grid}) == len(grid) == 4 and all(fb > f > 0 for _, _, fb, f in grid)
            assert c[f"elementwise_s_per_byte_{p}"] >= 0
    for prec in ("fp32", "bf16"):
        assert cal.load_calibration(path, prec).has_op_rates
        assert cal.load_calibration(path, prec).matmul_flops_per_s == rec["calibration"]["wall"][f"matmul_flops_per_s_{prec}"]
        w = rec["calibration"]["wall"]
        # the MFU peak: the measured GEMM peak, never below the block rates the estimate computes with
        assert cal.load_calibration(path, prec).peak_flops_per_s == max(
            w[f"gemm_peak_flops_per_s_{prec}"], w[f"matmul_flops_per_s_{prec}"], w[f"matmul_flops_per_s_{prec}_large"])
    again = []
    assert machine.machine_calibration_path(announce=again.append) == path and again == []
