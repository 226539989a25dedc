"""Collective-communication bench with nccl-tests' columns, busbw factors and a correctness check per row.

Conventions (nccl-tests doc/PERFORMANCE.md, quoted in docs/anchors.md):

* ``size`` is the bytes of the largest buffer of the op, as nccl-tests prints it: the all-reduce buffer,
  the gathered output of all-gather, the input of reduce-scatter, the per-rank buffer of all-to-all,
  the broadcast buffer. ``count`` is ``size`` in elements of ``type``.
* ``algbw = size / time`` in GB/s (1 GB = 1e9 bytes).
* ``busbw = algbw x factor`` with factor 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
  reduce-scatter and all-to-all, 1 for broadcast. This is *not* DeepSpeedExamples' all-reduce
  "throughput" 2*S/t (which equals busbw only as n -> infinity).
* ``time_us`` is the median over repetitions of the per-op time, where each repetition's time is the
  slowest rank's (a collective is done when every rank is done).
* ``#wrong`` counts elements, summed over ranks, that differ from the analytically expected result
  of one extra call made after timing on freshly patterned buffers.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

from dstoolkit.estimate.collective_time import busbw_factor  # the one definition; comm_options.parse_ops vets op names first
from dstoolkit.runtime.bench import harness, results_jsonl, stats
from dstoolkit.runtime.bench.comm_options import BENCH_NAME, DTYPES, ELEMENT_BYTES, OPS, CommOptions
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.ranks import check_world_size, spawn_ranks
from dstoolkit.runtime.rankexit import destroy_groups, install_exit_guard

#: Relative tolerance of the correctness check per dtype. The test pattern uses small integers, which
#: are exact in every type for world sizes up to 8; the tolerance only matters beyond that.
_RTOL = {"float32": 1e-6, "float64": 1e-12, "float16": 1e-3, "bfloat16": 8e-3}


@dataclasses.dataclass(frozen=True)
class Layout:
    """Buffer geometry of one op at one requested size."""

    size_bytes: int
    """Bytes of the op's largest buffer (nccl-tests 'size'), after rounding to the world size."""
    count: int
    """size_bytes in elements."""
    in_numel: int
    out_numel: int


