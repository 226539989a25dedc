"""Hardware table: names, lookup, published peaks, and a cited source for every row."""
import inspect
import re

import pytest

from dstoolkit.hardware import table as hardware
from dstoolkit.hardware.table import GPU_TABLE, get_gpu
from dstoolkit.hardware.table import GpuSpec

TFLOPS = 1e12


def test_table_has_the_required_names():
    assert list(GPU_TABLE) == ["H100-SXM", "H200", "H800", "B200", "B300", "GB200", "GB300", "A100-80G", "A100-40G",
                               "L40S", "MI300X", "cpu"]
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


def test_blackwell_rows():
    """Dense per-GPU peaks, memory and measured rates of the Blackwell rows (hardware.BLACKWELL_REFERENCE): HGX/DGX
    B200 and B300 at 2250 / 4500 TFLOP/s bf16 / fp8, the NVL72 parts at 2500 / 5000; B200 180 GB, GB200 186,
    B300 / GB300 as nvidia-smi's memory.total (275040 / 284208 MiB; the datasheets' 288 GB is not 288 GiB); large-GEMM fractions from the measured maximum matmul rates; one NIC per GPU."""
    from dstoolkit.estimate.gemm import SMS_BY_COMPUTE_CAPABILITY

    gib = 2**30
    expect = {"B200": (2250, 180 * gib, "10.0", 0.776, 50e9), "B300": (2250, 275040 * 2**20, "10.3", 0.786, 100e9),
              "GB200": (2500, 186 * gib, "10.0", 0.729, 50e9), "GB300": (2500, 284208 * 2**20, "10.3", 0.786, 100e9)}
    for name, (bf16, mem, cc, frac, nic) in expect.items():
        g = get_gpu(name)
        assert (g.peak_bf16_flops, g.peak_fp8_flops) == (bf16 * TFLOPS, 2 * bf16 * TFLOPS)
        assert (g.memory_bytes, g.compute_capability, g.gemm_fraction) == (mem, cc, frac)
        assert (g.hbm_bw_bytes_per_s, g.inter_node_bw_bytes_per_s) == (8.0e12, nic)
        assert SMS_BY_COMPUTE_CAPABILITY[cc] == 148
    # 1745.0 / 2250 and 1822.0 / 2500 TFLOP/s measured (hardware.B200_GEMM_FRACTION, GB200_GEMM_FRACTION)
    assert hardware.B200_GEMM_FRACTION == round(1745.0 / 2250, 3)
    assert hardware.GB200_GEMM_FRACTION == round(1822.0 / 2500, 3)
    # HGX boards: 8 NICs; NVL72: one per GPU of the NVLink domain the spec calls a node (None)
    assert get_gpu("B200").nics_per_node == get_gpu("B300").nics_per_node == 8
    assert get_gpu("GB200").nics_per_node is None and get_gpu("GB300").nics_per_node is None
    assert get_gpu("B200").intra_node_bw_bytes_per_s == 838e9 and get_gpu("GB200").intra_node_bw_bytes_per_s == 850e9


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


def test_l40s_memory_is_what_ecc_leaves():
    """L40S: 48 GiB GDDR6, ECC on by default holds 1/16; nvidia-smi memory.total 46068 MiB is what a rank gets."""
    assert get_gpu("L40S").memory_bytes == 46068 * 2**20
