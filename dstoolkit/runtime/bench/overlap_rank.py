"""Rank-side work of `dstoolkit bench overlap` (`dstoolkit.runtime.bench.overlap`): each spawned rank builds the
engine of every variant and measures the overlapped step and the replayed communication (N ranks), or the compute
alone (one rank, `compute_only_entry`), with an optional torch-profiler trace of the step.
"""
from __future__ import annotations

import gc
import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, results_jsonl
from dstoolkit.runtime.bench.overlap_math import covered_length, exposed_length
from dstoolkit.runtime.rankexit import end_ranks, install_exit_guard

#: Profiler event name prefixes that are communication work (gloo worker spans, NCCL kernels).
COMM_EVENT_PREFIXES = ("gloo:", "nccl", "ncclDevKernel", "ncclKernel")
#: Main-thread profiler events that are communication bookkeeping, not compute.
COMM_BOOKKEEPING_PREFIXES = ("c10d::", "record_param_comms", "gloo:", "nccl:", "dstoolkit.")


def _op_kind(log_name: str) -> Optional[str]:
    n = log_name.lower()
    if "reduce_scatter" in n:
        return "reduce_scatter"
    if "all_gather" in n or "allgather" in n:
        return "all_gather"
    if "all_to_all" in n or "alltoall" in n:
        return "all_to_all"
    if "all_reduce" in n or "allreduce" in n:
        return "all_reduce"
    if "broadcast" in n:
        return "broadcast"
    return None


def _engine(shape, ds_cfg: dict, ep_size: int):
    import deepspeed
    from dstoolkit.runtime.model import build_model, moe_param_groups

    model = build_model(shape, ep_size=ep_size, seed=0)
    engine, *_ = deepspeed.initialize(model=model, config=ds_cfg, model_parameters=moe_param_groups(model))
    return engine


def _batches(shape, micro_batch: int, seq_len: int, rank: int, device, n: int = 4):
    from dstoolkit.runtime.synthetic import synthetic_batch

    return [tuple(t.to(device) for t in synthetic_batch(shape, micro_batch, seq_len, step=i, rank=rank)) for i in range(n)]


def _capture_comm(engine, batch) -> list[dict[str, Any]]:
    """Run one step with DeepSpeed's comms logger on; return [{op, log_name, bytes, count}]."""
    from deepspeed.comm import comm as dscomm

    logger = dscomm.comms_logger
    saved = (logger.enabled, logger.prof_all, logger.verbose)
    logger.comms_dict = {}
    logger.enabled, logger.prof_all, logger.verbose = True, True, False
    try:
        loss = engine(*batch)
        engine.backward(loss)
        engine.step()
    finally:
        logger.enabled, logger.prof_all, logger.verbose = saved
    calls = []
    for log_name, by_size in logger.comms_dict.items():
        for size, entry in by_size.items():
            calls.append({"op": _op_kind(log_name), "log_name": log_name, "bytes": int(size), "count": int(entry[0]),
                          "logged_latency_s": float(sum(entry[1])) / 1000.0})  # the logger keeps milliseconds
    logger.comms_dict = {}
    return calls


def replay_comm(calls: Sequence[dict[str, Any]], world: int, device, warmup: int, reps: int) -> list[float]:
    """Replay the captured collectives alone (float32 buffers of the same bytes); seconds per step, one per rep."""
    import torch
    import torch.distributed as dist

    from dstoolkit.runtime.bench.comm import layout, op_callable

    fns = []
    for c in calls:
        if c["op"] is None or c["bytes"] <= 0:
            continue
        op = c["op"]
        in_bytes = c["bytes"]
        # The logger records the input tensor's bytes; nccl-tests 'size' is the larger buffer for all-gather.
        size = in_bytes * world if op == "all_gather" else in_bytes
        lay = layout(op, size, 4, world)
        inp = torch.zeros(lay.in_numel, dtype=torch.float32, device=device)
        out = torch.zeros(lay.out_numel, dtype=torch.float32, device=device)
        fn = op_callable(torch, dist, op, inp, out)
        fns += [fn] * c["count"]
    if not fns:
        return [0.0] * reps

    def one_step():
        for f in fns:
            f()

    return harness.time_repeated(one_step, warmup=warmup, reps=reps)


