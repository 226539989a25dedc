"""Benchmark results as JSON Lines, written and resumed the same way by every bench (split from
runtime.bench.harness): records are appended, flushed and fsynced, never rewritten; a run is closed by a
``run_done`` record, and an interrupted run resumes where it stopped, skipping the rows it already has. Records are
appended only to a new file or to a file of this project's records (`check_results_file`): never to a user's JSON
document, which a line appended would make invalid. No torch."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import sys
import uuid
from typing import Any, Callable, Iterable, Optional

#: Version of the record layout written by this module; bump when a field changes meaning.
RECORD_SCHEMA_VERSION = 1

#: Marker event that closes a run. A run with no such record was interrupted and can be resumed.
RUN_DONE_EVENT = "run_done"


def append_records(path: pathlib.Path | str, records: Iterable[dict[str, Any]]) -> None:
    """Append records as JSON Lines, flushed and fsynced so an interrupt loses at most the current row.

    The file is only ever opened in append mode: existing results are never rewritten. A file whose last
    line was cut off (an interrupted write) gets a newline first, so the new records start on a line of their
    own; the cut-off line stays as it is (`read_records` reports it).
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        if lacks_final_newline(path):
            fh.write("\n")
        for rec in records:
            fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def lacks_final_newline(path: pathlib.Path) -> bool:
    """The file is not empty and its last byte is not a newline (a cut-off last line)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        if fh.tell() == 0:
            return False
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) != b"\n"


@dataclasses.dataclass(frozen=True)
class BadLine:
    """A line of a JSON Lines file that holds no record."""

    file: pathlib.Path
    line: Optional[int]
    """1-based line number; None for a line `read_ends` read from the end of a long file."""
    reason: str


class Records(list):
    """What `read_records` returns: the records (a plain list of dicts, in file order), plus `bad_lines`, the
    lines that could not be read as a record, and `lines`, each record's (file, 1-based line number)."""

    def __init__(self) -> None:
        super().__init__()
        self.bad_lines: list[BadLine] = []
        self.lines: list[tuple[pathlib.Path, int]] = []

    def bad_lines_message(self, limit: int = 8) -> str:
        """'N line(s) could not be read as records: FILE line 4 (reason), ...' ('' when every line was a record)."""
        return describe_bad_lines(self.bad_lines, limit)


def describe_bad_lines(bad: list[BadLine], limit: int = 8) -> str:
    """One sentence naming how many lines held no record, and which (file, line number, why), at most `limit`."""
    if not bad:
        return ""
    shown = "; ".join(f"{b.file} line {b.line} ({b.reason})" for b in bad[:limit])
    more = f"; and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"{len(bad)} line(s) could not be read as records and were skipped: {shown}{more}"


_JSON_KIND = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def read_records(path: pathlib.Path | str) -> Records:
    """Read a JSON Lines file (or every ``*.jsonl`` under a directory) into a `Records` list.

    Lines that are not a JSON object (a line cut off by an interrupted write, text, a bare number) are left
    out and listed in the answer's `bad_lines` with their line numbers; blank lines are ignored.
    """
    path = pathlib.Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    out = Records()
    for f in files:
        if not f.exists():
            continue
        text = f.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        for no, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                cut = no == len(lines) and not text.endswith("\n")
                why = "cut off: the last line has no newline (an interrupted write?)" if cut else f"not JSON: {exc.msg}"
                out.bad_lines.append(BadLine(f, no, why))
                continue
            if not isinstance(rec, dict):
                out.bad_lines.append(BadLine(f, no, f"a JSON {_JSON_KIND.get(type(rec), 'value')}, not an object"))
                continue
            rec.setdefault("_file", f.name)
            out.append(rec)
            out.lines.append((f, no))
    return out


class NotResultsFileError(ValueError):
    """An existing file that is not JSON Lines of `dstoolkit bench` records, so appending records to it would spoil
    it (a DeepSpeed JSON over several lines, a text file). A ValueError (an input error, exit 2); its text names the
    file (and the flag), why, and the fix."""


def is_bench_record(rec: Any) -> bool:
    """A record this project's benches write: a JSON object with a string ``bench`` field (`base_record`,
    `close_run`)."""
    return isinstance(rec, dict) and isinstance(rec.get("bench"), str)


def results_file_problem(path: pathlib.Path | str, records: Optional[Records] = None) -> Optional[str]:
    """Why records must not be appended to the existing file `path`, or None (no file, an empty one, or JSON Lines
    holding at least one bench record): `jsonl_append_problem` for dstoolkit bench records. `records`:
    `read_records(path)` when the caller has it already."""
    return jsonl_append_problem(path, is_bench_record, "dstoolkit bench record", 'no "bench" field', records)


CHECK_END_BYTES = 64 * 1024
"""How much of an existing file `jsonl_append_check` reads at each end. A file up to twice this is read whole and
judged line by line; a longer one by the complete lines of its first and last CHECK_END_BYTES (a 93 MB metrics file
was read whole, on every rank: 2.5 s per rank before the run started)."""


