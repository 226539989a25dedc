"""What the sweep returns: the ranked layouts that fit (`Ranked`), the dropped ones with the reason (`Dropped`),
the advice when none fits (`FitsNowhere`), and the whole `SweepResult`. No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import GiB, CandidateEstimate, allowance_text, usable_device_bytes
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.spec import Spec


@dataclass(frozen=True)
class Ranked:
    """A candidate that fits, with its estimate and why it sits where it does."""

    candidate: Candidate
    estimate: CandidateEstimate
    reason: str = ""
    findings: tuple = ()
    """validate_config findings (warnings/info) on its DeepSpeed JSON; empty until validated."""


@dataclass(frozen=True)
class Dropped:
    """A candidate left out, with the rule (code) and the message."""

    candidate: Candidate
    code: str
    reason: str


@dataclass
class FitsNowhere:
    """A model that fits no candidate: what it needs and what would make it fit."""

    needed_per_gpu_bytes: int
    device_memory_bytes: int
    least_memory_label: str
    suggestions: list[str]
    least_memory_candidate: Optional[Candidate] = None
    """The layout behind `least_memory_label` (what `dstoolkit estimate` shows when nothing fits)."""
    host_needed_per_node_bytes: Optional[int] = None
    """Set when host RAM is the limit (some layout fits one GPU, none fits the node's host RAM): that layout's
    offloaded bytes per node, the least among them (`least_memory_label` is then that layout)."""
    host_capacity_bytes: int = 0
    """Host RAM of one node (with host_needed_per_node_bytes)."""
    host_source: str = ""
    """Where host_capacity_bytes comes from."""

    @property
    def host_limited(self) -> bool:
        return self.host_needed_per_node_bytes is not None

    def message(self, spec: Spec, gpu: GpuSpec, model_name: str) -> str:
        if self.host_limited:
            lines = [
                f"{model_name} fits nowhere on {spec.cluster.describe(gpu.name)}: the layouts that fit one GPU need "
                f"more host RAM per node for their offloaded states than a node has; the one that needs the least "
                f"({self.least_memory_label}, {self.needed_per_gpu_bytes / GiB:.1f} GiB per GPU) needs "
                f"{self.host_needed_per_node_bytes / GiB:.1f} GiB of host RAM per node > "
                f"{self.host_capacity_bytes / GiB:.1f} GiB ({self.host_source}).",
            ]
        else:
            lines = self._device_lines(spec, gpu, model_name)
        if self.suggestions:
            lines.append("What would make it fit:")
            lines += [f"  - {s}" for s in self.suggestions]
        else:
            lines.append("Nothing tried here makes it fit (more GPUs, offload, TP/PP, recompute, micro-batch 1).")
        return "\n".join(lines)

    def _device_lines(self, spec: Spec, gpu: GpuSpec, model_name: str) -> list[str]:
        return [
            f"{model_name} fits nowhere on {spec.cluster.describe(gpu.name)}: the "
            f"least memory-hungry layout ({self.least_memory_label}) still needs at least "
            f"{self.needed_per_gpu_bytes / GiB:.1f} GiB per GPU at its peak, and one GPU has "
            f"{self.device_memory_bytes / GiB:.1f} GiB ({usable_device_bytes(gpu) / GiB:.1f} GiB usable for tensors "
            f"after {allowance_text(gpu)}).",
        ]


@dataclass
class SweepResult:
    """Everything a sweep found."""

    ranked: list[Ranked]
    dropped: list[Dropped]
    considered: int
    estimator: str
    winner_reason: Optional[str] = None
    fits_nowhere: Optional[FitsNowhere] = None
    all_ranked_count: int = 0
    dropped_by_code: dict = field(default_factory=dict)

    @property
    def winner(self) -> Optional[Ranked]:
        return self.ranked[0] if self.ranked else None
