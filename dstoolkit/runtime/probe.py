"""Calibrate this machine for CPU estimates: a probe of about 15-30 s, run once per CPU model, core count
and torch version, cached by `dstoolkit.hardware.calibration` (which starts it as a subprocess, so the core
never imports torch).

    python -m dstoolkit.runtime.probe --out calib.json [--ranks 2]

What it measures, per rank, with `--ranks` gloo ranks running side by side (as the 2-rank CPU jobs do):
- compute: forward + backward of one transformer block of a probe shape (not a test shape), per precision
  (fp32 and bf16) at two sizes, as effective FLOP/s. bf16 is measured, not assumed: on a CPU without native
  bf16 it runs about 100x slower than fp32, and the estimate follows;
- GEMM peak: the best square matmul per precision (sizes 256-1024; larger ones skipped once one matmul takes
  over GEMM_SLOW_S, as bf16 does without native support) - the MFU denominator of estimates and the monitor;
- optimizer traffic: a torch AdamW step over 2 M fp32 elements (bytes per element from
  `dstoolkit.estimate.step_time.ADAM_BYTES_PER_PARAM_UPDATE`);
- gloo all-reduce at two sizes: bus bandwidth (nccl-tests convention, docs/anchors.md) and latency;
- framework overhead: a one-block DeepSpeed engine step (compute ~ 0).

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

PROBE_SHAPE = dict(name="probe", model_type="llama", hidden_size=320, num_hidden_layers=1, num_attention_heads=5,
                   num_key_value_heads=5, intermediate_size=864, vocab_size=2048)
"""Compute probe: between the widths of the step-time benchmark's shapes, and not one of them."""
TINY_SHAPE = dict(name="tinyprobe", model_type="llama", hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=256)
"""Overhead probe: compute is negligible, what remains is DeepSpeed's per-step cost."""
SEQ = 128
CLOCKS = ("wall", "cpu")
"""wall: elapsed time. cpu: this process's CPU time (robust when other processes share the machine)."""
GEMM_SIZES = (256, 512, 1024)
"""Square matmul sizes for the GEMM peak (the probe keeps the best rate)."""
GEMM_SLOW_S = 0.25
"""A matmul slower than this ends the size ladder for its precision (keeps the probe a few seconds)."""
SLOW_DTYPE_RATIO = 0.25
"""A precision whose rate is below this fraction of fp32's is reported as slow on this CPU."""


def _median_time(fn: Callable[[], None], reps: int, warmup: int = 1) -> dict[str, float]:
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
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        blk = Block(shape, 0, 1).to(dtype)
        for label, mb in (("", 2), ("_large", 8)):  # GEMM efficiency grows with size: two points, interpolated
            x = torch.randn(mb, SEQ, shape.hidden_size, dtype=dtype, requires_grad=True)

            def fb() -> None:
                y, _ = blk(x)
                y.float().sum().backward()

            t = _median_time(fb, reps=3 if label else 5, warmup=1)
            for k in CLOCKS:
                out[k][f"matmul_flops_per_s_{prec}{label}"] = flops * (mb / 2) / t[k]
                out[k][f"matmul_work{label}"] = mb * SEQ * shape.hidden_size
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for k, rate in gemm_peak(dtype).items():
            out[k][f"gemm_peak_flops_per_s_{prec}"] = rate
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


def gemm_peak(dtype) -> dict[str, float]:
    """Best FLOP/s of a square matmul over GEMM_SIZES, per clock (call on every rank: the ranks agree on when
    to stop through an all-reduce of the slowest time, so their barriers stay matched)."""
    import torch
    import torch.distributed as dist

    best = {k: 0.0 for k in CLOCKS}
    for n in GEMM_SIZES:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        t = _median_time(lambda: torch.mm(a, b), reps=3, warmup=1)
        for k in CLOCKS:
            best[k] = max(best[k], 2.0 * n**3 / max(t[k], 1e-9))
        slowest = torch.tensor([t["wall"]], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if slowest.item() > GEMM_SLOW_S:
            break
    return best


def probe_step_overhead() -> dict[str, float]:
    """Per-step framework cost: a one-block DeepSpeed engine at ZeRO-2 with torch AdamW (no JIT op build)."""
    import deepspeed

    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import build_model, synthetic_batch

    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": 2}, "steps_per_print": 10_000}
    shape = ModelShape(**TINY_SHAPE)
    model = build_model(shape, seed=0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    import torch.distributed as dist

    ids, labels = synthetic_batch(shape, 1, SEQ, step=0, rank=dist.get_rank())

    def one_step() -> None:
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()

    return _median_time(one_step, reps=5, warmup=2)


def slow_precisions(clock: dict[str, float]) -> list[str]:
    """Precisions that run far below fp32's rate here (e.g. bf16 on a CPU without native bf16)."""
    fp32 = clock.get("matmul_flops_per_s_fp32_large") or clock.get("matmul_flops_per_s_fp32")
    out = []
    for prec in ("bf16",):
        rate = clock.get(f"matmul_flops_per_s_{prec}_large") or clock.get(f"matmul_flops_per_s_{prec}")
        if fp32 and rate and rate < SLOW_DTYPE_RATIO * fp32:
            out.append(prec)
    return out


def _worker(rank: int, world: int, port: int, out_path: str, key: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_SIZE=str(world))
    import deepspeed
    import torch

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed 0.19.8 never removes its CPU all-reduce buffers from /dev/shm
    t0 = time.time()
    load_before = os.getloadavg()[0]
    cal = probe_rates()
    overhead = probe_step_overhead()
    for k in CLOCKS:
        cal[k]["step_overhead_s"] = overhead[k]
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
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run_probe(out_path: pathlib.Path, ranks: int = 2, key: Optional[dict] = None) -> dict:
    """Run the probe on `ranks` local gloo ranks and write the calibration JSON to `out_path`."""
    import torch.multiprocessing as mp

    from dstoolkit.runtime.train.launch import free_port

    os.environ.setdefault("OMP_NUM_THREADS", "1")
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
    if rec["loadavg_before"] > cores:
        print(f"warning: the machine was busy while probing (load {rec['loadavg_before']:.1f} on {cores} cores): "
              f"rates may be low; delete {args.out} to probe again on a quiet machine", file=sys.stderr)
    print(f"calibrated in {rec['probe_s']} s: block fwd+bwd fp32 {wall['matmul_flops_per_s_fp32_large'] / 1e9:.1f} "
          f"GFLOP/s, bf16 {wall['matmul_flops_per_s_bf16_large'] / 1e9:.1f} GFLOP/s per rank (GEMM peak fp32 "
          f"{wall['gemm_peak_flops_per_s_fp32'] / 1e9:.1f}, bf16 {wall['gemm_peak_flops_per_s_bf16'] / 1e9:.1f}); all-reduce "
          f"{wall['comm_busbw_bytes_per_s'] / 1e9:.2f} GB/s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
