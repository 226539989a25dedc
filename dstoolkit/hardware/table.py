"""Hardware table: one `GpuSpec` per accelerator the spec can name (`cluster.gpu: H100-SXM`).

No torch import. Figures are vendor datasheet numbers (dense math, no structured sparsity) and published
nccl-tests bus bandwidths; each row cites its sources. Memory is the capacity the vendor markets, read as
GiB of physical HBM where the part has that many GiB (A100, H100, H200, B200, GB200, MI300X: CUDA reports slightly
less usable, within the estimator's own runtime reserve), else what nvidia-smi reports as memory.total (B300 and GB300
market 288 GB and show 268.6 / 277.5 GiB; L40S loses 1/16 of its 48 GiB to ECC).

Bandwidth fields are *achievable bus bandwidth* (nccl-tests busbw, see docs/anchors.md), not link
line rates: the step-time model divides collective bytes by them directly.
"""
from __future__ import annotations

import re
from typing import Union

from dstoolkit.common.text import did_you_mean
from dstoolkit.hardware.gpu_spec import GpuSpec


GiB = 2**30
"""Bytes per GiB."""
TFLOPS = 1e12
"""FLOP/s per TFLOP/s."""
GBps = 1e9
"""Bytes/s per GB/s (decimal, as nccl-tests prints)."""
TBps = 1e12
"""Bytes/s per TB/s (decimal, as datasheets print HBM bandwidth)."""

IB_400G_BUSBW_BYTES_PER_S = 50 * GBps
"""One 400 Gb/s InfiniBand NIC per GPU: ~50 GB/s busbw (docs/anchors.md, Collective bandwidth table; DeepSeek-V3
paper §3.1 quotes 50 GB/s IB per H800 GPU)."""
IB_200G_BUSBW_BYTES_PER_S = 24 * GBps
"""One 200 Gb/s HDR InfiniBand NIC per GPU (DGX A100): 25 GB/s line rate, ~24 GB/s achievable busbw."""

