"""Harness overhead: `bench comm` busbw against a bare torch.distributed timing loop on the same sizes.

Both are measured in the same ranks, interleaved round by round so that load from other processes hits both
alike. The bare loop is the simplest honest timing: barrier, perf_counter, N calls, barrier, perf_counter, with the
median over the same number of windows as the harness uses repetitions (so both use the same statistic).
Goal (issue #5): the harness agrees within 5% (median busbw).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/comm_overhead.py \
        --out benchmarks/results/comm_overhead_cpu_202611.jsonl            # ~3 min on 2 gloo ranks here

Appends one record per (op, size) to --out (bench = "comm_overhead"); `dstoolkit report` renders it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from dstoolkit.runtime.bench import comm, comm_options, harness, ranks, results_jsonl

BENCH_NAME = "comm_overhead"


def _bare_busbw(torch, dist, op: str, size: int, world: int, iters: int, reps: int, warmup: int, dtype) -> float:
    """Plain torch.distributed: barrier, perf_counter, `iters` calls, barrier; median of `reps` such windows."""
    lay = comm.layout(op, size, torch.tensor([], dtype=dtype).element_size(), world)
    inp = torch.zeros(lay.in_numel, dtype=dtype)
    out = torch.zeros(lay.out_numel, dtype=dtype)
    if op == "all_reduce":
        call = lambda: dist.all_reduce(inp)  # noqa: E731
    else:
        call = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            call()
        dist.barrier()
        times.append((time.perf_counter() - t0) / iters)
    dt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return lay.size_bytes / statistics.median(dt.tolist()) / 1e9 * comm.busbw_factor(op, world)


def _rank(rank: int, world: int, port: int, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    sizes = comm_options.parse_sizes(args.sizes)
    ops = comm_options.parse_ops(args.ops)
    cfg = {"bench": BENCH_NAME, "sizes": sizes, "ops": ops, "rounds": args.rounds, "iters": args.iters, "world": world}
    env = harness.capture_env(world, "gloo", cfg) if rank == 0 else {}
    run_id = results_jsonl.open_run(args.out, BENCH_NAME, harness.config_hash(cfg), resume=False).run_id
    opts = comm_options.CommOptions(ops=ops, sizes=sizes, iters=args.iters, warmup=2, reps=3, backend="gloo",
                            world_size=world, time_budget_s=1e9, progress=False)
    for op in ops:
        for size in sizes:
            h, b = [], []
            for rnd in range(args.rounds):
                # ABBA order: neither method always runs first (caches, scheduler state, load drift).
                order = ("h", "b") if rnd % 2 == 0 else ("b", "h")
                for which in order:
                    if which == "h":
                        h.append(comm.measure_row(torch, dist, op, size, opts, rank, world, torch.device("cpu"))["busbw"])
                    else:
                        b.append(_bare_busbw(torch, dist, op, size, world, args.iters, opts.reps, 2, torch.float32))
            if rank == 0:
                hm, bm = statistics.median(h), statistics.median(b)
                env["load_avg"] = harness.load_average()
                rec = results_jsonl.base_record(BENCH_NAME, run_id, f"{op}:{size}", dict(env))
                rec.update({"op": op, "size": comm.layout(op, size, 4, world).size_bytes, "harness_busbw": hm,
                            "bare_busbw": bm, "rel_diff": hm / bm - 1, "harness_samples": h, "bare_samples": b,
                            "rounds": args.rounds, "iters": args.iters, "world_size": world, "backend": "gloo"})
                results_jsonl.append_records(args.out, [rec])
                print(f"{op:>12} {size:>11}  harness {hm:.3f}  bare {bm:.3f} GB/s  diff {100 * (hm / bm - 1):+.1f}%  "
                      f"load {env['load_avg']}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1M,16M,64M")
    ap.add_argument("--ops", default="all_reduce,all_gather")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved harness/bare rounds per size")
    ap.add_argument("--iters", type=int, default=5, help="ops per repetition")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ranks.spawn_ranks(_rank, args.world_size, (args.world_size, harness.free_port(), args), 3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
