"""How a caller names the checkpoint folder, the resume and the rank count in the refusals and save failures of
`dstoolkit.runtime.train.resume_check` and `ckpt`: one text, the names passed in (`CLI`: `dstoolkit train`'s flags;
`GUARD`: `Guard`'s parameters). It imports nothing of dstoolkit: both of those files read it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class Names:
    """How the caller names the checkpoint folder, the resume and the rank count: the refusals are one text
    for `dstoolkit train` (`CLI`, its flags) and for a user's own loop (`GUARD`, `Guard`'s parameters)."""

    dir: str = "--checkpoint-dir"
    """The folder's parameter ("give a new ...")."""
    at: str = "--checkpoint-dir {root}"
    """The folder's parameter with its value (`{root}`), at the head of each message."""
    resume: str = "--resume"
    """What resumes ("this run has no ...", "... would load")."""
    add_resume: str = "add --resume"
    """The resume fix."""
    nproc: str = "--nproc"
    """What sets the data-parallel size (followed by the number)."""
    who: str = "the bundled trainer"
    """What resumes only its own step_* checkpoints."""
    keep: str = "--keep-checkpoints"
    """What sets how many checkpoints are kept (the full-disk fix: "keep fewer checkpoints (a lower ...)")."""
    ep: str = "the trainer's --ep-size {ep} (or training.ep: {ep} in the spec)"
    """What sets the expert-parallel size (`{ep}`: the saved one): "Resume with ..."."""
    model: str = ("Resume with the spec (and --shrink, or not) it was saved with, or give this run a new "
                  "--checkpoint-dir")
    """The fix for a checkpoint of another model."""

    def where(self, root: Path | str) -> str:
        return self.at.format(root=str(root))

    def missing_dir(self, asked: list[str]) -> Optional[str]:
        """The refusal of settings that write or load checkpoints (`asked`: each as the caller names it, e.g.
        "--save-every 5", "save_every=5", "--resume", a rollback action) when no checkpoint folder is given; None
        when nothing is asked. One rule for `dstoolkit train` and `Guard`: without a folder nothing is ever saved,
        so every rollback would find no target and a resume nothing to load."""
        if not asked:
            return None
        one = len(asked) == 1
        return (f"{' / '.join(asked)} need{'s' if one else ''} {self.dir}: without one no checkpoint is ever saved, "
                f"so every rollback finds no target and a resume nothing to load; give {self.dir}, or drop "
                f"{'it' if one else 'them'}")


CLI = Names()
GUARD = Names(dir="checkpoint_dir", at="Guard: checkpoint_dir={root!r}", resume="guard.resume()",
              add_resume="call guard.resume() before the first step", nproc="a world size of", who="Guard.resume()",
              keep="Guard(keep=...)", ep="a model whose deepspeed.moe.layer.MoE layers have ep_size={ep}",
              model="Resume with the model it was saved from, or give Guard a new checkpoint_dir")
"""`dstoolkit.runtime.train.guard.Guard`'s names."""
