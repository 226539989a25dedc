"""Before a launch: what every rank of the example trainer would read and check, read and checked once in the
launching process, so bad input is one clear error (exit 2) instead of N rank tracebacks and the launcher's own.

`check_launch` parses the trainer's command line with the trainer's own parser, reads its inputs the way each rank
does (`trainer_inputs.read_inputs`, which also checks that --metrics-out, --checkpoint-dir and --monitor-dir can be
written: `trainer_inputs.check_output_paths`), and checks the DeepSpeed config against the number of ranks with
`dstoolkit validate`'s checks (`validate_config(..., world_size=N)`, as `dstoolkit validate --world-size N`):
a finding that appears only once the world size is known (the batch triad, DS201) is a config made for another
number of ranks. Then the --checkpoint-dir against the run (`resume_check`): a fresh run into a folder that holds
checkpoints, a --resume from a universal checkpoint, from unfinished saves only, or from a tag saved at another
ZeRO stage / dp size. No torch import.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

from dstoolkit.dsconfig.rules import DS201_DP_FIX_LEAD
from dstoolkit.runtime.train.fault_flags import World
from dstoolkit.runtime.train.names import CLI
from dstoolkit.runtime.train.resume_check import fresh_run_refusal, resume_refusal
from dstoolkit.runtime.train.writer_lock import live_writer_refusal
from dstoolkit.runtime.train.trainer_inputs import Inputs, UsageError, build_parser, ep_size_of, read_inputs
from dstoolkit.validate.engine import validate_config
from dstoolkit.validate.folder import LAYOUT_FILE, config_layout

__all__ = ["UsageError", "check_launch", "world_size_errors", "world_size_refusal"]


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


def model_parallel_layout(config_path: str, spec: Any) -> tuple[int, int, str]:
    """(tp, pp, where it was read) the config was made for: the generated folder's layout.json entry for it (what
    `dstoolkit validate` reads), else the spec's training.tp / pp (1 where "auto" or unreadable)."""
    layout = config_layout(config_path)
    if layout is not None:
        return int(layout.tp or 1), int(layout.pp or 1), f"{Path(config_path).parent / LAYOUT_FILE}"
    training = getattr(spec, "training", None)
    tp, pp = getattr(training, "tp", 1), getattr(training, "pp", 1)
    return (tp if isinstance(tp, int) else 1), (pp if isinstance(pp, int) else 1), "the spec's training.tp / pp"


def world_size_refusal(first: Any, inputs: Inputs, config_path: str, nproc: int, *, config_flag: str,
                       nproc_flag: str) -> str:
    """The refusal of a config whose batch sizes do not fit `nproc` data-parallel ranks (`first`: the first
    `world_size_errors` finding), naming fixes the launching command has. A config made for tensor / pipeline
    parallelism (tp x pp > 1) cannot run in the example trainer at any rank count: it is data parallel only (every
    rank builds the whole model; `builders.build_model_for_run`), so its fixes are another trainer or a tp 1 / pp 1
    layout, never a rank count."""
    head = f"{nproc_flag} {nproc} does not fit {config_flag} {config_path}: {first.message} [{first.code}]"
    tp, pp, where = model_parallel_layout(config_path, inputs.spec)
    own_trainer = ("run that layout with your own Megatron / DeepSpeed trainer through the generated launch files "
                   "(launch.sh with TRAIN_MODULE set to it, or `dstoolkit generate --target megatron-lm|megatron-"
                   "deepspeed`), or generate a strategy with tp 1 and pp 1 (training.tp: 1, training.pp: 1 in the "
                   "spec) and train that")
    if tp * pp > 1:
        return (f"{head}; it was made for tp {tp} x pp {pp} ({where}), and the bundled example trainer is data "
                f"parallel only (every rank holds the whole model): {own_trainer}")
    # DS201 checked without a layout may read the config as model parallel and advise `validate`'s --tp / --pp,
    # which `dstoolkit train` does not have: keep its data-parallel fix, say the rest in the trainer's terms
    fix = first.suggestion or ""
    mp_hint = DS201_DP_FIX_LEAD in fix
    fix = fix.split(DS201_DP_FIX_LEAD)[-1]
    fits = _fitting_world_size(inputs.ds_config, config_path)
    made_for = f"its batch sizes fit {fits} data-parallel ranks" if mp_hint else "the ranks it was made for"
    other = f"{nproc_flag} {fits} ({made_for})" if fits else "a config made for these ranks"
    note = (f" (if it was made for tensor / pipeline parallelism, the bundled trainer, data parallel only, cannot "
            f"run it: {own_trainer})") if mp_hint else ""
    return (f"{head}; {fix + ', ' if fix else ''}or run with {other}{note}. `dstoolkit validate CONFIG "
            "--world-size N` checks a config for N ranks")


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
            `nproc` ranks (the message names the fix); a --checkpoint-dir the run must not write into (another live
            run's writer lock: `writer_lock`) or cannot resume from (`resume_check`); a fault-injection or slow-rank
            flag that could never fire at `nproc` ranks (`fault_flags`).
    """
    parser = build_parser()

    def refuse(message: str) -> None:
        raise UsageError(f"the trainer's command line: {message} (`python -m {parser.prog} --help` lists its flags)")

    parser.error = refuse  # an unknown or malformed trainer flag: a UsageError, not argparse's exit
    args: argparse.Namespace = parser.parse_args(list(trainer_args))
    try:
        inputs = read_inputs(args, config_flag, World(nproc, f"{nproc_flag} {nproc}"))  # rank / micro-batch flags
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
        raise UsageError(world_size_refusal(bad[0], inputs, str(args.deepspeed_config), nproc, config_flag=config_flag,
                                            nproc_flag=nproc_flag))
    if args.checkpoint_dir:
        ep = ep_size_of(args, inputs.spec, inputs.shape, inputs.shrunk)
        problem = live_writer_refusal(args.checkpoint_dir) or (resume_refusal(args.checkpoint_dir, inputs.ds_config,
                                                                              nproc, replace(CLI, nproc=nproc_flag), ep)
                   if args.resume else fresh_run_refusal(args.checkpoint_dir))
        if problem:
            raise UsageError(problem)
    return inputs
