"""Write a generated folder atomically: build it in a temp dir next to the target, then rename it into place.

Nothing the user had is overwritten silently: an existing target is refused unless `force` is set, and even
with `force` only a folder that is empty or was written by `dstoolkit generate` (it holds `MARKER_FILE`) is
replaced. The old folder is moved aside first and removed only after the new one is in place.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Mapping

from dstoolkit.validate.folder import MARKER_FILE  # one owner: validate DIR recognises generated folders by it

MARKER_TEXT = "This folder was written by `dstoolkit generate`; `--force` may replace it.\n"
EXECUTABLE_SUFFIXES = (".sh", ".sbatch")


class OutputExistsError(Exception):
    """The output folder exists and may not be replaced (no --force, or not a dstoolkit folder)."""


def check_target(out_dir: Path, *, force: bool) -> None:
    """Raise `OutputExistsError` when writing to `out_dir` would overwrite something it should not."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise OutputExistsError(f"{out_dir} exists and is not a folder; choose another --out")
    entries = list(out_dir.iterdir())
    if not force:
        raise OutputExistsError(f"{out_dir} already exists; pass --force to replace it, or choose another --out")
    if entries and not (out_dir / MARKER_FILE).is_file():
        raise OutputExistsError(
            f"{out_dir} is not empty and was not written by dstoolkit generate (no {MARKER_FILE}); "
            "refusing to replace it even with --force: choose another --out")


def write_tree_atomic(out_dir: Path, files: Mapping[str, str], *, force: bool = False) -> None:
    """Write `files` (relative path -> text) as the whole content of `out_dir`, atomically.

    Args:
        out_dir: The target folder.
        files: Relative POSIX paths to file contents; `.sh`/`.sbatch` files are made executable.
        force: Replace an existing folder that dstoolkit wrote (or an empty one).

    Raises:
        OutputExistsError: The target exists and may not be replaced.
        ValueError: A relative path escapes the folder.
    """
    out_dir = Path(out_dir)
    check_target(out_dir, force=force)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        for rel, text in {**files, MARKER_FILE: MARKER_TEXT}.items():
            path = (tmp / rel).resolve()
            if tmp.resolve() not in path.parents:
                raise ValueError(f"generated path {rel!r} escapes the output folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(text)
            mode = 0o755 if rel.endswith(EXECUTABLE_SUFFIXES) else 0o644
            os.chmod(path, mode)
        os.chmod(tmp, 0o755)
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.rmdir(old)
            os.rename(out_dir, old)
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if old is not None:
                os.rename(old, out_dir)  # put the user's folder back
            raise
        if old is not None:
            shutil.rmtree(old, onerror=_force_remove)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _force_remove(func, path, _exc) -> None:  # pragma: no cover - read-only leftovers only
    os.chmod(path, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
    func(path)
