"""The processes whose command line names a text (a test's folder, its checkpoint dir): what a signal test checks
outlived the command it stopped, and kills at teardown."""
from __future__ import annotations

import os
from pathlib import Path


def processes_naming(text: str) -> dict[int, str]:
    """pid -> command line (words joined by spaces) of every process but this one whose command line contains
    `text`."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in line and int(cmdline.parent.name) != os.getpid():
            found[int(cmdline.parent.name)] = line
    return found
