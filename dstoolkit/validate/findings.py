"""The `Finding` record every validator returns, and the table of stable finding codes.

Codes are stable: tools may filter on them. ``DS0xx`` are input problems (the file cannot be read as a
config; the CLI exits 2), ``DS01x`` syntax notes, ``DS1xx`` per-key findings, ``DS2xx`` cross-field rules.
``CODES`` (code -> title) is `KEY_CODES` plus the titles the rule registry declares. Spec files use the same
`Finding` with their own codes (``SPxxx``, `SPEC_CODES`) and layout codes (``LYxxx``).
"""
from __future__ import annotations

import re

from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

from dstoolkit.dsconfig.rules import RULES

Severity = Literal["error", "warning"]

KEY_CODES: dict[str, str] = {
    "DS001": "file cannot be parsed as JSON/hjson",
    "DS002": "NaN or Infinity literal",
    "DS003": "nesting too deep",
    "DS004": "file too large",
    "DS005": "binary or undecodable file",
    "DS006": "YAML where a JSON config was expected",
    "DS007": "top level is not a JSON object",
    "DS008": "file cannot be read",
    "DS009": "validator could not check this input",
    "DS010": "comment (hjson extension)",
    "DS011": "trailing comma (hjson extension)",
    "DS012": "unquoted value, read as a string by hjson",
    "DS013": "duplicate key",
    "DS014": "other hjson-only syntax",
    "DS101": "unknown key",
    "DS102": "wrong type",
    "DS103": "value out of range or not allowed",
    "DS104": "key belongs to another section",
    "DS105": "key ignored (or, for optimizer offload at stage 0, fatal on GPUs) at the configured ZeRO stage",
    "DS106": "deprecated key",
    "DS107": "section or key removed from DeepSpeed",
    "DS108": "required key missing",
    "DS110": '"auto" in strict mode',
    "DS111": '"auto" where nothing fills it',
    "DS120": "accelerate config disagrees with the layout it was generated for",
    "DS121": "multi-node accelerate config whose nodes would not form one job",
}
"""The codes that are not cross-field rules (input, syntax and per-key findings): code -> short title.
The DS2xx titles are declared with their rules (dstoolkit.dsconfig.registry)."""


SPEC_CODES: dict[str, str] = {
    "SP001": "YAML syntax error, duplicate key, or a file that is not a mapping",
    "SP002": "unknown key",
    "SP003": "wrong type or value",
    "SP004": "cross-field rule",
    "SP005": "required field missing",
    "SP006": "spec file, or a file it names (model.hf_config), cannot be read",
    "SP007": "the spec's layout is estimated not to fit in device memory, or in host RAM per node",
}
"""Codes of spec findings (dstoolkit.spec.errors raises them; `dstoolkit validate SPEC.yaml` prints them). Layout
constraints keep their LYxxx code (dstoolkit.layout.constraints)."""
SPEC_INPUT_CODES = ("SP001", "SP006")
"""Spec codes that are input errors (the file, or the model config it names, cannot be read): the CLI exits 2 for
them, as for DS00x."""


def __getattr__(name: str) -> Any:
    if name == "CODES":  # built on first use, so importing Finding loads no rule module
        codes = {**KEY_CODES, **{code: r.title for code, r in RULES.items()}}
        globals()["CODES"] = codes
        return codes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


INPUT_ERROR_PREFIX = "DS00"
"""Codes starting with this are input errors: the CLI exits 2 for them."""


