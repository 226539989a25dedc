"""Shared base model and value types for the DeepSpeed config schemas.

The types are stricter than DeepSpeed's own (DeepSpeed validates most sections with lax pydantic or not
at all): a string is never silently turned into a number or a bool. An integral float such as ``5e8`` is
accepted where an int is expected, because hjson (DeepSpeed's parser) and DeepSpeed's pydantic both accept it.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from pydantic import BeforeValidator, ConfigDict, Field, StrictBool
from typing_extensions import Annotated

from dstoolkit.common.model import Auto, StrictModel  # noqa: F401  (Auto re-exported: the HF placeholder here)
from dstoolkit.dsconfig.facts import FLOAT_INT_LIMIT, FLOAT_INT_TOO_BIG


class DSModel(StrictModel):
    """Base of every DeepSpeed section model: strict (unknown keys are errors, docstrings become schema
    descriptions), and aliased keys accept both spellings, as DeepSpeed's own models do."""

    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())


def deprecated(new_param: Optional[str] = None, *, use: Optional[str] = None) -> dict[str, Any]:
    """``json_schema_extra`` for a deprecated DeepSpeed key, declared on its field (as DeepSpeed's own config
    models do). `new_param`: the key DeepSpeed moves the value to (it asserts when both are given); `use`: what
    to write instead when that is not one key. The exported schema carries both, and `validate_config` reads
    them from there (``"deprecated": true`` is the JSON Schema 2020-12 annotation editors show)."""
    extra: dict[str, Any] = {"deprecated": True}
    if new_param is not None:
        extra["new_param"] = new_param
    if use is not None:
        extra["use"] = use
    return extra


def _strict_int(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got boolean {str(value).lower()}")
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < FLOAT_INT_LIMIT:
            return int(value)
        if math.isfinite(value) and value == int(value):
            raise ValueError(f"expected an integer, got {value!r}: {FLOAT_INT_TOO_BIG}")
        raise ValueError(f"expected an integer, got {value!r}")
    if not isinstance(value, int):
        raise ValueError(f"expected an integer, got {type(value).__name__} {value!r}")
    return value


def _strict_float(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


Int = Annotated[int, BeforeValidator(_strict_int)]
"""An int; integral floats (5e8) are accepted, strings and bools are not."""
Float = Annotated[float, BeforeValidator(_strict_float)]
"""A finite number; strings and bools are not accepted."""
Bool = StrictBool
"""A JSON boolean; "true" strings and 0/1 are not accepted."""
IntOrAuto = Union[Int, Auto]
FloatOrAuto = Union[Float, Auto]
BoolOrAuto = Union[Bool, Auto]

PosInt = Annotated[int, Field(gt=0), BeforeValidator(_strict_int)]
"""An int > 0."""
NonNegInt = Annotated[int, Field(ge=0), BeforeValidator(_strict_int)]
"""An int >= 0."""
PosIntOrAuto = Union[PosInt, Auto]
NonNegIntOrAuto = Union[NonNegInt, Auto]
