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
``os.replace`` would fail with EISDIR naming the temporary file), a file path that ends with a separator
(``-o new/``: a folder's name; `FolderPathError`), ``-`` as a file path (`DashPathError`: stdout, where a verb
supports it, is the verb's to handle), a link to nothing at or above the path (`DanglingLinkError`), and a path whose
folder this user cannot write in (`UnwritableOutputError`): the one wording for each, which a verb asks early with
`check_output_parents` / `check_output_path` / `check_output_folder`, before any work, to name its flag. A write
that fails anyway (a disk that fills, /proc) raises `OutputWriteError`, naming the target (and the flag), never the
temporary file. Imports nothing from dstoolkit.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


class _MessageOnly:
    """For the OSError subclasses below: str() is the message alone (it names the path itself), not OSError's
    "[Errno N] message"."""

    def __str__(self) -> str:
        return self.strerror


class FileInPathError(_MessageOnly, NotADirectoryError):
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


class OutputIsFolderError(_MessageOnly, IsADirectoryError):
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


class FolderPathError(OutputIsFolderError):
    """A file output path that ends with a path separator (``-o new/``): that names a folder, and writing a file
    named ``new`` in its place would not be what was asked. An `OutputIsFolderError` (EISDIR); its text names the path
    and the fix.

    Attributes:
        path: the output path, as given (separator included).
    """

    def __init__(self, path: PathLike, name: Optional[str] = None, suggest: Optional[str] = None) -> None:
        self.path = Path(path)
        text = os.fspath(path)
        fix = f", e.g. {text}{suggest}" if suggest else f" (a file inside it, or the name without the {text[-1]!r})"
        IsADirectoryError.__init__(self, errno.EISDIR, f"{name or text}: ends with {text[-1]!r}, so it names a folder, "
                                                       f"not a file; give the path of the file to write{fix}")


class DashPathError(ValueError):
    """``-`` given as an output file path: it reads as "stdout", which this output does not support; writing a file
    named ``-`` is almost never what was meant. A ValueError (an input error); its text names the flag and the fix."""

    def __init__(self, name: Optional[str] = None) -> None:
        super().__init__(f"{name or '-'}: '-' (stdout) is not supported for this output; give the path of the file "
                         "to write (./- for a file named '-')")


class DanglingLinkError(_MessageOnly, FileExistsError):
    """The output path, or a part of it, is a symbolic link to nothing: a write would create the link's target
    somewhere else, replace the link, or fail with EEXIST / ENOENT after the work. An OSError (EEXIST); its text
    names the link, its target and the fix.

    Attributes:
        path: the output path.
        link: the dangling link (the path itself or one of its parents).
    """

    def __init__(self, path: PathLike, link: Path, name: Optional[str] = None) -> None:
        self.path = Path(path)
        self.link = link
        where = "is" if Path(path) == link else f"{link} is"
        super().__init__(errno.EEXIST, f"{name or path}: {where} a link to {os.readlink(link)}, which does not "
                                       "exist, so writing there would not make what was asked; remove the link, or "
                                       "give another path")


class UnwritableOutputError(_MessageOnly, PermissionError):
    """The folder an output would be written in (the path's own folder, or for a new path the first existing folder
    above it; for an output that is a folder or is appended to, the path itself) cannot be written by this user
    (``os.access``: permissions, a read-only mount, an immutable folder). An OSError (EACCES); its text names the
    folder and the fix.

    Attributes:
        path: the output path.
        where: the folder (or file) that cannot be written.
    """

    def __init__(self, path: PathLike, where: Path, name: Optional[str] = None) -> None:
        self.path = Path(path)
        self.where = where
        kind = "folder" if where.is_dir() else "file"
        super().__init__(errno.EACCES, f"{name or path}: the {kind} {where} is not writable by this user "
                                       "(permissions, a read-only filesystem, an immutable flag), so nothing can be "
                                       "written there; give a path you can write to")


class OutputWriteError(OSError):
    """Writing an output failed after the checks (a full disk, a filesystem that refuses new files such as /proc).
    An OSError with ``filename`` the output as the caller names it (``-o FILE``) and the underlying errno, so its
    text names the target, never the temporary file the write went through; the target is left as it was.

    Attributes:
        path: the output path.
    """

    def __init__(self, path: PathLike, cause: OSError, name: Optional[str] = None) -> None:
        self.path = Path(path)
        why = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot be written ({why}); nothing was changed: give a path in a folder you "
                                      "can write to", name or os.fspath(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


_SEPARATORS = "".join(s for s in (os.sep, os.altsep) if s)
_WRITE_AND_ENTER = os.W_OK | os.X_OK


def file_in_path(path: PathLike) -> Optional[Path]:
    """The existing parent of ``path`` closest to it when that is not a folder (a file), else None. Parents past it
    cannot exist (a file has no children), so it is the part that blocks the write."""
    for parent in Path(path).parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def first_existing_parent(path: PathLike) -> Path:
    """The existing folder above ``path`` closest to it (``.`` for a bare relative name): where a new ``path`` is
    created (its missing folders included)."""
    for parent in Path(path).parents:
        if parent.exists():
            return parent
    return Path(".")  # pragma: no cover - the last parent of a relative path is "." and of an absolute one "/"


def dangling_link(path: PathLike) -> Optional[Path]:
    """``path`` itself, or the closest part above it, when that is a symbolic link to nothing; else None."""
    for part in (Path(path), *Path(path).parents):
        if part.is_symlink() and not part.exists():
            return part
        if part.exists():
            return None
    return None


def check_output_parents(path: PathLike, name: Optional[str] = None) -> None:
    """Refuse, before any work, what blocks creating ``path``: `FileInPathError` when a part above it is a file,
    `DanglingLinkError` when it or a part above it is a link to nothing, and `UnwritableOutputError` when it does not
    exist and the first existing folder above it is not writable (whether an existing ``path`` may be replaced or
    written into is `check_output_path` / `check_output_folder`'s). ``name``: how the caller's input names the path
    (``-o OUT``), for the message; default the path."""
    blocker = file_in_path(path)
    if blocker is not None:
        raise FileInPathError(path, blocker, name)
    link = dangling_link(path)
    if link is not None:
        raise DanglingLinkError(path, link, name)
    if not os.path.lexists(path):
        where = first_existing_parent(path)
        if not os.access(where, _WRITE_AND_ENTER):
            raise UnwritableOutputError(path, where, name)


def check_output_path(path: PathLike, name: Optional[str] = None, *, append: bool = False,
                      suggest: Optional[str] = None) -> None:
    """Refuse an output file path that cannot be written, before any work: `DashPathError` for ``-``,
    `FolderPathError` for a path that ends with a separator (a folder's name), then `check_output_parents`, then
    `OutputIsFolderError` when it is an existing folder (a link to one is not refused: ``os.replace`` replaces the
    link, not the folder), and `UnwritableOutputError` when an existing file cannot be replaced (its folder is not
    writable: the atomic write makes a temporary file beside it) or, with ``append``, cannot be appended to (the file
    itself is not writable).

    Args:
        path: the output file, as the user gave it (a str keeps a trailing separator; a Path drops it).
        name: how the caller's input names the path (``-o OUT``), for the message; default the path.
        append: the file is opened for appending, not replaced (``bench --out``).
        suggest: a file name the messages suggest inside a folder (``-o new/`` -> ``new/ds_config.json``).
    """
    text = os.fspath(path)
    if text == "-":
        raise DashPathError(name)
    if text.endswith(tuple(_SEPARATORS)) and text.rstrip(_SEPARATORS):
        raise FolderPathError(path, name, suggest)
    check_output_parents(path, name)
    if os.path.isdir(path) and not os.path.islink(path):
        raise OutputIsFolderError(path, name)
    if os.path.lexists(path):
        where = Path(path) if append else Path(path).parent
        if not os.access(where, os.W_OK if append else _WRITE_AND_ENTER):
            raise UnwritableOutputError(path, where, name)


def check_output_folder(path: PathLike, name: Optional[str] = None) -> None:
    """Refuse an output folder that cannot be written, before any work: `check_output_parents`, then
    `UnwritableOutputError` when it is an existing folder this user cannot write in. An existing path that is not a
    folder is the caller's to refuse (a new folder only, or one to resume into), with its own wording."""
    check_output_parents(path, name)
    if os.path.isdir(path) and not os.access(path, _WRITE_AND_ENTER):
        raise UnwritableOutputError(path, Path(path), name)


def umask() -> int:
    """The process's file-creation mask (read by setting and restoring it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: PathLike, data: bytes, name: Optional[str] = None) -> Path:
    """Replace ``path`` with ``data`` atomically (temp file in the same dir, fsync, os.replace).

    Creates the parent directory if needed. Returns the target path.

    Args:
        path: the file to write.
        data: its new content.
        name: how the caller's input names the path (``-o OUT``), for the messages; default the path.

    Raises:
        DashPathError, FolderPathError, FileInPathError, DanglingLinkError, OutputIsFolderError,
        UnwritableOutputError: the path cannot be written (`check_output_path`; nothing is written).
        OutputWriteError: the write itself failed (naming the target, not the temporary file; nothing is changed).
    """
    check_output_path(path, name)
    target = Path(path)
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, target)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(exc, OSError):
            raise OutputWriteError(path, exc, name) from exc
        raise
    return target


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8", name: Optional[str] = None) -> Path:
    """Replace ``path`` with ``text`` atomically; see :func:`atomic_write_bytes`."""
    return atomic_write_bytes(path, text.encode(encoding), name)
