"""dstoolkit.dsconfig: pydantic models of the whole DeepSpeed config, its cross-field rules and the JSON Schema
export. Imports no torch or deepspeed.

    from dstoolkit.dsconfig import DeepSpeedConfig, strip_dstoolkit_section

Names load lazily (PEP 562) so that `dstoolkit validate`, which checks against the committed JSON Schema,
never imports pydantic for a clean config.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DeepSpeedConfig", "strip_dstoolkit_section"]

_LAZY = {
    "DeepSpeedConfig": "dstoolkit.dsconfig.deepspeed",
    "strip_dstoolkit_section": "dstoolkit.dsconfig.strip",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dstoolkit.dsconfig' has no attribute {name!r}")
