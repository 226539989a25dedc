"""The tables of measured figures in README.md and docs/*.md, rendered from the committed results.

Every figure in these tables is read from a file under ``benchmarks/results/`` (JSON / JSON Lines first; where a
benchmark keeps its summary only in its rendered markdown, that file), and every row names the file it came from.
A page holds each table between two markers::

    <!-- BEGIN generated: fidelity ... -->
    ...
    <!-- END generated: fidelity -->

and ``python -m dstoolkit.runtime.bench.pages --write`` replaces what lies between them; ``--check`` exits 1 when a
committed page differs from a fresh render (tests/unit/test_results_pages.py runs it). What each table says, read
from which file: `dstoolkit.runtime.bench.fidelity_table` (the README's) and `dstoolkit.runtime.bench.result_tables`
(the docs'). No torch is imported here.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
from typing import Optional

from dstoolkit.common.atomic import atomic_write_text
from dstoolkit.runtime.bench.result_files import RESULTS, PageError, Results
from dstoolkit.runtime.bench.result_tables import TABLES

REPO = pathlib.Path(__file__).resolve().parents[3]
PAGE_GLOBS = ("README.md", "docs/*.md")
COMMAND = "python -m dstoolkit.runtime.bench.pages --write"
_BLOCK = re.compile(r"(<!-- BEGIN generated: (?P<name>[\w-]+)[^\n]*-->\n)(?P<body>.*?)(<!-- END generated: (?P=name) -->)",
                    re.S)


# --------------------------------------------------------------------------------------------------
# pages
# --------------------------------------------------------------------------------------------------

def pages(root: pathlib.Path = REPO) -> list[pathlib.Path]:
    """README.md and docs/*.md under `root`."""
    out: list[pathlib.Path] = []
    for g in PAGE_GLOBS:
        out += sorted(root.glob(g))
    return out


def render_page(text: str, page: pathlib.Path, root: pathlib.Path = REPO,
                results: Optional[pathlib.Path] = None) -> str:
    """The page with every generated block re-rendered from the results (text outside the markers unchanged)."""
    res = Results(results or root / RESULTS)
    prefix = os.path.relpath(root, page.parent).replace(os.sep, "/") + "/"
    prefix = "" if prefix == "./" else prefix

    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in TABLES:
            raise PageError(f"{page}: unknown generated table {name!r}; known: {', '.join(TABLES)}")
        return m.group(1) + "\n".join(TABLES[name](res, prefix)) + "\n" + m.group(4)

    return _BLOCK.sub(sub, text)


def stale(root: pathlib.Path = REPO, results: Optional[pathlib.Path] = None) -> list[pathlib.Path]:
    """Pages whose generated blocks differ from a fresh render."""
    out = []
    for p in pages(root):
        text = p.read_text(encoding="utf-8")
        if render_page(text, p, root, results) != text:
            out.append(p)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dstoolkit.runtime.bench.pages",
                                 description="Render the tables of measured figures in README.md and docs/*.md "
                                             "from benchmarks/results/.")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the generated blocks in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page differs from a fresh render")
    ap.add_argument("--root", type=pathlib.Path, default=REPO, help="repository root (default: this checkout)")
    args = ap.parse_args(argv)
    try:
        if args.check:
            bad = stale(args.root)
            for p in bad:
                print(f"{p}: generated tables differ from benchmarks/results/; run: {COMMAND}", file=sys.stderr)
            return 1 if bad else 0
        for p in pages(args.root):
            text = p.read_text(encoding="utf-8")
            new = render_page(text, p, args.root)
            if new != text:
                atomic_write_text(p, new)
                print(f"wrote {p}")
        return 0
    except PageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
