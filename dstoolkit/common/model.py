"""The strict pydantic base and the "auto" type, defined once for the spec, the hardware table, the DeepSpeed
section models and the FP8 section. Imports pydantic (never on `dstoolkit validate`'s clean path)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Auto = Literal["auto"]
"""The placeholder "auto": a value the generator (spec) or Hugging Face Trainer/Accelerate (DeepSpeed JSON,
see ``dstoolkit.dsconfig.auto``) fills in."""


class StrictModel(BaseModel):
    """Unknown keys are errors, assignments are validated, attribute docstrings become field descriptions.

    Models that must also accept aliases (DeepSpeed's ``stage3_*`` spellings) add their own config on top."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)
