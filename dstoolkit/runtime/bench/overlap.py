"""Compute/communication overlap of real DeepSpeed engines: η = 1 − exposed / total communication.

For each DeepSpeed config, each ``overlap_comm`` setting and each ``reduce_bucket_size`` ("variant"):

1. **Overlapped step** (N ranks, the real engine): median wall time of forward + backward + optimizer step.
2. **Communication only** (same N ranks): DeepSpeed's comms logger records every collective one real step
   issues (op and bytes); those calls are replayed alone with torch.distributed, timed the same way.
3. **Compute only** (no peers): N independent single-rank engines run *at the same time*, one per device (or
   CPU core), so each gets the same resources as a rank of the real job. Each runs the same model, micro
   batch and config on a data-parallel group of one. Its forward+backward is the compute of one rank; its
   optimizer step updates the whole model where a ZeRO (or bf16-optimizer) rank of N updates 1/N of it, so
   that phase is scaled by 1/N (Adam's update is linear in the elements it touches; ZeRO §3.1 partitions
   exactly those). Per step, the slowest of the N engines counts, as in the real job.

Then (Lee et al., arXiv 2507.03114, and docs/anchors.md 'Overlap'):

* exposed = max(0, overlapped − compute_only)   — time the step waits for communication;
* η = 1 − exposed / comm_only, clamped to [0, 1] (``eta_raw`` keeps the unclamped value);
* compute slowdown = overlapped × (1 − exposed_profiled / traced step) / compute_only − 1, where
  exposed_profiled is the part of the communication intervals in a torch-profiler trace of the step that no compute interval
  covers (gloo worker-thread spans vs main-thread *leaf* ops on CPU; NCCL kernels vs other kernels on GPU).
  ``eta_profiler`` is the same ratio read straight from that trace.

On CPU the accelerator is 'synchronized' (DeepSpeed's cpu_accelerator has no streams), so DeepSpeed issues
its collectives synchronously and η is expected near 0 with overlap_comm on or off: the bench measures that
rather than assuming it. Gradient accumulation is set to 1 so that one step = one micro-batch.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError

BENCH_NAME = "overlap"

#: DeepSpeed 0.19.8 default reduce_bucket_size (elements; deepspeed/runtime/zero/config.py, docs/anchors.md).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000

#: Profiler event name prefixes that are communication work (gloo worker spans, NCCL kernels).
COMM_EVENT_PREFIXES = ("gloo:", "nccl", "ncclDevKernel", "ncclKernel")
#: Main-thread profiler events that are communication bookkeeping, not compute.
COMM_BOOKKEEPING_PREFIXES = ("c10d::", "record_param_comms", "gloo:", "nccl:", "dstoolkit.")


@dataclasses.dataclass
class Variant:
    """One measured configuration."""

    key: str
    config_name: str
    ds_config: dict
    zero_stage: int
    overlap_comm: Optional[bool]
    """Effective overlap_comm (None at stage 0, which has no such switch)."""
    reduce_bucket_size: Optional[int]
    ep_size: int
    spec_path: Optional[str]
    opt_partitioned: bool
    """Whether each rank's optimizer step touches 1/N of the model (ZeRO >= 1, or DeepSpeed's bf16 optimizer)."""


def parse_bucket_sizes(text: str) -> Optional[list[int]]:
    """'5e5,2e6' -> [500000, 2000000]; 'auto' -> None (chosen from the model size)."""
    if text.strip().lower() == "auto":
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            v = int(float(part))
        except ValueError:
            raise BenchInputError(f"--bucket-sizes: {part!r} is not a number; use elements, e.g. 5e5,2e6,5e8") from None
        if v <= 0:
            raise BenchInputError(f"--bucket-sizes: {part!r} must be > 0 elements")
        out.append(v)
    if not out:
        raise BenchInputError("--bucket-sizes: no sizes given; use e.g. 5e5,2e6,5e8 or auto")
    return out


def auto_bucket_sizes(num_params: int, configured: int) -> list[int]:
    """A range that splits the model's gradients into ~16 buckets, ~4 buckets, and the config's own size."""
    sizes = {max(1000, num_params // 16), max(1000, num_params // 4), configured}
    return sorted(sizes)


def _normalise(ds: dict, micro_batch: Optional[int]) -> dict:
    """Copy of a config with one micro-batch per step (grad accumulation 1) and no batch total to conflict."""
    cfg = copy.deepcopy(ds)
    mb = micro_batch or cfg.get("train_micro_batch_size_per_gpu")
    if mb is None:
        tb, ga = cfg.get("train_batch_size"), cfg.get("gradient_accumulation_steps") or 1
        mb = max(1, int(tb) // int(ga)) if tb else 1
    cfg["train_micro_batch_size_per_gpu"] = int(mb)
    cfg["gradient_accumulation_steps"] = 1
    cfg.pop("train_batch_size", None)
    cfg.pop("comms_logger", None)
    for noisy in ("wall_clock_breakdown", "flops_profiler", "tensorboard", "csv_monitor", "wandb"):
        cfg.pop(noisy, None)
    cfg["steps_per_print"] = 10**9
    return cfg


def build_variants(targets: Sequence[targets_mod.BenchTarget], num_params: dict[str, int], overlap: str,
                   bucket_sizes: Optional[list[int]], micro_batch: Optional[int]) -> list[Variant]:
    """Cross every target with the requested overlap_comm settings and bucket sizes."""
    out: list[Variant] = []
    for t in targets:
        base = _normalise(t.ds_config, micro_batch)
        z = base.get("zero_optimization") or {}
        stage = int(z.get("stage", 0))
        bf16 = bool((base.get("bf16") or base.get("bfloat16") or {}).get("enabled", False))
        partitioned = stage >= 1 or bf16
        if stage == 0:
            out.append(Variant(key=f"{t.name}|stage0", config_name=t.name, ds_config=base, zero_stage=0,
                               overlap_comm=None, reduce_bucket_size=None, ep_size=t.ep_size,
                               spec_path=str(t.spec_path) if t.spec_path else None, opt_partitioned=partitioned))
            continue
        configured = int(z.get("reduce_bucket_size", DS_DEFAULT_REDUCE_BUCKET))
        sizes = bucket_sizes or auto_bucket_sizes(num_params[t.name], configured)
        default_overlap = bool(z.get("overlap_comm", stage == 3))  # DeepSpeed: True only for stage 3 by default
        settings = {"both": [True, False], "on": [True], "off": [False]}[overlap]
        for oc in settings:
            for b in sizes:
                cfg = copy.deepcopy(base)
                zz = cfg.setdefault("zero_optimization", {})
                zz["overlap_comm"] = oc
                zz["reduce_bucket_size"] = int(b)
                if stage in (1, 2):
                    zz["allgather_bucket_size"] = int(b)
                out.append(Variant(key=f"{t.name}|oc={int(oc)}|b={b}", config_name=t.name, ds_config=cfg,
                                   zero_stage=stage, overlap_comm=oc, reduce_bucket_size=int(b), ep_size=t.ep_size,
                                   spec_path=str(t.spec_path) if t.spec_path else None, opt_partitioned=partitioned))
        del default_overlap
    return out


# --------------------------------------------------------------------------------------------------
# Interval arithmetic for the profiler trace (pure; unit-tested)
# --------------------------------------------------------------------------------------------------


def union_intervals(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end) intervals."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def covered_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of the union of intervals."""
    return sum(e - s for s, e in union_intervals(intervals))


