"""Torch-extension build locks: remove the ones whose holder is gone, wait (with a message) on live ones.

torch JIT-builds C++ extensions (DeepSpeed's cpu_adam, deepspeed_shm_comm, fused_adam...) under
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions/<py>_<device>/<op>/`` and takes a file baton,
``<build dir>/lock``, on every load, even when nothing is rebuilt (``torch.utils.file_baton.FileBaton``: the
file is created with O_EXCL, kept open while held and removed on release). A process killed while it holds
the baton leaves the file behind, and every later process loading that op waits on it forever, silently.

`check_locks` runs before every DeepSpeed job this project starts (the example trainer's launch, bench
train, tune trials, the machine probe, the test session start). A lock is *live* when some process

* has the lock file (or anything else in its build dir) open -- torch's baton keeps its descriptor open;
* has its working directory in the build dir -- ninja runs there;
* is a compiler/ninja whose command line names the build dir or ``-DTORCH_EXTENSION_NAME=<op>``;

and *stale* when none does and the file is older than ``min_age_s`` (a holder that has just created the
file and not yet started ninja leaves no other trace, for well under a second on a warm cache). A stale lock
is removed with one line naming the op and why; a live one is waited on, with a message, for at most
``wait_timeout_s`` (``DSTOOLKIT_JITLOCK_TIMEOUT_S``, default 600 s) and then left in place with a message.

No torch import (psutil, a DeepSpeed dependency, walks the processes).
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

DEFAULT_MIN_AGE_S = 10.0
"""A lock younger than this with no visible holder is given the benefit of the doubt (re-checked when older)."""
DEFAULT_WAIT_TIMEOUT_S = 600.0
"""How long a lock held by a live build is waited on before giving up (DSTOOLKIT_JITLOCK_TIMEOUT_S)."""
POLL_S = 0.5
_COMPILERS = ("ninja", "c++", "g++", "gcc", "cc", "clang", "clang++", "nvcc", "cc1plus", "ld", "sh", "hipcc")


def extensions_root() -> pathlib.Path:
    """Where torch builds extensions: TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions
    (torch.utils.cpp_extension._get_build_directory)."""
    return pathlib.Path(os.environ.get("TORCH_EXTENSIONS_DIR") or pathlib.Path.home() / ".cache" / "torch_extensions")


torch_extensions_dir = extensions_root  # the name dstoolkit.tune.objective used


def find_locks(root: Optional[pathlib.Path] = None) -> list[pathlib.Path]:
    """Every ``<root>/<op>/lock`` and ``<root>/<py_tag>/<op>/lock`` file."""
    root = root or extensions_root()
    if not root.is_dir():
        return []
    return sorted(p for p in list(root.glob("*/lock")) + list(root.glob("*/*/lock")) if p.is_file())


def _inside(path: str, build_dir: str) -> bool:
    return path == build_dir or path.startswith(build_dir + os.sep)


def lock_holders(lock: pathlib.Path) -> list[str]:
    """Live processes that hold or build `lock`'s op, each as "pid N (name): why" (empty: nobody)."""
    import psutil

    build_dir = str(lock.parent.resolve())
    op = lock.parent.name
    me = os.getpid()
    found: list[str] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        if proc.info["pid"] == me:
            continue
        why = None
        try:
            name = proc.info.get("name") or ""
            cmd = proc.info.get("cmdline") or []
            if any(f"-DTORCH_EXTENSION_NAME={op}" in a.split() or f"-DTORCH_EXTENSION_NAME={op}" == a
                   for a in cmd) or (name in _COMPILERS and any(build_dir in a for a in cmd)):
                why = "builds it"
            if why is None:
                try:
                    if _inside(proc.cwd(), build_dir):
                        why = "works in its build dir"
                except (psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError, OSError):
                    pass
            if why is None:
                try:
                    if any(_inside(f.path, build_dir) for f in proc.open_files()):
                        why = "has the lock open"
                except (psutil.AccessDenied, psutil.ZombieProcess, OSError):
                    pass
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if why:
            found.append(f"pid {proc.info['pid']} ({proc.info.get('name') or '?'}) {why}")
    return found


def _age_s(p: pathlib.Path) -> Optional[float]:
    try:
        return max(0.0, time.time() - p.stat().st_mtime)
    except FileNotFoundError:
        return None