@dataclasses.dataclass(frozen=True)
class FileEnds:
    """What `read_ends` read of a file."""

    lines: list[tuple[Optional[int], str]]
    """Its non-blank lines read, each with its 1-based line number (None for lines read from the end of a long file)."""
    whole: bool
    """`lines` are all the file's lines; else the complete lines of its first and last `CHECK_END_BYTES`."""
    text: str
    """The whole text when `whole`, else ''."""
    cut_last: bool
    """The file's last byte is not a newline: its last line was cut off (an interrupted write)."""


def read_ends(path: pathlib.Path | str, end_bytes: int = CHECK_END_BYTES) -> FileEnds:
    """The lines of `path` a check needs: all of a file of at most 2 x `end_bytes`, else the complete lines in its
    first and its last `end_bytes` (a line cut by either boundary is left out)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(0)
        if size <= 2 * end_bytes:
            raw = fh.read()
            text = raw.decode("utf-8", errors="replace")
            lines = [(no, line) for no, line in enumerate(text.splitlines(), 1) if line.strip()]
            return FileEnds(lines, True, text, bool(raw) and not raw.endswith(b"\n"))
        head = fh.read(end_bytes)
        fh.seek(size - end_bytes)
        tail = fh.read()
    head = head[:head.rfind(b"\n") + 1]  # up to its last newline: complete lines only
    first_nl = tail.find(b"\n")
    tail = tail[first_nl + 1:] if first_nl >= 0 else b""  # from the first newline on (a line longer: none)
    lines: list[tuple[Optional[int], str]] = [
        (no, line) for no, line in enumerate(head.decode("utf-8", errors="replace").splitlines(), 1) if line.strip()]
    lines += [(None, line) for line in tail.decode("utf-8", errors="replace").splitlines() if line.strip()]
    return FileEnds(lines, False, "", bool(tail) and not tail.endswith(b"\n"))


@dataclasses.dataclass(frozen=True)
class AppendCheck:
    """What `jsonl_append_check` found: `problem`, why nothing may be appended (None: records may be); `note`, what
    the user should know about a file records may be appended to (None: nothing)."""

    problem: Optional[str] = None
    note: Optional[str] = None


def jsonl_append_problem(path: pathlib.Path | str, is_record: Callable[[Any], bool], record_name: str, mark: str,
                         records: Optional[Records] = None) -> Optional[str]:
    """`jsonl_append_check(...).problem`."""
    return jsonl_append_check(path, is_record, record_name, mark, records).problem


def _parse_line(line: str, cut: bool) -> tuple[Any, Optional[str]]:
    """(the record, None), or (None, why the line holds none): `read_records`' reasons."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, "cut off: the last line has no newline (an interrupted write?)" if cut else f"not JSON: {exc.msg}"
    if not isinstance(rec, dict):
        return None, f"a JSON {_JSON_KIND.get(type(rec), 'value')}, not an object"
    return rec, None


def _opens_record(line: str, openings: tuple[str, ...]) -> bool:
    """`line` (cut off) is the start of a record a writer writes: it starts with one of `openings` (the text every
    record of that writer starts with), or is cut inside one."""
    line = line.strip()
    return any(line.startswith(o) or o.startswith(line) for o in openings) if line else False


def jsonl_append_check(path: pathlib.Path | str, is_record: Callable[[Any], bool], record_name: str, mark: str,
                       records: Optional[Records] = None, cut_openings: tuple[str, ...] = ()) -> AppendCheck:
    """May JSON Lines of `record_name` records be appended to the existing file `path`? Yes: no file, an empty one,
    or JSON Lines holding at least one record `is_record` accepts (lines that are not records there, such as a last
    line cut off by an interrupted write, are tolerated as `read_records` reports them), or a file whose only line is
    cut off and starts as a record of this writer does (`cut_openings`: a run killed while writing its first record;
    accepted with a note). Otherwise the lines appended would spoil the file: one JSON document over several lines (a
    config), text (a YAML spec, notes), or another tool's JSON Lines (`mark`: what their records lack). The one rule
    of every file this project appends records to (bench --out, the trainer's --metrics-out). Reads at most
    2 x `CHECK_END_BYTES` (`read_ends`); `records`: `read_records(path)` when the caller has it already."""
    path = pathlib.Path(path)
    if not path.is_file():
        return AppendCheck()
    ends = read_ends(path)
    lines = ends.lines
    kib = CHECK_END_BYTES // 1024
    if not lines:
        return AppendCheck() if ends.whole else AppendCheck(
            f"no line in its first or last {kib} KiB ends there: not JSON Lines of {record_name}s")
    if ends.whole and len(lines) > 1:
        try:
            json.loads(ends.text)
        except json.JSONDecodeError:
            pass  # JSON Lines (or not JSON at all): one record per line, below
        else:
            return AppendCheck(f"it is one JSON document over {len(lines)} lines, not JSON Lines of {record_name}s; "
                               "a record appended would make it invalid JSON")
    if not ends.whole and lines[-1][1].strip() in ("}", "]") and _parse_line(lines[0][1], False)[1]:
        return AppendCheck(f"it is one JSON document over many lines (its first line is not JSON on its own, its last "
                           f"a bare {lines[-1][1].strip()}), not JSON Lines of {record_name}s; a record appended would "
                           "make it invalid JSON")
    parsed = [(no, *_parse_line(line, ends.cut_last and i == len(lines) - 1)) for i, (no, line) in enumerate(lines)]
    if records is None:
        found = [rec for _, rec, _ in parsed if rec is not None]
        bad = [BadLine(path, no, why) for no, _, why in parsed if why]
    else:
        found, bad = list(records), records.bad_lines
    if any(is_record(r) for r in found):
        return AppendCheck()
    if len(lines) == 1 and ends.cut_last and parsed[0][2] and _opens_record(lines[0][1], cut_openings):
        # cut off: not JSON on its own (a whole object without its newline is another tool's record, refused below)
        return AppendCheck(note=f"its only line is cut off ({lines[0][1].strip()[:40]!r}): a run killed while writing "
                                "its first record; it stays as it is (the file is only appended to) and the records "
                                "appended start on a line of their own")
    where = f"its {len(lines)} line(s)" if ends.whole else (
        f"the {len(lines)} line(s) in its first and last {kib} KiB")
    if bad:
        first = bad[0]
        at = f"line {first.line}" if first.line is not None else "a line near its end"
        return AppendCheck(f"none of {where} is a {record_name} ({len(bad)} of them not a JSON object; the first, "
                           f"{at}: {first.reason}); records appended would mix with it")
    held = f"its {len(found)} JSON record(s)" if ends.whole else (
        f"the {len(found)} JSON record(s) in its first and last {kib} KiB")
    return AppendCheck(f"none of {held} is a {record_name} ({mark}); records appended would mix with another tool's "
                       "data")


