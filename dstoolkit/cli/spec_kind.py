"""Whether the SPEC a verb was given is a DeepSpeed config instead (a common first mistake: `dstoolkit generate
ds_config.json`). generate, sweep, tune and estimate SPEC ask `deepspeed_config_problem` before their spec loader,
whose reading of such a file is "required field is missing" plus one "unknown key" per DeepSpeed key. No torch
import."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

EXAMPLE_SPEC = "ds_configs/tiny_cpu.yaml"
"""The spec a refusal points to (the one launch/demo.sh generates from)."""


def deepspeed_keys(data: dict) -> list[str]:
    """The top-level keys of `data` that are DeepSpeed config keys (the committed schema's properties, i.e.
    `DeepSpeedConfig`'s fields by their JSON names), in file order."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.validate.schema_check import load_schema

    props = load_schema()["properties"]
    return [k for k in data if k in props]


def deepspeed_config_problem(path: str, verb: str) -> Optional[str]:
    """The one line that says SPEC is a DeepSpeed config, not a spec, or None: a JSON / hjson object (read as
    `dstoolkit validate` reads configs, `validate.parse.parse_text`) with none of the spec's sections
    (`validate.findings.SPEC_SECTIONS`) and a top-level key of DeepSpeed's config (the committed schema's
    properties). Anything else, unreadable files included, is left to the spec loader and its located errors.
    `verb`: the command the user ran (its name starts the sentence that says what it takes)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.validate.findings import SPEC_SECTIONS
    from dstoolkit.validate.parse import parse_text

    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    parsed = parse_text(text, str(path))
    if parsed.fatal or not isinstance(parsed.data, dict) or any(k in parsed.data for k in SPEC_SECTIONS):
        return None
    ds_keys = deepspeed_keys(parsed.data)
    if not ds_keys:
        return None
    shown = ", ".join(ds_keys[:3]) + (", ..." if len(ds_keys) > 3 else "")
    return (f"{path} is a DeepSpeed config (top-level {shown}), not a spec: {verb} "
            f"takes a spec (model + cluster + training sections), e.g. {EXAMPLE_SPEC}; a DeepSpeed config goes to "
            f"`dstoolkit validate {path}` or `dstoolkit estimate --config {path} --model NAME --world-size N`")
