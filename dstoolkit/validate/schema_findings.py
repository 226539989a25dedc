"""Schema issues -> findings: unknown keys (with did-you-mean), types, ranges and missing keys, from the
committed JSON Schema (no pydantic on this path), plus the FP8 sub-section through its pydantic model.
`pydantic_schema_issues` is the same check through `DeepSpeedConfig`, for the tests that show the two agree.
"""
from __future__ import annotations

import difflib
from typing import Any, Optional

from dstoolkit.common.text import did_you_mean
from dstoolkit.dsconfig.facts import (FLOAT_INT_TOO_BIG, LAX_BOOL_SECTIONS, LAX_BOOL_STRINGS,
                                      NULL_REFUSED_TOP_LEVEL)
from dstoolkit.validate import schema_check as _schema_check
from dstoolkit.validate.findings import Collector, pointer_of
from dstoolkit.validate.keys import TOP_LEVEL_RENAMES


def check_schema(clean: dict, version: str, out: Collector, mode: str = "strict") -> None:
    """Unknown keys, types and ranges, against the committed JSON Schema (no pydantic on this path). `mode`: who
    reads the file (validate_config's), for the quoted booleans HF reads itself (`_quoted_bool`)."""
    fp8 = None
    ds = clean.get("dstoolkit")
    if isinstance(ds, dict) and "fp8" in ds:
        fp8 = ds.pop("fp8")  # Fp8Config has cross-field validators: checked with pydantic below
    for issue in _schema_check.check_config(clean):
        _report_issue(clean, issue, out, mode, version)
    if fp8 is not None:
        _check_fp8(fp8, out)


def _check_fp8(fp8: Any, out: Collector) -> None:
    try:
        # start-up time: the validate fast path (a clean config against the committed schema) imports no pydantic
        from pydantic import ValidationError

        # start-up time: the validate fast path (a clean config against the committed schema) imports no pydantic
        from dstoolkit.dsconfig.fp8 import Fp8Config
    except ImportError:  # pragma: no cover - fp8 module absent
        return
    if fp8 is None:
        return
    try:
        Fp8Config.model_validate(fp8)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            path = ("dstoolkit", "fp8") + tuple(err["loc"])
            code = "DS101" if err["type"] == "extra_forbidden" else (
                "DS103" if err["type"] in ("literal_error", "greater_than", "greater_than_equal", "less_than",
                                           "less_than_equal", "value_error") else "DS102")
            msg = err["msg"].replace("Value error, ", "").replace("Input should be", "must be")
            out.add(code, "error", pointer_of(path), f"dstoolkit.fp8: {msg}", None)


