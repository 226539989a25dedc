"""The spec's whole-number fields (degrees, batch sizes, steps, nodes), read as strictly as `dstoolkit validate` reads
a DeepSpeed JSON: a number, never a string ("4") or a boolean, and a float only when it is whole (4.0 is 4, as the
JSON side's `as_int` takes an integral float; 4.5 is refused). Each refusal names the field, the value and the fix,
instead of pydantic's "unable to parse string as an integer". No torch import.

`WholeNumberFields` is the base of the training, cluster and batch-ramp sections: it asks `whole_number` for every
field whose type is an int (plain, optional, with "auto", or a Literal of ints such as zero_stage), and
`finite_number` for every float field (lr, checkpoint_ratio, host_memory_per_node_gib, ...): YAML reads `1e1000` and
`.inf` as infinity and `.nan` as NaN, which a bound such as `gt=0` lets through (inf) or refuses without saying why.
"""
from __future__ import annotations

import functools
import math
import typing
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic import field_validator

from dstoolkit.common.model import StrictModel
from dstoolkit.spec.errors import SpecFieldError


def _int_kinds(annotation: Any) -> tuple[bool, bool, tuple]:
    """(takes an int, takes "auto", the Literal ints it is limited to) for one field's annotation."""
    takes_int, auto, allowed = False, False, ()
    for arg in typing.get_args(annotation) or (annotation,):
        if arg is int:
            takes_int = True
        elif typing.get_origin(arg) is Literal:
            values = typing.get_args(arg)
            auto = auto or "auto" in values
            ints = tuple(v for v in values if isinstance(v, int) and not isinstance(v, bool))
            if ints:
                takes_int, allowed = True, allowed + ints
        elif typing.get_origin(arg) is not None:  # a nested Union / Optional
            sub = _int_kinds(arg)
            takes_int, auto, allowed = takes_int or sub[0], auto or sub[1], allowed + sub[2]
    return takes_int, auto, allowed


def _expected(info: Any, auto: bool, allowed: tuple) -> str:
    """What the field takes, in words: 'a whole number >= 1', '0, 1, 2 or 3', with "or 'auto'"."""
    if allowed:
        words = [str(v) for v in allowed]
        text = f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]
    else:
        text = "a whole number" + _bounds(info)
    return text + (", or 'auto'" if auto and allowed else " or 'auto'" if auto else "")


def _bounds(info: Any) -> str:
    """The field's bounds in words (' > 0', ' >= 0 and < 1'), from its Field(gt=, ge=, lt=, le=)."""
    words = []
    for m in getattr(info, "metadata", ()):
        for kind, op in ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<")):
            if isinstance(m, kind):
                words.append(f"{op} {getattr(m, kind.__name__.lower())}")
    return (" " + " and ".join(words)) if words else ""


def _takes_float(annotation: Any) -> bool:
    """Whether a field's annotation takes a float (plain or optional)."""
    return any(arg is float for arg in typing.get_args(annotation) or (annotation,))


def finite_number(value: Any, name: str, info: Any = None) -> Any:
    """`value` unchanged unless it is infinite or NaN (a number, or a string pydantic would read as one).

    Raises:
        SpecFieldError: inf / -inf / nan, naming the field, the value and what the field takes."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return value
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return value  # not a number at all: pydantic says so
    if math.isfinite(number):
        return value
    shown = value if isinstance(value, str) else repr(value)  # YAML reads 1e1000 (no dot) as a string
    raise SpecFieldError((), f"{name}={shown} is not a finite number", f"give a finite number{_bounds(info)}")


def whole_number(value: Any, name: str, info: Any = None, *, auto: bool = False, allowed: tuple = ()) -> Any:
    """`value` as a whole-number field takes it: an int as it is, a whole float as its int, "auto" where the field
    has it, None and other types for pydantic to judge.

    Raises:
        SpecFieldError: a boolean, a string, a fraction (naming the field, the value and what it takes)."""
    expected = _expected(info, auto, allowed)
    if isinstance(value, bool):
        raise SpecFieldError((), f"{name}={value!r} is a boolean", f"give {expected}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)  # 4.0: whole, as the DeepSpeed JSON side (dsconfig as_int) takes it
        raise SpecFieldError((), f"{name}={value!r} is not a whole number", f"give {expected}")
    if isinstance(value, str):
        if auto and value == "auto":
            return value
        if value.strip().lower() == "auto":
            raise SpecFieldError((), f"{name}={value!r}: the sweep does not choose {name}; only micro_batch, tp, pp, "
                                 "ep, zero_stage and activation_checkpointing take 'auto'", f"give {expected}")
        try:
            number = int(value.strip())
        except ValueError:
            raise SpecFieldError((), f"{name}={value!r} is not a number", f"give {expected}") from None
        raise SpecFieldError((), f"{name}={value!r} is a string, not a number",
                             f"write it without quotes: `{name}: {number}`")
    return value


@functools.lru_cache(maxsize=None)
def _whole_number_fields(cls: type) -> dict[str, tuple[bool, tuple]]:
    """field -> (takes "auto", its Literal ints) for each whole-number field of a section class."""
    out = {}
    for name, info in cls.model_fields.items():
        takes_int, auto, allowed = _int_kinds(info.annotation)
        if takes_int:
            out[name] = (auto, allowed)
    return out


@functools.lru_cache(maxsize=None)
def _float_fields(cls: type) -> frozenset:
    """The float fields of a section class."""
    return frozenset(name for name, info in cls.model_fields.items() if _takes_float(info.annotation))


class WholeNumberFields(StrictModel):
    """A spec section whose int fields are read by `whole_number` (no strings, booleans or fractions) and whose
    float fields by `finite_number` (no inf or nan)."""

    @field_validator("*", mode="before")
    @classmethod
    def _check_whole_numbers(cls, value: Any, info) -> Any:
        field = cls.model_fields[info.field_name]
        if info.field_name in _float_fields(cls):
            return finite_number(value, info.field_name, field)
        kind = _whole_number_fields(cls).get(info.field_name)
        if kind is None:
            return value
        return whole_number(value, info.field_name, field, auto=kind[0], allowed=kind[1])
