"""Input paths the user names on a command line or in a spec: one wording for what is wrong with them. Pure Python."""
from __future__ import annotations

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
