"""Calibrate this machine for CPU estimates: a probe of about 15-30 s, run once per CPU model, core count
and torch version, cached by `dstoolkit.hardware.calibration` (which starts it as a subprocess, so the core
never imports torch).

    python -m dstoolkit.runtime.probe --out calib.json [--ranks 2]

What it measures, per rank, with `--ranks` gloo ranks running side by side (as the 2-rank CPU jobs do):
- compute: forward + backward of one transformer block of a probe shape (not a test shape), per precision
  (fp32 and bf16) at two sizes, as effective FLOP/s. bf16 is measured, not assumed: on a CPU without native
  bf16 it runs about 100x slower than fp32, and the estimate follows;
- GEMMs: a grid of matmul shapes per precision (squares 64-1024 and thin ones; larger ones skipped once one
  takes over GEMM_SLOW_S, as bf16 does without native support): the best rate is the MFU denominator of
  estimates and the monitor, and a fit of time against shape drives the op-level CPU model
  (`dstoolkit.estimate.cpu_compute`);
- attention core: causal SDPA forward and forward + backward per query row on a (seq, head dim) grid, and the
  elementwise rest as the block's residual per saved byte (same module);
- optimizer traffic: a torch AdamW step over 2 M fp32 elements (bytes per element from
  `dstoolkit.estimate.step_time.ADAM_BYTES_PER_PARAM_UPDATE`);
- gloo all-reduce at two sizes: bus bandwidth (nccl-tests convention, docs/anchors.md) and latency;
- framework overhead: a one-block DeepSpeed engine step (compute ~ 0);
- gradient path: a ZeRO-2 engine step of a two-block model per precision, less the estimate of everything
  else, as the rate of DeepSpeed's memory-bound gradient handling (`grad_path_fields`).

The output has the file format `benchmarks/step_time_fidelity.py` writes (per-clock sections "wall" and
"cpu", per-precision rates), so a user can point `cluster.calibration` at either.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from typing import Callable, Optional, Sequence

from dstoolkit.runtime.cpu_precision import slow_precisions

PROBE_SHAPE = dict(name="probe", model_type="llama", hidden_size=320, num_hidden_layers=1, num_attention_heads=5,
                   num_key_value_heads=5, intermediate_size=864, vocab_size=2048)
"""Compute probe: between the widths of the step-time benchmark's shapes, and not one of them."""
TINY_SHAPE = dict(name="tinyprobe", model_type="llama", hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=256)
"""Overhead probe: compute is negligible, what remains is DeepSpeed's per-step cost."""
GRAD_PATH_SHAPE = dict(PROBE_SHAPE, name="gradprobe", num_hidden_layers=2)
"""Gradient-path probe: a whole model (embedding, two blocks, LM head) whose DeepSpeed step is timed."""
SEQ = 128
CLOCKS = ("wall", "cpu")
"""wall: elapsed time. cpu: this process's CPU time (robust when other processes share the machine)."""
GEMM_GRID = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 64, 512), (512, 512, 64), (64, 512, 512),
             (512, 512, 512), (2048, 256, 256), (1024, 1024, 1024))
"""(m, n, k) of the timed matmuls: squares for the GEMM peak and the size fall-off, thin ones for the
smallest-dimension fall-off (`dstoolkit.estimate.cpu_compute.fit_gemm` fits its form to them)."""
GEMM_SLOW_S = 0.25
"""A matmul slower than this ends the grid for its precision (keeps the probe a few seconds)."""
ATTENTION_GRID = ((128, 32), (128, 128), (512, 32), (512, 128))
"""(seq, head dim) of the timed causal attention cores: a full grid (interpolated in log space)."""
ATTENTION_ROWS = 1024
"""Query rows x heads per attention timing (heads = ATTENTION_ROWS / seq)."""


def _median_time(fn: Callable[[], None], reps: int, warmup: int = 1) -> dict[str, float]:
    """Median of `reps` timed calls per clock, after `warmup` calls, every rank starting together: the same
    statistic the benchmarks and the demo take of a job's steps (the fastest call instead made every estimate
    5-30% optimistic against median steps on this VM: benchmarks/step_time_fidelity.py, 2026-12-01)."""
    import torch.distributed as dist  # the probe runs under torch.distributed; the module is torch-only

    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}


def block_flops(shape, tokens: int, seq_len: int) -> float:
    """Model FLOPs of one block's forward + backward over `tokens` tokens of `seq_len`-long sequences, for a
    one-layer `shape`: 6 x the block's matmul parameters + attention (PaLM App. B; the LM head left out)."""
    from dstoolkit.estimate.flops import flops_per_token

    f = flops_per_token(shape, seq_len)
    return (f.dense - 6 * shape.vocab_size * shape.hidden_size + f.attention) * tokens