def _report_issue(clean: dict, issue: "_schema_check.Issue", out: Collector, mode: str = "strict",
                  version: str = "0.19") -> None:
    path = issue.path
    ptr = pointer_of(path)
    field = ".".join(str(p) for p in path) or "config"
    if issue.kind == "unknown_key":
        key = str(path[-1])
        if len(path) == 1 and key in TOP_LEVEL_RENAMES:
            return
        section = ".".join(str(p) for p in path[:-1]) or "the top level"
        message = f"unknown key {key!r} in {section}"
        hint = did_you_mean(key, issue.choices, cutoff=0.72)
        suggestion = f"did you mean {hint!r}?" if hint else None
        if len(path) == 1:
            # DeepSpeed 0.19.8 reads only the keys it knows and ignores the rest (runtime/config.py): a near-miss
            # of a known key is a setting silently lost (error); anything else is most likely another tool's
            # section (MS-AMP's msamp, a launcher's key) and is left to the user (warning)
            message += "; DeepSpeed ignores unknown top-level keys silently"
            if key == "fp8":  # dstoolkit's FP8 settings (fp8 plan / estimate --config) sit in the dstoolkit section
                out.add("DS101", "warning", ptr, message, "dstoolkit reads FP8 settings only from dstoolkit.fp8: move "
                        'it under dstoolkit.fp8 ("dstoolkit": {"fp8": {...}})')
                return
            if hint is None or not close_typo(key, hint):
                out.add("DS101", "warning", ptr, message, "fine if another tool reads it (e.g. MS-AMP's 'msamp'); "
                        "otherwise check its name: DeepSpeed never applies it"
                        + (f" (the nearest DeepSpeed key is {hint!r})" if hint else ""))
                return
            message += f", so the {hint!r} setting it was meant to be is not applied"
        if path[0] == "zero_optimization" and len(path) == 2:
            message += "; DeepSpeed refuses the config"
        if not suggestion and path[0] == "compile":
            suggestion = "the torch.compile backend is set in code (engine.compile(backend=...)), not in the config"
        out.add("DS101", "error", ptr, message, suggestion)
        return
    if issue.kind == "missing":
        out.add("DS108", "error", ptr, f"required key {ptr} is missing", None)
        return
    node = _node_at(clean, path)
    shown = _schema_check._show(node)
    if issue.kind == "range":
        out.add("DS103", "error", ptr, f"{field} = {shown}: {issue.message}", None, at_value=True)
        return
    if path == ("bfloat16",) and node is None and clean.get("bf16") is not None:
        return  # DeepSpeed reads the legacy name only when bf16 is absent or null (precision_config.py)
    if node is None and len(path) == 1 and path[0] in NULL_REFUSED_TOP_LEVEL:  # a Python None dumped as null
        section = "object" in issue.message
        out.add("DS102", "error", ptr, f"{field} = null: {issue.message}; DeepSpeed 0.19.8 does not read an explicit "
                f"null as a missing key: its config parser fails on it (TypeError / AttributeError / ValidationError)",
                f"write {'an object' if section else 'a value'} or delete the key", at_value=True)
        return
    message = f"{field} = {shown}: {issue.message}"
    if _quoted_bool(path, node, issue, mode, version):
        value = str(LAX_BOOL_STRINGS[node.lower()]).lower()
        out.add("DS102", "warning", ptr, f"{field} = {shown}: a quoted boolean; DeepSpeed's pydantic config reads it "
                f"as {value} (lax bool)", f"write the boolean without quotes: {value}", at_value=True)
        return
    if isinstance(node, float) and node.is_integer() and "integer" in issue.message:
        out.add("DS102", "error", ptr, f"{message}: {FLOAT_INT_TOO_BIG}",
                "write a value below 9.2e18 (what DeepSpeed's int64 fields hold)", at_value=True)
        return
    if mode == "hf" and tuple(path) in HF_READS_RAW and isinstance(node, str) and node.lower() in LAX_BOOL_STRINGS:
        message += ("; DeepSpeed would read it as a boolean, but HF reads this flag itself (a mismatch for "
                    "HfTrainerDeepSpeedConfig.fill_match, true for is_true)")
    if isinstance(node, str) and node.strip() and node.replace(",", "").replace("_", "").isupper():
        message += " (an unfilled template placeholder?)"
    out.add("DS102", "error", ptr, message, _type_hint(node), at_value=True)


TYPO_RATIO = 0.85
"""difflib ratio from which an unknown top-level key is a misspelling of the known one (a letter or two off:
gradient_cliping, steps_per_prints, zero_optimisation)."""


def close_typo(key: str, hint: str) -> bool:
    """Whether an unknown top-level `key` is surely `hint` mistyped (an error: the setting is lost), not just the
    nearest name (a warning: it may be another tool's key). Sure: the same letters or words (did_you_mean's own first
    tries), a ratio of at least `TYPO_RATIO`, or an abbreviation whose every word starts a word of `hint`, in order
    (grad_accum_steps, gradient_clip, train_micro_batch_size). Not: io_parallel -> tensor_parallel,
    checkpoint-factor -> checkpoint (found as DeepSpeed keys' nearest names in microsoft/DeepSpeed and gpt-neox
    configs)."""
    k, h = key.lower().replace("-", "_"), hint.lower()
    if sorted(k.split("_")) == sorted(h.split("_")) or difflib.SequenceMatcher(None, k, h).ratio() >= TYPO_RATIO:
        return True
    words = iter(h.split("_"))
    return all(w and any(c.startswith(w) for c in words) for w in k.split("_"))


