"""Lenient, position-tracking reader for DeepSpeed config text.

DeepSpeed reads config files with ``hjson.load`` (``deepspeed/runtime/config.py``,
``DeepSpeedConfig.__init__``), so comments, trailing commas, unquoted keys and unquoted values are accepted.
This reader accepts the same things, reports each as a warning, and records where every key sits so that
findings carry a line and column. Differences from plain JSON that matter:

- Duplicate keys: DeepSpeed raises (``dict_raise_error_on_duplicate_keys``); reported as an error, last wins.
- Unquoted values (``"stage": ZERO_STAGE``): hjson reads the rest of the line as a string, trailing comma
  included; so do we, with a warning. Template placeholders therefore show up as strings, as in DeepSpeed.
- ``NaN`` / ``Infinity``: not JSON; hjson reads them as strings. Rejected as an input error here.
- Depth and size are capped so hostile input cannot exhaust the stack or memory.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from dstoolkit.dsconfig.registry import HJSON_INT_BELOW
from dstoolkit.validate.findings import Finding

MAX_TEXT_BYTES = 8 * 1024 * 1024
"""Largest config accepted (8 MiB). Real DeepSpeed configs are a few KiB; anything near this is not one."""
MAX_DEPTH = 64
"""Deepest nesting accepted. DeepSpeed's deepest section (compression_training) nests 6 levels."""

_NUMBER_RE = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_YAML_LINE_RE = re.compile(r"^(---\s*$|[A-Za-z_][\w\-. ]*:(\s|$)|- )")
_KEY_CHARS_STOP = set(",:[]{}\n\r")
_WS_RE = re.compile(r"[ \t\r\n\ufeff]*")
_SIMPLE_STRING_RE = re.compile(r'"([^"\\\n]*)"')


