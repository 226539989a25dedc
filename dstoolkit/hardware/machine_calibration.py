"""This machine's calibration: what a CPU's measured rates depend on (`machine_key`), where they are cached, and
probing them once (`dstoolkit.runtime.probe`, started as a subprocess so this module never imports torch).

`hardware.calibration` decides which calibration an estimate uses and reads it; it asks this module for the
"machine" one. No torch import.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional

from dstoolkit.common.cpu_env import cpu_rank_env

PROBE_RANKS = 2
"""Ranks the probe runs side by side: the CPU jobs here run 2 ranks on 2 cores, and per-rank rates depend on it."""


class ProbeError(RuntimeError):
    """Probing this machine failed; the message has the end of the probe's output."""


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux), else platform.processor() (what a calibration and every benchmark
    record name the machine by)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass

    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The CPU features that change GEMM rates by dtype (native bf16 / AMX / AVX-512)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return sorted(f for f in set(flags) if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx_vnni"))


def _torch_version() -> Optional[str]:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


PROBE_VERSION = 4
"""What the probe measures; a cached calibration from another version is probed again (2: GEMM peak added; 3: op-level rates - GEMM grid fit, attention grid, elementwise per saved byte; 4: more repetitions, elementwise through the origin)."""


def machine_key(ranks: int = PROBE_RANKS) -> dict[str, Any]:
    """What a CPU calibration depends on: CPU model and features, usable cores, torch version, ranks, and the
    probe's version."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return {"cpu": cpu_model(), "flags": cpu_flags(), "cores": cores, "torch": _torch_version(), "ranks": ranks,
            "probe": PROBE_VERSION}


def cache_dir() -> pathlib.Path:
    """Where machine calibrations are cached: $DSTOOLKIT_CACHE_DIR, else $XDG_CACHE_HOME/dstoolkit, else
    ~/.cache/dstoolkit (one file per machine key under calibration/)."""
    root = os.environ.get("DSTOOLKIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dstoolkit")
    return pathlib.Path(root) / "calibration"


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


PROBE_TIMEOUT_S = 900.0
"""The probe's ranks are killed after this long (it takes 5-30 s on 2 cores)."""
PROBE_LINES_SHOWN = ("calibrated in", "warning:")
"""Probe output passed on to the user: its summary and a busy-machine warning; and every line about a
torch-extension lock (dstoolkit.runtime.jitlock, before the ranks start and inside them: a stale lock removed,
a live build waited for)."""


def _probe_subprocess(out: pathlib.Path, key: dict[str, Any]) -> None:
    cmd = [sys.executable, "-m", "dstoolkit.runtime.probe", "--out", str(out), "--ranks", str(key["ranks"]),
           "--key", json.dumps(key)]
    env = cpu_rank_env(dict(os.environ, OMP_NUM_THREADS="1"))  # the ranks' allocator settings, as jobs get them
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(PROBE_TIMEOUT_S, proc.kill)
    timer.start()
    lines = []
    try:
        for line in proc.stdout:  # as they come: a lock the probe removes or waits for is said while it happens
            lines.append(line.rstrip("\n"))
            if line.startswith(PROBE_LINES_SHOWN) or "torch-extension" in line:
                print(f"[dstoolkit] {line.rstrip()}", file=sys.stderr, flush=True)
        rc = proc.wait()
    finally:
        timer.cancel()
    if rc != 0 or not out.is_file():
        why = f"killed after {PROBE_TIMEOUT_S:.0f} s" if rc == -signal.SIGKILL else f"exit {rc}"
        raise ProbeError(f"probing this machine failed ({why}): {' | '.join(lines[-3:])}")


CONTENDED_CPU_SHARE = 0.8
"""A probe whose ranks ran less than this share of the elapsed time was sharing the CPU with other processes
(`cpu_share`): its block, elementwise and all-reduce rates come out low (a probe beside a busy test run read the
block rate 3.4x, the elementwise rate 16x below a quiet one on the same machine, and its estimate of the README
demo's step was 139% over the measured step), so it is probed again (`machine_calibration_path`)."""
REPROBE_AFTER_S = 600.0
"""A contended calibration is probed again at most this often: a machine that stays busy is not probed on every
estimate."""
SHARE_RATE = "matmul_flops_per_s_fp32_large"
"""The probe rate timed on both clocks that `cpu_share` compares (the whole block's forward + backward)."""


def cpu_share(record: dict[str, Any]) -> Optional[float]:
    """The share of the elapsed time the probe's ranks ran: its block rate on the wall clock over the same rate on
    the ranks' CPU-time clock (dstoolkit.runtime.probe times both; on a quiet machine they agree, ~1.0). None for a
    record without both."""
    cal = record.get("calibration") or {}
    wall, cpu = (cal.get(clock, {}).get(SHARE_RATE) for clock in ("wall", "cpu"))
    if not wall or not cpu:
        return None
    return min(1.0, float(wall) / float(cpu))


def _share_of(path: pathlib.Path) -> Optional[float]:
    try:
        return cpu_share(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def cached_machine_calibration_path(key: Optional[dict[str, Any]] = None) -> Optional[pathlib.Path]:
    """This machine's cached calibration file, or None when it was never probed (nothing is probed here: a
    training rank must not start a probe of its own beside the job's ranks)."""
    path = cache_dir() / f"cpu-{_key_digest(key or machine_key())}.json"
    return path if path.is_file() else None


def machine_calibration_path(key: Optional[dict[str, Any]] = None,
                             probe: Optional[Callable[[pathlib.Path, dict], None]] = None,
                             announce: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)
                             ) -> Optional[pathlib.Path]:
    """This machine's calibration file: cached for `key` (`machine_key()`), else probed now (once) and cached.

    Without torch installed nothing can be probed: None, and `announce` says that the packaged CPU reference
    stands in (hardware.calibration.calibration_path uses it). `probe(out_path, key)` runs the probe (default:
    `python -m dstoolkit.runtime.probe` in a subprocess).

    Raises:
        ProbeError: the probe failed (the message has the end of its output).
    """
    key = key or machine_key()
    path = cached_machine_calibration_path(key)
    if path is not None:
        return _reprobed_if_contended(path, key, probe, announce)
    path = cache_dir() / f"cpu-{_key_digest(key)}.json"
    if probe is None:
        if not _can_probe(key):
            announce("[dstoolkit] torch is not installed, so this CPU cannot be probed: CPU estimates use the "
                     "packaged reference calibration (measured on another machine; install dstoolkit[train] "
                     "to calibrate this one)")
            return None
        probe = _probe_subprocess
    announce(f"[dstoolkit] calibrating this CPU once ({key['cpu']}, {key['cores']} cores, torch {key['torch']}); "
             f"cached in {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    probe(path, key)
    return path


def _can_probe(key: dict[str, Any]) -> bool:
    """Whether this interpreter can run the probe: torch is installed (and the machine key saw it)."""
    return key.get("torch") is not None and importlib.util.find_spec("torch") is not None


def _reprobed_if_contended(path: pathlib.Path, key: dict[str, Any],
                           probe: Optional[Callable[[pathlib.Path, dict], None]],
                           announce: Callable[[str], None]) -> pathlib.Path:
    """The cached calibration, probed again first when other processes shared the CPU while it was probed
    (`cpu_share` below CONTENDED_CPU_SHARE) and it is older than REPROBE_AFTER_S: the less contended of the two
    probes is kept (a machine still busy keeps the better one and waits REPROBE_AFTER_S again)."""
    share = _share_of(path)
    if share is None or share >= CONTENDED_CPU_SHARE:
        return path
    if time.time() - path.stat().st_mtime < REPROBE_AFTER_S:
        return path
    if probe is None:
        if not _can_probe(key):
            return path
        probe = _probe_subprocess
    announce(f"[dstoolkit] this CPU's calibration ({path}) was probed while other processes used the CPU (its ranks "
             f"ran {share:.0%} of the time, so its rates read low); probing again")
    fresh = path.with_name(path.stem + ".reprobe.json")
    try:
        probe(fresh, key)
    except ProbeError as exc:
        announce(f"[dstoolkit] probing again failed, keeping the earlier calibration: {exc}")
        path.touch()
        return path
    new = _share_of(fresh)
    if new is not None and new > share:
        os.replace(fresh, path)
    else:
        fresh.unlink(missing_ok=True)
        path.touch()  # still busy: keep the better probe, and wait REPROBE_AFTER_S before trying again
    return path
