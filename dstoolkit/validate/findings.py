"""The `Finding` record every validator returns, and the table of stable finding codes.

Codes are stable: tools may filter on them. ``DS0xx`` are input problems (the file cannot be read as a
config; the CLI exits 2), ``DS01x`` syntax notes, ``DS1xx`` per-key findings, ``DS2xx`` cross-field rules.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal, Optional

Severity = Literal["error", "warning"]

# code -> short title (used in docs and --format json consumers)
CODES: dict[str, str] = {
    "DS001": "file cannot be parsed as JSON/hjson",
    "DS002": "NaN or Infinity literal",
    "DS003": "nesting too deep",
    "DS004": "file too large",
    "DS005": "binary or undecodable file",
    "DS006": "YAML where a JSON config was expected",
    "DS007": "top level is not a JSON object",
    "DS008": "file cannot be read",
    "DS010": "comment (hjson extension)",
    "DS011": "trailing comma (hjson extension)",
    "DS012": "unquoted value, read as a string by hjson",
    "DS013": "duplicate key",
    "DS014": "other hjson-only syntax",
    "DS101": "unknown key",
    "DS102": "wrong type",
    "DS103": "value out of range or not allowed",
    "DS104": "key belongs to another section",
    "DS105": "key ignored at the configured ZeRO stage",
    "DS106": "deprecated key",
    "DS107": "section or key removed from DeepSpeed",
    "DS108": "required key missing",
    "DS110": '"auto" in strict mode',
    "DS111": '"auto" where nothing fills it',
    "DS201": "batch sizes disagree with the data-parallel size",
    "DS202": "no batch size given",
    "DS203": "fp16 and bf16 both enabled",
    "DS204": "offload_param needs ZeRO stage 3",
    "DS205": "NVMe offload needs nvme_path",
    "DS206": "NVMe offload without an aio section",
    "DS207": "zero_hpz_partition_size does not divide gpus per node",
    "DS208": "ZeRO++ option needs ZeRO stage 3",
    "DS209": "optimizer type unknown or removed",
    "DS210": "optimizer parameter invalid for this optimizer",
    "DS211": "scheduler type unknown",
    "DS212": "scheduler parameter invalid for this scheduler",
    "DS213": "expert parallel size does not divide world size / experts",
    "DS214": "native DeepSpeed MoE at ZeRO stage 3",
    "DS215": "partial optimizer offload needs ZeRO stage 3",
    "DS216": "master-weight / optimizer-state precision option needs ZeRO stage 1-3",
    "DS217": "compute_grad_norm=false needs ZeRO stage 1 or 2",
    "DS218": "gradient_allreduce_op 'sum' at ZeRO stage 3",
    "DS219": "parallel sizes do not divide world size",
    "DS220": "fp16 dynamic loss scaling with a non-positive window or floor",
}

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

    def model_dump(self) -> dict[str, Any]:
        """The fields as a dict (file, pointer, line, column, severity, code, message, suggestion)."""
        return asdict(self)

    @property
    def is_input_error(self) -> bool:
        return self.code.startswith(INPUT_ERROR_PREFIX)

    def format_text(self) -> str:
        """Compiler-style one-liner: ``file:line:col: error[CODE]: message (suggestion)``."""
        loc = self.file
        if self.line is not None:
            loc += f":{self.line}:{self.column or 1}"
        where = f" at {self.pointer}" if self.pointer and self.line is None else ""
        text = f"{loc}: {self.severity}[{self.code}]: {self.message}{where}"
        if self.suggestion:
            text += f" ({self.suggestion})"
        return text


def escape_pointer_token(token: str) -> str:
    """Escape one JSON-pointer reference token (RFC 6901 §3)."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer_of(path: tuple) -> str:
    """JSON pointer for a tuple of keys/indices."""
    return "".join("/" + escape_pointer_token(str(p)) for p in path)
