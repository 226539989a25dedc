"""`strip_dstoolkit_section`: remove our own top-level section before DeepSpeed sees a config (no pydantic)."""
from __future__ import annotations

import copy

DSTOOLKIT_SECTION = "dstoolkit"
"""Top-level key of our section (MoE facts, FP8). DeepSpeed never receives it: generated JSON is emitted without
it, and hand-written configs that carry it must be stripped before DeepSpeed reads them."""


def strip_dstoolkit_section(cfg: dict) -> dict:
    """Return a copy of ``cfg`` without our ``dstoolkit`` section, ready to hand to DeepSpeed.

    Args:
        cfg: a parsed config dict (not modified).

    Returns:
        A deep copy without the top-level ``"dstoolkit"`` key.
    """
    out = copy.deepcopy(cfg)
    if isinstance(out, dict):
        out.pop(DSTOOLKIT_SECTION, None)
    return out
