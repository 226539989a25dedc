"""What `generate` produced: one `StrategyOutput` per generated folder, the strategies skipped with the reason, and
the whole `GenerateResult` (every file of the output folder, relative path -> text). Read by the writer
(`dstoolkit.generate.core.write_generated`) and the summaries (`dstoolkit.generate.summary`). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dstoolkit.generate.candidates import StrategyDef
from dstoolkit.generate.sweep_result import Ranked, SweepResult

@dataclass
class StrategyOutput:
    """One generated folder."""

    name: str
    strategy: StrategyDef
    chosen: Ranked
    sweep: SweepResult
    ds_config: dict
    findings: list
    files: dict[str, str]
    targets_skipped: dict[str, str] = field(default_factory=dict)
    """Requested targets that cannot express this model or layout, with the reason."""
    per_target: dict[str, Ranked] = field(default_factory=dict)
    """Requested target -> the layout its files were written for and its estimate under that target's engine (each
    group of `targets.target_groups` resolves the strategy on its own: HF's best layout can differ from DeepSpeed's,
    e.g. pp 1 where DeepSpeed's pick pipelines, and Megatron-LM's figures are Megatron-Core's)."""
    chosen_targets: list[str] = field(default_factory=list)
    """The targets whose layout and estimate `chosen` is (the folder's ds_config.json layout)."""


@dataclass
class SkippedStrategy:
    """A strategy that was considered and not generated, with the reason."""

    name: str
    reason: str
    fits_nowhere: Optional[str] = None
    """Where no layout of the strategy fits: what its least memory-hungry layout needs and what would make it fit."""
    fits_nowhere_bytes: Optional[int] = None
    """That layout's peak per GPU (FitsNowhere.needed_per_gpu_bytes): how `generate` finds the strategy closest to
    fitting."""


@dataclass
class GenerateResult:
    """All files of the output folder (relative path -> text), plus what was generated and skipped."""

    spec_name: str
    files: dict[str, str]
    generated: list[StrategyOutput] = field(default_factory=list)
    skipped: list[SkippedStrategy] = field(default_factory=list)
