"""Benchmark harness core: timing, statistics, environment capture and JSON Lines results.

Every bench in this package goes through these pieces so that all results share one discipline:

* warm-up iterations are run and discarded before anything is timed;
* every timed repetition is bracketed by a synchronisation (device sync + barrier where distributed);
* the raw samples are kept in the record, and the summary is the median with p10/p90 and IQR, never one run;
* each record carries its environment (versions, hardware, world size, git commit, load average, config hash);
* results are appended to JSON Lines files (never rewritten), and an interrupted run resumes where it stopped.

No torch import at module import time: torch is only touched inside functions that need it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from dstoolkit.hardware.machine_calibration import cpu_model  # noqa: F401  (its one definition)

#: Version of the record layout written by this module; bump when a field changes meaning.
RECORD_SCHEMA_VERSION = 1

#: Marker event that closes a run. A run with no such record was interrupted and can be resumed.
RUN_DONE_EVENT = "run_done"


class BenchInputError(ValueError):
    """Bad user input for a bench (unknown op, size 0, impossible world size...). CLI maps it to exit 2."""


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples)."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    p10: float
    p90: float
    iqr: float
    """Inter-quartile range p75 - p25: the spread we quote next to the median."""
    rel_spread: float
    """(p90 - p10) / median: how noisy the median is, as a fraction."""

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method) of already sorted values.

    Args:
        sorted_values: ascending values, at least one.
        q: percentile in [0, 100].
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equally long sequences (tied values share their average rank);
    nan when either is constant."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def summarize(samples: Iterable[float]) -> Stats:
    """Median, mean, extremes, p10/p90 and IQR of raw samples.

    Args:
        samples: raw measurements; at least one.

    Returns:
        A `Stats` with the same unit as the samples.
    """
    values = sorted(float(v) for v in samples)
    if not values:
        raise ValueError("summarize() needs at least one sample")
    med = percentile(values, 50)
    p10, p90 = percentile(values, 10), percentile(values, 90)
    return Stats(
        n=len(values),
        median=med,
        mean=sum(values) / len(values),
        min=values[0],
        max=values[-1],
        p10=p10,
        p90=p90,
        iqr=percentile(values, 75) - percentile(values, 25),
        rel_spread=(p90 - p10) / med if med else 0.0,
    )


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def device_sync() -> None:
    """Wait for queued device work (CUDA) to finish; a no-op on CPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def dist_barrier() -> None:
    """Barrier over the default process group when one is initialised; otherwise nothing."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def sync_all() -> None:
    """Device sync then a barrier: the bracket around every timed repetition."""
    device_sync()
    dist_barrier()


def time_repeated(
    fn: Callable[[], Any],
    *,
    warmup: int,
    reps: int,
    inner: int = 1,
    sync: Callable[[], None] = sync_all,
    progress: Optional[Callable[[], None]] = None,
) -> list[float]:
    """Time ``fn`` with warm-up and synchronisation; returns raw per-call seconds, one per repetition.

    Each repetition runs ``fn`` ``inner`` times between two ``sync()`` calls and records
    wall time / inner (so short ops are timed as a loop, as nccl-tests does).

    Args:
        fn: the work to time.
        warmup: untimed calls before the first repetition.
        reps: timed repetitions (samples); at least 1.
        inner: calls per repetition.
        sync: called before and after each repetition.
        progress: optional callback after each repetition (progress bars).
    """
    if reps < 1 or inner < 1 or warmup < 0:
        raise BenchInputError(f"reps={reps}, inner={inner}, warmup={warmup}: reps and inner must be >= 1, warmup >= 0")
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / inner)
        if progress is not None:
            progress()
    return samples


class Timer:
    """Context manager measuring wall seconds with synchronisation on entry and exit."""

    def __init__(self, sync: Callable[[], None] = device_sync):
        self._sync = sync
        self.seconds = float("nan")

    def __enter__(self) -> "Timer":
        self._sync()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._t0


@contextlib.contextmanager
def progress_bar(total: int, desc: str, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yield an ``update(n)`` callable backed by tqdm (on stderr) when enabled, else a no-op."""
    if not enabled or total <= 0:
        yield lambda n=1: None
        return
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the venv; degrade silently otherwise
        yield lambda n=1: None
        return
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)
    try:
        yield bar.update
    finally:
        bar.close()


# --------------------------------------------------------------------------------------------------
# Environment capture
# --------------------------------------------------------------------------------------------------


