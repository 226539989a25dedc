"""What `dstoolkit.runtime.train.guard.Guard` needs besides its loop: the checkpoint folder's writer lock (the one
`dstoolkit train` takes, `writer_lock`), the LR cool-down hooks on the torch optimizer, the rank's peak memory."""
from __future__ import annotations

import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Optional


class CheckpointDirError(RuntimeError):
    """checkpoint_dir cannot be written or resumed by this run (the one-line reason names the folder and the fix;
    the same refusals as `dstoolkit train`'s, `dstoolkit.runtime.train.resume_check`)."""


_LOCKS: dict = {}
"""Writer locks this process holds, by resolved folder: [lock, Guards holding it] (a second Guard on the same folder
in one process, e.g. a notebook building it again, shares the lock instead of being refused by itself)."""


def take_lock(root: str, rank: int, world: int, log: Callable[[str], Any]) -> Optional[str]:
    """Global rank 0 takes `root`'s writer lock (`writer_lock.take`, as `trainer.take_writer_lock`: released at exit
    and on SIGTERM); every rank learns the outcome (one broadcast). Returns the key to `release_lock` with (None on
    the other ranks).

    Raises:
        CheckpointDirError: another live run writes into `root` (on every rank).
    """
    key, problem = None, None
    if rank == 0:
        key = str(Path(root).resolve())
        held = _LOCKS.get(key)
        if held is not None:
            held[1] += 1
        else:
            from dstoolkit.runtime.train.writer_lock import take

            lock, problem = take(root, flag="checkpoint_dir", note=log)
            if lock is not None:
                _LOCKS[key] = [lock, 1]
    if world > 1:
        import deepspeed.comm as dist

        box = [problem]
        dist.broadcast_object_list(box, src=0)
        problem = box[0]
    if problem:
        raise CheckpointDirError(problem)
    return key


def release_lock(key: Optional[str]) -> None:
    """Give back one Guard's hold on the lock `take_lock` returned `key` for; the last one removes the lock file."""
    held = _LOCKS.get(key) if key else None
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _LOCKS[key]
        held[0].release()


def check_seconds(value: Any) -> None:
    """`Guard.step(input_wait_s=...)`: a finite number of seconds >= 0."""
    import math

    from dstoolkit.runtime.train.spike import SettingError

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise SettingError("input_wait_s", value, "must be a finite number of seconds >= 0 (the time this micro-batch "
                                                  "waited for its data; None: not measured)", where="Guard.step")


def default_log(rank: int) -> Callable[[str], None]:
    """Rank 0 prints `[guard] ...` to stderr; the other ranks say nothing."""
    def log(m: str) -> None:
        if rank == 0:
            print(f"[guard] {m}", file=sys.stderr, flush=True)
    return log


def hook_lr_cooldown(optimizer: Any, multiplier: Any) -> bool:
    """Scale the LR of every update by `multiplier()` through the step pre/post hooks of the torch optimizer
    inside `optimizer` (DeepSpeed's ZeRO / bf16 wrappers hold it as `.optimizer`): scaled while it steps, put
    back right after, before a scheduler runs. False when there is no torch optimizer to hook."""
    try:
        import torch
    except ImportError:  # pragma: no cover - DeepSpeed needs torch
        return False
    for _ in range(4):
        if isinstance(optimizer, torch.optim.Optimizer):
            break
        optimizer = getattr(optimizer, "optimizer", None)
    else:
        return False
    saved: list = []

    def pre(opt, args, kwargs):
        m = multiplier()
        if m != 1.0:
            saved[:] = [(g, g["lr"]) for g in opt.param_groups]
            for g, lr in saved:
                g["lr"] = lr * m

    def post(opt, args, kwargs):
        for g, lr in saved:
            g["lr"] = lr
        saved.clear()

    for handle in _HOOKS.pop(optimizer, ()):  # a later Guard on the same engine replaces the earlier one's hooks
        handle.remove()
    _HOOKS[optimizer] = (optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post))
    return True


_HOOKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""The cool-down hooks on each torch optimizer (one Guard's at a time: two would scale the LR twice)."""


def peak_memory_bytes() -> float:
    import resource

    try:
        import torch

        if torch.cuda.is_available():
            return float(torch.cuda.max_memory_allocated())
    except Exception:  # noqa: BLE001 - memory is an extra of the record
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
