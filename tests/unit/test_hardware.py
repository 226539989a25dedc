"""Hardware table: names, lookup, published peaks, and a cited source for every row."""
import inspect
import re

import pytest

from dstoolkit.hardware import table as hardware
from dstoolkit.hardware.table import GPU_TABLE, get_gpu
from dstoolkit.hardware.table import GpuSpec

TFLOPS = 1e12


def test_table_has_the_required_names():
    assert list(GPU_TABLE) == ["H100-SXM", "H200", "H800", "A100-80G", "A100-40G", "L40S", "MI300X", "cpu"]
    for key, row in GPU_TABLE.items():
        assert row.name == key


def test_published_dense_peaks():
    # docs/anchors.md "Peak (dense, no sparsity)": H100/H200 SXM 989 bf16 and 1979 fp8; A100 312; H800 as H100.
    for name in ("H100-SXM", "H200", "H800"):
        assert get_gpu(name).peak_bf16_flops == 989 * TFLOPS
        assert get_gpu(name).peak_fp8_flops == 1979 * TFLOPS
    for name in ("A100-80G", "A100-40G"):
        assert get_gpu(name).peak_bf16_flops == 312 * TFLOPS
        assert get_gpu(name).peak_fp8_flops is None  # Ampere has no fp8 tensor cores
    # docs/anchors.md measured busbw: H100 NVLink ring ~365-370, H200 ~475, H800 ~215 GB/s; IB 400G ~50 GB/s.
    assert 365e9 <= get_gpu("H100-SXM").intra_node_bw_bytes_per_s <= 370e9
    assert get_gpu("H200").intra_node_bw_bytes_per_s == 475e9
    assert get_gpu("H800").intra_node_bw_bytes_per_s == 215e9
    assert get_gpu("H800").inter_node_bw_bytes_per_s == 50e9


def test_memory_ordering_and_cpu_budget():
    gib = 2**30
    assert get_gpu("A100-40G").memory_bytes == 40 * gib
    assert get_gpu("H100-SXM").memory_bytes == get_gpu("A100-80G").memory_bytes == 80 * gib
    assert get_gpu("H200").memory_bytes == 141 * gib
    assert get_gpu("MI300X").memory_bytes == 192 * gib
    # This machine: 24 GiB shared by 2 ranks, the OS and other work; the per-rank budget must leave room.
    assert 2 * get_gpu("cpu").memory_bytes < 24 * gib


def test_every_row_cites_a_source():
    src = inspect.getsource(hardware)
    body = src[src.index("GPU_TABLE: dict"):]
    for key in GPU_TABLE:
        before = body[: body.index(f'"{key}": GpuSpec(')]
        comment = before.rstrip().splitlines()[-1].strip()
        assert comment.startswith("#"), f"row {key!r} has no source comment"
    # the cpu row is the reference machine's measurement: its file is cited next to it
    assert "calibration_cpu_reference.json" in src and "benchmarks/results/calibration_cpu_202611.json" in src


def test_cpu_row_rates_are_the_packaged_reference_measurement():
    """The cpu row's peak is the fastest rate the packaged calibration measured, and its bandwidth the
    measured gloo busbw (so MFU on the reference machine stays below 1)."""
    import json
    from pathlib import Path

    import dstoolkit

    ref = json.loads((Path(dstoolkit.__file__).parent / "data" / "calibration_cpu_reference.json").read_text())
    wall = ref["calibration"]["wall"]
    fastest = max(v for k, v in wall.items() if k.startswith("matmul_flops_per_s"))
    row = get_gpu("cpu")
    assert abs(row.peak_bf16_flops / fastest - 1) < 0.01
    assert abs(row.intra_node_bw_bytes_per_s / wall["comm_busbw_bytes_per_s"] - 1) < 0.01


@pytest.mark.parametrize("name", ["h100-sxm", "H100_SXM", "h100 sxm", "CPU", "mi300x", "a100-80g"])
def test_lookup_is_case_and_punctuation_insensitive(name):
    assert get_gpu(name).name.lower().replace("-", "") == re.sub(r"[^a-z0-9]", "", name.lower())


def test_unknown_name_lists_known_and_suggests():
    with pytest.raises(ValueError, match=r"unknown GPU 'H10' \(did you mean 'H100-SXM'\? known: H100-SXM, H200, H800"):
        get_gpu("H10")
    with pytest.raises(ValueError, match="known: H100-SXM.*cpu"):
        get_gpu("TPUv5")


def test_explicit_spec_passes_through_and_rows_are_copies():
    custom = GpuSpec(memory_bytes=1, peak_bf16_flops=1.0, intra_node_bw_bytes_per_s=1.0, inter_node_bw_bytes_per_s=1.0)
    assert get_gpu(custom) is custom
    row = get_gpu("H100-SXM")
    row.memory_bytes = 1
    assert GPU_TABLE["H100-SXM"].memory_bytes == 80 * 2**30
