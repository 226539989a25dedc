"""Atomic file writes: the one way dstoolkit replaces a file.

Why: reports, schemas, tuned configs and checkpoint pointers are read by other processes (a resuming
rank, a CI diff, a person with the file open) and are rewritten in place. Writing the target directly
leaves a truncated file behind when the process is killed or the disk fills mid-write. Instead the
bytes go to a temporary file in the *same directory* (so the rename stays on one filesystem, where
``os.replace`` is atomic), are fsync'ed (so a crash after the rename cannot expose an empty file),
and are then renamed over the target: a reader sees the old file or the new one, never half of one.
On any failure the temporary file is removed and the target is left as it was.

The new file gets the usual permissions (0666 less the umask), not mkstemp's private 0600.
Imports nothing from dstoolkit.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically (temp file in the same dir, fsync, os.replace).

    Creates the parent directory if needed. Returns the target path.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``text`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding))
