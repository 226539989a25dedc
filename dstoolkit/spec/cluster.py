"""The cluster section of a spec: nodes, GPUs per host, the accelerator, the NVLink domain, host memory and the
memory headroom a pick leaves. No torch import. Part of `dstoolkit.spec.model.Spec`."""
from __future__ import annotations

from typing import Optional, Union

from pydantic import Field, field_validator, model_validator

from dstoolkit.hardware.gpu_spec import rates_below_floor
from dstoolkit.hardware.hosts import GpusPerHostError, check_gpus_per_host
from dstoolkit.hardware.table import GpuSpec, get_gpu, gpu_name_error, lookup_gpu_name
from dstoolkit.spec.errors import SpecFieldError
from dstoolkit.spec.whole_numbers import WholeNumberFields


class ClusterSpec(WholeNumberFields):
    """Where the job runs (its int fields are whole numbers: `whole_numbers`)."""

    nodes: int = Field(default=1, ge=1)
    """Number of nodes."""
    gpus_per_node: int = Field(default=8, ge=1)
    """Ranks (GPUs, or CPU processes for gpu: cpu) per node."""
    gpu: Union[str, GpuSpec] = "H100-SXM"
    """A name from the hardware table (`dstoolkit.hardware.table.GPU_TABLE`: H100-SXM, B200, GB200, ..., cpu) or
    explicit facts."""
    cuda_version: Optional[str] = None
    """CUDA toolkit version on the cluster, such as "12.9"; gates FP8 recipes (block scaling needs 12.9+). None skips that check."""
    calibration: Optional[str] = None
    """Measured rates for step-time estimates: a path (relative to this spec file) to a calibration JSON written
    by benchmarks/step_time_fidelity.py, or "none" for the hardware table's nominal rates. Unset: the packaged
    reference measurement for gpu: cpu, nominal rates for GPUs (dstoolkit.hardware.calibration)."""
    host_memory_per_node_gib: Optional[float] = Field(default=None, gt=0)
    """Host RAM of one node in GiB, which offloaded states (and pinned buffers) of all its ranks share; a layout
    whose host memory per node exceeds it does not fit. None: `dstoolkit.spec.cluster_fields.host_memory_per_node_bytes`
    (2 TB for a GPU node, an NVIDIA DGX H100/H200's system memory; the ranks' memory for gpu: cpu)."""
    memory_headroom_fraction: Optional[float] = Field(default=None, ge=0, lt=1)
    """Share of device memory a pick should leave free beyond its estimated peak (allocator fragmentation, spikes);
    the ranking prefers layouts within it. None: `dstoolkit.spec.cluster_fields.DEFAULT_MEMORY_HEADROOM_FRACTION`."""
    nvlink_domain_gpus: Optional[int] = Field(default=None, ge=1)
    """GPUs of the NVLink partition the job runs in when NVLink joins several hosts (GB200 / GB300 NVL72: up to 72,
    hosts of 4): whole hosts, at most the GPU's `nvlink_domain_gpus`. Estimates, sweeps and layout rules treat the
    domain as one node (TP, EP and rings inside it at NVLink rates); launch files keep gpus_per_node per host.
    None: NVLink ends at the host (`nvlink_domain`)."""

    @model_validator(mode="after")
    def _check_gpus_per_host(self) -> "ClusterSpec":
        # one host's GPUs share its NVLink (intra_node_bw_bytes_per_s): more per node would be priced as one host
        try:
            check_gpus_per_host(self.gpus_per_node, self.gpu_spec)
        except GpusPerHostError as exc:
            most, world = self.gpu_spec.gpus_per_host, self.world_size
            same = (f"set nodes: {world // most}, gpus_per_node: {most} (the same {world} GPUs), or "
                    if world % most == 0 else "")
            raise SpecFieldError(("gpus_per_node",), f"gpus_per_node={self.gpus_per_node}: {exc.problem}",
                                 f"{same}{exc.fix}") from None
        return self

    @model_validator(mode="after")
    def _check_nvlink_domain(self) -> "ClusterSpec":
        checked_nvlink_domain(self.nvlink_domain_gpus, self.gpus_per_node, self.gpu_spec)
        return self

    def describe(self, gpu_name: str) -> str:
        """'4 x 8 H100-SXM', with the NVLink domain where it spans hosts: '16 x 4 GB200 (NVLink domains of 64)'."""
        text = f"{self.nodes} x {self.gpus_per_node} {gpu_name}"
        return text + (f" (NVLink domains of {self.nvlink_domain_gpus})" if self.nvlink_domain_gpus else "")

    @property
    def nvlink_domain(self) -> int:
        """GPUs that share one NVLink fabric, the network model's node: nvlink_domain_gpus, else gpus_per_node."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @field_validator("gpu")
    @classmethod
    def _check_gpu_known(cls, value: Union[str, GpuSpec]) -> Union[str, GpuSpec]:
        if isinstance(value, str):
            if lookup_gpu_name(value) is None:
                message = gpu_name_error(value)
                problem, _, fix = message.partition(" (")
                raise SpecFieldError((), problem, fix.rstrip(")"))
        elif low := rates_below_floor(value):  # explicit facts: each stated rate above its sanity floor
            also = "".join(f"; {r.field}={r.value:g} {r.unit} is below its floor too" for r in low[1:])
            raise SpecFieldError((low[0].field,), low[0].problem + also, low[0].fix, code="SP003")
        return value

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_spec(self) -> GpuSpec:
        """The `GpuSpec` for `gpu` (a table row for a name, or the explicit facts)."""
        return get_gpu(self.gpu)


def checked_nvlink_domain(domain: Optional[int], gpus_per_node: int, gpu: GpuSpec) -> int:
    """The NVLink domain a cluster states, checked: whole hosts, at most the GPU's (`GpuSpec.nvlink_domain_gpus`;
    none: NVLink ends at the host). None gives the host. The one statement of the rule (ClusterSpec and the
    `estimate --nvlink-domain-gpus` flag).

    Raises:
        SpecFieldError: at nvlink_domain_gpus, with the problem and the fix."""
    if domain is None:
        return gpus_per_node
    if domain % gpus_per_node:
        raise SpecFieldError(("nvlink_domain_gpus",), f"nvlink_domain_gpus={domain} is not whole hosts of "
                             f"gpus_per_node={gpus_per_node}",
                             f"use a multiple of {gpus_per_node} (an NVLink partition holds whole hosts)")
    most = gpu.nvlink_domain_gpus or gpus_per_node
    if domain > most:
        where = (f"{gpu.name}'s NVLink domain is at most {most} GPUs" if gpu.nvlink_domain_gpus else
                 f"{gpu.name} has NVLink only inside its host (the hardware table gives it no nvlink_domain_gpus)")
        raise SpecFieldError(("nvlink_domain_gpus",), f"nvlink_domain_gpus={domain}: {where}",
                             f"use at most {most}, or give the GPU's facts with nvlink_domain_gpus")
    return domain
