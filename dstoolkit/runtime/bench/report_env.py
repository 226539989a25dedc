"""Which environment (commit, software, hardware, backend, world size) measured which rows of `dstoolkit report`.

Rows of one report section can come from several runs: `--include 'train_*.jsonl'` reads files written at other
commits (other estimator versions), and the newest record per row key can come from different runs. An environment
line is written per group of rows that share one environment (`env_key`), and a section's summary is computed per
group, so no row is shown under another run's environment. No torch, no matplotlib.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

#: The `env` fields (`harness.capture_env`) that an environment line states for all of its rows; the time and the
#: load average vary per row and are shown as a range instead.
ENV_FIELDS = ("git_commit", "torch", "deepspeed", "transformer_engine", "gpu_model", "cpu_model", "cpu_count",
              "backend", "world_size")


def env_key(rec: dict[str, Any]) -> tuple:
    """The environment a record was measured in: its `ENV_FIELDS` values (all None for a record without env)."""
    env = rec.get("env") or {}
    return tuple(env.get(f) for f in ENV_FIELDS)


def env_groups(recs: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records split by `env_key`, groups in order of their first record, records in their given order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        groups.setdefault(env_key(r), []).append(r)
    return list(groups.values())


def _when(rec: dict[str, Any]) -> str | None:
    env = rec.get("env") or {}
    return env.get("timestamp_utc") or env.get("date")


def _span(recs: Sequence[dict[str, Any]], day_only: bool = False) -> str:
    """'T' or 'T0 to T1' over the records' measurement times (ISO 8601 UTC strings sort by time)."""
    times = sorted({t[:10] if day_only else t for t in (_when(r) for r in recs) if t})
    if not times:
        return "at an unrecorded time"
    return times[0] if len(times) == 1 else f"{times[0]} to {times[-1]}"


def env_line(recs: Sequence[dict[str, Any]]) -> str:
    """The italic environment line over `recs` (one `env_key` group: the fields are the same for every row), with
    the 1-min load range, the measurement time (or range) and, when the rows come from several runs, how many.
    '' when no record has an env."""
    envs = [r["env"] for r in recs if r.get("env")]
    if not envs:
        return ""
    e = envs[-1]
    loads = [r["env"]["load_avg"][0] for r in recs if (r.get("env") or {}).get("load_avg")]
    load = f"1-min load avg {min(loads):.2f}–{max(loads):.2f}" if loads else "load unknown"
    hw = e.get("gpu_model") or e.get("cpu_model")
    runs = {r.get("run_id") for r in recs if r.get("run_id")}
    runs_s = f" ({len(runs)} runs)" if len(runs) > 1 else ""
    return (f"_Environment: torch {e.get('torch')}, deepspeed {e.get('deepspeed')}, "
            f"TE {e.get('transformer_engine') or 'none'}, "
            f"{hw} ({e.get('cpu_count')} CPUs), backend {e.get('backend')}, world size {e.get('world_size')}, "
            f"commit {str(e.get('git_commit'))[:12]}, {load}, measured {_span(recs)}{runs_s}._")


def env_head(recs: Sequence[dict[str, Any]]) -> str:
    """A short name for one environment group: 'commit f8cf594f5f99, measured 2026-11-29' (the env line beneath
    says the rest)."""
    commit = ((recs[0].get("env") or {}).get("git_commit")) if recs else None
    who = f"commit {str(commit)[:12]}" if commit else "environment not recorded"
    return f"{who}, measured {_span(recs, day_only=True)}"


def by_env(recs: Sequence[dict[str, Any]], render: Callable[[list[dict[str, Any]]], list[str]]) -> list[str]:
    """A section's body, one environment at a time: `render(rows)` (its table and summary) under the rows' env line.
    Rows from one environment: the env line, then the table, as before; from several: a '### ' sub-head per
    environment, so each env line and summary covers exactly the rows of its table."""
    groups = env_groups(recs)
    if len(groups) == 1:
        return [env_line(groups[0]), "", *render(groups[0])]
    out = [f"These rows come from {len(groups)} environments ("
           + "; ".join(env_head(g) for g in groups) + "): one table, environment line and summary for each.", ""]
    for rows in groups:
        out += [f"### {env_head(rows)}", "", env_line(rows), "", *render(rows)]
    return out