HOPPER_GEMM_FRACTION = 0.80
"""Large bf16 GEMM on Hopper: 788 of 989 TFLOP/s measured on one H200 (8192^3, docs/anchors.md); S. Bekman's
Maximum Achievable Matmul FLOPS table (stas00/ml-engineering@b9e2972 compute/accelerator/README.md, "Maximum
Achievable Matmul FLOPS comparison table", BF16, v2 with cache reset) has H100 SXM 794.5 of 989 = 80.3%
(best shape 2048x2048x13312, torch 2.7.0+cu126). Re-read in this session."""
AMPERE_GEMM_FRACTION = 0.87
"""Large bf16 GEMM on A100 SXM: 271.2 of 312 TFLOP/s = 86.9% (same table and commit as HOPPER_GEMM_FRACTION,
best shape 1024x10240x5120, torch 2.6.0+cu126; the older v1 table gave 267.9 = 85.9%). Re-read in this session."""
BLACKWELL_REFERENCE = "stas00/ml-engineering@744d01e compute/accelerator/README.md"
"""Where the Blackwell rows' figures were read (this session): its "TFLOPS comparison table" (dense, per GPU,
citing the NVIDIA DGX B200 / DGX B300 datasheets and the GB200 / GB300 NVL72 specification pages), its memory
table, and its "Maximum Achievable Matmul FLOPS comparison table" (BF16, mean of 100 iterations at the best shape
of a brute-force search)."""
B200_GEMM_FRACTION = 0.776
"""Large bf16 GEMM on B200 SXM: 1745.0 of 2250 TFLOP/s = 77.6% (BLACKWELL_REFERENCE, best shape 1792x16128x3072,
torch 2.7.1+cu128)."""
B300_GEMM_FRACTION = 0.786
"""Large bf16 GEMM on B300 SXM: 1769.0 of 2250 TFLOP/s = 78.6% (BLACKWELL_REFERENCE, best shape
12288x18432x1024, torch 2.9.1+cu130). No GB300 figure is published; its row takes this one, measured on the
same B300 chip (in the HGX board at 1100 W; GB300 runs it at up to 1400 W against the same 2500 TFLOP/s dense bf16
the GB200 row states, so neither measured fraction is exactly its own). With GB200's 0.729 instead, the two GB300
rows of benchmarks/data/published_runs.yaml are predicted 9.8% and 18.7% slow; with this one, see
benchmarks/results/published_runs_*.md."""
GB200_GEMM_FRACTION = 0.729
"""Large bf16 GEMM on GB200's B200: 1822.0 of 2500 TFLOP/s = 72.9% (BLACKWELL_REFERENCE, best shape
4096x9728x2048, torch 2.10.0.dev20250916+cu130)."""
NVLINK5_BUSBW_BYTES_PER_S = 838 * GBps
"""All-reduce busbw on one 8x B200 node (NVLink 5 / NVSwitch): 838.0 GB/s at 8 GiB with NCCL 2.27.7, which picks
NVLink SHARP (NVLS) at 8 GPUs (682.2 GB/s with it off); stas00/ml-engineering@744d01e network/README.md, the
8x B200 p6-b200.48xlarge sweep measured 2026-08-09. B300 nodes have the same NVLink 5 switch generation: no
separate measurement, this figure."""
NVL72_BUSBW_BYTES_PER_S = 850 * GBps
"""All-reduce busbw across a GB200 NVL72 NVLink domain with NVLink SHARP: 850 GB/s (680 without; NVIDIA's slide
quoted in stas00/ml-engineering@744d01e network/README.md, "a 25% improvement (850/680)")."""
IB_800G_BUSBW_BYTES_PER_S = 100 * GBps
"""One 800 Gb/s ConnectX-8 NIC per GPU (DGX B300, GB300 NVL72): "100GBps per accelerator, or 800GBps per node, for
inter-node (8x ConnectX-8, as on DGX B300 XDR)" (stas00/ml-engineering@744d01e network/README.md), the line rate as
IB_400G_BUSBW_BYTES_PER_S takes it."""
MI300X_GEMM_FRACTION = 0.60
"""Large bf16 GEMM on MI300X: ~780 of 1307 TFLOP/s (AMD ROCm blog "Measuring Max-Achievable FLOPs", part 2)."""

CPU_MEMORY_PER_RANK_BYTES = 8 * GiB
"""This kind of machine has 24 GiB RAM shared by 2 ranks, the OS and other processes: budget 8 GiB per rank."""
CPU_REFERENCE_FLOPS = 104.8e9
"""Per-rank "peak" of the reference CPU machine: the fastest rate its calibration probe measured (fp32
transformer-block forward+backward, 2 ranks on 2 cores: 104.8 GFLOP/s; bf16 reaches 63.6; dstoolkit/data/
calibration_cpu_reference.json, from benchmarks/results/calibration_cpu_202611.json). Not a datasheet peak: the
MFU of a CPU run is relative to what this probe achieves. Step times on CPU use the calibration itself
(dstoolkit.hardware.calibration), which replaces this row's rates."""
CPU_REFERENCE_BW_BYTES_PER_S = 1.75 * GBps
"""All-reduce busbw between 2 ranks on the reference machine, as the calibration probe measures it (1.748 GB/s;
same calibration file)."""

