"""Benchmark results as JSON Lines, written and resumed the same way by every bench (split from
runtime.bench.harness): records are appended, flushed and fsynced, never rewritten; a run is closed by a
``run_done`` record, and an interrupted run resumes where it stopped, skipping the rows it already has. No torch."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import pathlib
import uuid
from typing import Any, Iterable, Optional

#: Version of the record layout written by this module; bump when a field changes meaning.
RECORD_SCHEMA_VERSION = 1

#: Marker event that closes a run. A run with no such record was interrupted and can be resumed.
RUN_DONE_EVENT = "run_done"


def append_records(path: pathlib.Path | str, records: Iterable[dict[str, Any]]) -> None:
    """Append records as JSON Lines, flushed and fsynced so an interrupt loses at most the current row.

    The file is only ever opened in append mode: existing results are never rewritten.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: pathlib.Path | str) -> list[dict[str, Any]]:
    """Read a JSON Lines file (or every ``*.jsonl`` under a directory); a torn last line is skipped."""
    path = pathlib.Path(path)
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    out: list[dict[str, Any]] = []
    for f in files:
        if not f.exists():
            continue
        for line in f.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # an interrupted write; the row will be redone on resume
            if isinstance(rec, dict):
                rec.setdefault("_file", f.name)
                out.append(rec)
    return out


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
    """
    fresh = RunState(run_id=uuid.uuid4().hex[:12], resumed=False, done_keys=set())
    if path is None or not resume:
        return fresh
    records = [r for r in read_records(path) if r.get("bench") == bench and r.get("config_hash") == cfg_hash]
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
