"""`GpuSpec`: one accelerator's facts, as the hardware table's rows (`dstoolkit.hardware.table.GPU_TABLE`) and a
spec's explicit `cluster.gpu: {...}` state them, with the rules every such set of facts obeys, and the sanity floors
a spec's stated rates are checked against (`rates_below_floor`, asked by `dstoolkit.spec.cluster.ClusterSpec`).
No torch import. `dstoolkit.hardware.table` re-exports GpuSpec.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from dstoolkit.common.model import StrictModel


class GpuSpec(StrictModel):
    """One accelerator's facts (explicit form of `cluster.gpu`, or a row of the hardware table)."""

    model_config = ConfigDict(**StrictModel.model_config, allow_inf_nan=False)
    """Every float fact is finite: pydantic refuses nan and +/-inf for each float field, naming it ("Input should be
    a finite number"). Before, gt=0 refused nan but let .inf through (`MFU 0.0% of inf TFLOP/s`)."""

    name: str = "custom"
    """Display name."""
    memory_bytes: int = Field(gt=0)
    """Device memory per GPU in bytes."""
    peak_bf16_flops: float = Field(gt=0)
    """Dense (no sparsity) bf16 peak FLOP/s per GPU."""
    peak_fp8_flops: Optional[float] = Field(default=None, gt=0)
    """Dense fp8 peak FLOP/s per GPU; None when the GPU has no fp8 tensor cores."""
    intra_node_bw_bytes_per_s: float = Field(gt=0)
    """Achievable all-reduce bus bandwidth inside a node (nccl-tests busbw), bytes/s."""
    inter_node_bw_bytes_per_s: float = Field(gt=0)
    """Achievable bus bandwidth of one compute NIC across nodes (one NIC per GPU on DGX/HGX systems, so per GPU
    there), bytes/s."""
    nics_per_node: Optional[int] = Field(default=None, ge=1)
    """Compute (east-west) NICs per node, each at inter_node_bw_bytes_per_s. NCCL opens rings/channels over every
    NIC near the group's GPUs, so a group with r ranks on a node can use up to r of them
    (estimate.collective_time.group_inter_node_busbw). None: one per GPU of the node."""
    nics_per_group: Optional[int] = Field(default=None, ge=1)
    """The most NICs one collective group's rings cross nodes over, where the cluster's NCCL does not spread a group
    over a NIC per rank: 1 where its log routes every ring of a group through one device per direction (measured on
    Jean Zay's A100 partition, benchmarks/data/clusters.yaml). None: no cap (a ring per NIC, as on DGX / HGX)."""
    compute_capability: Optional[str] = None
    """CUDA compute capability such as "9.0" (gates FP8 recipes); None for non-NVIDIA or CPU."""
    hbm_bw_bytes_per_s: Optional[float] = Field(default=None, gt=0)
    """Device-memory bandwidth (datasheet), bytes/s: the rate of the memory-bound parts of a step (optimizer
    update, gradient handling, elementwise kernels). None: the step-time model's H100 default."""
    gemm_fraction: Optional[float] = Field(default=None, gt=0, le=1)
    """Fraction of the dense bf16 peak a large bf16 GEMM sustains (measured maximum achievable matmul FLOP/s);
    None: the step-time model's default (estimate.gemm.DEFAULT_GEMM_FRACTION)."""
    nvlink_domain_gpus: Optional[int] = Field(default=None, ge=1)
    """The most GPUs one NVLink fabric joins beyond a host (72 for an NVL72 rack of 4-GPU hosts); a job's own
    domain is `cluster.nvlink_domain_gpus`, up to this. None: NVLink (or the node's fabric) ends at the host."""
    gpus_per_host: Optional[int] = Field(default=None, ge=1)
    """The most GPUs one host (node) of this kind holds: the bound on a cluster's gpus_per_node
    (`check_gpus_per_host`), since intra_node_bw_bytes_per_s is the rate inside one such host. More GPUs are more
    nodes; NVLink beyond a host is nvlink_domain_gpus. None: no bound (explicit facts, CPU ranks)."""

    @field_validator("peak_fp8_flops")
    @classmethod
    def _fp8_not_below_bf16(cls, fp8: Optional[float], info: ValidationInfo) -> Optional[float]:
        """No part's dense fp8 tensor peak is below its bf16 one (GPU_TABLE: 2x on every row with fp8 units, the
        cpu row's emulation 1x); a lower figure is a typo, and the step-time model caps fp8's GEMM speed-up at
        their ratio (estimate.gemm.precision_factor)."""
        bf16 = info.data.get("peak_bf16_flops")
        if fp8 is not None and bf16 is not None and fp8 < bf16:
            raise ValueError(
                f"peak_fp8_flops={fp8:g} FLOP/s is below peak_bf16_flops={bf16:g} FLOP/s, and no GPU's dense fp8 "
                f"peak is below its bf16 one (H100-SXM: 1979e12 vs 989e12); state the dense fp8 peak, or leave "
                f"peak_fp8_flops out for a GPU without fp8 tensor cores")
        return fp8


