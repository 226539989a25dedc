"""Where `ckpt reshard` (--out) and `ckpt export` (--hf) may write: a new folder, outside the checkpoint they read
(`dstoolkit.ckpt.paths.check_output_outside`), and one that can be made: under no path part that is a file, not a
link to nothing, in a folder this user can write in (`dstoolkit.common.atomic.check_output_folder`, the one wording
for each). Both verbs ask `check_new_output_folder`
once in the CLI, before torch is imported, and `to_universal` / `export_hf` ask it again for library callers.

Both write all or nothing through `atomic_output_folder`: into a temporary sibling of the output, renamed into
place at the end and removed on any other exit (Ctrl-C; SIGTERM too, under `sigterm_as_interrupt`), so an
interrupted run leaves nothing that blocks its rerun; a disk that fills is one `OutputSpaceError` line naming
the output and about how many bytes it needs. Torch-free.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.paths import check_output_outside
from dstoolkit.common.atomic import OutputWriteError, check_output_folder, umask


def check_new_output_folder(src: Path, out: Path, flag: str, suffix: str) -> None:
    """Refuse an output folder `out` for the checkpoint at `src` before anything is read or written.

    Args:
        flag: the option that named `out` (--out, --hf), for the messages.
        suffix: appended to the checkpoint folder's name for the suggested output (_universal, _hf).

    Raises:
        CkptError: `out` is in, is, or contains the checkpoint, or already exists (nothing is overwritten).
        FileInPathError, DanglingLinkError, UnwritableOutputError: `out` cannot be made (a part above it is a file,
            it or a part above it is a link to nothing, the folder it would be made in is not writable): OSErrors,
            the CLI exits 2 with their message.
    """
    out = Path(out)
    check_output_outside(Path(src), out, flag, suffix)
    check_output_folder(out, name=f"{flag} {out}")
    if out.exists():
        raise CkptError(str(out), "already exists", f"give {flag} a new folder (nothing is overwritten)")


PARTIAL_MARK = ".dstoolkit-partial-"
"""In the name of the temporary folder an output is written into before it is renamed into place:
`.<out name>.dstoolkit-partial-<host>-<pid>-<random>`, beside `out` (same parent: the rename is atomic)."""

FULL_BELOW_BYTES = 1 << 20
"""After a failed write, a filesystem with less than this free (shutil.disk_usage) is taken as full: a write that
fails for lack of space leaves at most a block or so, whatever error text the writer (torch's zip writer:
'inline_container.cc ... unexpected pos') turned ENOSPC into."""


class OutputSpaceError(OSError):
    """The output's filesystem filled up while it was written (ENOSPC, or found full after the failure); nothing
    of the output is left. Its text names the output, "no space left on device", about how many bytes the output
    needs, and the fix (the CLI prints it on one line, exit 1)."""

    def __init__(self, out: Path, flag: str, needs: int, free: int) -> None:
        self.out, self.needs, self.free = Path(out), int(needs), int(free)
        fs = Path(out).parent
        super().__init__(errno.ENOSPC, f"no space left on device: the output needs about {_size(needs)}, the "
                         f"filesystem of {fs} has {_size(free)} free (the partial output removed); nothing was "
                         f"written: free the space, or give {flag} a folder on a larger filesystem", str(out))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.1f} MiB)"


def is_enospc(exc: Optional[BaseException]) -> bool:
    """Whether `exc` or an exception in its chain is ENOSPC: its errno, or the text writers put it in (the OS's
    "No space left on device", safetensors' SafetensorError "os error 28"). Also the checkpoint saver's test
    (runtime/train/ckpt.save_failure_message)."""
    seen: set[int] = set()
    e: Optional[BaseException] = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).lower()
        if getattr(e, "errno", None) == errno.ENOSPC or "no space left on device" in text or "os error 28" in text:
            return True
        e = e.__cause__ or e.__context__
    return False


def _free_bytes(path: Path) -> Optional[int]:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _owner(tmp_name: str, prefix: str) -> Optional[tuple[str, int]]:
    """(host, pid) of the run that made a temporary folder `prefix<host>-<pid>-<random>`, or None."""
    parts = tmp_name[len(prefix):].rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process, alive
        return True
    return True


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove the temporary folders of `out` that a killed run (SIGKILL, a power cut) left behind: those made on
    this host by a process that no longer runs. Another host's, or a running process's, are left alone; their
    names differ from `out`, so they never block it. Returns what was removed."""
    out = Path(out)
    parent = out.parent
    prefix = f".{out.name}{PARTIAL_MARK}"
    removed = []
    try:
        entries = [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    for p in entries:
        owner = _owner(p.name, prefix)
        if owner is None or owner[0] != socket.gethostname() or _running(owner[1]):
            continue
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            removed.append(p)
    return removed


def _inside(filename: object, folder: Path) -> bool:
    """Whether an OSError's `filename` is `folder` or a path in it."""
    if not isinstance(filename, (str, os.PathLike)):
        return False
    return Path(filename) == folder or Path(filename).is_relative_to(folder)


@contextmanager
def atomic_output_folder(out: Path, flag: str, needs: int) -> Iterator[Path]:
    """Write a new output folder all or nothing: yields a temporary folder beside `out` (same parent, so the final
    rename is atomic), renamed to `out` when the block ends; on any other exit (an error, Ctrl-C, SIGTERM turned
    into KeyboardInterrupt, SystemExit) it is removed and `out` is never made. A leftover of a killed run is
    removed first, and said so on stderr (`remove_stale_partials`).

    Args:
        out: the folder to make (must not exist: `check_new_output_folder`).
        flag: the option that named it, for the messages.
        needs: about how many bytes the output takes at its peak, for the disk-full message.

    Raises:
        OutputSpaceError: the write failed and the filesystem is full (ENOSPC anywhere in the exception chain,
            or less than `FULL_BELOW_BYTES` free after the failure).
        CkptError: `out` appeared while the output was written (nothing is overwritten).
        OutputWriteError: the folder cannot be made or written although the checks passed (/proc, /sys as root):
            the shared wording (`dstoolkit.common.atomic`), naming `flag` and `out`, the OS's reason and the fix,
            never the temporary folder.
    """
    out = Path(out)
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for p in remove_stale_partials(out):
            print(f"removed {p}: the temporary folder of an earlier run that was killed before it finished",
                  file=sys.stderr)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{PARTIAL_MARK}{socket.gethostname()}-{os.getpid()}-",
                                    dir=parent))
    except OSError as exc:  # a filesystem the checks pass but that makes no folder (/proc, /sys): name the user's
        raise OutputWriteError(out, exc, f"{flag} {out}") from None  # path, not the temporary one
    try:
        try:
            yield tmp
            os.chmod(tmp, 0o777 & ~umask())  # mkdtemp makes it 0700; the output gets the usual folder mode
        except Exception as exc:
            free = _free_bytes(tmp)  # before the removal frees the space again
            if is_enospc(exc) or (free is not None and free < FULL_BELOW_BYTES):
                shutil.rmtree(tmp, ignore_errors=True)
                raise OutputSpaceError(out, flag, needs, _free_bytes(parent) or 0) from None
            if isinstance(exc, OSError) and _inside(getattr(exc, "filename", None), tmp):
                raise OutputWriteError(out, exc, f"{flag} {out}") from None  # the output, not its temporary name
            raise
        if os.path.lexists(out):  # os.rename would replace an empty folder silently
            raise CkptError(str(out), "appeared while it was being written", f"give {flag} a new folder "
                            "(nothing is overwritten)")
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # ours: made above
        raise


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (kill, timeout, a scheduler) raises KeyboardInterrupt while the block runs, so the cleanup of
    `atomic_output_folder` runs for it as for Ctrl-C (the default action ends the process at once). Only the main
    thread may install a handler; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise KeyboardInterrupt

    prev = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, prev)