class ParseFatal(Exception):
    """Input that cannot be read as a config at all (maps to an input-error finding)."""

    def __init__(self, code: str, message: str, offset: int = 0, suggestion: Optional[str] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.offset = offset
        self.suggestion = suggestion


@dataclass
class ParseResult:
    """What `parse_text` returns: the data (None when fatal), key positions and syntax findings."""

    data: Any
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    """JSON pointer -> (line, column) of the key (object members) or value (array items)."""
    value_positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    """JSON pointer -> (line, column) of the value."""
    findings: list[Finding] = field(default_factory=list)
    fatal: bool = False


class _Parser:
    def __init__(self, text: str, source: str):
        self.s = text
        self.n = len(text)
        self.i = 0
        self.source = source
        self.line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
        self.positions: dict[str, tuple[int, int]] = {}
        self.value_positions: dict[str, tuple[int, int]] = {}
        self.findings: list[Finding] = []
        self._noted: set[str] = set()

    # -- helpers -------------------------------------------------------------------------------
    def linecol(self, offset: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, offset) - 1
        return line + 1, offset - self.line_starts[line] + 1

    def note(self, code: str, severity: str, message: str, offset: int, pointer: str = "",
             suggestion: Optional[str] = None, once: bool = True) -> None:
        if once and code in self._noted:
            return
        self._noted.add(code)
        line, col = self.linecol(offset)
        self.findings.append(Finding(file=self.source, pointer=pointer, line=line, column=col, severity=severity,
                                     code=code, message=message, suggestion=suggestion))

    def fatal(self, message: str, offset: int | None = None, code: str = "DS001", suggestion: str | None = None):
        raise ParseFatal(code, message, self.i if offset is None else offset, suggestion)

    def skip_ws(self) -> bool:
        """Skip whitespace and comments; return True if a newline was crossed."""
        newline = False
        s, n = self.s, self.n
        while self.i < n:
            m = _WS_RE.match(s, self.i)
            if m.end() > self.i:
                if not newline and ("\n" in m.group(0) or "\r" in m.group(0)):
                    newline = True
                self.i = m.end()
                if self.i >= n:
                    break
            c = s[self.i]
            if c == "#" or (c == "/" and s.startswith("//", self.i)):
                self.note("DS010", "warning", "comment in config: not JSON; DeepSpeed's hjson reader skips it",
                          self.i, suggestion="remove comments so JSON tools (jq, editors) can read the file")
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j
            elif c == "/" and s.startswith("/*", self.i):
                self.note("DS010", "warning", "comment in config: not JSON; DeepSpeed's hjson reader skips it",
                          self.i, suggestion="remove comments so JSON tools (jq, editors) can read the file")
                j = s.find("*/", self.i + 2)
                if j < 0:
                    self.fatal("unterminated /* comment")
                newline = newline or ("\n" in s[self.i:j])
                self.i = j + 2
            else:
                break
        return newline

    # -- grammar -------------------------------------------------------------------------------
    def parse_document(self) -> Any:
        self.skip_ws()
        if self.i >= self.n:
            self.fatal("empty file: no JSON object", code="DS007")
        if self.s[self.i] not in "{[":
            # hjson allows a root object without braces; DeepSpeed configs never use it.
            self.fatal(f"expected '{{' at the start of the config, found {self.s[self.i]!r}")
        value = self.parse_value("", 0)
        self.skip_ws()
        if self.i < self.n:
            self.fatal(f"unexpected text after the end of the JSON value: {self.s[self.i:self.i + 20]!r}")
        return value

    def parse_value(self, ptr: str, depth: int) -> Any:
        if depth > MAX_DEPTH:
            self.fatal(f"nesting deeper than {MAX_DEPTH} levels; not a DeepSpeed config", code="DS003")
        s = self.s
        if self.i >= self.n:
            self.fatal("unexpected end of file")
        c = s[self.i]
        start = self.i
        self.value_positions[ptr] = self.linecol(start)
        if c == "{":
            return self.parse_object(ptr, depth)
        if c == "[":
            return self.parse_array(ptr, depth)
        if c == '"' or c == "'":
            return self.parse_string()
        if s.startswith("NaN", start) or s.startswith("Infinity", start) or s.startswith("-Infinity", start):
            word = "NaN" if c == "N" else ("-Infinity" if c == "-" else "Infinity")
            self.fatal(f"{word} is not a JSON number (at {ptr or '/'})", code="DS002",
                       suggestion="write a finite number; DeepSpeed's hjson reader would turn it into a string")
        m = _NUMBER_RE.match(s, start)
        if m and self._ends_value(m.end()):
            self.i = m.end()
            text = m.group(0)
            if "." in text or "e" in text or "E" in text:
                value = float(text)
                if "." not in text and value.is_integer() and abs(value) < HJSON_INT_BELOW:
                    return int(value)  # hjson reads 1e5 as the int 100000, 1e10 and above as floats
                if value in (float("inf"), float("-inf")):
                    self.fatal(f"number {text} overflows to infinity", start, code="DS002")
                return value
            return int(text)
        for word, val in (("true", True), ("false", False), ("null", None)):
            if s.startswith(word, start) and self._ends_value(start + len(word)):
                self.i = start + len(word)
                return val
        return self.parse_quoteless(ptr)

    def _ends_value(self, j: int) -> bool:
        s = self.s
        while j < self.n and s[j] in " \t":
            j += 1
        return j >= self.n or s[j] in ",]}\r\n#" or s.startswith("//", j) or s.startswith("/*", j)

    def parse_quoteless(self, ptr: str) -> str:
        start = self.i
        j = start
        s = self.s
        while j < self.n and s[j] not in "\r\n":
            j += 1
        text = s[start:j].rstrip()
        if not text or s[start] in ",:]}":
            self.fatal(f"expected a value, found {s[start:start + 1]!r}")
        self.i = start + len(text)
        self.note("DS012", "warning", f"unquoted value {text!r} is not JSON; DeepSpeed's hjson reader takes it as "
                  f"the string {text!r}", start, ptr, suggestion="replace template placeholders before use",
                  once=False)
        return text

    def parse_string(self) -> str:
        s = self.s
        m = _SIMPLE_STRING_RE.match(s, self.i)
        if m:  # no escapes: the common case
            self.i = m.end()
            return m.group(1)
        quote = s[self.i]
        if quote == "'":
            self.note("DS014", "warning", "single-quoted string is hjson, not JSON", self.i)
        self.i += 1
        out: list[str] = []
        while True:
            j = self.i
            while j < self.n and s[j] not in (quote, "\\", "\n"):
                j += 1
            out.append(s[self.i:j])
            if j >= self.n or s[j] == "\n":
                self.fatal("unterminated string", j)
            if s[j] == quote:
                self.i = j + 1
                return "".join(out)
            # escape
            if j + 1 >= self.n:
                self.fatal("unterminated string", j)
            e = s[j + 1]
            simple = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
            if e in simple:
                out.append(simple[e])
                self.i = j + 2
            elif e == "u":
                hexd = s[j + 2:j + 6]
                if len(hexd) != 4 or not all(ch in "0123456789abcdefABCDEF" for ch in hexd):
                    self.fatal("bad \\u escape in string", j)
                code = int(hexd, 16)
                self.i = j + 6
                low = s[j + 8:j + 12] if s.startswith("\\u", j + 6) else ""
                if 0xD800 <= code < 0xDC00 and len(low) == 4 and all(ch in "0123456789abcdefABCDEF" for ch in low) \
                        and 0xDC00 <= int(low, 16) < 0xE000:
                    code = 0x10000 + ((code - 0xD800) << 10) + (int(low, 16) - 0xDC00)  # UTF-16 surrogate pair
                    self.i = j + 12
                elif 0xD800 <= code < 0xE000:
                    code = 0xFFFD  # a lone surrogate cannot be printed or re-encoded; keep a placeholder
                out.append(chr(code))
            else:
                self.fatal(f"bad escape \\{e} in string", j)

    def parse_key(self) -> str:
        s = self.s
        if s[self.i] in "\"'":
            return self.parse_string()
        start = self.i
        j = start
        while j < self.n and s[j] not in _KEY_CHARS_STOP and not s[j].isspace():
            j += 1
        if j == start:
            self.fatal(f"expected a key, found {s[start:start + 1]!r}")
        self.note("DS014", "warning", "unquoted key is hjson, not JSON", start)
        self.i = j
        return s[start:j]

    def parse_object(self, path: str, depth: int) -> dict:
        self.i += 1
        obj: dict[str, Any] = {}
        seen_sep = True
        while True:
            newline = self.skip_ws()
            if self.i >= self.n:
                self.fatal("unterminated object: missing '}'")
            c = self.s[self.i]
            if c == "}":
                self.i += 1
                return obj
            if c == ",":
                if not obj or seen_sep and not newline:
                    self.fatal("unexpected ','")
                seen_sep = True
                self.i += 1
                save = self.i
                self.skip_ws()
                if self.i < self.n and self.s[self.i] == "}":
                    self.note("DS011", "warning", "trailing comma: not JSON; DeepSpeed's hjson reader accepts it",
                              save - 1, path)
                continue
            if not seen_sep:
                if newline:
                    self.note("DS014", "warning", "missing ',' between members (hjson allows a newline)", self.i)
                else:
                    self.fatal(f"expected ',' or '}}', found {c!r}")
            key_start = self.i
            key = self.parse_key()
            self.skip_ws()
            if self.i >= self.n or self.s[self.i] != ":":
                self.fatal(f"expected ':' after key {key!r}")
            self.i += 1
            self.skip_ws()
            ptr = path + "/" + (key.replace("~", "~0").replace("/", "~1") if ("~" in key or "/" in key) else key)
            if key in obj:
                line, col = self.linecol(key_start)
                first = self.positions.get(ptr)
                self.findings.append(Finding(
                    file=self.source, pointer=ptr, line=line, column=col, severity="error", code="DS013",
                    message=f"duplicate key {key!r}" + (f" (first at line {first[0]})" if first else "")
                    + "; DeepSpeed refuses the file ('Duplicate keys in DeepSpeed config')",
                    suggestion="keep one of them"))
            self.positions[ptr] = self.linecol(key_start)
            obj[key] = self.parse_value(ptr, depth + 1)
            seen_sep = False

    def parse_array(self, path: str, depth: int) -> list:
        self.i += 1
        arr: list[Any] = []
        seen_sep = True
        while True:
            newline = self.skip_ws()
            if self.i >= self.n:
                self.fatal("unterminated array: missing ']'")
            c = self.s[self.i]
            if c == "]":
                self.i += 1
                return arr
            if c == ",":
                if not arr or seen_sep:
                    self.fatal("unexpected ','")
                seen_sep = True
                self.i += 1
                save = self.i
                self.skip_ws()
                if self.i < self.n and self.s[self.i] == "]":
                    self.note("DS011", "warning", "trailing comma: not JSON; DeepSpeed's hjson reader accepts it",
                              save - 1, path)
                continue
            if not seen_sep and not newline:
                self.fatal(f"expected ',' or ']', found {c!r}")
            child = f"{path}/{len(arr)}"
            self.positions[child] = self.linecol(self.i)
            arr.append(self.parse_value(child, depth + 1))
            seen_sep = False


def looks_like_yaml(text: str) -> bool:
    """True when the first meaningful line reads like YAML (``key: value``, ``---``, ``- item``)."""
    for raw in text.splitlines()[:50]:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        return bool(_YAML_LINE_RE.match(line))
    return False


def parse_text(text: str, source: str = "<config>") -> ParseResult:
    """Parse config text leniently (hjson subset DeepSpeed accepts), never raising.

    Args:
        text: the file content.
        source: file name used in findings.

    Returns:
        ParseResult; ``fatal`` is True (and ``data`` None) when the text is not a config at all.
    """
    if len(text) > MAX_TEXT_BYTES:
        return _fatal_result(source, "DS004", f"file is {len(text) / 2**20:.1f} MiB; a DeepSpeed config is a few KiB "
                             f"(limit {MAX_TEXT_BYTES // 2**20} MiB)", None, "pass the config file, not a data file")
    if "\x00" in text:
        return _fatal_result(source, "DS005", "file contains NUL bytes: binary, not a JSON config", None, None)
    p = _Parser(text, source)
    try:
        data = p.parse_document()
    except ParseFatal as exc:
        code, msg, sugg = exc.code, exc.message, exc.suggestion
        if code == "DS001" and looks_like_yaml(text):
            code, msg = "DS006", "this is YAML, not a JSON DeepSpeed config (" + msg + ")"
            sugg = "DeepSpeed reads JSON/hjson; convert it (e.g. yaml.safe_load + json.dump) or pass the .json config"
        line, col = p.linecol(min(exc.offset, len(text)))
        notes = [f for f in p.findings if not (code == "DS006" and f.code == "DS010")]  # YAML '#': not hjson notes
        res = ParseResult(data=None, findings=notes, fatal=True)
        res.findings.append(Finding(file=source, pointer="", line=line, column=col, severity="error", code=code,
                                    message=msg, suggestion=sugg))
        return res
    except RecursionError:
        return _fatal_result(source, "DS003", "nesting too deep to read", None, None)
    if not isinstance(data, dict):
        res = ParseResult(data=None, findings=p.findings, fatal=True)
        res.findings.append(Finding(file=source, pointer="", line=1, column=1, severity="error", code="DS007",
                                    message=f"top level is a JSON {type(data).__name__}, not an object",
                                    suggestion='a DeepSpeed config is an object: {"train_batch_size": ...}'))
        return res
    return ParseResult(data=data, positions=p.positions, value_positions=p.value_positions, findings=p.findings)


def _fatal_result(source: str, code: str, message: str, line: Optional[int], suggestion: Optional[str]) -> ParseResult:
    return ParseResult(data=None, fatal=True, findings=[Finding(
        file=source, pointer="", line=line, column=1 if line else None, severity="error", code=code,
        message=message, suggestion=suggestion)])


def decode_bytes(raw: bytes, source: str) -> tuple[Optional[str], Optional[Finding]]:
    """Decode file bytes as UTF-8 text, or return an input-error finding for binary / oversized input."""
    if len(raw) > MAX_TEXT_BYTES:
        return None, Finding(file=source, pointer="", severity="error", code="DS004",
                             message=f"file is {len(raw) / 2**20:.1f} MiB; a DeepSpeed config is a few KiB "
                             f"(limit {MAX_TEXT_BYTES // 2**20} MiB)", suggestion="pass the config file")
    if b"\x00" in raw[:65536]:
        return None, Finding(file=source, pointer="", severity="error", code="DS005",
                             message="binary file (NUL bytes), not a JSON config")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return None, Finding(file=source, pointer="", severity="error", code="DS005",
                             message=f"not UTF-8 text ({exc.reason} at byte {exc.start}): binary, not a JSON config")
    return text, None