def _mtime(p: pathlib.Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return float("-inf")


def _fmt_age(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


@dataclass
class LockReport:
    """What `check_locks` did."""

    removed: list[str] = field(default_factory=list)
    """Stale lock files removed."""
    waited: list[str] = field(default_factory=list)
    """Locks held by a live process that were waited on (released or not)."""
    still_held: list[str] = field(default_factory=list)
    """Locks still held by a live process when the wait timed out (left in place)."""
    messages: list[str] = field(default_factory=list)


def _default_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def check_locks(*, root: Optional[pathlib.Path] = None, since_s: Optional[float] = None,
                min_age_s: float = DEFAULT_MIN_AGE_S, wait_timeout_s: Optional[float] = None,
                log: Optional[Callable[[str], None]] = _default_log, who: str = "dstoolkit") -> LockReport:
    """Remove stale torch-extension locks and wait on live ones (see the module docstring).

    Args:
        root: The extensions folder (default `extensions_root()`).
        since_s: Only consider locks modified at or after this epoch time (None: every lock).
        min_age_s: A lock with no visible holder is removed once it is this old.
        wait_timeout_s: Longest wait on locks held by a live process (None: DSTOOLKIT_JITLOCK_TIMEOUT_S or 600 s).
        log: Where the one-line messages go (default stderr; None: nowhere, they are still in the report).
        who: Prefix of the messages (the job about to start).

    Returns:
        A `LockReport`. Never raises for a lock it cannot remove (the message says so).
    """
    if wait_timeout_s is None:
        wait_timeout_s = float(os.environ.get("DSTOOLKIT_JITLOCK_TIMEOUT_S") or DEFAULT_WAIT_TIMEOUT_S)
    rep = LockReport()

    def say(msg: str) -> None:
        rep.messages.append(msg)
        if log is not None:
            log(msg)

    locks = find_locks(root)
    if since_s is not None:
        locks = [p for p in locks if _mtime(p) >= since_s - 1.0]
    if not locks:
        return rep
    deadline = time.monotonic() + wait_timeout_s
    announced: set[str] = set()
    pending = list(locks)
    while pending:
        nxt, held = [], []
        for lock in pending:
            age = _age_s(lock)
            if age is None:  # released meanwhile
                if str(lock) in announced:
                    say(f"{who}: torch-extension lock for op {lock.parent.name} released; continuing")
                continue
            holders = lock_holders(lock)
            if holders:
                if str(lock) not in announced:
                    announced.add(str(lock))
                    rep.waited.append(str(lock))
                    say(f"{who}: waiting up to {wait_timeout_s:.0f} s for the torch-extension build of op "
                        f"{lock.parent.name} ({lock}; {holders[0]})")
                nxt.append(lock)
                held.append(lock)
            elif age >= min_age_s:
                try:
                    lock.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    say(f"{who}: cannot remove stale torch-extension lock for op {lock.parent.name} ({lock}): {exc}")
                    continue
                rep.removed.append(str(lock))
                say(f"{who}: removed stale torch-extension lock for op {lock.parent.name} ({lock}): "
                    f"{_fmt_age(age)} old and no live process holds or builds it (a killed build left it)")
            else:
                if str(lock) not in announced:
                    announced.add(str(lock))
                    say(f"{who}: torch-extension lock for op {lock.parent.name} ({lock}) is {age:.1f} s old with no "
                        f"visible holder; judging it when {min_age_s:.0f} s old")
                nxt.append(lock)  # too young to judge: look again once it is min_age_s old
        pending = nxt
        if pending:
            if held and time.monotonic() >= deadline:
                for lock in held:
                    rep.still_held.append(str(lock))
                    say(f"{who}: gave up waiting after {wait_timeout_s:.0f} s on the torch-extension lock for op "
                        f"{lock.parent.name} ({lock}); still held, left in place -- a job loading this op will wait "
                        "until it is released")
                pending = [p for p in pending if p not in held]
                # young unheld ones stay pending: judged once min_age_s old
                if not pending:
                    break
            time.sleep(POLL_S)
    return rep


def clear_stale_extension_locks(since_s: float, grace_s: float = 5.0) -> list[str]:
    """Remove the locks created since `since_s` (epoch seconds) that nobody holds once `grace_s` old, waiting
    at most `grace_s` on held ones. Used by the tuner after it kills a trial's ranks.

    Returns:
        The paths removed.
    """
    return check_locks(since_s=since_s, min_age_s=grace_s, wait_timeout_s=grace_s, log=None).removed


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m dstoolkit.runtime.jitlock``: check once (exit 1 when a lock is still held)."""
    rep = check_locks(who="jitlock")
    if not rep.messages:
        print(f"jitlock: no torch-extension locks under {extensions_root()}", file=sys.stderr)
    return 1 if rep.still_held else 0


if __name__ == "__main__":
    sys.exit(main())
