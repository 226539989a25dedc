"""Torch-extension build locks: remove the ones whose holder is gone, wait (with a message) on live ones.

torch JIT-builds C++ extensions (DeepSpeed's cpu_adam, deepspeed_shm_comm, fused_adam...) under
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions/<py>_<device>/<op>/`` and takes a file baton,
``<build dir>/lock``, on every load, even when nothing is rebuilt (``torch.utils.file_baton.FileBaton``: the
file is created with O_EXCL, kept open while held and removed on release). A process killed while it holds
the baton leaves the file behind, and every later process loading that op waits on it forever, silently.

The guard runs where the wait happens:

* `check_locks` before every job this project starts (`dstoolkit train`, bench train, tune trials, the machine
  probe, the test session start) and in the generated ``launch.sh`` (``python -m dstoolkit.runtime.jitlock``);
* `guard_jit_waits` inside every rank dstoolkit's code runs in (the example trainer, the probe, the benches,
  the user-job metrics hook of ``bench train`` / ``tune``): torch's own wait on the baton
  (``FileBaton.wait``, an endless silent poll) is replaced by one that says every `REPORT_EVERY_S` what it
  waits for (op, lock path, age, the live process that builds it, or that none does) and removes a lock whose
  builder is gone, then lets torch take the lock and build the op itself.

A lock is *live* when some process

* has the lock file (or anything else in its build dir) open -- torch's baton keeps its descriptor open from
  the moment it creates the file (O_CREAT | O_EXCL) until it releases it;
* has its working directory in the build dir -- ninja runs there;
* is a compiler/ninja whose command line names the build dir or ``-DTORCH_EXTENSION_NAME=<op>``;

and *stale* when none does on two looks `STALE_CONFIRM_S` apart, whatever its age (a lock left a second
ago by a killed build is as dead as one left an hour ago; the second look covers a holder between closing its
descriptor and removing the file). A stale lock is removed with one line naming the op, the path, its age and
why; a live one is waited on, with a message every `REPORT_EVERY_S`, for at most ``wait_timeout_s``
(``DSTOOLKIT_JITLOCK_TIMEOUT_S``, default 600 s) by `check_locks` and for as long as it lives inside a rank.
Holders are seen through /proc: a builder on another host sharing the extensions folder over a network file
system is invisible (give each node its own ``TORCH_EXTENSIONS_DIR``).

No torch import at module level (psutil, a DeepSpeed dependency, walks the processes); `guard_jit_waits`
imports torch when a rank calls it.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

DEFAULT_MIN_AGE_S = 0.0
"""No age is required before a lock with no live holder is removed (callers may ask for one)."""
STALE_CONFIRM_S = 1.0
"""A lock is stale when no live process holds it on two looks this far apart."""
REPORT_EVERY_S = 5.0
"""A wait on a live build says what it waits for this often."""
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
            try:
                inside: Optional[bool] = _inside(proc.cwd(), build_dir)
            except (psutil.AccessDenied, psutil.ZombieProcess, FileNotFoundError, OSError):
                inside = None  # unreadable: a compile naming the op still counts
            # torch compiles in the op's build dir (cpp_extension._run_ninja_build): a compile naming the op from
            # elsewhere builds it for another TORCH_EXTENSIONS_DIR, not this lock
            names_op = inside is not False and any(
                f"-DTORCH_EXTENSION_NAME={op}" in a.split() or f"-DTORCH_EXTENSION_NAME={op}" == a for a in cmd)
            if names_op or (name in _COMPILERS and any(build_dir in a for a in cmd)):
                why = "builds it"
            elif inside:
                why = "works in its build dir"
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


def describe(lock: pathlib.Path, holders: list[str]) -> str:
    """'op X (path; N s old; pid P (name) builds it)' -- what a wait waits for."""
    age = _age_s(lock)
    who = holders[0] if holders else "no live process holds or builds it"
    return f"op {lock.parent.name} ({lock}; {_fmt_age(age or 0.0)} old; {who})"


def _identity(p: pathlib.Path) -> Optional[tuple[int, int]]:
    """(inode, mtime ns): the same lock file, not a new one taken since (another rank rebuilding the op)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def remove_stale(lock: pathlib.Path, say: Callable[[str], None], who: str,
                 seen: Optional[tuple[int, int]] = None) -> bool:
    """Unlink `lock` (judged stale) with one line naming it; False if it was gone, was replaced by a new lock
    since it was judged (`seen`: its `_identity` then), has a holder now, or cannot be removed."""
    age = _age_s(lock)
    if (seen is not None and _identity(lock) != seen) or lock_holders(lock):
        return False
    try:
        lock.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        say(f"{who}: cannot remove stale torch-extension lock for op {lock.parent.name} ({lock}): {exc}")
        return False
    say(f"{who}: removed stale torch-extension lock for op {lock.parent.name} ({lock}): {_fmt_age(age or 0.0)} "
        "old and no live process holds or builds it (a killed build left it)")
    return True


