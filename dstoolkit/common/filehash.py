"""SHA-256 of a file, read in chunks: the one hash the trainer's checkpoint manifest is written and checked with
(dstoolkit.runtime.train.ckpt writes it, dstoolkit.ckpt.inspect and the trainer's resume verify it)."""
from __future__ import annotations

import hashlib
import os

HASH_CHUNK_BYTES = 1 << 20
"""Read size while hashing: 1 MiB keeps memory flat for multi-GB shards."""


def sha256_file(path: "os.PathLike[str] | str") -> str:
    """Hex SHA-256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()