GPU_TABLE: dict[str, GpuSpec] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 989 TFLOP/s bf16 and 1979 fp8 dense
    # (the datasheet's 1979/3958 are with sparsity). NVLink4 ring all-reduce busbw ~365-370 GB/s (nccl-tests,
    # docs/anchors.md). One 400 Gb/s NIC per GPU (DGX H100).
    "H100-SXM": GpuSpec(
        name="H100-SXM",
        memory_bytes=80 * GiB,
        peak_bf16_flops=989 * TFLOPS,
        peak_fp8_flops=1979 * TFLOPS,
        intra_node_bw_bytes_per_s=365 * GBps,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability="9.0",
        hbm_bw_bytes_per_s=3.35 * TBps,
        gemm_fraction=HOPPER_GEMM_FRACTION,
        nics_per_node=8,  # DGX H100 user guide: 8x ConnectX-7 400 Gb/s compute NICs (one per GPU) plus storage NICs
        gpus_per_host=8,  # DGX H100 / HGX H100: at most 8 SXM5 GPUs on one NVSwitch baseboard (HGX also comes as 4)
    ),
    # NVIDIA H200 Tensor Core GPU product brief: 141 GB HBM3e, same Hopper compute as H100 SXM (989 bf16,
    # 1979 fp8 dense). All-reduce busbw ~475 GB/s (docs/anchors.md). One 400 Gb/s NIC per GPU (HGX H200).
    "H200": GpuSpec(
        name="H200",
        memory_bytes=141 * GiB,
        peak_bf16_flops=989 * TFLOPS,
        peak_fp8_flops=1979 * TFLOPS,
        intra_node_bw_bytes_per_s=475 * GBps,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability="9.0",
        hbm_bw_bytes_per_s=4.8 * TBps,
        gemm_fraction=HOPPER_GEMM_FRACTION,
        nics_per_node=8,  # HGX H200 reference systems: one 400 Gb/s compute NIC per GPU, 8 per node
        gpus_per_host=8,  # HGX H200: 4- and 8-GPU boards
    ),
    # H800 (China export SKU of H100 SXM): compute as H100 (docs/anchors.md), NVLink cut to 400 GB/s
    # bidirectional; all-reduce busbw ~215 GB/s (docs/anchors.md). DeepSeek-V3 paper §3.1: 8 GPUs per node,
    # IB 50 GB/s per GPU across nodes.
    "H800": GpuSpec(
        name="H800",
        memory_bytes=80 * GiB,
        peak_bf16_flops=989 * TFLOPS,
        peak_fp8_flops=1979 * TFLOPS,
        intra_node_bw_bytes_per_s=215 * GBps,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability="9.0",
        hbm_bw_bytes_per_s=3.35 * TBps,
        gemm_fraction=HOPPER_GEMM_FRACTION,
        nics_per_node=8,  # DeepSeek-V3 report §3.1: 8 GPUs per node, one 400 Gb/s InfiniBand NIC (50 GB/s) per GPU
        gpus_per_host=8,  # DeepSeek-V3 report §3.1: 8 GPUs per node
    ),
    # NVIDIA B200 (DGX / HGX B200, 1000 W): 180 GB HBM3e (the platform figure), 8.0 TB/s, 2250 TFLOP/s bf16 and
    # 4500 fp8 dense (BLACKWELL_REFERENCE, notes 20: DGX B200 datasheet). 148 SMs, compute capability 10.0.
    # 8x ConnectX-7 400 Gb/s compute NICs, one per GPU (DGX B200 datasheet; AWS P6-B200: 8x 400 Gb/s EFA).
    "B200": GpuSpec(
        name="B200",
        memory_bytes=180 * GiB,
        peak_bf16_flops=2250 * TFLOPS,
        peak_fp8_flops=4500 * TFLOPS,
        intra_node_bw_bytes_per_s=NVLINK5_BUSBW_BYTES_PER_S,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability="10.0",
        hbm_bw_bytes_per_s=8.0 * TBps,
        gemm_fraction=B200_GEMM_FRACTION,
        nics_per_node=8,
        gpus_per_host=8,  # DGX / HGX B200: 8 GPUs on one NVSwitch baseboard
    ),
    # NVIDIA B300 (DGX / HGX B300, Blackwell Ultra): 288 GB HBM3e, 8.0 TB/s, 2250 TFLOP/s bf16 and 4500 fp8 dense
    # (BLACKWELL_REFERENCE, note 21: DGX B300 datasheet; its gain over B200 is in fp4). Compute capability 10.3.
    # 8x ConnectX-8 800 Gb/s compute NICs, one per GPU (IB_800G_BUSBW_BYTES_PER_S).
    # Memory: nvidia-smi memory.total 275040 MiB (268.6 GiB; the datasheet's 288 GB is decimal). Read as 288 GiB
    # (until session 35) the table gave a rank 19.4 GiB that is not there.
    "B300": GpuSpec(
        name="B300",
        memory_bytes=275040 * 2**20,
        peak_bf16_flops=2250 * TFLOPS,
        peak_fp8_flops=4500 * TFLOPS,
        intra_node_bw_bytes_per_s=NVLINK5_BUSBW_BYTES_PER_S,
        inter_node_bw_bytes_per_s=IB_800G_BUSBW_BYTES_PER_S,
        compute_capability="10.3",
        hbm_bw_bytes_per_s=8.0 * TBps,
        gemm_fraction=B300_GEMM_FRACTION,
        nics_per_node=8,
        gpus_per_host=8,  # DGX / HGX B300: 8 GPUs (NVIDIA counts its 16 dies as "NVL16"; CUDA sees 8 devices)
    ),
    # NVIDIA GB200 NVL72, per B200 GPU (1200 W): 186 GB HBM3e, 8.0 TB/s, 2500 TFLOP/s bf16 and 5000 fp8 dense
    # (BLACKWELL_REFERENCE, note 23: GB200 NVL72 specifications). 72 GPUs on 18 hosts of 4 share one NVLink
    # domain: a spec states gpus_per_node 4 (what a host launches) and cluster.nvlink_domain_gpus (the NVLink
    # partition the job runs in, up to 72), which the network model treats as one node. One 400 Gb/s ConnectX-7
    # per GPU (DGX GB200 user guide, networking: four per 4-GPU compute tray): nics_per_node is left to one per GPU.
    "GB200": GpuSpec(
        name="GB200",
        memory_bytes=186 * GiB,
        peak_bf16_flops=2500 * TFLOPS,
        peak_fp8_flops=5000 * TFLOPS,
        intra_node_bw_bytes_per_s=NVL72_BUSBW_BYTES_PER_S,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability="10.0",
        hbm_bw_bytes_per_s=8.0 * TBps,
        gemm_fraction=GB200_GEMM_FRACTION,
        nvlink_domain_gpus=72,
        gpus_per_host=4,  # a GB200 NVL72 compute tray (the host) holds 2 Grace CPUs and 4 GPUs; NVLink beyond it:
        # nvlink_domain_gpus
    ),
    # NVIDIA GB300 NVL72, per B300 GPU: 288 GB HBM3e, 8.0 TB/s, 2500 TFLOP/s bf16 and 5000 fp8 dense
    # (BLACKWELL_REFERENCE, note 24: GB300 NVL72 specifications, "the same but faster fp4 and more memory").
    # NVLink domain and hosts as GB200; one 800 Gb/s ConnectX-8 per GPU.
    # Memory: nvidia-smi memory.total 284208 MiB (277.5 GiB) on a GB300 NVL72 tray GPU, not 288 GiB.
    "GB300": GpuSpec(
        name="GB300",
        memory_bytes=284208 * 2**20,
        peak_bf16_flops=2500 * TFLOPS,
        peak_fp8_flops=5000 * TFLOPS,
        intra_node_bw_bytes_per_s=NVL72_BUSBW_BYTES_PER_S,
        inter_node_bw_bytes_per_s=IB_800G_BUSBW_BYTES_PER_S,
        compute_capability="10.3",
        hbm_bw_bytes_per_s=8.0 * TBps,
        gemm_fraction=B300_GEMM_FRACTION,
        nvlink_domain_gpus=72,
        gpus_per_host=4,  # as GB200: a compute tray holds 4 GPUs
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 312 TFLOP/s bf16 dense, no fp8 tensor cores.
    # NVLink3 600 GB/s bidirectional; nccl-tests all-reduce busbw on DGX A100 ~230 GB/s.
    # One 200 Gb/s HDR NIC per GPU (DGX A100).
    "A100-80G": GpuSpec(
        name="A100-80G",
        memory_bytes=80 * GiB,
        peak_bf16_flops=312 * TFLOPS,
        peak_fp8_flops=None,
        intra_node_bw_bytes_per_s=230 * GBps,
        inter_node_bw_bytes_per_s=IB_200G_BUSBW_BYTES_PER_S,
        compute_capability="8.0",
        hbm_bw_bytes_per_s=2.039 * TBps,
        gemm_fraction=AMPERE_GEMM_FRACTION,
        nics_per_node=8,  # DGX A100 user guide: 8x ConnectX-6 200 Gb/s HDR compute NICs (one per GPU)
        gpus_per_host=16,  # HGX A100 came as 4-, 8- and 16-GPU boards (two 8-GPU baseboards joined by NVSwitch);
        # DGX A100 has 8
    ),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB): as A100-80G with 40 GB HBM2.
    "A100-40G": GpuSpec(
        name="A100-40G",
        memory_bytes=40 * GiB,
        peak_bf16_flops=312 * TFLOPS,
        peak_fp8_flops=None,
        intra_node_bw_bytes_per_s=230 * GBps,
        inter_node_bw_bytes_per_s=IB_200G_BUSBW_BYTES_PER_S,
        compute_capability="8.0",
        hbm_bw_bytes_per_s=1.555 * TBps,
        gemm_fraction=AMPERE_GEMM_FRACTION,
        nics_per_node=8,  # DGX A100 user guide: 8x ConnectX-6 200 Gb/s HDR compute NICs (one per GPU)
        gpus_per_host=16,  # as A100-80G
    ),
    # NVIDIA L40S datasheet: 48 GB GDDR6, 362.05 TFLOP/s bf16 and 733 fp8 dense (733 / 1466 with sparsity).
    # No NVLink: PCIe Gen4 x16 (64 GB/s bidirectional, ~25 GB/s achievable all-reduce busbw through the host).
    # Typical L40S servers have 200 Gb/s networking per GPU pair; use the 200 Gb/s figure.
    # Memory: 48 GiB of GDDR6 of which ECC (on by default in data-centre L40S) holds 1/16: nvidia-smi memory.total
    # 46068 MiB with ECC on (45.0 GiB), the capacity a rank gets.
    "L40S": GpuSpec(
        name="L40S",
        memory_bytes=46068 * 2**20,
        peak_bf16_flops=362.05 * TFLOPS,
        peak_fp8_flops=733 * TFLOPS,
        intra_node_bw_bytes_per_s=25 * GBps,
        inter_node_bw_bytes_per_s=IB_200G_BUSBW_BYTES_PER_S,
        compute_capability="8.9",
        hbm_bw_bytes_per_s=0.864 * TBps,
        # gpus_per_host unset: PCIe cards, the chassis decides (8, up to 10 in the 5U PCIe servers of
        # servethehome.com's L40S review); no NVLink, so a larger "host" prices nothing the network would not (25 vs
        # 24 GB/s above)
    ),
    # AMD Instinct MI300X datasheet: 192 GB HBM3, 1307.4 TFLOP/s bf16 and 2614.9 fp8 dense.
    # Infinity Fabric 7 links x 128 GB/s = 896 GB/s aggregate per GPU; RCCL all-reduce busbw on 8x MI300X
    # is published at ~300 GB/s for large messages (AMD ROCm blogs). 400 Gb/s NIC per GPU.
    "MI300X": GpuSpec(
        name="MI300X",
        memory_bytes=192 * GiB,
        peak_bf16_flops=1307.4 * TFLOPS,
        peak_fp8_flops=2614.9 * TFLOPS,
        intra_node_bw_bytes_per_s=300 * GBps,
        inter_node_bw_bytes_per_s=IB_400G_BUSBW_BYTES_PER_S,
        compute_capability=None,
        hbm_bw_bytes_per_s=5.3 * TBps,
        gemm_fraction=MI300X_GEMM_FRACTION,
        nics_per_node=8,  # one 400 Gb/s NIC per GPU, 8 per node (above)
        gpus_per_host=8,  # AMD Instinct MI300X platform: 8 OAM GPUs on one Infinity Fabric baseboard
    ),
    # This kind of machine (2 CPU cores, 24 GiB RAM, gloo over shared memory). Memory is a conservative
    # per-rank share of host RAM; flops and bandwidth are the reference machine's measured rates (above), and
    # estimates for gpu: cpu use its full calibration unless the spec names another (cluster.calibration).
    # fp8 is emulated on CPU (dequantize + matmul), so its "peak" is the same rate (no speed-up).
    "cpu": GpuSpec(
        name="cpu",
        memory_bytes=CPU_MEMORY_PER_RANK_BYTES,
        peak_bf16_flops=CPU_REFERENCE_FLOPS,
        peak_fp8_flops=CPU_REFERENCE_FLOPS,
        intra_node_bw_bytes_per_s=CPU_REFERENCE_BW_BYTES_PER_S,
        inter_node_bw_bytes_per_s=CPU_REFERENCE_BW_BYTES_PER_S,
        compute_capability=None,
        # gpus_per_host unset: CPU ranks are processes, as many per node as the spec says
    ),
}


