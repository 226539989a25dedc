"""Swap decisions and the swap report (no torch import: `dstoolkit fp8 plan` uses these on shapes alone).

`decide_linear` is the single rule set used by the converter (on real modules) and the planner (on
module names derived from a `ModelShape`), so the plan lists exactly what `convert` would swap.
"""
from __future__ import annotations

import json
import re
from typing import Mapping, Optional

from pydantic import BaseModel, Field

from dstoolkit.dsconfig.fp8 import Fp8Config

_BLOCK_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def block_index(name: str) -> Optional[int]:
    """Index of the transformer block a qualified module name lives in (first numeric path part), or None."""
    m = _BLOCK_INDEX.search(name)
    return int(m.group(1)) if m else None


def layer_skip_problem(cfg: Fp8Config, num_blocks: Optional[int], names: Optional[Mapping[str, str]] = None,
                       model: str = "the model") -> Optional[str]:
    """Why fp8.layers.skip_first_layers / skip_last_layers leave no transformer block to run in FP8 (their sum
    reaches the block count, so `decide_linear` keeps every block in bf16 and FP8 does nothing), with the fix; None
    when at least one block is left, FP8 is off, or the block count is unknown. `names` spells the two settings
    (a CLI gives its flags)."""
    sel = cfg.layers
    skipped = sel.skip_first_layers + sel.skip_last_layers
    if not cfg.enabled or not num_blocks or skipped < num_blocks:
        return None
    n = {"skip_first_layers": "fp8.layers.skip_first_layers", "skip_last_layers": "fp8.layers.skip_last_layers",
         **(names or {})}
    given = [f"{n[k]}={getattr(sel, k)}" for k in ("skip_first_layers", "skip_last_layers") if getattr(sel, k)]
    return (f"{' + '.join(given)} keeps all {num_blocks} transformer blocks of {model} in bf16 "
            f"({skipped} >= {num_blocks}), so no block would run in FP8 (pick at most {num_blocks - 1} in total; "
            "to train without FP8 set fp8.enabled false)")


def decide_linear(cfg: Fp8Config, name: str, in_features: int, out_features: int,
                  num_blocks: Optional[int]) -> Optional[str]:
    """Why a linear layer must stay in high precision, or None when it is swapped to FP8.

    Args:
        cfg: FP8 settings (layer selection and recipe alignment).
        name: qualified module name, e.g. "blocks.0.self_attn.q_proj".
        in_features: GEMM reduction dim K.
        out_features: GEMM output dim N.
        num_blocks: number of transformer blocks (for skip_first/last_layers); None when unknown.

    Returns:
        A human-readable reason naming the rule and its value, or None.
    """
    if not cfg.enabled:
        return "fp8.enabled is false"
    sel = cfg.layers
    reason = sel.name_reason(name)
    if reason:
        return reason
    idx = block_index(name)
    if idx is not None and sel.skip_first_layers and idx < sel.skip_first_layers:
        return f"in block {idx}, one of the first {sel.skip_first_layers} (fp8.layers.skip_first_layers) kept in bf16"
    if idx is not None and num_blocks and sel.skip_last_layers and idx >= num_blocks - sel.skip_last_layers:
        return f"in block {idx}, one of the last {sel.skip_last_layers} (fp8.layers.skip_last_layers) kept in bf16"
    if in_features < sel.min_in_features:
        return f"in_features={in_features} < fp8.layers.min_in_features={sel.min_in_features}"
    if out_features < sel.min_out_features:
        return f"out_features={out_features} < fp8.layers.min_out_features={sel.min_out_features}"
    align = cfg.align_elements
    if in_features % align or out_features % align:
        return (f"dims not divisible by {align}: in_features={in_features}, out_features={out_features} "
                f"(FP8 GEMMs need multiples of {align} for recipe {cfg.recipe!r})")
    return None


class SwapEntry(BaseModel):
    """One module replaced by an FP8 module."""

    name: str
    """Qualified module name."""
    old_type: str
    """Class name before the swap (Linear, or the norm+MLP pair for fused TE modules)."""
    new_type: str
    """Class name after the swap (EmulatedFp8Linear, te.Linear, te.LayerNormMLP)."""
    in_features: int
    """GEMM reduction dim K (for fused modules: hidden size)."""
    out_features: int
    """GEMM output dim N (for fused modules: intermediate size)."""
    params: int
    """Parameters whose GEMMs now run in FP8."""


class SkipEntry(BaseModel):
    """One module with parameters that stays in high precision, and why."""

    name: str
    """Qualified module name."""
    type: str
    """Class name."""
    reason: str
    """Rule that kept it (pattern, dims, position, or 'not a linear layer')."""


class SwapReport(BaseModel):
    """Everything `convert` (or `plan`) did or would do, module by module."""

    backend: str
    """"te", "emulated", or "plan" (no model touched)."""
    recipe: str
    """Scaling recipe."""
    format: str
    """FP8 format (e4m3 | hybrid)."""
    swapped: list[SwapEntry] = Field(default_factory=list)
    """Modules replaced, in model order."""
    skipped: list[SkipEntry] = Field(default_factory=list)
    """Modules with parameters kept in high precision, in model order."""
    forward_wrapped: bool = False
    """Whether the root forward now runs inside the FP8 autocast context."""

    @property
    def swapped_params(self) -> int:
        """Parameters whose GEMMs run in FP8."""
        return sum(e.params for e in self.swapped)

    def to_table(self) -> str:
        """Plain-text table: one line per swapped and per skipped module."""
        lines = [f"FP8 swap ({self.backend}, recipe={self.recipe}, format={self.format}): "
                 f"{len(self.swapped)} swapped ({self.swapped_params:,} params), {len(self.skipped)} skipped"]
        w = max([len(e.name) for e in self.swapped] + [len(e.name) for e in self.skipped] + [6])
        for e in self.swapped:
            lines.append(f"  swap  {e.name:<{w}}  {e.old_type} -> {e.new_type}  [{e.in_features} x {e.out_features}]")
        for s in self.skipped:
            lines.append(f"  keep  {s.name:<{w}}  {s.type}: {s.reason}")
        return "\n".join(lines)

    def to_json(self) -> str:
        """JSON with the swapped/skipped lists and the totals."""
        d = self.model_dump()
        d["swapped_params"] = self.swapped_params
        return json.dumps(d, indent=2)
