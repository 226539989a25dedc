"""Local ranks for a bench: spawn `world` processes and fail cleanly when one fails or the time runs out, and refuse
more local ranks than this machine has devices or cores (split from runtime.bench.comm; the comm, overlap and
train benches share it)."""
from __future__ import annotations

import time
from typing import Callable

from dstoolkit.runtime.bench import harness
from dstoolkit.runtime.bench.harness import BenchInputError


def spawn_ranks(entry: Callable, world: int, args: tuple, timeout_s: float) -> None:
    """Start `world` spawned processes running ``entry(rank, *args)``; fail (and kill them) after timeout_s.

    Raises:
        RuntimeError: a rank failed or the timeout passed.
    """
    import torch.multiprocessing as mp

    ctx = mp.start_processes(entry, args=args, nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise RuntimeError(f"ranks did not finish within {timeout_s:g} s (raise --timeout-s)")
    except mp.ProcessRaisedException as exc:
        raise RuntimeError(f"a rank failed: {str(exc).strip().splitlines()[-1]}") from None
    except mp.ProcessExitedException as exc:
        raise RuntimeError(f"a rank exited abnormally: {exc}") from None
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)


def check_world_size(backend: str, world_size: int) -> None:
    """Refuse more local ranks than this node has devices (nccl) or CPU cores (gloo)."""
    limit = harness.max_local_ranks(backend)
    if world_size > limit:
        what = "CUDA devices" if backend == "nccl" else "CPU cores (one gloo rank per core)"
        raise BenchInputError(
            f"--world-size {world_size}: this machine has {limit} {what}; use --world-size {max(limit, 2) if limit >= 2 else 2}"
            + (" on a machine with at least 2 GPUs" if backend == "nccl" and limit < 2 else "")
            + " or run under torchrun across nodes"
        )