def exposed_length(comm: Sequence[tuple[float, float]], compute: Sequence[tuple[float, float]]) -> float:
    """Length of the communication union that no compute interval covers."""
    comm_u, comp_u = union_intervals(comm), union_intervals(compute)
    overlap = 0.0
    j = 0
    for s, e in comm_u:
        while j < len(comp_u) and comp_u[j][1] <= s:
            j += 1
        k = j
        while k < len(comp_u) and comp_u[k][0] < e:
            overlap += min(e, comp_u[k][1]) - max(s, comp_u[k][0])
            k += 1
    return covered_length(comm_u) - overlap


def eta_from(exposed_s: float, comm_s: float) -> tuple[float, float]:
    """(clamped, raw) η = 1 − exposed/comm; comm_s <= 0 gives η = 1 (nothing to hide)."""
    if comm_s <= 0:
        return 1.0, 1.0
    raw = 1.0 - exposed_s / comm_s
    return min(1.0, max(0.0, raw)), raw


# --------------------------------------------------------------------------------------------------
# Rank-side work
# --------------------------------------------------------------------------------------------------


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
    from dstoolkit.runtime.model import synthetic_batch

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

    from dstoolkit.runtime.bench.comm import _op_callable, layout

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
        fn = _op_callable(torch, dist, op, inp, out)
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
            harness.append_records(out_path, [res])
        _free_engine(engine)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def merge_compute_only(per_engine: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant, the slowest of the N concurrent single-rank engines at each step (pure; unit-tested)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for recs in per_engine:
        for r in recs:
            by_key.setdefault(r["key"], []).append(r)
    out = {}
    for key, recs in by_key.items():
        if len(recs) != len(per_engine):
            continue  # an engine is missing this variant: no result
        fb = [list(r["compute_fb_samples_s"]) for r in recs]
        op = [list(r["compute_opt_samples_s"]) for r in recs]
        n = min(len(x) for x in fb)
        slowest = [max(range(len(recs)), key=lambda j: fb[j][i] + op[j][i]) for i in range(n)]
        out[key] = {"key": key, "compute_fb_samples_s": [fb[j][i] for i, j in enumerate(slowest)],
                    "compute_opt_samples_s": [op[j][i] for i, j in enumerate(slowest)],
                    "engines": len(recs), "loss": recs[0].get("loss")}
    return out


def combine(v: Variant, world: int, multi: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
    """Turn raw samples of one variant into the overlap record (see module docstring for the definitions)."""
    scale = 1.0 / world if v.opt_partitioned else 1.0
    compute = [fb + op * scale for fb, op in zip(single["compute_fb_samples_s"], single["compute_opt_samples_s"])]
    c_stats = harness.summarize(compute)
    o_stats = harness.summarize(multi["overlapped_samples_s"])
    m_stats = harness.summarize(multi["comm_samples_s"])
    exposed = max(0.0, o_stats.median - c_stats.median)
    eta, eta_raw = eta_from(exposed, m_stats.median)
    rec: dict[str, Any] = {
        "config_name": v.config_name, "zero_stage": v.zero_stage, "overlap_comm": v.overlap_comm,
        "reduce_bucket_size": v.reduce_bucket_size, "ep_size": v.ep_size, "world_size": world,
        "micro_batch": v.ds_config["train_micro_batch_size_per_gpu"],
        "compute_s": c_stats.to_dict(), "comm_s": m_stats.to_dict(), "overlapped_s": o_stats.to_dict(),
        "exposed_comm_s": exposed, "eta": eta, "eta_raw": eta_raw,
        "compute_fb_s": harness.summarize(single["compute_fb_samples_s"]).median,
        "compute_opt_full_s": harness.summarize(single["compute_opt_samples_s"]).median,
        "opt_scale": scale,
        "comm_calls": multi.get("comm_calls", []),
        "comm_bytes_per_step": sum(c["bytes"] * c["count"] for c in multi.get("comm_calls", [])),
        "samples": {"overlapped_s": multi["overlapped_samples_s"], "comm_s": multi["comm_samples_s"], "compute_s": compute},
        "loss_last": multi.get("loss"),
        "compute_slowdown": None, "eta_profiler": None,
        "ds_config": v.ds_config,
    }
    prof = multi.get("profile")
    if prof:
        exp_p = sorted(p["exposed_s"] for p in prof)[len(prof) // 2]
        union_p = sorted(p["comm_union_s"] for p in prof)[len(prof) // 2]
        rec["profiler"] = {"steps": prof, "exposed_s": exp_p, "comm_union_s": union_p}
        rec["eta_profiler"] = eta_from(exp_p, union_p)[0] if union_p > 0 else None
        # The profiler slows the traced steps, so carry over the exposed *fraction* of the traced step, not its
        # seconds: compute inside the overlapped step = overlapped x (1 - exposed/step) from the trace.
        frac = sorted(p["exposed_s"] / p["step_s"] for p in prof if p["step_s"] > 0)
        f = frac[len(frac) // 2] if frac else 0.0
        rec["profiler"]["exposed_fraction"] = f
        rec["compute_slowdown"] = o_stats.median * (1.0 - f) / c_stats.median - 1.0 if c_stats.median > 0 else None
    return rec


def run_overlap(target: str, *, model: Optional[str], strategies: Optional[list[str]], bucket_sizes: Optional[list[int]],
                overlap: str, steps: int, warmup: int, world_size: int, backend: str, seq_len: Optional[int],
                micro_batch: Optional[int], profile: bool, out: Optional[str], resume: bool, timeout_s: float,
                progress: bool = True) -> list[dict[str, Any]]:
    """Run the overlap bench; returns the records (also appended to ``out``)."""
    from dstoolkit.runtime.bench.comm import check_world_size, spawn_ranks
    from dstoolkit.models import count_params

    if steps < 2 or warmup < 0:
        raise BenchInputError(f"--steps {steps} / --warmup {warmup}: need at least 2 timed steps and warmup >= 0")
    if world_size < 2:
        raise BenchInputError(f"--world-size {world_size}: overlap needs at least 2 ranks")
    check_world_size(backend, world_size)
    with targets_mod.temp_work_dir() as tmp:
        tmp = pathlib.Path(tmp)
        tgts = targets_mod.resolve_targets([target], None, strategies, tmp, world_size)
        shapes, seqs, nparams = {}, {}, {}
        for t in tgts:
            shape, spec = targets_mod.shape_for(t, model)
            shapes[t.name] = shape
            seqs[t.name] = seq_len or (spec.training.seq_len if spec is not None else 128)
            nparams[t.name] = count_params(shape).total
        variants = build_variants(tgts, nparams, overlap, bucket_sizes, micro_batch)
        cfg = {"bench": BENCH_NAME, "variants": [(v.key, v.ds_config) for v in variants], "steps": steps,
               "warmup": warmup, "world_size": world_size, "backend": backend,
               "shapes": {k: s.model_dump() for k, s in shapes.items()}, "seq": seqs, "profile": profile}
        cfg_hash = harness.config_hash(cfg)
        state = harness.open_run(out, BENCH_NAME, cfg_hash, resume=resume)
        todo = [v for v in variants if v.key not in state.done_keys]
        if state.resumed:
            print(f"# resuming overlap run {state.run_id}: {len(state.done_keys)} variants done, {len(todo)} to go",
                  file=sys.stderr)
        env = harness.capture_env(world_size, backend, cfg)
        records: list[dict[str, Any]] = []
        groups: dict[str, list[Variant]] = {}
        for v in todo:
            groups.setdefault(v.config_name, []).append(v)
        with harness.progress_bar(len(groups), "bench overlap", enabled=progress) as update:
            # One launch pair (N ranks, then 1 rank) per config: an interrupt loses at most that config's variants.
            for name, group in groups.items():
                payload = {"backend": backend, "steps": steps, "warmup": warmup, "profile": profile,
                           "variants": [{"key": v.key, "ds_config": v.ds_config, "ep_size": v.ep_size,
                                         "shape": shapes[name].model_dump(), "seq_len": seqs[name]} for v in group]}
                multi_path = tmp / "multi.jsonl"
                single_dir = tmp / "single"
                multi_path.unlink(missing_ok=True)
                if single_dir.exists():
                    for p in single_dir.glob("*.jsonl"):
                        p.unlink()
                single_dir.mkdir(exist_ok=True)
                spawn_ranks(rank_main, world_size, (world_size, harness.free_port(), payload, str(multi_path)), timeout_s)
                ports = [harness.free_port() for _ in range(world_size)]
                spawn_ranks(compute_only_entry, world_size, (ports, payload, str(single_dir)), timeout_s)
                multi = {r["key"]: r for r in harness.read_records(multi_path)}
                single = merge_compute_only([harness.read_records(p) for p in sorted(single_dir.glob("single_*.jsonl"))])
                for v in group:
                    if v.key not in multi or v.key not in single:
                        raise RuntimeError(f"overlap variant {v.key}: a rank produced no result")
                    env["load_avg"] = harness.load_average()
                    rec = harness.base_record(BENCH_NAME, state.run_id, v.key, dict(env))
                    rec.update(combine(v, world_size, multi[v.key], single[v.key]))
                    rec["seq_len"] = seqs[name]
                    rec["model"] = shapes[name].name
                    records.append(rec)
                    if out:
                        harness.append_records(out, [rec])
                update(1)
        harness.close_run(out, BENCH_NAME, cfg_hash, state.run_id)
    if out and state.resumed:
        records = [r for r in harness.read_records(out) if r.get("run_id") == state.run_id and r.get("event") is None]
    return records


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Text table of the overlap records."""
    lines = ["# dstoolkit bench overlap: times are medians in ms; eta = 1 - exposed/comm (clamped to [0,1]); "
             "slowdown = compute inside the overlapped step / compute-only - 1 (from the profiler trace)",
             f"# {'config':<16} {'Z':>1} {'oc':>3} {'bucket':>9} {'compute':>9} {'comm':>9} {'overlap':>9} "
             f"{'exposed':>9} {'eta':>5} {'eta_raw':>7} {'eta_prof':>8} {'slowdown':>8}"]
    for r in records:
        oc = "-" if r["overlap_comm"] is None else ("on" if r["overlap_comm"] else "off")
        b = "-" if r["reduce_bucket_size"] is None else f"{r['reduce_bucket_size']:.0e}"
        ep = r.get("eta_profiler")
        sl = r.get("compute_slowdown")
        lines.append(
            f"  {r['config_name']:<16} {r['zero_stage']:>1} {oc:>3} {b:>9} {1e3 * r['compute_s']['median']:>9.2f} "
            f"{1e3 * r['comm_s']['median']:>9.2f} {1e3 * r['overlapped_s']['median']:>9.2f} {1e3 * r['exposed_comm_s']:>9.2f} "
            f"{r['eta']:>5.2f} {r['eta_raw']:>7.2f} {('%.2f' % ep) if ep is not None else '-':>8} "
            f"{('%+.1f%%' % (100 * sl)) if sl is not None else '-':>8}")
    return "\n".join(lines)


def cli_run(args) -> int:
    """`dstoolkit bench overlap` entry (called by dstoolkit.cli.bench)."""
    backend = args.backend
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() else "gloo"
    recs = run_overlap(args.target, model=args.model, strategies=args.strategy,
                       bucket_sizes=parse_bucket_sizes(args.bucket_sizes), overlap=args.overlap, steps=args.steps,
                       warmup=args.warmup, world_size=args.world_size, backend=backend, seq_len=args.seq_len,
                       micro_batch=args.micro_batch, profile=args.profile, out=args.out, resume=args.resume,
                       timeout_s=args.timeout_s, progress=args.progress)
    if args.format == "json":
        print(json.dumps(recs, indent=1, default=str))
    else:
        print(format_table(recs))
    return 0
