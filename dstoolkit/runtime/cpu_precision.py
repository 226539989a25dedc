"""Which precision this CPU runs at a usable rate: bf16 without native support (no avx512_bf16 / AMX) goes through
aten's generic GEMM at ~1-2 GFLOP/s, 50-100x below fp32. The probe reports such precisions from its measured rates
(`slow_precisions`); test and demo jobs whose timing assumes a usable precision ask `precision_for_this_cpu`.
"""
from __future__ import annotations

import time

SLOW_DTYPE_RATIO = 0.25
"""A precision whose rate is below this fraction of fp32's is reported as slow on this CPU."""


def slow_precisions(clock: dict[str, float]) -> list[str]:
    """Precisions that run far below fp32's rate here (e.g. bf16 on a CPU without native bf16)."""
    fp32 = clock.get("matmul_flops_per_s_fp32_large") or clock.get("matmul_flops_per_s_fp32")
    out = []
    for prec in ("bf16",):
        rate = clock.get(f"matmul_flops_per_s_{prec}_large") or clock.get(f"matmul_flops_per_s_{prec}")
        if fp32 and rate and rate < SLOW_DTYPE_RATIO * fp32:
            out.append(prec)
    return out


def precision_for_this_cpu(precision: str = "bf16", n: int = 256) -> str:
    """`precision`, or "fp32" where it runs below SLOW_DTYPE_RATIO of fp32's GEMM rate on this CPU (bf16 without
    avx512_bf16 / amx: ~1-2 GFLOP/s through aten's generic GEMM, 50-100x below fp32). A quick check (an n^3 matmul
    per dtype, best of 5 after 3 warm-up calls; ~0.1 s where bf16 is slow) for test jobs whose timing assumes a
    usable precision."""
    if precision == "fp32":
        return precision
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]

    def best_s(dt) -> float:
        a, b = torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)
        for _ in range(3):  # the first calls start the thread pool and pick the kernel (seen 300x slower)
            a @ b
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t0)
        return min(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: a busy second core stalls a 2-thread GEMM for milliseconds
    try:
        return "fp32" if best_s(torch.float32) < SLOW_DTYPE_RATIO * best_s(dtype) else precision
    finally:
        torch.set_num_threads(threads)
