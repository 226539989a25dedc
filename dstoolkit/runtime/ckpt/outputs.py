"""Where `ckpt reshard` (--out) and `ckpt export` (--hf) may write: a new folder, outside the checkpoint they read
(`dstoolkit.ckpt.paths.check_output_outside`), and one that can be made: under no path part that is a file, not a
link to nothing, in a folder this user can write in (`dstoolkit.common.atomic.check_output_folder`, the one wording
for each). Both verbs ask `check_new_output_folder`
once in the CLI, before torch is imported, and `to_universal` / `export_hf` ask it again for library callers.
Torch-free.
"""
from __future__ import annotations

from pathlib import Path

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.paths import check_output_outside
from dstoolkit.common.atomic import check_output_folder


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
