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
        if _lacks_final_newline(path):
            fh.write("\n")
        for rec in records:
            fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _lacks_final_newline(path: pathlib.Path) -> bool:
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
    line: int
    """1-based line number."""
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


def jsonl_append_problem(path: pathlib.Path | str, is_record: Callable[[Any], bool], record_name: str, mark: str,
                         records: Optional[Records] = None) -> Optional[str]:
    """Why JSON Lines of `record_name` records must not be appended to the existing file `path`, or None: no file, an
    empty one, or JSON Lines holding at least one record `is_record` accepts (lines that are not records there, such
    as a last line cut off by an interrupted write, are tolerated as `read_records` reports them). Otherwise the
    lines appended would spoil the file: one JSON document over several lines (a config), text (a YAML spec, notes),
    or another tool's JSON Lines (`mark`: what their records lack). The one rule of every file this project appends
    records to (bench --out, the trainer's --metrics-out)."""
    path = pathlib.Path(path)
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if len(lines) > 1:
        try:
            json.loads(text)
        except json.JSONDecodeError:
            pass  # JSON Lines (or not JSON at all): one record per line, below
        else:
            return (f"it is one JSON document over {len(lines)} lines, not JSON Lines of {record_name}s; a "
                    "record appended would make it invalid JSON")
    records = read_records(path) if records is None else records
    if any(is_record(r) for r in records):
        return None
    if records.bad_lines:
        first = records.bad_lines[0]
        return (f"none of its {len(lines)} line(s) is a {record_name} ({len(records.bad_lines)} of them not a "
                f"JSON object; the first, line {first.line}: {first.reason}); records appended would mix with it")
    return (f"none of its {len(records)} JSON record(s) is a {record_name} ({mark}); records "
            "appended would mix with another tool's data")


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