def op_rate_fields(shape, prec: str, grid: list, attention: list, blocks: dict[str, float]) -> dict:
    """Fields of the op-level CPU model for one precision and clock (`Calibration.has_op_rates`): the GEMM fit,
    the attention grid, and the elementwise rate that accounts for the rest of the probe block's measured time
    at its two sizes (`dstoolkit.estimate.cpu_compute`)."""
    from dstoolkit.estimate import cpu_compute as cc
    from dstoolkit.estimate.activations import layer_activation_bytes
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runplan import RunPlan

    fit = cc.fit_gemm(grid)
    rates = cc.OpRates(fit, tuple(tuple(p) for p in attention), 0.0)
    residual, saved = [], []
    for label, mb in (("", 2), ("_large", 8)):
        plan = RunPlan(shape=shape, ds_config={"train_micro_batch_size_per_gpu": mb, "bf16": {"enabled": prec == "bf16"}},
                       world_size=1, gpus_per_node=1, gpu=get_gpu("cpu"), seq_len=SEQ, precision=prec)
        b = layer_activation_bytes(plan, 0, mb).full
        residual.append(blocks[f"{prec}{label}"] - cc.layer_s(plan, rates, 0, mb * SEQ, mb, b, recompute=False))
        saved.append(b)
    per_byte = cc.fit_elementwise(residual, saved)
    return {f"gemm_rate_flops_per_s_{prec}": fit.rate_flops_per_s, f"gemm_half_dim_{prec}": fit.half_dim,
            f"gemm_call_s_{prec}": fit.call_s, f"attention_points_{prec}": attention,
            f"elementwise_s_per_byte_{prec}": per_byte}


