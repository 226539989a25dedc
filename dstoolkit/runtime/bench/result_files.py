"""Reading the committed results that the pages quote: one folder, every read naming the file on failure, and the
two cell formats every table shares (a percentage, a link to the file a row was read from). No torch is imported here.
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Sequence

RESULTS = "benchmarks/results"
"""Where the committed results live, relative to the repository root."""


class PageError(ValueError):
    """A result file a table needs is missing or does not hold the field the table reads."""


class Results:
    """Read-only access to one results folder; every read names the file on failure."""

    def __init__(self, root: pathlib.Path):
        self.root = pathlib.Path(root)

    def _path(self, name: str) -> pathlib.Path:
        p = self.root / name
        if not p.is_file():
            raise PageError(f"{p}: result file not found (the page quotes it; rerun its benchmark or drop the row)")
        return p

    def json(self, name: str) -> Any:
        return json.loads(self._path(name).read_text(encoding="utf-8"))

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self._path(name).read_text(encoding="utf-8").splitlines() if line.strip()]

    def text(self, name: str) -> str:
        return self._path(name).read_text(encoding="utf-8")

    def newest_runs(self, stem: str, n: int) -> list[str]:
        """The n newest numbered runs of a benchmark's page (`<stem>_run<k>.md`, highest k first)."""
        runs = sorted(((int(m[1]), p.name) for p in self.root.glob(f"{stem}_run*.md")
                       if (m := re.fullmatch(re.escape(stem) + r"_run(\d+)\.md", p.name))), reverse=True)
        if not runs:
            raise PageError(f"{self.root}: no {stem}_run<k>.md (the page quotes the newest; rerun its benchmark)")
        return [name for _, name in runs[:n]]

    def match(self, name: str, pattern: str) -> re.Match:
        m = re.search(pattern, self.text(name))
        if m is None:
            raise PageError(f"{self.root / name}: no line matches {pattern!r} (the benchmark's summary line changed?)")
        return m


def pct(x: float, digits: int = 1, sign: bool = True) -> str:
    return f"{100 * x:{'+' if sign else ''}.{digits}f}%"


def files_cell(files: Sequence[str], prefix: str) -> str:
    out = []
    for f in files:
        out.append(f"[`{RESULTS}/{f}`]({prefix}{RESULTS}/{f})")
    return ", ".join(out)