@dataclass(frozen=True)
class Finding:
    """One problem in one config file, located by JSON pointer and (when known) line/column.

    A frozen dataclass rather than a pydantic model so that `dstoolkit validate` never has to import pydantic
    for clean configs; ``model_dump()`` is kept for callers that treat it like one.
    """

    file: str
    """The file (or source label) the finding is about."""
    pointer: str
    """JSON pointer (RFC 6901) to the key or value, '' for the whole document."""
    line: Optional[int] = None
    """1-based line in the source text; None when validating an already-parsed dict."""
    column: Optional[int] = None
    """1-based column in the source text."""
    severity: Severity = "error"
    """error (the job would fail or silently misbehave) or warning."""
    code: str = ""
    """Stable code, see ``CODES``."""
    message: str = ""
    """What is wrong, naming the field and the value."""
    suggestion: Optional[str] = None
    """How to fix it (a replacement key, a value, a section)."""
    path: Optional[str] = None
    """The field path as a hand-written file names it (a spec's ``training.tp``, ``<yaml>`` for the syntax
    itself). Set for spec findings, which print as ``file:line:col: <path>: <problem> (<fix>)``; None for
    DeepSpeed configs, located by `pointer` alone."""

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (file, pointer, line, column, severity, code, message, suggestion; path when set)."""
        out = asdict(self)
        if out["path"] is None:
            del out["path"]
        return out

    def __str__(self) -> str:
        if self.path is None:
            return self.format_text()
        where = (f"{self.file}:{self.line}:{self.column or 1}: " if self.line is not None
                 else (f"{self.file}: " if self.file else ""))
        text = f"{where}{self.path + ': ' if self.path else ''}{self.message}"
        return text + (f" ({self.suggestion})" if self.suggestion is not None else "")

    @property
    def is_input_error(self) -> bool:
        return self.code.startswith(INPUT_ERROR_PREFIX) or self.code in SPEC_INPUT_CODES

    def format_text(self) -> str:
        """Compiler-style one-liner: ``file:line:col: error[CODE]: message (suggestion)``."""
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}:{self.column or 1}"
        where = f" at {self.pointer}" if self.pointer and self.line is None else ""
        # a spec finding names its field as the other verbs print it (`__str__`), unless the message already does
        named = self.path and re.search(rf"(?<![\w.]){re.escape(self.path)}(?![\w.])", self.message)
        field = f"{self.path}: " if self.path and not self.path.startswith("<") and not named else ""
        text = f"{loc}: {self.severity}[{self.code}]: {field}{self.message}{where}"
        if self.suggestion:
            text += f" ({self.suggestion})"
        return text


def escape_pointer_token(token: str) -> str:
    """Escape one JSON-pointer reference token (RFC 6901 §3)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer_of(path: tuple) -> str:
    """JSON pointer for a tuple of keys/indices."""
    return "".join("/" + escape_pointer_token(str(p)) for p in path)


class Collector:
    """Accumulates the findings of one file: positions from the parse (when there is one), one finding per
    (code, pointer, severity)."""

    def __init__(self, source: str, parsed: Any = None):
        self.source = source
        self.parsed = parsed
        """A `dstoolkit.validate.parse.ParseResult`, or None for an already-parsed dict."""
        self.findings: list[Finding] = []
        self.seen: set[tuple[str, str, str]] = set()

    def position(self, pointer: str, value: bool = False) -> tuple[Optional[int], Optional[int]]:
        if self.parsed is None:
            return None, None
        table = self.parsed.value_positions if value else self.parsed.positions
        p = pointer
        while True:
            if p in table:
                return table[p]
            if p in self.parsed.positions:
                return self.parsed.positions[p]
            if not p:
                return 1, 1
            p = p.rsplit("/", 1)[0]

    def add(self, code: str, severity: str, pointer: str, message: str, suggestion: Optional[str] = None,
            at_value: bool = False) -> None:
        if (code, pointer, severity) in self.seen:
            return
        self.seen.add((code, pointer, severity))
        line, col = self.position(pointer, at_value)
        self.findings.append(Finding(file=self.source, pointer=pointer, line=line, column=col, severity=severity,
                                     code=code, message=message, suggestion=suggestion))


SPEC_SECTIONS = ("model", "cluster", "training")
"""A dstoolkit spec's top-level sections; a DeepSpeed config (or accelerate's YAML) has none of them."""


def has_spec_sections(data: object) -> bool:
    """A parsed file that is a spec, not a DeepSpeed config: a mapping with two or more of SPEC_SECTIONS (one may
    be missing or misspelled; load_spec then says which)."""
    return isinstance(data, dict) and sum(k in data for k in SPEC_SECTIONS) >= 2
