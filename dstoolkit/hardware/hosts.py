"""The bound on a node's GPUs from the hardware table (split from dstoolkit.hardware.table): one host of a GPU holds at
most `GpuSpec.gpus_per_host`; the spec's cluster and estimate's --gpus-per-node ask `check_gpus_per_host`, each naming
its own field. No torch import.
"""
from __future__ import annotations

from dstoolkit.hardware.table import GpuSpec


class GpusPerHostError(ValueError):
    """More GPUs per node than one host of the GPU holds (`check_gpus_per_host`): `problem` and `fix` name no field,
    so each caller puts its own in front (the spec's cluster.gpus_per_node, estimate's --gpus-per-node)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem} ({fix})")
        self.problem = problem
        self.fix = fix


def check_gpus_per_host(gpus_per_node: int, gpu: GpuSpec) -> None:
    """Refuse a node of more GPUs than one host of `gpu` holds (`GpuSpec.gpus_per_host`): the network model prices
    everything inside a node at the host's rate (intra_node_bw_bytes_per_s), so 64 "H100-SXM per node" would be
    priced as one NVLink host of 64. The one statement of the bound, for every reader of a cluster's GPUs per node.

    Raises:
        GpusPerHostError: gpus_per_node > gpu.gpus_per_host."""
    most = gpu.gpus_per_host
    if most is None or gpus_per_node <= most:
        return
    beyond = (f"; NVLink across hosts is nvlink_domain_gpus (up to {gpu.nvlink_domain_gpus})"
              if gpu.nvlink_domain_gpus else "")
    raise GpusPerHostError(f"one {gpu.name} host holds at most {most} GPUs (the hardware table's gpus_per_host), "
                           f"not {gpus_per_node}",
                           f"use at most {most} GPUs per node: more GPUs are more nodes{beyond}; or give the GPU's "
                           "facts with gpus_per_host")
