"""One writer per --checkpoint-dir: a lock file in the checkpoint root naming the run that writes there.

Two runs saving into one folder replace each other's tags (`CheckpointManager._commit` swaps an existing tag) and
both exit 0 with interleaved trajectories; the second is often a relaunch with --resume while the first one's
ranks still run (orphans of a killed launcher). Global rank 0 takes the lock before training (`take`): a file
`WRITER_LOCK` created exclusively, holding its pid, host, the process's start time and when it took it. A second
run finds it and is refused (`live_writer_refusal`: one line naming the writer and the fix, exit 2); a lock whose
process is gone (same host, the pid dead or now another process) was left by a killed run and is taken over with
a printed note. The lock is removed when the run ends (`WriterLock.release`, also at exit); a SIGKILL leaves it
behind, stale, for the next run to take over. `dstoolkit train`'s pre-flight asks the same before any rank starts.
No torch import (psutil for the pid's start time, where installed).
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

WRITER_LOCK = ".dstoolkit-writer.lock"
"""The lock file's name in the checkpoint root."""
START_TIME_SLACK_S = 1.0  # a pid whose process started more than this away from the recorded time is another one


def _process_start(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch); None when unknown."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # psutil missing, no such process, no access
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """Who holds a lock: as written in the file (any field may be missing in a damaged one)."""

    pid: Optional[int]
    host: Optional[str]
    process_start: Optional[float]
    taken: Optional[float]

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.taken)) if self.taken else "an unknown time"
        return f"pid {self.pid} on host {self.host}, since {when}"

    def is_gone(self) -> bool:
        """True when the holder is known to have ended: same host, and its pid dead or now another process; or a
        file naming no pid or host (`take` writes the whole record before the lock appears, so such a file is
        damaged, not a run starting)."""
        if not isinstance(self.pid, int) or not self.host:
            return True
        if self.host != socket.gethostname():
            return False
        if not _alive(self.pid):
            return True
        started = _process_start(self.pid)
        return (started is not None and self.process_start is not None
                and abs(started - self.process_start) > START_TIME_SLACK_S)


def read_holder(root: Path | str) -> Optional[Holder]:
    """The holder of `root`'s lock; None when there is no lock file."""
    path = Path(root) / WRITER_LOCK
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        data = {}
    data = data if isinstance(data, dict) else {}
    pid = data.get("pid")
    return Holder(pid if isinstance(pid, int) else None, data.get("host"), data.get("process_start"),
                  data.get("taken"))


def live_writer_refusal(root: Path | str, flag: str = "--checkpoint-dir") -> Optional[str]:
    """Why a run must not write into `root`: another live run holds its lock (None: no lock, or a stale one)."""
    holder = read_holder(root)
    if holder is None or holder.is_gone():
        return None
    fix = (f"kill {holder.pid}" if holder.host == socket.gethostname() and holder.pid else
           f"stop it on {holder.host}")
    return (f"{flag} {root}: another run is writing checkpoints there ({holder.describe()}; "
            f"{Path(root) / WRITER_LOCK}): two writers would replace each other's tags. Wait for it to end or stop "
            f"it ({fix}), or give this run another {flag}; if that run is gone (a crashed host), delete "
            f"{Path(root) / WRITER_LOCK}")


@dataclass
class WriterLock:
    """A lock this process holds; `release` removes it (only while it is still this process's)."""

    path: Path
    token: str

    def release(self) -> None:
        try:
            if self.path.read_text() == self.token:
                self.path.unlink()
        except OSError:
            pass


def _release_on_sigterm(lock: WriterLock) -> None:
    """Release `lock` when SIGTERM ends this process: atexit does not run on a signal, and SIGTERM is how
    launch.sh, `dstoolkit train`, torchrun and Slurm stop a job; a lock left behind on a host that does not run the
    next attempt (a requeue elsewhere) would refuse every later run. Chains to the handler before it (the default
    one: the process still ends by SIGTERM); not installed where TERM is ignored or off the main thread."""
    prev = signal.getsignal(signal.SIGTERM)
    if prev is signal.SIG_IGN:
        return

    def on_term(signum, frame):
        lock.release()
        if callable(prev):
            prev(signum, frame)
        else:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread
        pass


def take(root: Path | str, flag: str = "--checkpoint-dir", note=print) -> tuple[Optional[WriterLock], Optional[str]]:
    """Take `root`'s writer lock for this process: (the lock, None), or (None, the refusal) when a live run holds
    it. A stale lock is replaced, saying so through `note`. The lock is released at exit too."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / WRITER_LOCK
    token = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
                        "taken": time.time()})
    # the record is written to a file of this process's own, then linked in place: the lock appears whole or not
    # at all (os.link fails on an existing lock, as O_EXCL would)
    tmp = root / f"{WRITER_LOCK}.{socket.gethostname()}.{os.getpid()}.tmp"
    tmp.write_text(token)
    try:
        return _take_linked(root, path, tmp, token, flag, note)
    finally:
        tmp.unlink(missing_ok=True)


def _link_or_create(tmp: Path, path: Path, token: str) -> None:
    """Link `tmp` to `path`; where the file system has no hard links, create `path` exclusively and write it.

    Raises:
        FileExistsError: `path` exists.
    """
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some FUSE / object-store mounts)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(token)


def _take_linked(root: Path, path: Path, tmp: Path, token: str, flag: str,
                 note) -> tuple[Optional[WriterLock], Optional[str]]:
    for _ in range(3):  # a stale lock removed, then linked again (another run may race for it: os.link decides)
        try:
            _link_or_create(tmp, path, token)
        except FileExistsError:
            problem = live_writer_refusal(root, flag)
            if problem:
                return None, problem
            holder = read_holder(root)
            note(f"{flag} {root}: taking over the writer lock of a run that is gone "
                 f"({holder.describe() if holder else 'no holder'}; {path})")
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            continue
        lock = WriterLock(path, token)
        atexit.register(lock.release)
        _release_on_sigterm(lock)
        return lock, None
    return None, f"{flag} {root}: could not take the writer lock {path} (another run keeps taking it); retry"
