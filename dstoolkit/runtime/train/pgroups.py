"""Process groups for the example trainer: the world group and every group DeepSpeed makes later (ZeRO, expert,
expert-data-parallel) with one timeout (--dist-timeout-s), so a collective stuck on a dead peer fails instead of
hanging.
"""
from __future__ import annotations

import datetime
import math

from dstoolkit.runtime.rankexit import install_exit_guard


def set_default_group_timeout(timeout_s: float) -> datetime.timedelta:
    """Make every process group created from now on without an explicit timeout use `timeout_s`.

    DeepSpeed 0.19.8 creates its ZeRO data-parallel group (`groups._clone_world_group`), expert and
    expert-data-parallel groups with `deepspeed.comm.new_group(ranks)`, which calls
    `torch.distributed.new_group(ranks)` with no timeout; torch 2.13 then reads the module globals
    `distributed_c10d.default_pg_timeout` (gloo and others: 30 min) or `default_pg_nccl_timeout` (NCCL: 10 min)
    through `_get_default_timeout` at creation time. Setting both here covers every later group.

    Args:
        timeout_s: seconds (> 0).

    Returns:
        The timeout as a timedelta (pass it to `deepspeed.init_distributed` for the world group).
    """
    import torch.distributed.distributed_c10d as c10d

    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"process-group timeout {timeout_s} s must be a positive number of seconds, e.g. 600")
    timeout = datetime.timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    if c10d.default_pg_nccl_timeout is not None:  # None when torch is built without NCCL (CPU wheels)
        c10d.default_pg_nccl_timeout = timeout
    return timeout


def init_distributed(backend: str, timeout_s: float) -> list[str]:
    """`deepspeed.init_distributed` with `timeout_s` on the world group AND on every group made afterwards.

    Call it before `deepspeed.initialize` (and before building an MoE model): the groups DeepSpeed creates
    there take the timeout set here. A collective waiting on a rank that stopped answering then raises after
    about `timeout_s` instead of hanging.

    Args:
        backend: "gloo" or "nccl".
        timeout_s: seconds (> 0).

    Returns:
        The /dev/shm buffer names this rank unlinked (`dstoolkit.runtime.train.shm.unlink_after_rendezvous`; gloo only).
    """
    timeout = set_default_group_timeout(timeout_s)
    import deepspeed

    install_exit_guard()  # whatever the caller does, the groups are released before the interpreter exits
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    if backend == "gloo":
        from dstoolkit.runtime.train.shm import unlink_after_rendezvous

        # DeepSpeed never unlinks its CPU all-reduce buffers (dstoolkit.runtime.train.shm): once every rank has mapped
        # them, drop their names so nothing is left in /dev/shm however the job ends.
        return unlink_after_rendezvous()
    return []