MIN_PEAK_FLOPS = 1e6
"""Sanity floor, not a measurement: a stated peak (peak_bf16_flops, peak_fp8_flops) below 1 MFLOP/s is refused. The
slowest rank these fields legitimately describe is a CPU without native bf16, ~1 GFLOP/s (hardware.calibration:
CPU rates differ up to 60x between machines, and the reference machine's bf16 block rate is 63.6 GFLOP/s; the
lowest measured here is 16.5 GFLOP/s, benchmarks/results/multinode_throttle_cpu_202611_run1.json), 1000x above it.
What it catches: a figure in the wrong unit (989 meaning TFLOP/s) and values like 1e-300, whose step time
overflowed to nan."""
MIN_BANDWIDTH_BYTES_PER_S = 1e6
"""Sanity floor, not a measurement: a stated bandwidth (intra_node_bw_bytes_per_s, inter_node_bw_bytes_per_s,
hbm_bw_bytes_per_s) below 1 MB/s is refused. The slowest measured here is gloo's all-reduce busbw between CPU ranks,
0.69 GB/s (benchmarks/results/multinode_throttle_cpu_202611_run1.json), ~700x above it; a 1 Gb/s Ethernet link
is ~0.1 GB/s. It catches GB/s written as bytes/s (450 for 450 GB/s) and values like 1e-300."""
RATE_FLOORS: dict[str, tuple[float, str, str]] = {
    "peak_bf16_flops": (MIN_PEAK_FLOPS, "FLOP/s", "989e12 for 989 TFLOP/s"),
    "peak_fp8_flops": (MIN_PEAK_FLOPS, "FLOP/s", "1979e12 for 1979 TFLOP/s"),
    "intra_node_bw_bytes_per_s": (MIN_BANDWIDTH_BYTES_PER_S, "bytes/s", "365e9 for 365 GB/s"),
    "inter_node_bw_bytes_per_s": (MIN_BANDWIDTH_BYTES_PER_S, "bytes/s", "50e9 for 50 GB/s"),
    "hbm_bw_bytes_per_s": (MIN_BANDWIDTH_BYTES_PER_S, "bytes/s", "3.35e12 for 3.35 TB/s"),
}
"""Each rate field of GpuSpec: its sanity floor, its unit and an example of the unit (H100-SXM's row)."""


@dataclass(frozen=True)
class RateBelowFloor:
    """One stated rate below its sanity floor (RATE_FLOORS)."""

    field: str
    value: float
    floor: float
    unit: str
    example: str

    @property
    def problem(self) -> str:
        return (f"{self.field}={self.value:g} {self.unit} is below {self.floor:g} {self.unit}, the sanity floor for "
                f"this rate (no accelerator or CPU rank is that slow)")

    @property
    def fix(self) -> str:
        return f"{self.field} is in {self.unit} per GPU, not a larger unit: write e.g. {self.example}"


def rates_below_floor(gpu: GpuSpec) -> list[RateBelowFloor]:
    """The rates of `gpu` below their sanity floors (RATE_FLOORS), in field order; empty when all are plausible.
    Asked of facts a user states (spec.cluster.ClusterSpec), not by GpuSpec itself: code builds GpuSpecs whose
    rates are placeholders (runtime.fp8.te_backend: 1.0, only compute_capability matters there)."""
    low = []
    for field, (floor, unit, example) in RATE_FLOORS.items():
        value = getattr(gpu, field)
        if value is not None and value < floor:
            low.append(RateBelowFloor(field, value, floor, unit, example))
    return low