def layout(op: str, size_bytes: int, element_bytes: int, world_size: int) -> Layout:
    """Round a requested size to whole elements divisible by the world size where the op needs it."""
    count = max(1, size_bytes // element_bytes)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(world_size, count // world_size * world_size)
    per_rank = count // world_size
    if op == "all_reduce" or op == "broadcast":
        in_n, out_n = count, count
    elif op == "all_gather":
        in_n, out_n = per_rank, count
    elif op == "reduce_scatter":
        in_n, out_n = count, per_rank
    else:  # all_to_all
        in_n, out_n = count, count
    return Layout(size_bytes=count * element_bytes, count=count, in_numel=in_n, out_numel=out_n)


_SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")


def plan_rows(ops: Sequence[str], sizes: Sequence[int], dtype: str,
              world_size: int) -> tuple[list[tuple[str, int]], list[str]]:
    """The (op, requested size) rows to measure and a note for each size that is not measured as asked.

    A size becomes whole `dtype` elements (and, for all_gather / reduce_scatter / all_to_all, a whole number of
    elements per rank: `layout`); two requested sizes that give the same buffer are measured once (the first),
    so the table never shows the same op and size twice."""
    elem = ELEMENT_BYTES[dtype]
    plan: list[tuple[str, int]] = []
    notes: list[str] = []
    for op in ops:
        groups: dict[int, list[int]] = {}  # measured bytes -> requested sizes, in order
        for s in sizes:
            groups.setdefault(layout(op, s, elem, world_size).size_bytes, []).append(s)
        for got, asked in groups.items():
            keep = got if got in asked else asked[0]  # a request of exactly the measured size names the row
            plan.append((op, keep))
            if keep != got:
                unit = (f"whole {dtype} elements split evenly over {world_size} ranks: a multiple of "
                        f"{world_size * elem} B" if op in _SPLIT_OPS else
                        f"whole {dtype} elements: a multiple of {elem} B")
                notes.append(f"{op} {keep} B: measured as {got} B ({unit})")
            notes += [f"{op} {s} B: the same {got} B buffer as {keep} B; measured once" for s in asked if s != keep]
    return plan, notes


# --------------------------------------------------------------------------------------------------
# Rank-side work (torch imported here only)
# --------------------------------------------------------------------------------------------------


def _pattern(torch, numel: int, rank: int, offset: int, dtype):
    """Rank r's test values: (r + 1) * ((offset + i) % 7 + 1), small integers exact in every dtype."""
    idx = torch.arange(offset, offset + numel, dtype=torch.int64)
    return ((idx % 7 + 1) * (rank + 1)).to(dtype)


def _expected(torch, op: str, lay: Layout, rank: int, world: int, dtype):
    """The analytically correct output of `op` on rank `rank` for the `_pattern` inputs."""
    rank_sum = world * (world + 1) // 2  # sum over ranks of (r + 1)
    per = lay.count // world if op != "broadcast" and op != "all_reduce" else lay.count
    if op == "all_reduce":
        return _pattern(torch, lay.count, rank_sum - 1, 0, torch.int64).to(dtype)
    if op == "broadcast":
        return _pattern(torch, lay.count, 0, 0, dtype)
    if op == "all_gather":
        return torch.cat([_pattern(torch, per, j, 0, dtype) for j in range(world)])
    if op == "reduce_scatter":
        return (_pattern(torch, per, 0, rank * per, torch.int64) * rank_sum).to(dtype)
    # all_to_all: chunk j of the output is chunk `rank` of rank j's input
    return torch.cat([_pattern(torch, per, j, rank * per, dtype) for j in range(world)])


def op_callable(torch, dist, op: str, inp, out, group=None) -> Callable[[], Any]:
    if op == "all_reduce":
        return lambda: dist.all_reduce(inp, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(inp, src=0, group=group)
    if op == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, inp, group=group)
    if op == "reduce_scatter":
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(out, inp, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(out, inp, group=group)
    raise BenchInputError(f"unknown op {op!r}")


def count_wrong(torch, got, expected) -> int:
    """Elements of `got` that differ from `expected` (relative tolerance per float dtype, exact for integers)."""
    if got.shape != expected.shape:
        return int(max(got.numel(), expected.numel()))
    if got.dtype.is_floating_point:
        rtol = _RTOL.get(str(got.dtype).replace("torch.", ""), 1e-6)
        ok = torch.isclose(got.double(), expected.double(), rtol=rtol, atol=0.0)
    else:
        ok = got == expected
    return int((~ok).sum())


def _check_wrong(torch, dist, op: str, lay: Layout, rank: int, world: int, dtype, device) -> int:
    """Run `op` once on patterned buffers and count wrong elements summed over ranks."""
    if op == "broadcast" and rank != 0:
        inp = torch.zeros(lay.in_numel, dtype=dtype, device=device)
    else:
        inp = _pattern(torch, lay.in_numel, rank, 0, dtype).to(device)
    out = torch.zeros(lay.out_numel, dtype=dtype, device=device) if op in ("all_gather", "reduce_scatter", "all_to_all") else None
    op_callable(torch, dist, op, inp, out)()
    got = (out if out is not None else inp).cpu()
    exp = _expected(torch, op, lay, rank, world, dtype)
    wrong = torch.tensor([count_wrong(torch, got, exp)], dtype=torch.int64, device=device)
    dist.all_reduce(wrong)
    return int(wrong.item())


def measure_row(torch, dist, op: str, size_bytes: int, opts: CommOptions, rank: int, world: int, device,
                progress: Optional[Callable[[], None]] = None) -> dict[str, Any]:
    """Time one (op, size) on the current process group and check correctness. Collective: all ranks call it."""
    dtype = getattr(torch, opts.dtype)
    lay = layout(op, size_bytes, ELEMENT_BYTES[opts.dtype], world)
    # Timing buffers are zeros: repeated in-place sums stay finite (no inf/denormal slow paths).
    inp = torch.zeros(lay.in_numel, dtype=dtype, device=device)
    out = torch.zeros(lay.out_numel, dtype=dtype, device=device) if op in ("all_gather", "reduce_scatter", "all_to_all") else None
    fn = op_callable(torch, dist, op, inp, out)

    # Size the inner loop to the time budget from one timed warm-up call (same value on every rank).
    harness.sync_all()
    t0 = time.perf_counter()
    fn()
    harness.sync_all()
    probe = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX)
    est_s = max(float(probe.item()), 1e-7)
    iters = opts.iters
    if est_s * iters * opts.reps > opts.time_budget_s:
        iters = max(1, int(opts.time_budget_s / (est_s * opts.reps)))
    warmup = min(opts.warmup, max(1, iters)) if iters < opts.iters else opts.warmup

    samples = harness.time_repeated(fn, warmup=warmup, reps=opts.reps, inner=iters, progress=progress)
    # A repetition lasts as long as its slowest rank.
    t = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    samples = [float(x) for x in t.cpu().tolist()]

    wrong = _check_wrong(torch, dist, op, lay, rank, world, dtype, device)
    factor = busbw_factor(op, world)
    time_stats = stats.summarize([s * 1e6 for s in samples])
    algbw_samples = [lay.size_bytes / s / 1e9 for s in samples]
    busbw_samples = [a * factor for a in algbw_samples]
    bus_stats = stats.summarize(busbw_samples)
    return {
        "op": op,
        "size": lay.size_bytes,
        "requested_size": size_bytes,
        "count": lay.count,
        "type": DTYPES[opts.dtype][1],
        "time_us": time_stats.median,
        # from the reported median time (nccl-tests: algbw = size / time): with an even --reps the median of per-rep
        # bandwidths is another pair of reps than the median time, and the columns would not match their header
        **dict(zip(("algbw", "busbw"), bandwidths(lay.size_bytes, time_stats.median, factor))),
        "#wrong": wrong,
        "busbw_factor": factor,
        "bw_unit": "GB/s (1e9 bytes/s)",
        "bw_convention": "nccl-tests: algbw=size/time, busbw=algbw*factor",
        "time_us_stats": time_stats.to_dict(),
        "busbw_stats": bus_stats.to_dict(),
        "samples_us": [s * 1e6 for s in samples],
        "iters": iters,
        "reps": opts.reps,
        "warmup": warmup,
        "world_size": world,
        "backend": opts.backend,
        "dtype": opts.dtype,
    }


def bandwidths(size_bytes: int, time_us: float, factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) of one row from its reported time (nccl-tests convention: algbw =
    size / time, busbw = algbw x factor)."""
    algbw = size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return algbw, algbw * factor


def row_key(op: str, size: int) -> str:
    """Resume key of one row."""
    return f"{op}:{size}"


def rank_main(rank: int, world: int, local_rank: int, opts: CommOptions, port: Optional[int],
              rows_path: Optional[str]) -> list[dict[str, Any]]:
    """Body of one rank: init the process group (unless already initialised), run every row, return rows on rank 0."""
    import torch
    import torch.distributed as dist

    if opts.backend == "gloo":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    device = torch.device("cpu")
    if opts.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    own_group = False
    if not dist.is_initialized():
        init = f"tcp://127.0.0.1:{port}" if port is not None else "env://"
        dist.init_process_group(opts.backend, init_method=init, rank=rank, world_size=world,
                                timeout=__import__("datetime").timedelta(seconds=opts.timeout_s))
        own_group = True
        install_exit_guard()  # the groups we made are released before the interpreter exits (rankexit)
    try:
        cfg = opts.config()
        cfg_hash = harness.config_hash(cfg)
        state = results_jsonl.open_run(opts.out, BENCH_NAME, cfg_hash, resume=opts.resume) if rank == 0 else None
        # Everyone must skip the same rows: broadcast rank 0's resume set.
        obj = [sorted(state.done_keys) if state else None, state.run_id if state else None]
        dist.broadcast_object_list(obj, src=0)
        done, run_id = set(obj[0]), obj[1]
        plan, notes = plan_rows(opts.ops, opts.sizes, opts.dtype, world)
        todo = [(op, s) for op, s in plan if row_key(op, s) not in done]
        env = harness.capture_env(world, opts.backend, cfg) if rank == 0 else {}
        for note in notes if rank == 0 else ():
            print(f"# bench comm: {note}", file=sys.stderr)
        if rank == 0 and done:
            print(f"# resuming run {run_id}: {len(done)} rows already in {opts.out}, {len(todo)} to go", file=sys.stderr)
        rows: list[dict[str, Any]] = []
        with harness.progress_bar(len(todo) * opts.reps, "bench comm", enabled=opts.progress and rank == 0) as update:
            for op, size in todo:
                row = measure_row(torch, dist, op, size, opts, rank, world, device, progress=lambda: update(1))
                if rank == 0:
                    env["load_avg"] = harness.load_average()
                    rec = results_jsonl.base_record(BENCH_NAME, run_id, row_key(op, size), dict(env))
                    rec.update(row)
                    rows.append(rec)
                    if opts.out:
                        results_jsonl.append_records(opts.out, [rec])
                    if rows_path:
                        results_jsonl.append_records(rows_path, [rec])
        if rank == 0 and opts.out:
            results_jsonl.close_run(opts.out, BENCH_NAME, cfg_hash, run_id)
        if rank == 0 and done and opts.out:
            # Return the whole run (earlier rows included) so the table is complete after a resume.
            rows = [r for r in results_jsonl.read_records(opts.out) if r.get("run_id") == run_id and r.get("event") is None
                    and r.get("bench") == BENCH_NAME]
        dist.barrier()
        return rows if rank == 0 else []
    finally:
        if own_group:
            destroy_groups()


def _spawn_entry(rank: int, world: int, opts: CommOptions, port: int, rows_path: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    os.dup2(2, 1)  # spawned ranks' logs go to stderr: stdout carries only the parent's table / JSON
    rank_main(rank, world, rank, opts, port, rows_path)


def run_comm(opts: CommOptions) -> list[dict[str, Any]]:
    """Run the comm bench: inside the current launcher's ranks, or by spawning `opts.world_size` local ranks.

    Returns:
        Rank 0's result rows (other ranks under a launcher get an empty list).
    """
    opts.check()
    launched = harness.launched_env()
    if launched is not None:
        rank, world, local = launched
        opts.world_size = world
        return rank_main(rank, world, local, opts, None, None)
    check_world_size(opts.backend, opts.world_size)
    port = harness.free_port()
    with tempfile.TemporaryDirectory(prefix="dstoolkit-comm-") as tmp:
        rows_path = str(pathlib.Path(tmp) / "rows.jsonl")
        spawn_ranks(_spawn_entry, opts.world_size, (opts.world_size, opts, port, rows_path), opts.timeout_s)
        rows = results_jsonl.read_records(rows_path)
    if opts.out and rows:
        run_id = rows[0]["run_id"]
        rows = [r for r in results_jsonl.read_records(opts.out) if r.get("run_id") == run_id and r.get("event") is None
                and r.get("bench") == BENCH_NAME]
    for r in rows:
        r.pop("_file", None)
    return rows


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------

TABLE_COLUMNS = ("size", "count", "type", "time_us", "algbw", "busbw", "#wrong")


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """nccl-tests-style text table, one block per op, with the bandwidth convention stated."""
    if not rows:
        return "# no rows"
    r0 = rows[0]
    lines = [
        f"# dstoolkit bench comm  backend={r0.get('backend')}  world_size={r0.get('world_size')}  "
        f"reps={r0.get('reps')}  (time = median over reps of the slowest rank; spread = p10-p90 busbw)",
        "# algbw = size/time, busbw = algbw x factor [all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all "
        "(n-1)/n; broadcast 1] -- nccl-tests convention, GB/s = 1e9 B/s; NOT DeepSpeedExamples' 2S/t 'throughput'",
    ]
    for op in OPS:
        op_rows = [r for r in rows if r.get("op") == op]
        if not op_rows:
            continue
        lines.append(f"# {op}")
        lines.append(f"#{'size':>12} {'count':>12} {'type':>9} {'time_us':>12} {'algbw':>8} {'busbw':>8} "
                     f"{'#wrong':>7} {'busbw p10-p90':>15} {'iters':>6}")
        for r in sorted(op_rows, key=lambda r: r["size"]):
            st = r.get("busbw_stats", {})
            spread = f"{st.get('p10', 0):.3f}-{st.get('p90', 0):.3f}" if st else ""
            lines.append(f" {r['size']:>12} {r['count']:>12} {r['type']:>9} {r['time_us']:>12.1f} {r['algbw']:>8.3f} "
                         f"{r['busbw']:>8.3f} {r['#wrong']:>7} {spread:>15} {r.get('iters', ''):>6}")
    wrong = sum(int(r.get("#wrong", 0)) for r in rows)
    lines.append(f"# out-of-bounds values: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    return "\n".join(lines)


def json_rows(rows: Sequence[dict[str, Any]]) -> str:
    """One JSON record per op and size (nccl-tests column names plus stats and env)."""
    return json.dumps(list(rows), indent=1, default=str)