def check_locks(*, root: Optional[pathlib.Path] = None, since_s: Optional[float] = None,
                min_age_s: float = DEFAULT_MIN_AGE_S, wait_timeout_s: Optional[float] = None,
                log: Optional[Callable[[str], None]] = _default_log, who: str = "dstoolkit") -> LockReport:
    """Remove stale torch-extension locks and wait on live ones (see the module docstring).

    Args:
        root: The extensions folder (default `extensions_root()`).
        since_s: Only consider locks modified at or after this epoch time (None: every lock).
        min_age_s: A lock with no live holder is removed once it is also this old (default 0: any age).
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
    announced: dict[str, float] = {}  # lock -> when its wait was last reported
    unheld_since: dict[str, tuple[float, Optional[tuple[int, int]]]] = {}  # lock -> (first unheld look, identity)
    pending = list(locks)
    while pending:
        nxt, held = [], []
        now = time.monotonic()
        for lock in pending:
            key = str(lock)
            age = _age_s(lock)
            if age is None:  # released meanwhile
                if key in announced:
                    say(f"{who}: torch-extension lock for op {lock.parent.name} released; continuing")
                continue
            holders = lock_holders(lock)
            if holders:
                unheld_since.pop(key, None)
                if key not in announced:
                    announced[key] = now
                    rep.waited.append(key)
                    say(f"{who}: waiting up to {wait_timeout_s:.0f} s for the torch-extension build of "
                        f"{describe(lock, holders)}")
                elif now - announced[key] >= REPORT_EVERY_S:
                    announced[key] = now
                    say(f"{who}: still waiting for the torch-extension build of {describe(lock, holders)}")
                nxt.append(lock)
                held.append(lock)
                continue
            first, seen = unheld_since.setdefault(key, (now, _identity(lock)))
            if now - first >= STALE_CONFIRM_S and age >= min_age_s:
                if remove_stale(lock, say, who, seen):
                    rep.removed.append(key)
                    continue
                if _identity(lock) is None:
                    continue
                unheld_since.pop(key, None)  # replaced or taken meanwhile: judge it afresh
            nxt.append(lock)  # look again: a lock is judged stale on two looks STALE_CONFIRM_S apart
        pending = nxt
        if pending:
            if held and time.monotonic() >= deadline:
                for lock in held:
                    rep.still_held.append(str(lock))
                    say(f"{who}: gave up waiting after {wait_timeout_s:.0f} s on the torch-extension lock for op "
                        f"{lock.parent.name} ({lock}); still held, left in place -- a job loading this op will wait "
                        "until it is released")
                pending = [p for p in pending if p not in held]
                if not pending:
                    break
            time.sleep(POLL_S)
    return rep


class _RetryAfterStaleLock(Exception):
    """Raised out of the guarded baton wait inside `_jit_compile`: the lock was stale and is gone; build again."""


_guard_who: list[str] = []


def _guarded_wait(self) -> None:
    """`FileBaton.wait` with a voice: report the wait every REPORT_EVERY_S, remove a lock whose builder is gone."""
    lock = pathlib.Path(self.lock_file_path)
    who = _guard_who[0] if _guard_who else "dstoolkit"
    rank = os.environ.get("RANK")
    who = f"{who} rank {rank}" if rank is not None else who
    t0 = time.monotonic()
    last_report = None
    unheld = None  # (first look that saw no holder, the lock's identity then)
    while lock.exists():
        now = time.monotonic()
        holders = lock_holders(lock)
        if holders:
            unheld = None
        else:
            unheld = unheld if unheld is not None else (now, _identity(lock))
            if now - unheld[0] >= STALE_CONFIRM_S:
                removed = remove_stale(lock, _default_log, who, unheld[1])
                unheld = None
                if removed and getattr(_inside_jit, "on", False):
                    raise _RetryAfterStaleLock(str(lock))
                continue
        if last_report is None or now - last_report >= REPORT_EVERY_S:
            last_report = now
            say = "waiting" if now - t0 < REPORT_EVERY_S / 2 else f"still waiting ({now - t0:.0f} s)"
            _default_log(f"{who}: {say} for the torch-extension build of {describe(lock, holders)}")
        time.sleep(min(POLL_S, max(getattr(self, "wait_seconds", POLL_S), 0.05)))


import threading as _threading  # noqa: E402

_inside_jit = _threading.local()


def pin_ninja() -> Optional[str]:
    """Put the interpreter's own ``ninja`` (the pip wheel the venv installs) first on PATH; returns its path
    when PATH changed, None when it already came first or the interpreter has none beside it.

    torch runs ``ninja`` by name (``torch.utils.cpp_extension._run_ninja_build``), so which ninja builds an op
    depends on each process's PATH. Two versions that write different ``.ninja_log`` formats take turns
    rebuilding the same op: ninja 1.13 writes log v7 (rapidhash of the command), 1.11 (Debian's
    /usr/bin/ninja) reads that as a mismatch and rebuilds writing v5 (MurmurHash), and the next 1.13 process
    rebuilds again. Seen here: deepspeed_shm_comm rebuilt, 1.5-3.5 min each under load, by every job that
    alternated between a PATH with the venv's bin and one without (a test calling .venv/bin/python directly),
    while every other rank waited on the build lock.
    """
    bindir = os.path.dirname(sys.executable)
    own = os.path.join(bindir, "ninja")
    if not (os.path.isfile(own) and os.access(own, os.X_OK)):
        return None
    first = shutil.which("ninja")
    if first is not None and os.path.realpath(first) == os.path.realpath(own):
        return None
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    return own


def guard_jit_waits(who: str = "dstoolkit") -> bool:
    """Inside a rank: replace torch's silent wait on a JIT build lock by `_guarded_wait` and let
    `torch.utils.cpp_extension._jit_compile` build again after a stale lock was removed (the killed builder
    finished nothing). Idempotent; imports torch (call it in ranks only). Returns False without torch."""
    try:
        import torch.utils.cpp_extension as cpp
        from torch.utils.file_baton import FileBaton
    except ImportError:
        return False
    _guard_who[:] = [who]
    pin_ninja()  # one ninja for every build of an op, whatever PATH this rank was started with
    if getattr(FileBaton.wait, "_dstoolkit_guard", False):
        return True
    _guarded_wait._dstoolkit_guard = True  # type: ignore[attr-defined]
    FileBaton.wait = _guarded_wait
    jit = cpp._jit_compile

    def _jit_compile(*a, **k):
        while True:
            _inside_jit.on = True
            try:
                return jit(*a, **k)
            except _RetryAfterStaleLock:
                continue
            finally:
                _inside_jit.on = False

    cpp._jit_compile = _jit_compile
    return True


def clear_stale_extension_locks(since_s: float, grace_s: float = 5.0) -> list[str]:
    """Remove the locks created since `since_s` (epoch seconds) that nobody holds once `grace_s` old, waiting
    at most `grace_s` on held ones. Used by the tuner after it kills a trial's ranks.

    Returns:
        The paths removed.
    """
    return check_locks(since_s=since_s, min_age_s=grace_s, wait_timeout_s=grace_s, log=None).removed


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m dstoolkit.runtime.jitlock [--who NAME]``: check once (exit 1 when a lock is still held);
    the generated launch.sh runs it before it starts the ranks."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dstoolkit.runtime.jitlock", description=main.__doc__)
    ap.add_argument("--who", default="jitlock", help="prefix of the messages (the job about to start)")
    rep = check_locks(who=ap.parse_args(argv).who)
    if not rep.messages:
        print(f"jitlock: no torch-extension locks under {extensions_root()}", file=sys.stderr)
    return 1 if rep.still_held else 0


if __name__ == "__main__":
    sys.exit(main())