def _normalize(name: str) -> str:
    """Case- and punctuation-insensitive key: 'h100_sxm', 'H100 SXM' and 'H100-SXM' all match."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_NORMALIZED = {_normalize(k): k for k in GPU_TABLE}


def known_gpu_names() -> list[str]:
    """The table's names, in table order."""
    return list(GPU_TABLE)


def _suggestions(name: str) -> list[str]:
    """The table names an unknown `name` most likely meant: those that start with what was typed ('H100' ->
    H100-SXM, 'A100' -> A100-80G and A100-40G), else the closest spelling (`did_you_mean`), else none."""
    typed = _normalize(name)
    started = [key for norm, key in _BY_NORMALIZED.items() if typed and norm.startswith(typed)]
    if started:
        return started
    close = did_you_mean(typed, _BY_NORMALIZED, cutoff=0.5)
    return [_BY_NORMALIZED[close]] if close else []


def gpu_name_error(name: str) -> str:
    """The message for an unknown GPU name: known names plus a did-you-mean (`_suggestions`)."""
    close = _suggestions(name)
    hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
    return (
        f"unknown GPU {name!r} ({hint}known: {', '.join(GPU_TABLE)}; or give explicit facts: memory_bytes, "
        "peak_bf16_flops, peak_fp8_flops, intra_node_bw_bytes_per_s, inter_node_bw_bytes_per_s)"
    )


def lookup_gpu_name(name: str) -> str | None:
    """The table key a name refers to (case/punctuation-insensitive), or None."""
    return _BY_NORMALIZED.get(_normalize(name))


def get_gpu(name_or_spec: Union[str, GpuSpec]) -> GpuSpec:
    """Return the `GpuSpec` for a table name, or the spec itself.

    Args:
        name_or_spec: A table name (case-insensitive: "h100-sxm", "H200", "cpu") or an explicit `GpuSpec`.

    Returns:
        A copy of the table row (safe to modify), or the given spec itself.

    Raises:
        ValueError: Unknown name; the message lists the known names and a did-you-mean.
    """
    if isinstance(name_or_spec, GpuSpec):
        return name_or_spec
    if not isinstance(name_or_spec, str):
        raise ValueError(f"gpu must be a name or a GpuSpec, got {type(name_or_spec).__name__}")
    key = lookup_gpu_name(name_or_spec)
    if key is None:
        raise ValueError(gpu_name_error(name_or_spec))
    return GPU_TABLE[key].model_copy()
