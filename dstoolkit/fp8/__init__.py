"""dstoolkit.fp8: FP8 recipes (from the schema's `Fp8Config`) and the swap plan of a model shape, without torch.

The torch side (Transformer Engine swap, CPU emulation backend) is `dstoolkit.runtime.fp8`:

    from dstoolkit.runtime.fp8 import convert, revert
    report = convert(model, {"recipe": "block", "format": "e4m3"}, backend="emulated")
    print(report.to_table())
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Fp8BackendUnavailable": "dstoolkit.fp8.recipes",
    "build_te_recipe": "dstoolkit.fp8.recipes",
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
