"""dstoolkit.schemas: pydantic models of the DeepSpeed config and of our specs. Imports no torch/deepspeed.

Public entry points::

    from dstoolkit.schemas import DeepSpeedConfig, validate_config, strip_dstoolkit_section
    from dstoolkit.schemas.findings import Finding
"""
from dstoolkit.schemas.deepspeed import DeepSpeedConfig, strip_dstoolkit_section
from dstoolkit.schemas.findings import Finding
from dstoolkit.schemas.validate import validate_config

__all__ = ["DeepSpeedConfig", "Finding", "strip_dstoolkit_section", "validate_config"]
