"""dstoolkit.fp8: FP8 layer swaps (Transformer Engine or CPU emulation), recipes and the swap plan.

Importing this package does not import torch; the torch-backed names below load on first use:

    from dstoolkit.fp8 import convert, revert
    report = convert(model, {"recipe": "block", "format": "e4m3"}, backend="emulated")
    print(report.to_table())
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "convert": "dstoolkit.fp8.converter",
    "revert": "dstoolkit.fp8.converter",
    "load_state_dict": "dstoolkit.fp8.converter",
    "Fp8Converter": "dstoolkit.fp8.converter",
    "Fp8BackendUnavailable": "dstoolkit.fp8.recipes",
    "build_te_recipe": "dstoolkit.fp8.recipes",
    "EmulatedFp8Linear": "dstoolkit.fp8.emulated",
    "fp8_autocast": "dstoolkit.fp8.emulated",
    "SwapReport": "dstoolkit.fp8.report",
    "SwapEntry": "dstoolkit.fp8.report",
    "SkipEntry": "dstoolkit.fp8.report",
    "plan_from_shape": "dstoolkit.fp8.plan",
    "Fp8Plan": "dstoolkit.fp8.plan",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'dstoolkit.fp8' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
