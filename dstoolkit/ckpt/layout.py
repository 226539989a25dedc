"""Which layouts a checkpoint can be resharded to through a DeepSpeed 0.19.8 universal checkpoint (no torch).

The rules, each with where DeepSpeed decides it:
- dp (world size) and ZeRO stage 1-3 may change: the universal checkpoint holds each parameter whole
  (checkpoint/ds_to_universal.py `main`, zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt) and every ZeRO optimizer
  re-partitions it on load (runtime/zero/stage_1_and_2.py `_load_universal_checkpoint`,
  stage3.py `_load_universal_checkpoint`).
- tp / pp may change only for models that declare how their tensors split (`universal_checkpoint_info`
  patterns, written by Megatron-DeepSpeed); a plain model has none, so ds_to_universal merges nothing across
  tp/pp and the target must keep them.
- expert parallelism (native DeepSpeed MoE, `deepspeed.moe.layer.MoE`): ds_to_universal skips the experts
  ("assuming native DeepSpeed MoE and skipping AutoEP consolidation", checkpoint/ds_to_universal.py:1250-1252),
  and `extract_zero_shards` (ds_to_universal.py:133-171) keys each optimizer fragment by the rank-local
  parameter name, so local expert 0 of ep rank 0 (global expert 0) and of ep rank 1 (global expert E/ep) land
  in the same zero/<name>/ folder; a universal load (runtime/engine.py:4621-4623) then skips the per-expert
  files. Native-MoE checkpoints with ep > 1 therefore cannot be resharded; only AutoEP layers carry the
  metadata that makes experts movable.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

from dstoolkit.ckpt.errors import CkptError

ZERO_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class Target:
    """The layout a resharded checkpoint will be resumed at (None: not constrained)."""

    world: Optional[int] = None
    zero: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    ep: Optional[int] = None


def parse_target(text: str) -> Target:
    """`world=1,zero=3,tp=1,pp=1,ep=1` -> Target.

    Raises:
        CkptError: an empty list, an unknown key, a key given twice, or a value that is not a positive integer
            (zero=0 is parsed: `check_target` refuses it, naming the stages a universal checkpoint loads into).
    """
    keys = [f.name for f in fields(Target)]
    values: dict[str, int] = {}
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise CkptError("--to", f"{text!r} names no layout", "write KEY=N pairs, e.g. --to world=1,zero=3 "
                        "(or leave --to out)")
    for part in parts:
        if not part:
            raise CkptError("--to", f"{text!r} has an empty item between commas",
                            "write KEY=N pairs separated by single commas, e.g. --to world=1,zero=3")
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or key not in keys:
            raise CkptError("--to", f"{part!r} is not KEY=N with KEY one of {', '.join(keys)}",
                            "write e.g. --to world=1,zero=3")
        raw = raw.strip()
        least = 0 if key == "zero" else 1  # zero=0 is a stage: check_target says why a universal load cannot be it
        if not raw.isascii() or not raw.isdigit() or int(raw) < least:
            raise CkptError("--to", f"{key}={raw!r} is not a positive integer",
                            "give zero=1, 2 or 3" if key == "zero" else f"give {key}=N with N >= 1")
        if key in values:
            raise CkptError("--to", f"{key} is given twice ({key}={values[key]} and {key}={int(raw)})",
                            f"give {key} once")
        values[key] = int(raw)
    return Target(**values)


def check_target(info, target: Target) -> list[tuple[str, str]]:
    """(problem, fix) for each reason `info` (a CheckpointInfo) cannot be resumed at `target`; empty when it can."""
    out: list[tuple[str, str]] = []
    if target.zero is not None and target.zero not in ZERO_STAGES:
        out.append((f"target zero={target.zero}: a universal checkpoint loads into ZeRO stages 1-3 only "
                    "(runtime/engine.py loads zero/ through the ZeRO optimizer)",
                    "resume at zero=1, 2 or 3"))
    for dim in ("tp", "pp"):
        have, want = getattr(info, dim) or 1, getattr(target, dim)
        if want is not None and want != have:
            out.append((f"target {dim}={want} but the checkpoint was written at {dim}={have}, and its model declares "
                        "no tensor-split patterns (universal_checkpoint_info), so DeepSpeed cannot re-split it",
                        f"keep {dim}={have}; change dp (world size) or the ZeRO stage instead"))
    ep = info.ep or 1
    if info.num_experts and ep > 1:
        out.append((f"native DeepSpeed MoE at ep={ep}: ds_to_universal skips native experts "
                    "(deepspeed/checkpoint/ds_to_universal.py:1250-1252) and keys optimizer fragments by the "
                    "rank-local name (ds_to_universal.py:133-171), so experts of different ep ranks collide",
                    f"resume at the same layout (ep={ep}, same world size) from the original checkpoint "
                    "with load_checkpoint; or train with ep=1 (or AutoEP layers) to be able to reshard"))
    elif info.num_experts and target.ep is not None and target.ep != ep:
        out.append((f"target ep={target.ep} but the checkpoint is native DeepSpeed MoE at ep={ep}: "
                    "ds_to_universal does not consolidate native experts (ds_to_universal.py:1250-1252)",
                    f"resume at ep={ep}"))
    elif not info.num_experts and target.ep is not None and target.ep > 1:
        out.append((f"target ep={target.ep} but the checkpoint's model has no MoE layers (no num_experts in its "
                    "model states): there are no experts to split over expert-parallel ranks",
                    "leave ep out of --to (or give ep=1)"))
    if target.world is not None and info.tp and info.pp:
        mp = int(target.tp or info.tp) * int(target.pp or info.pp)
        if target.world % mp:
            out.append((f"target world={target.world} is not a multiple of tp x pp = {mp}",
                        f"pick a world size divisible by {mp}"))
        elif target.ep and (target.world // mp) % target.ep:
            out.append((f"target ep={target.ep} does not divide the data-parallel size {target.world // mp}",
                        "pick ep dividing world / (tp x pp)"))
    return out
