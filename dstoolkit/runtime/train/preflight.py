"""Before a launch: what every rank of the example trainer would read and check, read and checked once in the
launching process, so bad input is one clear error (exit 2) instead of N rank tracebacks and the launcher's own.

`check_launch` parses the trainer's command line with the trainer's own parser, reads its inputs the way each rank
does (`trainer_inputs.read_inputs`, which also checks that --metrics-out, --checkpoint-dir and --monitor-dir can be
written: `trainer_inputs.check_output_paths`), and checks the DeepSpeed config against the number of ranks with
`dstoolkit validate`'s checks (`validate_config(..., world_size=N)`, as `dstoolkit validate --world-size N`):
a finding that appears only once the world size is known (the batch triad, DS201) is a config made for another
number of ranks. No torch import.
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from dstoolkit.runtime.train.trainer_inputs import Inputs, UsageError, build_parser, read_inputs
from dstoolkit.validate.engine import validate_config

__all__ = ["UsageError", "check_launch", "world_size_errors"]


def world_size_errors(ds_config: dict, world_size: int, source: str = "<config>") -> list:
    """The error findings of `validate_config` that a world size of `world_size` adds (pure data parallel, as
    the example trainer runs): errors the config has anyway are not counted here (each rank reports them)."""
    def errors(world: Optional[int]) -> list:
        return [f for f in validate_config(ds_config, source=source, world_size=world, mode="hf")
                if str(f.severity).lower().endswith("error")]

    known = {(f.code, f.pointer) for f in errors(None)}
    return [f for f in errors(world_size) if (f.code, f.pointer) not in known]


def _fitting_world_size(ds_config: dict, source: str, limit: int = 64) -> Optional[int]:
    """The smallest rank count (up to `limit`) the config's batch sizes fit, checked by `world_size_errors`."""
    for n in range(1, limit + 1):
        if not world_size_errors(ds_config, n, source):
            return n
    return None


def check_launch(trainer_args: Sequence[str], nproc: int, *, config_flag: str = "--deepspeed_config",
                 nproc_flag: str = "--nproc") -> Inputs:
    """Read and check a trainer launch before any rank starts.

    Args:
        trainer_args: the trainer's command line (``--deepspeed_config ... --spec ... --steps ...``).
        nproc: ranks to launch.
        config_flag, nproc_flag: how the caller's command line names the config and the rank count (messages).

    Returns:
        The inputs the ranks will read.

    Raises:
        UsageError: a flag the trainer refuses, an unreadable config or spec, an output path that cannot be
            written (a file in the path, a folder for --metrics-out), or a config whose batch sizes do not fit
            `nproc` ranks (the message names the fix).
    """
    parser = build_parser()

    def refuse(message: str) -> None:
        raise UsageError(f"the trainer's command line: {message} (`python -m {parser.prog} --help` lists its flags)")

    parser.error = refuse  # an unknown or malformed trainer flag: a UsageError, not argparse's exit
    args: argparse.Namespace = parser.parse_args(list(trainer_args))
    try:
        inputs = read_inputs(args)
    except UsageError as exc:
        text = str(exc)
        if text.startswith("--deepspeed_config ") and config_flag != "--deepspeed_config":
            text = config_flag + text[len("--deepspeed_config"):]
        raise UsageError(text) from None
    if not isinstance(inputs.ds_config, dict):
        raise UsageError(f"{config_flag} {args.deepspeed_config}: holds a JSON {type(inputs.ds_config).__name__}, "
                         "not a DeepSpeed config object; pass the ds_config.json of a generated folder")
    bad = world_size_errors(inputs.ds_config, nproc, str(args.deepspeed_config))
    if bad:
        fits = _fitting_world_size(inputs.ds_config, str(args.deepspeed_config))
        first = bad[0]
        fix = f"{first.suggestion}, " if first.suggestion else ""
        other = f"{nproc_flag} {fits} (the ranks it was made for)" if fits else "a config made for these ranks"
        raise UsageError(f"{nproc_flag} {nproc} does not fit {config_flag} {args.deepspeed_config}: {first.message} "
                         f"[{first.code}]; {fix}or run with {other}. `dstoolkit validate CONFIG --world-size N` "
                         "checks a config for N ranks")
    return inputs
