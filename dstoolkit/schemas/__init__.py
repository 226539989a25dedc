"""dstoolkit.schemas: pydantic models of the DeepSpeed config and of our specs. Imports no torch/deepspeed.

Public entry points::

    from dstoolkit.schemas import DeepSpeedConfig, validate_config, strip_dstoolkit_section
    from dstoolkit.schemas.findings import Finding

Names are resolved lazily (PEP 562): `validate_config` checks against the committed JSON Schema and needs no
pydantic import, so `dstoolkit validate` starts fast; `DeepSpeedConfig` builds the pydantic models on first use.
"""
from __future__ import annotations

from typing import Any

__all__ = ["DeepSpeedConfig", "Finding", "strip_dstoolkit_section", "validate_config"]

_LAZY = {
    "DeepSpeedConfig": "dstoolkit.schemas.deepspeed",
    "strip_dstoolkit_section": "dstoolkit.schemas.strip",
    "Finding": "dstoolkit.schemas.findings",
    "validate_config": "dstoolkit.schemas.validate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dstoolkit.schemas' has no attribute {name!r}")
