"""The ranges of the example trainer's fault-injection and slow-rank flags (--inject-poison, --inject-lr-blowup,
--kill-at-step, --kill-rank, --data-delay-s, --data-delay-rank, --link-probe-bytes), checked before any rank starts:
by `dstoolkit train`'s pre-flight at its --nproc (`preflight.check_launch`) and by the trainer's own read of its flags
at the launch's world size (`trainer_inputs.read_inputs`). A fault that can never fire (a rank the run does not have,
a step beyond --steps, a micro-batch the step does not train) ran the whole demo without it, and nothing said why no
culprit, rollback or kill appeared. Pure functions: each returns the refusal, one line naming the flag, the value
and the fix, or None. No torch import.
"""
from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from typing import Any, Optional

from dstoolkit.dsconfig.registry import as_int
from dstoolkit.layout.dims import LayoutError, resolve_batch
from dstoolkit.runtime.train.crossrank import PROBE_BYTES

DEFAULT_KILL_RANK = 1
"""The rank --kill-at-step kills when --kill-rank is not given."""
PROBE_ITEM_BYTES = 4
"""The link probe sends `probe_bytes // 4` float32 values (crossrank.CrossRank._probe): fewer bytes send nothing."""


@dataclass(frozen=True)
class World:
    """The number of ranks a launch starts, and how its command line or environment names it (messages)."""

    size: int
    named: str


@dataclass(frozen=True)
class StepAccum:
    """The micro-batches each rank trains in one optimizer step, and where that number comes from."""

    count: int
    source: str


def launched_world() -> Optional[World]:
    """The world size this process was launched into, before the process group exists: WORLD_SIZE (torchrun and the
    deepspeed launcher set it), else OMPI_COMM_WORLD_SIZE (mpirun, which DeepSpeed's `mpi_discovery` reads through
    mpi4py); None when neither says (rank-dependent checks are then left to the launch)."""
    for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"):
        size = os.environ.get(name, "").strip()
        if size.isdigit() and int(size) > 0:
            return World(int(size), f"{name}={size}, the launch's world size")
    return None


def parse_blowups(specs: list[str]) -> dict[int, float]:
    """--inject-lr-blowup STEP:FACTOR values -> {step: factor}; `fault_flags_problem` has refused bad ones."""
    return {int(s.split(":")[0]): float(s.split(":")[1]) for s in specs}


def step_accum(ds_config: Any, spec: Any, world: Optional[World], step: int, config_flag: str,
               config_path: str) -> Optional[StepAccum]:
    """Micro-batches per rank in optimizer step `step` (1-based): the config's gradient_accumulation_steps, given or
    completed from the batch triad at the world size the way DeepSpeed does (`layout.dims.resolve_batch`; runtime/
    config.py `_set_batch_related_parameters`), or, with the spec's batch ramp, the ramp's at that step (the trainer
    applies `BatchRamp.batch_at(consumed_samples)` before each step; `estimate.batch_ramp`). None when it cannot be
    known here (an "auto" or inconsistent triad: DeepSpeed or `dstoolkit validate` says that)."""
    if not isinstance(ds_config, dict):
        return None
    tb, mb, ga = (as_int(ds_config.get(k)) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                      "gradient_accumulation_steps"))
    ramp = getattr(getattr(spec, "training", None), "batch_ramp", None)
    if ramp is None and ga is not None and ga > 0:
        return StepAccum(ga, f"gradient_accumulation_steps {ga} of {config_flag} {config_path}")
    if world is None:
        return None
    dp = world.size // max(1, as_int(ds_config.get("sequence_parallel_size")) or 1)
    try:
        triad = resolve_batch(tb, mb, ga, max(1, dp))
    except LayoutError:
        return None
    if ramp is None:
        return StepAccum(triad.grad_accum, f"gradient_accumulation_steps {triad.grad_accum} of {config_flag} "
                                           f"{config_path} at {world.named}")
    from dstoolkit.estimate.batch_ramp import BatchRamp

    try:
        sched = BatchRamp.from_spec(ramp, global_batch=triad.train_batch, micro_batch=triad.micro_batch, dp_size=dp,
                                    seq_len=spec.training.seq_len)
    except ValueError:
        return None
    at = sched.schedule(step)[-1]  # step `step` is the schedule's point step - 1 (0-based)
    return StepAccum(at.grad_accum, f"the spec's batch_ramp at step {step}: global batch {at.global_batch} = micro "
                                    f"batch {sched.micro_batch} x {sched.dp_size} ranks x {at.grad_accum} "
                                    f"({world.named})")


def _rank_problem(flag: str, rank: int, world: Optional[World], fix: str, default: bool = False) -> Optional[str]:
    """A rank flag: 0 <= rank < the world size (>= 0 where the world size is unknown); `default`: the value is the
    flag's default, not typed."""
    said = f"{flag}={rank}{' (the default)' if default else ''}"
    if rank < 0:
        return f"{said} must be a rank, a whole number >= 0; {fix}"
    if world is not None and rank >= world.size:
        return (f"{said} is not a rank of this run: it has {world.size} rank{'s' * (world.size > 1)}, "
                f"0..{world.size - 1} ({world.named}); {fix}")
    return None


