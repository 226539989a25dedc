"""dstoolkit.runtime.fp8: FP8 layer swaps on a torch model (Transformer Engine, or the CPU emulation backend
with the same recipes). Torch loads on first use of a name:

    from dstoolkit.runtime.fp8 import convert, revert
    report = convert(model, {"recipe": "block", "format": "e4m3"}, backend="emulated")
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "convert": "dstoolkit.runtime.fp8.converter",
    "revert": "dstoolkit.runtime.fp8.converter",
    "load_state_dict": "dstoolkit.runtime.fp8.converter",
    "Fp8Converter": "dstoolkit.runtime.fp8.converter",
    "EmulatedFp8Linear": "dstoolkit.runtime.fp8.emulated",
    "fp8_autocast": "dstoolkit.runtime.fp8.emulated",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'dstoolkit.runtime.fp8' has no attribute {name!r}")
    return getattr(importlib.import_module(mod), name)
