"""Shared by the test_s29c_out_* files: a folder (or file) nothing can be written in, for the user running the tests.

Root ignores permission bits (chmod 555 does not stop it), so as root the folder is made immutable with
`chattr +i` (which os.access and the writes honour); where neither works (root on a filesystem without chattr
support) the tests that need it are skipped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a folder, the target for a link): what "nothing written"
    compares."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = os.readlink(p).encode()
        else:
            out[str(p.relative_to(root))] = None if p.is_dir() else p.read_bytes()
    return out


def _chattr(flag: str, path: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.fixture
def read_only():
    """Make a path read-only for this user (immutable as root); undone after the test."""
    made: list[tuple[Path, int]] = []

    def make(path: Path) -> Path:
        if os.geteuid() == 0:
            if not _chattr("+i", path):
                pytest.skip("running as root and chattr +i is not available here: cannot make a read-only folder")
            made.append((path, -1))
        else:
            made.append((path, path.stat().st_mode))
            path.chmod(0o555 if path.is_dir() else 0o444)
        if os.access(path, os.W_OK):  # pragma: no cover - a filesystem that ignores both
            pytest.skip("cannot make a read-only path here")
        return path

    yield make
    for path, mode in reversed(made):
        if mode == -1:
            _chattr("-i", path)
        else:
            path.chmod(mode)
