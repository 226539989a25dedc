"""What `dstoolkit tune` wrote in its output folder: a manifest, so `--force` (a fresh study) and a resumed study
delete or overwrite only tune's own files, never a file the user put there or edited since.

`MANIFEST_FILE` lists each file tune wrote with its SHA-256, in sha256sum's format (`dstoolkit.common.manifest`, as
`dstoolkit generate`'s ``.dstoolkit-generated``): the outputs when written, the command file, and each trial's folder when the trial ends
(its spec and config, the trainer's metrics and log). The study database changes with every trial, so it is listed
with `UNPINNED` instead of a hash. A file is tune's when listed and, unless unpinned, unchanged (`Manifest.owns`).
"""
from __future__ import annotations

import os
import pathlib
from typing import Iterable, Optional

from dstoolkit.common.atomic import atomic_write_text
from dstoolkit.common.filehash import sha256_file
from dstoolkit.common.manifest import UNPINNED, parse, render

MANIFEST_FILE = ".dstoolkit-tune"
_HEADER = ("# written by `dstoolkit tune`: the files it wrote in this folder (sha256, path; '-' = changes as the study "
           "runs). --force and a resumed study delete or overwrite only these, and only while unchanged.\n")
SHOWN = 5
"""How many files a refusal names (then a count of the rest)."""


def files_under(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every file and link under `folder` (links are not followed), sorted; [] when it is not a folder."""
    if not folder.is_dir() or folder.is_symlink():
        return []
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        base = pathlib.Path(root)
        out += [base / f for f in files]
        out += [base / d for d in dirs if (base / d).is_symlink()]
    return sorted(out)


def name_files(rels: list[str]) -> str:
    """'a, b, c' with at most `SHOWN` names, then 'and N more'."""
    return ", ".join(rels[:SHOWN]) + (f" and {len(rels) - SHOWN} more" if len(rels) > SHOWN else "")


class Manifest:
    """The manifest of one output folder (empty when the folder has none: `exists` is False)."""

    def __init__(self, out_dir: pathlib.Path) -> None:
        self.out_dir = pathlib.Path(out_dir)
        self.path = self.out_dir / MANIFEST_FILE
        self.exists = self.path.is_file() and not self.path.is_symlink()
        self.entries: dict[str, str] = {}
        if self.exists:
            text = self.path.read_text(encoding="utf-8", errors="replace")
            self.entries = parse(text)

    def rel(self, path: pathlib.Path) -> str:
        return pathlib.Path(path).relative_to(self.out_dir).as_posix()

    def owns(self, rel: str) -> bool:
        """`rel` is listed and, unless unpinned, still as tune wrote it (a plain file with the listed hash)."""
        want = self.entries.get(rel)
        if want is None:
            return False
        path = self.out_dir / rel
        if path.is_symlink() or not path.is_file():
            return not os.path.lexists(path)  # gone since: nothing of the user's there
        return want == UNPINNED or sha256_file(path) == want

    def record(self, rels: Iterable[str], *, pinned: bool = True) -> None:
        """List `rels` (relative POSIX paths of files tune just wrote) and save the manifest atomically."""
        for rel in rels:
            path = self.out_dir / rel
            if path.is_file() and not path.is_symlink():
                self.entries[rel] = sha256_file(path) if pinned else UNPINNED
        self.save()

    def record_tree(self, folder: pathlib.Path) -> None:
        """List every file under `folder` (a trial's folder, all of it written by the trial) and save."""
        self.record([self.rel(p) for p in files_under(pathlib.Path(folder))])

    def forget(self, rels: Iterable[str]) -> None:
        for rel in rels:
            self.entries.pop(rel, None)
        self.save()

    def save(self) -> None:
        atomic_write_text(self.path, render(_HEADER, self.entries))
        self.exists = True


def load(out_dir: pathlib.Path) -> Optional[Manifest]:
    """The folder's manifest, or None when it has none (a new folder, or one written by an older dstoolkit)."""
    m = Manifest(out_dir)
    return m if m.exists else None