def _profile_steps(engine, batches, steps: int) -> list[dict[str, float]]:
    """Per profiled step: step wall, communication union and its exposed part (seconds)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for i in range(steps):
            harness.sync_all()
            with record_function("dstoolkit.overlap.step"):
                loss = engine(*batches[i % len(batches)])
                engine.backward(loss)
                engine.step()
                harness.device_sync()
    events = list(prof.events())
    windows = [e for e in events if e.name == "dstoolkit.overlap.step"]
    out = []
    for w in windows:
        ws, we, main = w.time_range.start, w.time_range.end, w.thread
        comm, compute = [], []
        for e in events:
            s, t = e.time_range.start, e.time_range.end
            if t <= ws or s >= we or e is w:
                continue
            s, t = max(s, ws), min(t, we)
            is_gpu = str(getattr(e, "device_type", "")).endswith("CUDA")
            if e.name.startswith(COMM_EVENT_PREFIXES):
                comm.append((s, t))
            elif is_gpu:
                compute.append((s, t))
            elif (e.thread == main and not torch.cuda.is_available() and not e.cpu_children
                  and not e.name.startswith(COMM_BOOKKEEPING_PREFIXES)):
                # Leaf ops only: an enclosing span (an autograd node whose gradient hook issues a blocking
                # all-reduce, say) would otherwise count the wait for communication as compute.
                compute.append((s, t))
        comm_s = covered_length(comm) / 1e6  # profiler times are microseconds
        out.append({"step_s": (we - ws) / 1e6, "comm_union_s": comm_s, "exposed_s": exposed_length(comm, compute) / 1e6})
    return out


def _free_engine(engine) -> None:
    try:
        engine.destroy()
    except Exception:
        pass
    del engine
    gc.collect()


def _stdout_to_stderr() -> None:
    """Spawned ranks log (DeepSpeed prints to stdout); keep the parent's stdout for the table / JSON only."""
    sys.stdout.flush()
    os.dup2(2, 1)


def compute_only_entry(index: int, ports: list[int], payload: dict, out_dir: str) -> None:
    """Spawn target for the compute-only phase: engine `index` of N, each in its own 1-rank process group."""
    rank_main(0, 1, ports[index], payload, str(pathlib.Path(out_dir) / f"single_{index}.jsonl"), device_index=index)


def rank_main(rank: int, world: int, port: int, payload: dict, out_path: str, device_index: Optional[int] = None) -> None:
    """Overlapped + comm-only measurements (world >= 2) or compute-only (world == 1) for every variant."""
    device_index = rank if device_index is None else device_index
    _stdout_to_stderr()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(device_index), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    import deepspeed

    from dstoolkit.models.shape import ModelShape

    backend = payload["backend"]
    if backend == "nccl":
        torch.cuda.set_device(device_index)
    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    if backend == "gloo":
        from dstoolkit.runtime.train.shm import unlink_after_rendezvous

        unlink_after_rendezvous()  # DeepSpeed leaves its CPU all-reduce buffers in /dev/shm otherwise
    steps, warmup = payload["steps"], payload["warmup"]
    for v in payload["variants"]:
        shape = ModelShape(**v["shape"])
        ep = v["ep_size"] if world > 1 else 1  # compute-only: every expert local (same tokens per expert)
        engine = _engine(shape, v["ds_config"], ep)
        mb = v["ds_config"]["train_micro_batch_size_per_gpu"]
        batches = _batches(shape, mb, v["seq_len"], device_index, engine.device)
        res: dict[str, Any] = {"key": v["key"]}
        for i in range(warmup):
            loss = engine(*batches[i % len(batches)])
            engine.backward(loss)
            engine.step()
        step_s, fb_s, opt_s = [], [], []
        for i in range(steps):
            harness.sync_all()
            t0 = time.perf_counter()
            loss = engine(*batches[i % len(batches)])
            engine.backward(loss)
            if world == 1:
                harness.device_sync()
                t1 = time.perf_counter()
            engine.step()
            harness.sync_all()
            t2 = time.perf_counter()
            step_s.append(t2 - t0)
            if world == 1:
                fb_s.append(t1 - t0)
                opt_s.append(t2 - t1)
        if world > 1:
            t = torch.tensor(step_s, dtype=torch.float64, device=engine.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)  # a step ends when the slowest rank does
            res["overlapped_samples_s"] = t.cpu().tolist()
            calls = _capture_comm(engine, batches[0])
            res["comm_calls"] = calls
            comm = replay_comm(calls, world, engine.device, warmup=1, reps=max(3, steps))
            t = torch.tensor(comm, dtype=torch.float64, device=engine.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            res["comm_samples_s"] = t.cpu().tolist()
            if payload.get("profile"):
                res["profile"] = _profile_steps(engine, batches, 2)
        else:
            res["compute_fb_samples_s"] = fb_s
            res["compute_opt_samples_s"] = opt_s
        res["loss"] = float(loss.detach().float().cpu())
        if rank == 0:
            results_jsonl.append_records(out_path, [res])
        _free_engine(engine)
    end_ranks()  # barrier, then every group destroyed (and released at exit: rankexit)