def _step_problem(flag: str, value: str, step: int, steps: int) -> Optional[str]:
    """A fault's step: 1..--steps (the trainer's steps are 1-based; a later one is never reached)."""
    if 1 <= step <= steps:
        return None
    when = f"is beyond --steps {steps}" if step > steps else "never comes (steps count from 1)"
    return f"{flag}={value}: step {step} {when}, so it never fires; give a step 1..{steps}"


def _twice(flag: str, steps: list[int], values: list[str]) -> Optional[str]:
    """One fault per step: a second value for the same step replaced the first silently (a dict)."""
    for i, s in enumerate(steps):
        if s in steps[:i]:
            return (f"{flag} is given twice for step {s} ({values[steps.index(s)]} and {values[i]}); only one "
                    "fires: give each step once")
    return None


def fault_flags_problem(args: argparse.Namespace, *, world: Optional[World], ds_config: Any, spec: Any,
                        config_flag: str = "--deepspeed_config") -> Optional[str]:
    """The refusal of a fault-injection or slow-rank flag that is out of range or would never fire, or None.
    `world`: the ranks of the launch (None: unknown, rank bounds unchecked); `config_flag`: the caller's name for the
    DeepSpeed config. Micro-batch MICRO of --inject-poison STEP:MICRO fires when the step has trained MICRO batches
    (`FaultInjector.poison_due`), so it must be below the step's gradient accumulation (`step_accum`)."""
    steps = args.steps
    if not (math.isfinite(args.data_delay_s) and args.data_delay_s >= 0):
        return (f"--data-delay-s={args.data_delay_s} must be a finite number of seconds >= 0 (0: no delay), "
                "e.g. 0.3")
    if args.data_delay_rank is not None:
        if not args.data_delay_s:
            return (f"--data-delay-rank={args.data_delay_rank} without --data-delay-s: no rank sleeps; add "
                    "--data-delay-s SECONDS, e.g. --data-delay-s 0.3")
        problem = _rank_problem("--data-delay-rank", args.data_delay_rank, world,
                                "give one of them, or leave the flag out to slow every rank")
        if problem:
            return problem
    if args.link_probe_bytes is not None and not (args.link_probe_bytes == 0
                                                  or args.link_probe_bytes >= PROBE_ITEM_BYTES):
        return (f"--link-probe-bytes={args.link_probe_bytes} must be 0 (off) or a byte count >= {PROBE_ITEM_BYTES} "
                f"(the probe sends float32 values), e.g. {PROBE_BYTES} (the default)")
    if args.kill_rank is not None and args.kill_at_step is None:
        return (f"--kill-rank={args.kill_rank} without --kill-at-step: no rank is killed; add --kill-at-step STEP "
                f"(1..{steps})")
    if args.kill_at_step is not None:
        rank = DEFAULT_KILL_RANK if args.kill_rank is None else args.kill_rank
        fix = "give the rank to kill with --kill-rank" + (f" 0..{world.size - 1}" if world else "")
        problem = _step_problem("--kill-at-step", str(args.kill_at_step), args.kill_at_step, steps) or _rank_problem(
            "--kill-rank", rank, world, fix, default=args.kill_rank is None)
        if problem:
            return problem
    blowups = [s.split(":") for s in args.inject_lr_blowup]
    for text, parts in zip(args.inject_lr_blowup, blowups):
        try:
            step, factor = int(parts[0]), float(parts[1]) if len(parts) == 2 else None
        except ValueError:
            factor = None
        if factor is None:
            return f"--inject-lr-blowup {text!r}: expected STEP:FACTOR, e.g. 18:1000"
        if not (math.isfinite(factor) and factor > 0):
            return f"--inject-lr-blowup={text}: factor {factor} must be a finite number > 0, e.g. {step}:1000"
        problem = _step_problem("--inject-lr-blowup", text, step, steps)
        if problem:
            return problem
    problem = _twice("--inject-lr-blowup", [int(p[0]) for p in blowups], args.inject_lr_blowup)
    if problem:
        return problem
    texts = [f"{s}:{m}" for s, m in args.inject_poison]
    for (step, micro), text in zip(args.inject_poison, texts):
        problem = _step_problem("--inject-poison", text, step, steps)
        if problem:
            return problem
        accum = step_accum(ds_config, spec, world, step, config_flag, str(args.deepspeed_config))
        if accum is not None and micro >= accum.count:
            return (f"--inject-poison={text}: step {step} trains {accum.count} micro-batch"
                    f"{'es' * (accum.count > 1)} per rank ({accum.source}), so micro-batch {micro} never comes; give "
                    f"a 0-based MICRO 0..{accum.count - 1}, e.g. {step}:{accum.count - 1}")
    return _twice("--inject-poison", [s for s, _ in args.inject_poison], texts)