def probe_rates() -> dict[str, dict[str, float]]:
    """Compute, optimizer-traffic and all-reduce rates of this rank (call on every rank of a gloo group)."""
    import torch
    import torch.distributed as dist

    from dstoolkit.estimate.step_time import ADAM_BYTES_PER_PARAM_UPDATE
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import Block

    out: dict[str, dict[str, float]] = {k: {} for k in CLOCKS}
    shape = ModelShape(**PROBE_SHAPE)
    tokens = 2 * SEQ
    flops = block_flops(shape, tokens, SEQ)
    blocks: dict[str, dict[str, float]] = {k: {} for k in CLOCKS}
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        blk = Block(shape, 0, 1).to(dtype)
        for label, mb in (("", 2), ("_large", 8)):  # GEMM efficiency grows with size: two points, interpolated
            x = torch.randn(mb, SEQ, shape.hidden_size, dtype=dtype, requires_grad=True)

            def fb() -> None:
                y, _ = blk(x)
                y.float().sum().backward()

            t = _median_time(fb, reps=5 if label else 7, warmup=1)
            for k in CLOCKS:
                out[k][f"matmul_flops_per_s_{prec}{label}"] = flops * (mb / 2) / t[k]
                out[k][f"matmul_work{label}"] = mb * SEQ * shape.hidden_size
                blocks[k][f"{prec}{label}"] = t[k]
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        grid, att = gemm_grid(dtype), attention_grid(dtype)
        for k in CLOCKS:
            out[k][f"gemm_peak_flops_per_s_{prec}"] = max(2.0 * m * n * kk / t for m, n, kk, t in grid[k])
            out[k].update(op_rate_fields(shape, prec, grid[k], att[k], blocks[k]))
    n = 2_000_000
    p = torch.nn.Parameter(torch.zeros(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3)
    t = _median_time(opt.step, reps=5, warmup=2)
    for k in CLOCKS:
        out[k]["mem_bw_bytes_per_s"] = n * ADAM_BYTES_PER_PARAM_UPDATE / t[k]
    sizes = [64 * 1024, 8 * 1024 * 1024]
    times = []
    for size in sizes:
        buf = torch.ones(size // 4)
        times.append(_median_time(lambda: dist.all_reduce(buf), reps=7, warmup=2))
    ws = dist.get_world_size()
    factor = 2 * (ws - 1) / ws if ws > 1 else 1.0  # all-reduce busbw factor (nccl-tests PERFORMANCE.md)
    for k in CLOCKS:
        slope = max((times[1][k] - times[0][k]) / (sizes[1] - sizes[0]), 1e-15)
        out[k]["comm_busbw_bytes_per_s"] = factor / slope
        out[k]["comm_latency_s"] = max(0.0, times[0][k] - sizes[0] * slope)
    return out


def gemm_grid(dtype) -> dict[str, list[tuple[int, int, int, float]]]:
    """Timed (m, n, k, seconds) per clock over GEMM_GRID, cheapest first (call on every rank: the ranks agree on
    when to stop through an all-reduce of the slowest time, so their barriers stay matched)."""
    import torch
    import torch.distributed as dist

    out: dict[str, list] = {k: [] for k in CLOCKS}
    for m, n, k_ in sorted(GEMM_GRID, key=lambda g: g[0] * g[1] * g[2]):
        a, b = torch.randn(m, k_).to(dtype), torch.randn(k_, n).to(dtype)
        t = _median_time(lambda: torch.mm(a, b), reps=5, warmup=1)
        for k in CLOCKS:
            out[k].append((m, n, k_, t[k]))
        slowest = torch.tensor([t["wall"]], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if slowest.item() > GEMM_SLOW_S:
            break
    return out


def attention_grid(dtype) -> dict[str, list[list[float]]]:
    """Causal SDPA per query row and head on ATTENTION_GRID: [seq, head_dim, fwd+bwd s, fwd s] per clock
    (`dstoolkit.estimate.cpu_compute.attention_row_s` interpolates them)."""
    import torch
    import torch.nn.functional as F

    out: dict[str, list] = {k: [] for k in CLOCKS}
    for seq, hd in ATTENTION_GRID:
        bh = max(1, ATTENTION_ROWS // seq)
        q, k_, v = (torch.randn(1, bh, seq, hd).to(dtype).requires_grad_() for _ in range(3))

        def fb() -> None:
            o = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
            o.backward(torch.ones_like(o))

        def fwd() -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k_, v, is_causal=True)

        tb, tf = _median_time(fb, reps=5, warmup=1), _median_time(fwd, reps=5, warmup=1)
        for k in CLOCKS:
            out[k].append([seq, hd, tb[k] / (bh * seq), tf[k] / (bh * seq)])
    return out


def engine_step_s(shape_kw: dict, precision: str = "fp32") -> dict[str, float]:
    """Seconds per step of a DeepSpeed engine at ZeRO-2 with torch AdamW (no JIT op build) training a model
    of `shape_kw` on one micro batch of 1 x SEQ tokens, per clock (median of 5 after 2 warm-up steps)."""
    import torch.distributed as dist

    from dstoolkit.runtime.synthetic import synthetic_batch

    engine, shape = _probe_engine(shape_kw, precision)
    ids, labels = synthetic_batch(shape, 1, SEQ, step=0, rank=dist.get_rank())

    def one_step() -> None:
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()

    t = _median_time(one_step, reps=5, warmup=2)
    del engine
    return t


def _probe_engine(shape_kw: dict, precision: str):
    import deepspeed

    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import build_model

    shape = ModelShape(**shape_kw)
    model = build_model(shape, seed=0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                           config=probe_engine_config(precision))
    return engine, shape


def probe_engine_config(precision: str) -> dict:
    """The DeepSpeed JSON of the probe's engine steps (ZeRO-2, torch AdamW, DeepSpeed's default buckets)."""
    return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
            "bf16": {"enabled": precision == "bf16"}, "zero_optimization": {"stage": 2}, "steps_per_print": 10_000}


def grad_path_fields(clock: dict, precision: str, measured_s: float, ranks: int) -> dict[str, float]:
    """`grad_bw_bytes_per_s_<precision>`: the rate at which the memory-bound gradient path (DeepSpeed's
    gradient hooks, bucket copies and casts, the parameter write-back; `estimate.step_time.GRAD_HANDLING_PASSES`)
    runs on this machine, from a real ZeRO-2 engine step of GRAD_PATH_SHAPE: its measured time minus the
    estimate of everything else, over the bytes that path moves. Nothing when the rest already explains the
    step (the memory bandwidth then stands in)."""
    from dstoolkit.estimate import estimate_run
    from dstoolkit.hardware.calibration import calibration_from_raw
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runplan import RunPlan

    def predicted(grad_bw: float) -> float:
        cal = calibration_from_raw({**clock, f"grad_bw_bytes_per_s_{precision}": grad_bw, "_source": "probe"},
                                   precision)
        plan = RunPlan(shape=ModelShape(**GRAD_PATH_SHAPE), ds_config=probe_engine_config(precision),
                       world_size=ranks, gpus_per_node=ranks, gpu=get_gpu("cpu"), seq_len=SEQ, precision=precision,
                       calibration=cal)
        return estimate_run(plan).step_time_s

    rest = predicted(1e30)
    grad_bytes = (predicted(clock["mem_bw_bytes_per_s"]) - rest) * clock["mem_bw_bytes_per_s"]
    if measured_s <= rest or grad_bytes <= 0:
        return {}
    return {f"grad_bw_bytes_per_s_{precision}": grad_bytes / (measured_s - rest)}


def probe_calibration(world: int) -> dict[str, dict]:
    """Every probe, per clock (call on every rank of a gloo group of `world` ranks): rates, the step overhead
    and the gradient path."""
    cal = probe_rates()
    overhead = engine_step_s(TINY_SHAPE)
    for k in CLOCKS:
        cal[k]["step_overhead_s"] = overhead[k]
    for prec in ("fp32", "bf16"):
        step = engine_step_s(GRAD_PATH_SHAPE, prec)
        for k in CLOCKS:
            cal[k].update(grad_path_fields(cal[k], prec, step[k], world))
    return cal


def _worker(rank: int, world: int, port: int, out_path: str, key: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import deepspeed
    import torch

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import end_ranks, install_rank_guards

    install_rank_guards("probe")
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed 0.19.8 never removes its CPU all-reduce buffers from /dev/shm
    t0 = time.time()
    load_before = os.getloadavg()[0]
    cal = probe_calibration(world)
    if rank == 0:
        from dstoolkit.common.atomic import atomic_write_text

        record = {
            "description": "Calibration of this machine for gpu: cpu estimates (dstoolkit.runtime.probe; per-rank "
                           f"rates with {world} gloo ranks side by side).",
            "machine": key,
            "env": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                    "python": platform.python_version(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            "probe_s": round(time.time() - t0, 1),
            # rates probed on a busy machine are low; the load (1-min average, before) says how busy it was
            "loadavg_before": load_before,
            "slow_precisions": slow_precisions(cal["wall"]),
            "calibration": cal,
        }
        atomic_write_text(pathlib.Path(out_path), json.dumps(record, indent=1) + "\n")
    end_ranks()


def run_probe(out_path: pathlib.Path, ranks: int = 2, key: Optional[dict] = None) -> dict:
    """Run the probe on `ranks` local gloo ranks and write the calibration JSON to `out_path`."""
    import torch.multiprocessing as mp

    from dstoolkit.runtime.train.launch import free_port

    from dstoolkit.common.cpu_env import cpu_rank_env

    os.environ.update(cpu_rank_env())  # the spawned ranks start with the allocator settings jobs get
    from dstoolkit.runtime.jitlock import check_locks

    check_locks(who="probe")  # a dead build's torch-extension lock would hang the ranks' DeepSpeed op load
    out_path.parent.mkdir(parents=True, exist_ok=True)
    mp.spawn(_worker, args=(ranks, free_port(), str(out_path), key or {}), nprocs=ranks, join=True)
    return json.loads(out_path.read_text(encoding="utf-8"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dstoolkit.runtime.probe", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=pathlib.Path, help="calibration JSON to write")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks probing side by side (default 2)")
    ap.add_argument("--key", default="{}", help="machine key (JSON) recorded in the file")
    args = ap.parse_args(argv)
    if args.ranks < 1:
        print(f"--ranks={args.ranks}: need at least 1", file=sys.stderr)
        return 2
    rec = run_probe(args.out, args.ranks, json.loads(args.key))
    wall = rec["calibration"]["wall"]
    cores = os.cpu_count() or 1
    from dstoolkit.hardware.machine_calibration import CONTENDED_CPU_SHARE, cpu_share

    share = cpu_share(rec)
    if rec["loadavg_before"] > cores or (share is not None and share < CONTENDED_CPU_SHARE):
        ran = f", its ranks ran {share:.0%} of the time" if share is not None else ""
        print(f"warning: the machine was busy while probing (load {rec['loadavg_before']:.1f} on {cores} cores{ran}): "
              f"rates may be low; it is probed again later, or delete {args.out} to probe again on a quiet machine",
              file=sys.stderr)
    print(f"calibrated in {rec['probe_s']} s: block fwd+bwd fp32 {wall['matmul_flops_per_s_fp32_large'] / 1e9:.1f} "
          f"GFLOP/s, bf16 {wall['matmul_flops_per_s_bf16_large'] / 1e9:.1f} GFLOP/s per rank (GEMM peak fp32 "
          f"{wall['gemm_peak_flops_per_s_fp32'] / 1e9:.1f}, bf16 {wall['gemm_peak_flops_per_s_bf16'] / 1e9:.1f}); all-reduce "
          f"{wall['comm_busbw_bytes_per_s'] / 1e9:.2f} GB/s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
