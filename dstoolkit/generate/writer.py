"""Write a generated folder atomically: build it in a temp dir next to the target, then rename it into place.

Nothing the user had is overwritten silently: an existing target is refused unless `force` is set, and even
with `force` only a folder that is empty or was written by `dstoolkit generate` (it holds `MARKER_FILE`) is
replaced, and only while it holds nothing but what generate wrote there: `MARKER_FILE` lists each file it wrote with
its SHA-256 (`manifest_text`), so a file added since (a checkpoint saved by the launch script, notes) or a generated
file edited since (a tuned ds_config.json) makes `--force` refuse and name them (`foreign_files`). The old folder
is moved aside first and removed only after the new one is in place.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Mapping, Optional

from dstoolkit.common.atomic import check_output_parents
from dstoolkit.common.manifest import parse as parse_manifest, render as render_manifest, sha256_bytes
from dstoolkit.validate.folder import MARKER_FILE  # one owner: validate DIR recognises generated folders by it

MARKER_TEXT = "This folder was written by `dstoolkit generate`; `--force` may replace it.\n"
MANIFEST_HEADER = ("# the files generate wrote here (sha256, path): `--force` refuses to replace this folder while it "
                   "holds any other file or any of these differs\n")
EXECUTABLE_SUFFIXES = (".sh", ".sbatch")
FOREIGN_SHOWN = 5
"""How many of the files `--force` would lose the refusal names (then a count of the rest)."""


def manifest_text(files: Mapping[str, str]) -> str:
    """MARKER_FILE's content: MARKER_TEXT, then one `sha256  path` line per written file (sha256sum's format)."""
    return render_manifest(MARKER_TEXT + MANIFEST_HEADER,
                           {rel: sha256_bytes(text.encode("utf-8")) for rel, text in files.items()})


def _manifest(out_dir: Path) -> Optional[dict[str, str]]:
    """path -> sha256 from the folder's MARKER_FILE, or None for a marker without a manifest (older dstoolkit)."""
    text = (out_dir / MARKER_FILE).read_text(encoding="utf-8", errors="replace")
    return parse_manifest(text) or None


def foreign_files(out_dir: Path, new_files: Mapping[str, str]) -> list[str]:
    """Files under a generated `out_dir` that replacing it would lose: not in its manifest, or no longer as
    generate wrote them (relative POSIX paths, sorted). A marker without a manifest (written before it had one)
    cannot say what was edited: there, every file the new tree does not write again counts."""
    known = _manifest(out_dir)
    out = []
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(out_dir).as_posix()
        if rel == MARKER_FILE:
            continue
        if known is None:
            if rel not in new_files:
                out.append(rel)
        elif rel not in known or path.is_symlink() or sha256_bytes(path.read_bytes()) != known[rel]:
            out.append(rel)
    return out


class OutputExistsError(Exception):
    """The output folder exists and may not be replaced (no --force, or not a dstoolkit folder)."""


def check_target(out_dir: Path, *, force: bool, new_files: Optional[Mapping[str, str]] = None) -> None:
    """Raise `OutputExistsError` when writing to `out_dir` would overwrite something it should not (`new_files`:
    what will be written, for a marker without a manifest; None: only the marker is checked)."""
    if not out_dir.exists() and not out_dir.is_symlink():
        return
    if out_dir.is_symlink() and out_dir.is_dir():
        target = out_dir.resolve()
        raise OutputExistsError(
            f"{out_dir} is a link to the folder {target}; generate replaces its --out folder whole, which would "
            f"replace the link, not that folder: pass --out {target}, or choose another --out")
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise OutputExistsError(f"{out_dir} exists and is not a folder; choose another --out")
    entries = list(out_dir.iterdir())
    if not force:
        raise OutputExistsError(f"{out_dir} already exists; pass --force to replace it, or choose another --out")
    if entries and not (out_dir / MARKER_FILE).is_file():
        raise OutputExistsError(
            f"{out_dir} is not empty and was not written by dstoolkit generate (no {MARKER_FILE}); "
            "refusing to replace it even with --force: choose another --out")
    if entries:
        lost = foreign_files(out_dir, new_files if new_files is not None else {})
        if lost and (new_files is not None or _manifest(out_dir) is not None):
            shown = ", ".join(lost[:FOREIGN_SHOWN]) + (f" and {len(lost) - FOREIGN_SHOWN} more"
                                                       if len(lost) > FOREIGN_SHOWN else "")
            raise OutputExistsError(
                f"{out_dir} holds {len(lost)} file(s) dstoolkit generate did not write or that were edited since: "
                f"{shown}; --force would delete them: move them out of the folder, or choose another --out")


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
    check_output_parents(out_dir)  # a file in the path: FileInPathError naming it, before anything is made
    check_target(out_dir, force=force, new_files=files)
    parent = out_dir.parent if str(out_dir.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        for rel, text in {**files, MARKER_FILE: manifest_text(files)}.items():
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