HF_READS_RAW = frozenset({("fp16", "enabled"), ("bf16", "enabled"), ("bfloat16", "enabled")})
"""Flags HF reads from the file itself: transformers' HfTrainerDeepSpeedConfig.fill_match reports "false" != False
as a mismatch (ValueError), and HfDeepSpeedConfig.is_true / accelerate's state.py take bool("false"), true."""


def _quoted_bool(path: tuple, node: Any, issue: "_schema_check.Issue", mode: str, version: str = "0.19") -> bool:
    """A quoted boolean ("false", "True", "1"...) where a boolean is expected, in a section DeepSpeed reads through
    its lax pydantic models (facts.LAX_BOOL_SECTIONS): DeepSpeed does what the user meant, a warning. Measured on
    0.19.8 only: 0.16 read fp16 / bf16 with get_scalar_param, where any non-empty string is truthy ("false" turns
    it on), so there it stays an error. Not in hf mode for the flags HF reads itself (`HF_READS_RAW`), and not in
    sections DeepSpeed reads raw."""
    return (version.startswith("0.19") and isinstance(node, str) and node.lower() in LAX_BOOL_STRINGS
            and issue.message.startswith("expected a "
            "boolean") and bool(path) and path[0] in LAX_BOOL_SECTIONS
            and not (mode == "hf" and tuple(path[:2]) in HF_READS_RAW and len(path) == 2))


def _node_at(root: Any, path: tuple) -> Any:
    node = root
    for p in path:
        node = node[p]
    return node


def _type_hint(node: Any) -> Optional[str]:
    if isinstance(node, str):
        try:
            float(node)
            return f"write the number without quotes: {node}"
        except ValueError:
            pass
        if node.lower() in ("true", "false"):
            return f"write the boolean without quotes: {node.lower()}"
    return None


def pydantic_schema_issues(clean: dict) -> set[tuple[str, str]]:
    """(code, pointer) of the per-key errors pydantic's `DeepSpeedConfig` reports for ``clean`` (the same kinds
    `_check_schema` reports from the JSON Schema). Used by tests to show the two paths agree; imports pydantic."""
    # start-up time: the validate fast path (a clean config against the committed schema) imports no pydantic
    from pydantic import ValidationError

    # start-up time: the validate fast path (a clean config against the committed schema) imports no pydantic
    from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

    try:
        DeepSpeedConfig.model_validate(clean, context={"skip": True})
        return set()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    out: set[tuple[str, str]] = set()
    paths = {_data_path(tuple(e["loc"]), clean) for e in errors}
    for err in errors:
        path = _data_path(tuple(err["loc"]), clean)
        if err["type"] == "extra_forbidden":
            out.add(("DS101", pointer_of(path)))
            continue
        node = _node_at(clean, path)
        if isinstance(node, (dict, list)) and any(p != path and p[:len(path)] == path for p in paths):
            continue
        if err["type"] == "missing":
            out.add(("DS108", pointer_of(path)))
        elif err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error",
                             "enum") and not (err["type"] == "literal_error" and "'auto'" in str(err.get("ctx"))):
            out.add(("DS103", pointer_of(path)))
        elif err["type"] != "literal_error":
            out.add(("DS102", pointer_of(path)))
    # a pointer reported both as a type and a range error by different union branches counts once, as range
    return {(c, p) for c, p in out if not (c == "DS102" and ("DS103", p) in out)}


def _data_path(loc: tuple, data: Any) -> tuple:
    """Keep the parts of a pydantic loc that address the data (drop union-branch labels)."""
    path: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
    return tuple(path)
