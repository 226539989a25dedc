"""The records `dstoolkit report` renders, read and checked: a line that is not a record, or a record whose fields
the tables and plots cannot show (a size of "1K", an op that is a list, a busbw of "fast"), is left out and named
by file and line, never rendered as-is and never a traceback. No torch, no matplotlib.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Any, Callable, Optional, Sequence

from dstoolkit.runtime.bench import results_jsonl

#: The bench kinds the report has a section for.
KINDS = ("comm", "comm_overhead", "overlap", "train")


def _is_num(v: Any) -> bool:
    """A number the tables and plots can show: JSON's Infinity / -Infinity (a zero time divided into a size) is not
    one, and is left out with its field named, as a busbw of "fast" is; NaN stays a number (rendered "–")."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isinf(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# (test, what the field must be): None-able fields accept null or a missing key.
_STR = (lambda v: isinstance(v, str), "a string")
_STR_OPT = (lambda v: v is None or isinstance(v, str), "a string or null")
_INT_OPT = (lambda v: v is None or _is_int(v), "a whole number or null")
_COUNT = (lambda v: _is_int(v) and v >= 0, "a whole number >= 0")
_BYTES = (lambda v: _is_int(v) and v >= 1, "a whole number of bytes >= 1")
_NUM_OPT = (lambda v: v is None or _is_num(v), "a number or null")
_BOOL_OPT = (lambda v: v is None or isinstance(v, bool), "true, false or null")
_DICT_OPT = (lambda v: v is None or isinstance(v, dict), "an object or null")
_MEDIAN = (lambda v: isinstance(v, dict) and _is_num(v.get("median")), 'an object with a numeric "median"')

#: Fields every known kind's row is grouped and labelled by.
_COMMON = {"key": _STR, "backend": _STR_OPT, "world_size": _INT_OPT, "type": _STR_OPT, "env": _DICT_OPT}

#: Per kind: required fields (must be present) and optional ones (checked when present).
_REQUIRED: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "comm": {"op": _STR, "size": _BYTES, "count": _COUNT, "time_us": _NUM_OPT, "algbw": _NUM_OPT,
             "busbw": _NUM_OPT, "#wrong": _COUNT},
    "comm_overhead": {"size": _BYTES},
    "overlap": {"compute_s": _MEDIAN, "comm_s": _MEDIAN, "overlapped_s": _MEDIAN},
    "train": {},
}
_OPTIONAL: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "comm": {"busbw_stats": _DICT_OPT},
    "comm_overhead": {"op": _STR_OPT, "harness_busbw": _NUM_OPT, "bare_busbw": _NUM_OPT, "rel_diff": _NUM_OPT},
    "overlap": {"overlap_comm": _BOOL_OPT, "exposed_comm_s": _NUM_OPT, "eta": _NUM_OPT, "eta_profiler": _NUM_OPT,
                "compute_slowdown": _NUM_OPT, "reduce_bucket_size": _NUM_OPT},
    "train": {"measured": _DICT_OPT, "estimate": _DICT_OPT, "error": _DICT_OPT},
}
#: Numbers inside the nested objects the tables and plots compute with.
_NESTED_NUMBERS = {
    "comm": {"busbw_stats": ("p10", "p90")},
    "train": {"measured": ("tokens_per_s", "step_time_s_median", "step_time_s_p90", "peak_memory_bytes", "mfu",
                           "loss_first", "loss_last"),
              "estimate": ("tokens_per_s", "step_time_s", "memory_per_rank_bytes", "mfu"),
              "error": ("tokens_per_s", "step_time_s", "memory_bytes")},
}


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def record_problem(rec: dict[str, Any]) -> Optional[str]:
    """Why the report cannot show this record ('field "size" is '1K' (expected ...)'), or None when it can.
    Records of kinds the report has no section for, and run markers (``event``), are not checked."""
    kind = rec.get("bench")
    if kind not in KINDS or rec.get("event") is not None:
        return None
    for name, (ok, what) in {"key": _STR, **_REQUIRED[kind]}.items():
        if name not in rec:
            return f'{kind} record without the field "{name}" (expected {what})'
    for name, (ok, what) in {**_COMMON, **_REQUIRED[kind], **_OPTIONAL[kind]}.items():
        if name in rec and not ok(rec[name]):
            return f'field "{name}" is {_show(rec[name])} (expected {what})'
    env = rec.get("env") or {}
    for name, (ok, what) in (("world_size", _INT_OPT), ("backend", _STR_OPT)):
        if not ok(env.get(name)):
            return f'field "env.{name}" is {_show(env.get(name))} (expected {what})'
    load = env.get("load_avg")
    if load is not None and not (isinstance(load, (list, tuple)) and load and _is_num(load[0])):
        return f'field "env.load_avg" is {_show(load)} (expected a list of numbers)'
    for parent, names in _NESTED_NUMBERS.get(kind, {}).items():
        sub = rec.get(parent) or {}
        for name in names:
            if not _NUM_OPT[0](sub.get(name)):
                return f'field "{parent}.{name}" is {_show(sub.get(name))} (expected a number or null)'
    return None


@dataclasses.dataclass
class ReportInput:
    """The records a report renders, and what was left out of it (one line per problem, naming file and line)."""

    records: list[dict[str, Any]]
    skipped: list[str]
    """'FILE line N: why', for unreadable lines and for records the report cannot show."""
    bad_lines: int
    """How many lines were not records (JSON objects) at all."""


def read_report_input(files: Sequence[pathlib.Path]) -> ReportInput:
    """Every record of `files` that the report can show, and the lines and records it leaves out."""
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    bad = 0
    for f in files:
        recs = results_jsonl.read_records(f)
        bad += len(recs.bad_lines)
        problems = [(b.line, b.reason) for b in recs.bad_lines]
        for rec, (_, line) in zip(recs, recs.lines):
            why = record_problem(rec)
            if why is None:
                records.append(rec)
            else:
                problems.append((line, why))
        skipped += [f"{f} line {line}: {why}" for line, why in sorted(problems)]
    return ReportInput(records=records, skipped=skipped, bad_lines=bad)