def check_results_file(path: pathlib.Path | str, name: Optional[str] = None, records: Optional[Records] = None) -> None:
    """Raise `NotResultsFileError` when `path` exists and is not a results file records may be appended to
    (`results_file_problem`). ``name``: how the caller's input names the path (``--out FILE``); default the path."""
    problem = results_file_problem(path, records)
    if problem:
        path = pathlib.Path(path)
        other = path.with_name(path.stem + ".jsonl")
        if other == path or other.exists():
            other = path.with_name(path.stem + "_bench.jsonl")
        raise NotResultsFileError(f"{name or path}: {problem}; nothing was written: give a new file to append the "
                                  f"records to (or a results file of dstoolkit bench), e.g. {other}")


@dataclasses.dataclass
class RunState:
    """Where a (possibly resumed) run stands."""

    run_id: str
    resumed: bool
    done_keys: set[str]
    """Row keys already recorded by this run (skipped on resume)."""


def open_run(path: Optional[pathlib.Path | str], bench: str, cfg_hash: str, resume: bool = True) -> RunState:
    """Start a new run, or resume the latest interrupted run of the same bench and config hash.

    A run is complete once a ``{"event": "run_done"}`` record with its run_id is written. Re-running
    the same command after an interrupt picks up the unfinished run's id and skips the rows it already
    has; re-running after a complete run starts a fresh run (results accumulate, nothing is overwritten).

    Raises:
        NotResultsFileError: `path` exists and is not a results file (`check_results_file`), resume or not; the
            CLI asks it before any rank starts, naming --out.
    """
    fresh = RunState(run_id=uuid.uuid4().hex[:12], resumed=False, done_keys=set())
    if path is None:
        return fresh
    everything = read_records(path)
    check_results_file(path, records=everything)
    if not resume:
        return fresh
    if everything.bad_lines:  # kept as they are; the new records start on a line of their own
        print(f"# {path}: {everything.bad_lines_message()}", file=sys.stderr)
    records = [r for r in everything if r.get("bench") == bench and r.get("config_hash") == cfg_hash]
    if not records:
        return fresh
    last_run = records[-1].get("run_id")
    run_recs = [r for r in records if r.get("run_id") == last_run]
    if any(r.get("event") == RUN_DONE_EVENT for r in run_recs):
        return fresh
    keys = {r["key"] for r in run_recs if "key" in r and r.get("event") is None}
    return RunState(run_id=last_run, resumed=True, done_keys=keys)


def close_run(path: Optional[pathlib.Path | str], bench: str, cfg_hash: str, run_id: str, **extra: Any) -> None:
    """Write the run_done marker for a run (see `open_run`)."""
    if path is None:
        return
    rec = {"bench": bench, "config_hash": cfg_hash, "run_id": run_id, "event": RUN_DONE_EVENT,
           "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    rec.update(extra)
    append_records(path, [rec])


def run_rows(path: Optional[pathlib.Path | str], state: RunState, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every result row of the run `state` describes: the rows just measured, and on a resumed run also the rows its
    interrupted part wrote to `path` (read back, in file order)."""
    if path is None or not state.resumed:
        return new
    return [r for r in read_records(path) if r.get("run_id") == state.run_id and r.get("event") is None]


def base_record(bench: str, run_id: str, key: str, env: dict[str, Any]) -> dict[str, Any]:
    """Fields every result row starts with."""
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "bench": bench,
        "run_id": run_id,
        "key": key,
        "config_hash": env.get("config_hash"),
        "env": env,
    }
