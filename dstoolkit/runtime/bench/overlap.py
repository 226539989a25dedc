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

This module is the driver (variants, launches, records, table); the ranks' work: `overlap_rank`; the arithmetic:
`overlap_math`.
"""
from __future__ import annotations

import copy
import json
import pathlib
import sys
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, results_jsonl, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.overlap_math import Variant, combine, merge_compute_only
from dstoolkit.runtime.bench.overlap_rank import compute_only_entry, rank_main

BENCH_NAME = "overlap"

#: DeepSpeed 0.19.8 default reduce_bucket_size (elements; deepspeed/runtime/zero/config.py, docs/anchors.md).
DS_DEFAULT_REDUCE_BUCKET = 500_000_000


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
    mb = micro_batch if micro_batch is not None else cfg.get("train_micro_batch_size_per_gpu")
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
# Driver
# --------------------------------------------------------------------------------------------------


def run_overlap(target: str, *, model: Optional[str], strategies: Optional[list[str]], bucket_sizes: Optional[list[int]],
                overlap: str, steps: int, warmup: int, world_size: int, backend: str, seq_len: Optional[int],
                micro_batch: Optional[int], profile: bool, out: Optional[str], resume: bool, timeout_s: float,
                progress: bool = True) -> list[dict[str, Any]]:
    """Run the overlap bench; returns the records (also appended to ``out``)."""
    from dstoolkit.runtime.bench.ranks import check_world_size, spawn_ranks
    from dstoolkit.models import count_params

    if steps < 2 or warmup < 0:
        raise BenchInputError(f"--steps {steps} / --warmup {warmup}: need at least 2 timed steps and warmup >= 0")
    if world_size < 2:
        raise BenchInputError(f"--world-size {world_size}: overlap needs at least 2 ranks")
    for flag, value in (("--seq-len", seq_len), ("--micro-batch", micro_batch)):
        if value is not None and value < 1:
            raise BenchInputError(f"{flag} {value}: must be >= 1 (or leave it out for the config's / spec's own)")
    check_world_size(backend, world_size)
    with targets_mod.temp_work_dir() as tmp:
        tmp = pathlib.Path(tmp)
        tgts = targets_mod.resolve_targets([target], None, strategies, tmp, world_size, cpu=backend == "gloo")
        shapes, seqs, nparams = {}, {}, {}
        for t in tgts:
            shape, spec = targets_mod.shape_for(t, model)
            shapes[t.name] = shape
            seqs[t.name] = seq_len if seq_len is not None else (spec.training.seq_len if spec is not None else 128)
            nparams[t.name] = count_params(shape).total
        variants = build_variants(tgts, nparams, overlap, bucket_sizes, micro_batch)
        cfg = {"bench": BENCH_NAME, "variants": [(v.key, v.ds_config) for v in variants], "steps": steps,
               "warmup": warmup, "world_size": world_size, "backend": backend,
               "shapes": {k: s.model_dump() for k, s in shapes.items()}, "seq": seqs, "profile": profile}
        cfg_hash = harness.config_hash(cfg)
        state = results_jsonl.open_run(out, BENCH_NAME, cfg_hash, resume=resume)
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
                ports = harness.free_ports(world_size)  # distinct: one single-rank group per rank
                spawn_ranks(compute_only_entry, world_size, (ports, payload, str(single_dir)), timeout_s)
                multi = {r["key"]: r for r in results_jsonl.read_records(multi_path)}
                single = merge_compute_only([results_jsonl.read_records(p) for p in sorted(single_dir.glob("single_*.jsonl"))])
                for v in group:
                    if v.key not in multi or v.key not in single:
                        raise RuntimeError(f"overlap variant {v.key}: a rank produced no result")
                    env["load_avg"] = harness.load_average()
                    rec = results_jsonl.base_record(BENCH_NAME, state.run_id, v.key, dict(env))
                    rec.update(combine(v, world_size, multi[v.key], single[v.key]))
                    rec["seq_len"] = seqs[name]
                    rec["model"] = shapes[name].name
                    records.append(rec)
                    if out:
                        results_jsonl.append_records(out, [rec])
                update(1)
        results_jsonl.close_run(out, BENCH_NAME, cfg_hash, state.run_id)
    return results_jsonl.run_rows(out, state, records)


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
