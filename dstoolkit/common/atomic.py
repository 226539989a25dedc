"""Atomic file writes: the one way dstoolkit replaces a file.

Why: reports, schemas, tuned configs and checkpoint pointers are read by other processes (a resuming
rank, a CI diff, a person with the file open) and are rewritten in place. Writing the target directly
leaves a truncated file behind when the process is killed or the disk fills mid-write. Instead the
bytes go to a temporary file in the *same directory* (so the rename stays on one filesystem, where
``os.replace`` is atomic), are fsync'ed (so a crash after the rename cannot expose an empty file),
and are then renamed over the target: a reader sees the old file or the new one, never half of one.
On any failure the temporary file is removed and the target is left as it was.

The new file gets the usual permissions (0666 less the umask), not mkstemp's private 0600.
An output under a path part that is a file (``-o notes.json/out.json``) is refused before anything is written
(`FileInPathError`, naming that part), and so is an output that is an existing folder (`OutputIsFolderError`;
``os.replace`` would fail with EISDIR naming the temporary file): the one wording for each, which a verb asks early
with `check_output_parents` / `check_output_path` to name its flag. Imports nothing from dstoolkit.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class FileInPathError(NotADirectoryError):
    """A part of an output path is an existing file, so nothing can be written under it. An OSError (ENOTDIR, what
    the write itself would raise), so handlers of write errors still catch it; its text names the file and the fix.

    Attributes:
        path: the output path.
        blocker: its first existing parent (closest to the path) that is not a folder.
    """

    def __init__(self, path: PathLike, blocker: Path, name: Optional[str] = None) -> None:
        self.path = Path(path)
        self.blocker = blocker
        super().__init__(errno.ENOTDIR, f"{name or path}: {blocker} is a file, not a folder, so nothing can be "
                                        "written under it; give a path in a folder")

    def __str__(self) -> str:
        return self.strerror


class OutputIsFolderError(IsADirectoryError):
    """The output path is an existing folder, so no file can be written in its place. An OSError (EISDIR, what
    ``os.replace`` would raise, naming the temporary file instead), so handlers of write errors still catch it; its
    text names the path and the fix.

    Attributes:
        path: the output path.
    """

    def __init__(self, path: PathLike, name: Optional[str] = None) -> None:
        self.path = Path(path)
        super().__init__(errno.EISDIR, f"{name or path}: is a folder, not a file, so no file can be written in its "
                                       "place; give the path of the file to write (a file inside it, or a new name)")

    def __str__(self) -> str:
        return self.strerror


def file_in_path(path: PathLike) -> Optional[Path]:
    """The existing parent of ``path`` closest to it when that is not a folder (a file), else None. Parents past it
    cannot exist (a file has no children), so it is the part that blocks the write."""
    for parent in Path(path).parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_output_parents(path: PathLike, name: Optional[str] = None) -> None:
    """Raise `FileInPathError` when a part of ``path`` above it is a file. ``name``: how the caller's input names
    the path (``-o OUT``), for the message; default the path."""
    blocker = file_in_path(path)
    if blocker is not None:
        raise FileInPathError(path, blocker, name)


def check_output_path(path: PathLike, name: Optional[str] = None) -> None:
    """Refuse an output file path that cannot be written: `FileInPathError` when a part above it is a file,
    `OutputIsFolderError` when it is an existing folder (a link to one is not refused: ``os.replace`` replaces the
    link, not the folder). ``name``: how the caller's input names the path (``-o OUT``), for the message; default the
    path."""
    check_output_parents(path, name)
    if os.path.isdir(path) and not os.path.islink(path):
        raise OutputIsFolderError(path, name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically (temp file in the same dir, fsync, os.replace).

    Creates the parent directory if needed. Returns the target path.

    Raises:
        FileInPathError: a part of ``path`` above it is a file (nothing is written).
        OutputIsFolderError: ``path`` is an existing folder (nothing is written).
    """
    target = Path(path)
    check_output_path(target)
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
