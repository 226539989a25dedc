"""One reader of a DeepSpeed JSON file for the verbs beside `dstoolkit validate` (estimate --config, fp8 plan
--config): validate's own reader, so a file either verb refuses is refused with validate's DS00x finding. No
pydantic, no torch import."""
from __future__ import annotations

from dstoolkit.validate.parse import decode_bytes, parse_text


def read_config_file(path: str) -> tuple[str, dict]:
    """The file as `dstoolkit validate` reads it (`decode_bytes` then `parse_text`: UTF-8 with or without a BOM,
    DeepSpeed's hjson subset, comments and trailing commas), as (text, data). Raises OSError when it cannot be read,
    and ValueError with validate's finding (`Finding.format_text`) when it is not a config: YAML, binary, too large,
    a top level that is not an object."""
    with open(path, "rb") as fh:
        text, problem = decode_bytes(fh.read(), path)
    if problem is None:
        parsed = parse_text(text, path)
        if not parsed.fatal:
            return text, parsed.data
        problem = next(f for f in parsed.findings if f.severity == "error")
    raise ValueError(problem.format_text())
