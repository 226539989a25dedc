"""`dstoolkit report`'s entry point: the results read and checked (`report_records`), the files it would write
checked before anything is written, then the markdown and PNG plots rendered (`report`'s sections).

What it writes never replaces a results file it reads, whatever --force says, and never replaces an existing
report or plot without --force; a failed write leaves none of the files this run created behind.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Optional

from dstoolkit.common.atomic import check_output_path
from dstoolkit.common.paths import same_file
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.report import (_comm_overhead_section, _comm_section, _overlap_section, _latest,
                                            _train_section, write_report)
from dstoolkit.runtime.bench.report_records import read_report_input


@dataclasses.dataclass
class ReportResult:
    """What `render_report` wrote."""

    markdown_path: pathlib.Path
    plots: list[pathlib.Path]
    counts: dict[str, int]
    """Rows shown per bench kind."""
    markdown: str
    skipped: list[str] = dataclasses.field(default_factory=list)
    """Lines and records left out, each 'FILE line N: why' (also listed at the end of the markdown)."""


def planned_plots(md_path: pathlib.Path, by_kind: dict[str, list[dict[str, Any]]]) -> list[pathlib.Path]:
    """The PNG files the sections will write for these records (named after the report: report.md ->
    report_comm_busbw.png), so they can be checked before anything is written."""
    prefix, d = md_path.stem, md_path.parent
    out = []
    if by_kind.get("comm"):
        out.append(d / f"{prefix}_comm_busbw.png")
    if by_kind.get("overlap"):
        out.append(d / f"{prefix}_overlap_eta.png")
    if any((r.get("estimate") or {}).get("step_time_s") and (r.get("measured") or {}).get("step_time_s_median")
           for r in by_kind.get("train", [])):
        out.append(d / f"{prefix}_train_step_time.png")
    return out


def check_outputs(md_path: pathlib.Path, plots: list[pathlib.Path], inputs: list[pathlib.Path], force: bool,
                  out_given: bool, given: Optional[str] = None) -> None:
    """Refuse (BenchInputError, naming -o and the fix) an output that is a folder, is or would become a
    results file, or replaces an existing report or plot without --force; and (`dstoolkit.common.atomic`'s errors,
    OSErrors or ValueErrors: exit 2) one that cannot be written: under a path part that is a file, ending with a
    separator (``given``: -o as typed; a Path drops the separator), ``-``, a link to nothing, an unwritable folder."""
    flag = f"-o {given or md_path}" if out_given else f"the report {md_path}"
    if md_path.is_dir():
        raise BenchInputError(f"{flag}: is a folder; pass the markdown file to write, e.g. -o {md_path / 'report.md'}")
    # a file in the path (-o f.json/sub/report.md), -o new/, an unwritable folder: atomic's one wording
    check_output_path(given if given is not None else md_path, name=flag, suggest="report.md")
    for p in plots:  # beside the report: a plot path that is a folder is refused before anything is written
        check_output_path(p)
    for f in inputs:
        if same_file(md_path, f):
            raise BenchInputError(f"{flag}: is the results file {f}, which the report reads (results are never "
                                  "overwritten, --force included); pick another name, e.g. -o "
                                  f"{f.parent / 'report.md'}")
    if md_path.suffix == ".jsonl":
        raise BenchInputError(f"{flag}: a .jsonl name would make the report a results file the next report reads; "
                              f"pick a markdown name, e.g. -o {md_path.with_suffix('.md')}")
    if force:
        return
    taken = [p for p in [md_path, *plots] if p.exists()]
    if taken:
        names = ", ".join(str(p) for p in taken)
        raise BenchInputError(f"{names} exist{'s' if len(taken) == 1 else ''} (this report would replace "
                              f"{'it' if len(taken) == 1 else 'them'}); pass --force to replace, or -o another "
                              "REPORT.md (the JSONL results are never touched)")


def render_report(results_dir: pathlib.Path | str, out: Optional[pathlib.Path | str] = None,
                  force: bool = False, pattern: str = "*.jsonl") -> ReportResult:
    """Render markdown + PNGs from every ``*.jsonl`` file in ``results_dir``.

    Args:
        results_dir: folder of JSON Lines result files.
        out: markdown file to write (default ``RESULTS_DIR/report.md``); PNGs go next to it.
        force: replace an existing report and its plots (otherwise refuse, so nothing is overwritten silently).
            A results file is never replaced.
        pattern: comma-separated globs of the result files to include (e.g. ``comm_*.jsonl,train_*.jsonl``).

    Raises:
        BenchInputError: the folder is missing or holds no readable records, or an output is refused
            (`check_outputs`).
        OSError / ValueError: ``out`` cannot be written (`check_outputs`, `dstoolkit.common.atomic`'s wording: a
            file in its path, a trailing separator, ``-``, an unwritable folder; nothing is written).
    """
    results_dir = pathlib.Path(results_dir)
    if not results_dir.is_dir():
        raise BenchInputError(f"RESULTS_DIR {str(results_dir)!r} is not a directory; pass the folder holding *.jsonl results")
    files = sorted({f for pat in include_patterns(pattern) for f in results_dir.glob(pat)})
    inputs = [f for f in files if f.suffix == ".jsonl" and f.is_file()]
    got = read_report_input(inputs)
    latest = _latest(got.records)
    if not latest:
        if got.skipped:
            raise BenchInputError(
                f"RESULTS_DIR {str(results_dir)!r} holds no record the report can show ({pattern}): "
                f"{len(got.skipped)} line(s) left out, the first: {got.skipped[0]}; fix or delete those lines, or "
                "rerun the bench with --out")
        raise BenchInputError(f"RESULTS_DIR {str(results_dir)!r} holds no benchmark records ({pattern}); run "
                              "`dstoolkit bench ... --out` first")
    md_path = pathlib.Path(out) if out else results_dir / "report.md"
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in latest:
        by_kind.setdefault(r["bench"], []).append(r)
    check_outputs(md_path, planned_plots(md_path, by_kind), inputs, force, out is not None,
                  given=None if out is None else str(out))
    md_path.parent.mkdir(parents=True, exist_ok=True)
    existed = {p for p in [md_path, *planned_plots(md_path, by_kind)] if p.exists()}
    plots: list[pathlib.Path] = []
    prefix = md_path.stem  # plots are named after the report: report.md -> report_comm_busbw.png
    lines = ["# Benchmark report", "", f"Rendered by `dstoolkit report` from {len(got.records)} records in "
             f"{len(inputs)} JSON Lines files ({pattern}); newest record per row (older runs stay in the files).", ""]
    try:
        if by_kind.get("comm"):
            lines += _comm_section(by_kind["comm"], md_path.parent, plots, prefix)
        if by_kind.get("comm_overhead"):
            lines += _comm_overhead_section(by_kind["comm_overhead"])
        if by_kind.get("overlap"):
            lines += _overlap_section(by_kind["overlap"], md_path.parent, plots, prefix)
        if by_kind.get("train"):
            lines += _train_section(by_kind["train"], md_path.parent, plots, prefix)
        if got.skipped:
            lines += [f"## Left out ({len(got.skipped)})", "", "Lines that are not records, or records whose fields "
                      "the tables cannot show:", ""] + [f"- {s}" for s in got.skipped] + [""]
        text = "\n".join(lines).rstrip() + "\n"
        write_report(md_path, text)
    except BaseException:
        for p in [*plots, md_path]:  # this run's new files only: an existing report or plot stays as it was
            if p not in existed and p.exists():
                p.unlink()
        raise
    return ReportResult(markdown_path=md_path, plots=plots, counts={k: len(v) for k, v in by_kind.items()},
                        markdown=text, skipped=got.skipped)


def include_patterns(pattern: str) -> list[str]:
    """--include's globs, each relative to RESULTS_DIR: an absolute one, or one that climbs out with '..', is a
    BenchInputError naming the flag, the value and the fix."""
    out = []
    for pat in (p.strip() for p in pattern.split(",")):
        if not pat:
            continue
        if pathlib.PurePath(pat).is_absolute() or ".." in pathlib.PurePath(pat).parts:
            name = pathlib.PurePath(pat).name or "*.jsonl"
            raise BenchInputError(f"--include {pat!r}: patterns are relative to RESULTS_DIR; use {name!r} (and pass the "
                                  "folder holding those files as RESULTS_DIR)")
        out.append(pat)
    return out
