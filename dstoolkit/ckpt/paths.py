"""Where `ckpt reshard` / `ckpt export` may write: never inside, onto, or around the checkpoint they read.

A universal copy or an HF export written into the source (`--out ck/step_4/univ`) mixes foreign folders into
DeepSpeed's tag folder or save_dir (inspect, the trainer's retention and DeepSpeed's own loaders then see them),
and an output folder that contains the source would be the source's parent. Torch-free: the CLI checks before it
imports torch.
"""
from __future__ import annotations

from pathlib import Path

from dstoolkit.ckpt import names as N
from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import resolve


def protected_folders(src: Path) -> list[Path]:
    """The folders of the checkpoint at `src` that an output must stay out of (resolved, outermost first): the tag
    folder, and the checkpoint root (the folder holding the tags) when it is DeepSpeed's save_dir (it holds `latest`
    / `latest_universal`) or the folder the user named. An HF Trainer output_dir is not itself a checkpoint (an
    export beside its checkpoint-N/ folders is fine); the checkpoint-N/ inside it is.

    Raises:
        CkptError: `src` is not a checkpoint folder (as `resolve`).
    """
    src = Path(src)
    root, tag, _, _ = resolve(src)
    out = {(root / tag).resolve()}
    if (root / N.LATEST).is_file() or (root / N.LATEST_UNIVERSAL).is_file() or src.resolve() == root.resolve():
        out.add(root.resolve())
    return sorted(out, key=lambda p: len(p.parts))


def check_output_outside(src: Path, out: Path, flag: str, suffix: str) -> None:
    """Refuse an output folder `out` equal to, inside, or containing the checkpoint at `src`.

    Args:
        flag: the option that named `out` (--out, --hf), for the message.
        suffix: appended to the checkpoint folder's name for the suggested output (_universal, _hf).

    Raises:
        CkptError: naming `out`, the checkpoint folder it collides with, and a folder beside it to use instead.
    """
    folders = protected_folders(src)
    target = Path(out).resolve()
    outer = folders[0]
    fix = f"give {flag} a new folder outside the checkpoint, e.g. {outer.parent / (outer.name + suffix)}"
    for p in folders:
        if target == p:
            raise CkptError(str(out), f"is the checkpoint folder {p} itself", fix)
    for p in reversed(folders):  # the innermost folder it is in
        if p in target.parents:
            raise CkptError(str(out), f"is inside the checkpoint folder {p} it is made from (it would be written "
                            "into the source checkpoint)", fix)
    for p in folders:
        if target in p.parents:
            raise CkptError(str(out), f"contains the checkpoint folder {p} it is made from", fix)
