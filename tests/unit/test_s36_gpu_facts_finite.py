"""s36 finding 4: non-finite or absurd GPU facts. `.inf` passed GpuSpec's gt=0 (`MFU 0.0% of inf TFLOP/s`,
`"mfu_peak_flops_per_gpu": Infinity` in --format json); rates of 1.0e-300 gave `step time nan s` and
`"step_time_s": NaN`. Now every float field of GpuSpec is finite (one model setting, allow_inf_nan=False), and a
spec's stated rates are checked against declared sanity floors (hardware.gpu_spec.RATE_FLOORS), the refusal naming
the field, the value and its unit."""
from __future__ import annotations

import typing

import pydantic
import pytest

from dstoolkit.cli import main
from dstoolkit.hardware.table import GPU_TABLE, GpuSpec
from dstoolkit.spec import SpecError, load_spec

FACTS = dict(memory_bytes=85899345920, peak_bf16_flops="989.0e12", intra_node_bw_bytes_per_s="450.0e9",
             inter_node_bw_bytes_per_s="50.0e9")


def _spec(**facts) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in {**FACTS, **facts}.items())
    return ("name: s\nmodel: {preset: tiny}\ncluster:\n  nodes: 1\n  gpus_per_node: 2\n  gpu:\n    name: mine\n"
            f"{lines}training:\n  seq_len: 128\n  global_batch: 8\n  micro_batch: 1\n")


def _error(tmp_path, **facts) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(_spec(**facts))
    with pytest.raises(SpecError) as info:
        load_spec(p)
    return str(info.value).replace(str(p), "s.yaml")


FLOAT_FIELDS = [n for n, f in GpuSpec.model_fields.items() if float in (f.annotation, *typing.get_args(f.annotation))]


def test_float_fields_are_the_rates_and_gemm_fraction():
    assert FLOAT_FIELDS == ["peak_bf16_flops", "peak_fp8_flops", "intra_node_bw_bytes_per_s",
                            "inter_node_bw_bytes_per_s", "hbm_bw_bytes_per_s", "gemm_fraction"]


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_every_float_field_refuses_non_finite(field, value):
    """Before: +inf passed every gt=0 field; nan and -inf were refused as 'greater than 0'."""
    facts = dict(memory_bytes=1, peak_bf16_flops=1.0, intra_node_bw_bytes_per_s=1.0, inter_node_bw_bytes_per_s=1.0)
    with pytest.raises(pydantic.ValidationError) as info:
        GpuSpec(**{**facts, field: value})
    assert [(e["loc"], e["type"]) for e in info.value.errors()] == [((field,), "finite_number")]


def test_inf_in_a_spec_is_refused_at_its_line(tmp_path):
    """Before: estimate printed 'MFU 0.0% of inf TFLOP/s' and --format json wrote Infinity."""
    assert _error(tmp_path, peak_bf16_flops=".inf") == (
        "s.yaml:9:22: cluster.gpu.peak_bf16_flops: inf is not valid: Input should be a finite number "
        "(expected: Dense (no sparsity) bf16 peak FLOP/s per GPU.)")


def test_tiny_rates_are_refused_naming_field_value_and_unit(tmp_path):
    """Before: 'step time nan s', and --format json wrote "step_time_s": NaN."""
    assert _error(tmp_path, peak_bf16_flops="1.0e-300", intra_node_bw_bytes_per_s="1.0e-300") == (
        "s.yaml:9:22: cluster.gpu.peak_bf16_flops: peak_bf16_flops=1e-300 FLOP/s is below 1e+06 "
        "FLOP/s, the sanity floor for this rate (no accelerator or CPU rank is that slow); "
        "intra_node_bw_bytes_per_s=1e-300 bytes/s is below its floor too "
        "(peak_bf16_flops is in FLOP/s per GPU, not a larger unit: write e.g. 989e12 for 989 TFLOP/s)")


@pytest.mark.parametrize("field,value,example", [
    ("intra_node_bw_bytes_per_s", "450", "365e9 for 365 GB/s"),
    ("inter_node_bw_bytes_per_s", "50", "50e9 for 50 GB/s"),
    ("hbm_bw_bytes_per_s", "3.35", "3.35e12 for 3.35 TB/s"),
    ("peak_fp8_flops", "1979", None),  # below the bf16 peak first: that rule speaks
])
def test_a_figure_in_the_wrong_unit_is_refused(tmp_path, field, value, example):
    text = _error(tmp_path, **{field: value})
    if example is None:
        assert f"cluster.gpu.{field}: peak_fp8_flops=1979 FLOP/s is below peak_bf16_flops=9.89e+14" in text
    else:
        assert (f"cluster.gpu.{field}: {field}={value} bytes/s is below 1e+06 bytes/s, the sanity floor for this "
                f"rate (no accelerator or CPU rank is that slow) ({field} is in bytes/s per GPU, not a larger unit: "
                f"write e.g. {example})") in text


def test_slow_cpu_ranks_and_every_table_row_are_not_refused(tmp_path):
    """The slowest ranks these facts describe: a CPU without native bf16 (~1 GFLOP/s, hardware.calibration) and
    gloo between CPU ranks (0.69 GB/s measured); 1 Gb/s Ethernet ~0.1 GB/s. All load."""
    from dstoolkit.hardware.gpu_spec import rates_below_floor

    p = tmp_path / "s.yaml"
    p.write_text(_spec(peak_bf16_flops="1.0e9", peak_fp8_flops="1.0e9", intra_node_bw_bytes_per_s="1.0e8",
                       inter_node_bw_bytes_per_s="1.0e8", hbm_bw_bytes_per_s="1.0e9"))
    assert load_spec(p).cluster.gpu_spec.peak_bf16_flops == 1e9
    assert {name: rates_below_floor(g) for name, g in GPU_TABLE.items()} == {name: [] for name in GPU_TABLE}


def test_every_rate_field_has_a_floor():
    from dstoolkit.hardware.gpu_spec import RATE_FLOORS

    assert list(RATE_FLOORS) == [f for f in FLOAT_FIELDS if f.endswith(("_flops", "_bytes_per_s"))]


def test_estimate_refuses_without_a_traceback(tmp_path, capsys):
    p = tmp_path / "s.yaml"
    p.write_text(_spec(peak_bf16_flops="1.0e-300"))
    assert main(["estimate", str(p), "--format", "json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("dstoolkit estimate: error: ") and "Traceback" not in err
    assert "cluster.gpu.peak_bf16_flops: peak_bf16_flops=1e-300 FLOP/s is below 1e+06 FLOP/s" in err
