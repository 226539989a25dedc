"""Input paths the user names on a command line or in a spec: one wording for what is wrong with them. Pure Python."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union


NO_SUCH_FILE = "no such file"
A_FOLDER = "is a folder, not a file"
NOT_REGULAR = "is not a regular file"


def input_file_problem(path: Union[str, Path]) -> Optional[str]:
    """What is wrong with `path` as an input file, the text that follows "<path>: " in an error ("no such file",
    "is a folder, not a file", "is not a regular file"), or None when it is a file (readable or not: reading it
    says why not)."""
    p = Path(path)
    if p.is_dir():
        return A_FOLDER
    if not p.exists():
        return NO_SUCH_FILE
    if not p.is_file():
        return NOT_REGULAR
    return None


def same_file(a: Union[str, Path], b: Union[str, Path]) -> bool:
    """`a` and `b` name one file: the same path once links and ``..`` are resolved, or (both existing) the same device
    and inode (a hard link). An output that is the same file as one of the command's inputs would overwrite or
    append to that input."""
    try:
        return Path(a).resolve() == Path(b).resolve() or (Path(a).exists() and Path(b).exists()
                                                          and os.path.samefile(a, b))
    except OSError:
        return False
