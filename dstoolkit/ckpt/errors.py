"""The one error of the ckpt verbs: the file, the problem, the fix (the CLI prints it and exits 2)."""
from __future__ import annotations


class CkptError(ValueError):
    """Bad checkpoint input: `file` (the path at fault), `problem` (what is wrong), `fix` (what to do)."""

    def __init__(self, file: str, problem: str, fix: str) -> None:
        self.file = str(file)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.file}: {problem}; {fix}")
