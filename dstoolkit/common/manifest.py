"""The manifest format of a folder dstoolkit writes into (`generate`'s `.dstoolkit-generated`, `tune`'s
`.dstoolkit-tune`): comment lines, then one `sha256  relative/path` line per file it wrote, sha256sum's format, so
`--force` and a resume replace only files that are still as written. A file whose content changes as the tool runs
(tune's study database) is listed with `UNPINNED` in the hash column. One reader (`parse`) and one writer
(`render`) for both verbs; file hashes are `dstoolkit.common.filehash`'s.
"""
from __future__ import annotations

import hashlib
import re
from typing import Mapping

UNPINNED = "-" * 64
"""The hash column of a listed file whose content changes while the tool runs."""
_LINE = re.compile(r"^([0-9a-f]{64}|-{64})  (.+)$")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def render(header: str, entries: Mapping[str, str]) -> str:
    """`header` (its lines kept as given: comments, or a marker sentence), then `hash  path` per entry, by path."""
    return header + "".join(f"{h}  {rel}\n" for rel, h in sorted(entries.items()))


def parse(text: str) -> dict[str, str]:
    """relative path -> hash (or UNPINNED) of every manifest line in `text`; other lines are skipped."""
    return dict(reversed(m.groups()) for m in map(_LINE.match, text.splitlines()) if m)
