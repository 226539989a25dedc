"""Stale torch-extension locks planted for the lock tests (issue 25): a lock file as a killed build leaves it,
with no holder, under an op name nobody loads, in the real extensions folder the job under test uses."""
from __future__ import annotations

import os
import pathlib
import time

from dstoolkit.runtime import jitlock


def plant_lock(op: str, age_s: float, root: pathlib.Path | None = None) -> pathlib.Path:
    """Write <root or the extensions folder>/py311_cpu/<op>/lock, `age_s` seconds old; returns its path."""
    build = (root or jitlock.extensions_root()) / "py311_cpu" / op
    build.mkdir(parents=True, exist_ok=True)
    lock = build / "lock"
    lock.write_text("")
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def remove_planted(op: str) -> None:
    build = jitlock.extensions_root() / "py311_cpu" / op
    (build / "lock").unlink(missing_ok=True)
    try:
        build.rmdir()
    except OSError:
        pass


def private_extensions(tmp: pathlib.Path) -> pathlib.Path:
    """A private TORCH_EXTENSIONS_DIR whose op folders are symlinks to the real ones: the ops already built are
    loaded, not rebuilt, and locks planted in it are seen only by the job under test (on a shared machine another
    job's lock check would remove them from the real folder first)."""
    shared = jitlock.extensions_root() / "py311_cpu"
    mine = tmp / "ext" / "py311_cpu"
    mine.mkdir(parents=True)
    for d in shared.iterdir() if shared.is_dir() else ():
        (mine / d.name).symlink_to(d, target_is_directory=d.is_dir())
    return mine.parent