def _pkg_version(name: str) -> Optional[str]:
    """Installed distribution version without importing the package (TE cannot import without CUDA)."""
    from importlib import metadata

    for candidate in (name, name.replace("-", "_")):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def git_commit(repo: Optional[pathlib.Path] = None) -> Optional[str]:
    """HEAD commit of the dstoolkit checkout, with '-dirty' when tracked files differ; None outside git."""
    repo = repo or pathlib.Path(__file__).resolve().parents[3]
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", "dstoolkit"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def config_hash(config: Any) -> str:
    """Stable short hash of a JSON-able config (sorted keys): identifies 'the same experiment'."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def load_average() -> Optional[list[float]]:
    """1/5/15-minute load average; recorded because this machine's CPUs are shared."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return None


def capture_env(world_size: int, backend: Optional[str] = None, config: Any = None,
                packages: Sequence[str] = ()) -> dict[str, Any]:
    """Everything a reader needs to compare one result with another: the one environment capture of the
    `dstoolkit bench` verbs and every benchmarks/*.py script.

    Args:
        world_size: ranks taking part.
        backend: torch.distributed backend (gloo, nccl) if any.
        config: the bench configuration; its hash goes in ``config_hash``.
        packages: further distributions whose versions matter to this bench (``packages``: name -> version,
            read from their metadata without importing them); the key is absent when none are asked for.
    """
    env: dict[str, Any] = {
        "torch": _pkg_version("torch"),
        "deepspeed": _pkg_version("deepspeed"),
        "transformer_engine": _pkg_version("transformer-engine") or _pkg_version("transformer_engine_torch"),
        "python": platform.python_version(),
        "cuda": None,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpu_model": None,
        "gpu_count": 0,
        "hostname": socket.gethostname(),
        "world_size": world_size,
        "backend": backend,
        "git_commit": git_commit(),
        "load_avg": load_average(),
        "config_hash": config_hash(config) if config is not None else None,
        "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if packages:
        env["packages"] = {name: _pkg_version(name) for name in packages}
    try:
        import torch

        env["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu_count"] = torch.cuda.device_count()
            env["gpu_model"] = torch.cuda.get_device_name(0)
    except Exception:  # pragma: no cover - env capture must never break a bench
        pass
    return env


# --------------------------------------------------------------------------------------------------
# Ports and processes
# --------------------------------------------------------------------------------------------------


from dstoolkit.runtime.train.launch import free_port  # noqa: E402,F401  (one definition; re-exported for bench callers)


def launched_env() -> Optional[tuple[int, int, int]]:
    """(rank, world_size, local_rank) when running under torchrun / the deepspeed launcher, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        return rank, world, local
    return None


def max_local_ranks(backend: str) -> int:
    """Most ranks one node can host: GPUs for nccl, CPU cores for gloo (one rank per core)."""
    if backend == "nccl":
        try:
            import torch

            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:  # pragma: no cover
            return 0
    return os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------
# JSON Lines results: append-only, resumable
# --------------------------------------------------------------------------------------------------


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


def run_rank_cells(script: pathlib.Path, cells: list, out_dir: pathlib.Path, timeout_s: float,
                   nproc: int = 2) -> list[dict]:
    """Run a benchmark script's ``--worker`` mode once under torchrun on `nproc` local ranks for many cells
    (one launch: DeepSpeed's start-up is paid once) and return the per-rank JSONL records it wrote to
    ``out_dir/rank<r>.jsonl``. The cells travel as ``out_dir/cells.json`` (``--cells-file``).

    Raises:
        RuntimeError: torchrun failed and no rank wrote a record (the end of its stderr is in the message).
    """
    repo = pathlib.Path(__file__).resolve().parents[3]
    out_dir.mkdir(parents=True, exist_ok=True)
    cells_path = out_dir / "cells.json"
    cells_path.write_text(json.dumps(cells))
    outs = [out_dir / f"rank{r}.jsonl" for r in range(nproc)]
    for p in outs:
        if p.exists():
            p.unlink()
    from dstoolkit.common.cpu_env import cpu_rank_env

    env = cpu_rank_env(dict(os.environ, OMP_NUM_THREADS="1",
                            PYTHONPATH=str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
           "127.0.0.1", "--master_port", str(free_port()), str(pathlib.Path(script).resolve()), "--worker",
           "--cells-file", str(cells_path), "--out", str(out_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=str(repo))
    recs = [json.loads(line) for p in outs if p.exists() for line in p.read_text().splitlines() if line.strip()]
    if proc.returncode != 0 and not recs:
        raise RuntimeError(f"torchrun failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return recs
