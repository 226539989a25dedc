"""The spec's whole-number fields (degrees, batch sizes, steps, nodes), read as strictly as `dstoolkit validate` reads
a DeepSpeed JSON: a number, never a string ("4") or a boolean, and a float only when it is whole (4.0 is 4, as the
JSON side's `as_int` takes an integral float; 4.5 is refused). Each refusal names the field, the value and the fix,
instead of pydantic's "unable to parse string as an integer". No torch import.

`WholeNumberFields` is the base of the training, cluster and batch-ramp sections: it asks `whole_number` for every
field whose type is an int (plain, optional, with "auto", or a Literal of ints such as zero_stage).
"""
from __future__ import annotations

import functools
import typing
from typing import Any, Literal

from annotated_types import Ge, Gt
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
        text = "a whole number"
        for m in getattr(info, "metadata", ()):
            if isinstance(m, Ge):
                text += f" >= {m.ge}"
            elif isinstance(m, Gt):
                text += f" > {m.gt}"
    return text + (", or 'auto'" if auto and allowed else " or 'auto'" if auto else "")


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


class WholeNumberFields(StrictModel):
    """A spec section whose int fields are read by `whole_number` (no strings, booleans or fractions)."""

    @field_validator("*", mode="before")
    @classmethod
    def _check_whole_numbers(cls, value: Any, info) -> Any:
        kind = _whole_number_fields(cls).get(info.field_name)
        if kind is None:
            return value
        return whole_number(value, info.field_name, cls.model_fields[info.field_name], auto=kind[0], allowed=kind[1])
