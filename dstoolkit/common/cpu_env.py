"""Environment of CPU training ranks: the one place that says what dstoolkit sets for them (no torch import).

- OMP_NUM_THREADS=1: CPU ranks share the machine's cores; the deepspeed launcher does not set it, and 2 ranks
  with a BLAS pool each oversubscribe 2 cores.
- glibc malloc keeps freed memory for reuse: MALLOC_MMAP_THRESHOLD_ (no mmap/munmap per large tensor),
  MALLOC_TRIM_THRESHOLD_ (the heap is not given back to the kernel after each step) and MALLOC_TOP_PAD_ (the
  heap grows in 1 GiB steps). These are glibc's documented mallopt(3) parameters M_MMAP_THRESHOLD,
  M_TRIM_THRESHOLD and M_TOP_PAD set through their environment variables. With glibc's defaults every tensor
  above the (dynamic, at most 32 MiB) mmap threshold is mapped fresh and first-touched each step; PyTorch's
  performance tuning guide recommends an allocator that reuses memory for CPU training for this reason
  ("Switch Memory allocator": jemalloc / TCMalloc). Measured here (benchmarks/results/cpu_malloc_202612.md,
  `benchmarks/cpu_malloc.py`): a 26M-parameter ZeRO-2 bf16 step on 2 CPU ranks takes ~96,000 minor page
  faults with the defaults and ~100 with these settings, and runs about a third faster. The cost: a rank keeps
  its peak heap until it exits (what a training process reaches every step anyway).

The probe that calibrates CPU estimates (`dstoolkit.runtime.probe`) runs with the same environment, so estimates
describe ranks launched this way; values the user already exported win.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

CPU_RANK_ENV: dict[str, str] = {
    "OMP_NUM_THREADS": "1",
    "MALLOC_MMAP_THRESHOLD_": str(16 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
    "MALLOC_TOP_PAD_": str(1 << 30),
}
"""Variable -> default for CPU ranks (see the module docstring)."""


def cpu_rank_env(base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """`base` (default: os.environ) with CPU_RANK_ENV's defaults added where `base` has no value."""
    env = dict(os.environ if base is None else base)
    for key, value in CPU_RANK_ENV.items():
        env.setdefault(key, value)
    return env


def shell_exports() -> list[str]:
    """`export VAR="${VAR:-default}"` lines for CPU_RANK_ENV (generated launch scripts)."""
    return [f'export {k}="${{{k}:-{v}}}"' for k, v in CPU_RANK_ENV.items()]
