"""s34: `estimate` names the peak its MFU divides by. An fp8 run's MFU is over the GPU's fp8 peak (twice the bf16
one on Hopper), which the output did not say: DeepSeek-V3's bundled spec printed "MFU 16.4%", which reads as poor
beside the bf16-peak MFU published runs quote. Now the line names the peak, and for fp8 also gives the bf16-peak
figure; the JSON carries both the peak and what it is."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.hardware.table import get_gpu


def _estimate(capsys, spec, *extra):
    assert main(["estimate", spec, *extra]) == 0
    return capsys.readouterr().out


def test_fp8_mfu_names_the_fp8_peak_and_gives_the_bf16_one(repo_root, capsys):
    spec = str(repo_root / "ds_configs" / "deepseek_v3_32x8_h800.yaml")
    est = json.loads(_estimate(capsys, spec, "--format", "json"))
    h800 = get_gpu("H800")
    assert est["mfu_peak_flops_per_gpu"] == h800.peak_fp8_flops
    assert est["mfu_peak"] == "H800 fp8 peak (hardware table)"
    text = _estimate(capsys, spec)
    line = next(ln for ln in text.splitlines() if ln.startswith("MFU "))
    bf16_mfu = est["mfu"] * h800.peak_fp8_flops / h800.peak_bf16_flops
    assert line == (f"MFU {est['mfu']:.1%} of {h800.peak_fp8_flops / 1e12:,.4g} TFLOP/s per rank, the H800 fp8 peak "
                    f"(hardware table); {bf16_mfu:.1%} of the bf16 peak ({h800.peak_bf16_flops / 1e12:,.4g} TFLOP/s)")


def test_bf16_mfu_names_the_bf16_peak_once(repo_root, capsys):
    spec = str(repo_root / "ds_configs" / "llama3_8b_1x8_h100.yaml")
    est = json.loads(_estimate(capsys, spec, "--format", "json"))
    assert est["mfu_peak_flops_per_gpu"] == pytest.approx(get_gpu("H100-SXM").peak_bf16_flops)
    line = next(ln for ln in _estimate(capsys, spec).splitlines() if ln.startswith("MFU "))
    assert line == f"MFU {est['mfu']:.1%} of 989 TFLOP/s per rank, the H100-SXM bf16 peak (hardware table)"
