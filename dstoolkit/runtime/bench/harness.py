"""Benchmark harness core: timing, environment capture and local launch; the statistics live in
`runtime.bench.stats`, the JSON Lines results in `runtime.bench.results_jsonl`.

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
import datetime as _dt
import hashlib
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Iterator, Optional, Sequence

from dstoolkit.hardware.machine_calibration import cpu_model  # noqa: F401  (its one definition)

class BenchInputError(ValueError):
    """Bad user input for a bench (unknown op, size 0, impossible world size...). CLI maps it to exit 2."""


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


# one definition; re-exported for bench callers
from dstoolkit.runtime.train.launch import free_port, free_ports  # noqa: E402,F401


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


def run_tracked_cells(cells: list, out_path: str, run_cell: Callable[..., dict]) -> None:
    """The ``--worker`` side of `run_rank_cells` for the memory benchmarks: one gloo process group, the counting
    CPU allocator (`dstoolkit.runtime.alloc_tracker`) installed before any cell builds a model, then
    ``run_cell(cell, torch, deepspeed, rank, tracker)`` per cell, one JSON line each (an exception is recorded
    and the next cell runs), all ranks meeting at a barrier between cells."""
    import gc

    import deepspeed
    import torch

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.alloc_tracker import AllocTracker
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()
    rank = torch.distributed.get_rank()
    tracker = AllocTracker.install()  # before any cell builds a model: every later CPU allocation is counted
    for cell in cells:
        t0 = time.time()
        rec = dict(cell=cell, rank=rank, world=torch.distributed.get_world_size())
        try:
            rec.update(ok=True, **run_cell(cell, torch, deepspeed, rank, tracker))
        except Exception as exc:  # record and continue with the next cell
            import traceback

            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc()[-2000:])
        gc.collect()
        rec["seconds"] = round(time.time() - t0, 2)
        with open(out_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        torch.distributed.barrier()
