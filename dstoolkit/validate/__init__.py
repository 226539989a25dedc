"""dstoolkit.validate: the parser (JSON/hjson/YAML with line numbers), findings, the fast JSON Schema checker
and the validation engine behind `dstoolkit validate`. No pydantic, torch or deepspeed on the clean path.

    from dstoolkit.validate import validate_config, Finding
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Finding", "validate_config"]

_LAZY = {
    "Finding": "dstoolkit.validate.findings",
    "validate_config": "dstoolkit.validate.engine",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dstoolkit.validate' has no attribute {name!r}")
