"""Training-throughput bench: N real DeepSpeed steps per config through the `deepspeed` launcher, vs the estimate.

Each config runs the example trainer (`dstoolkit.runtime.train.trainer`, the same command generated launch.sh files
use) on ``--world-size`` local ranks. Rank 0's per-step metrics are read back; the first ``--skip-steps``
steps (engine warm-up, lazy optimizer state) are excluded, and the rest give

* step time: median and p90 over the timed steps (the trainer times each optimizer step end to end);
* tokens/s: global tokens per step / median step time;
* peak memory: peak RSS of rank 0 on CPU (which includes the ~0.3 GB torch runtime; the estimate counts
  model states + activations + buffers only) -- on GPU the same field the trainer reports;
* MFU: measured tokens/s × the estimate's FLOPs per token ÷ (peak FLOP/s × ranks), i.e. the same definition
  and the same peak as the estimate's own MFU (docs/anchors.md 'FLOPs and MFU');
* loss: first and last step.

Beside each, the estimate from `dstoolkit.estimate.estimate_run` and the error (estimate ÷ measured − 1).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.jitlock import check_locks
from dstoolkit.runtime.train.shm import remove_orphaned_buffers

BENCH_NAME = "train"


def _deepspeed_cmd() -> list[str]:
    """The deepspeed launcher next to this interpreter (the venv's), else the one on PATH."""
    exe = pathlib.Path(sys.executable).parent / "deepspeed"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("deepspeed")
    if found:
        return [found]
    return [sys.executable, "-m", "deepspeed.launcher.runner"]


def trainer_command(ds_config_path: pathlib.Path, spec_path: pathlib.Path, steps: int, metrics_out: pathlib.Path,
                    world_size: int, ep_size: int, port: int) -> list[str]:
    """The deepspeed launcher command for one config (as a generated launch.sh would run it). Paths are made
    absolute: the ranks run in the config's own working folder."""
    ds_config_path, spec_path, metrics_out = (pathlib.Path(x).resolve() for x in (ds_config_path, spec_path, metrics_out))
    cmd = _deepspeed_cmd() + ["--num_gpus", str(world_size), "--master_port", str(port),
                              "--module", "dstoolkit.runtime.train.trainer",
                              "--deepspeed_config", str(ds_config_path), "--spec", str(spec_path),
                              "--steps", str(steps), "--metrics-out", str(metrics_out), "--no-progress"]
    if ep_size > 1:
        cmd += ["--ep-size", str(ep_size)]
    return cmd


def summarize_metrics(rows: Sequence[dict[str, Any]], skip_steps: int, seq_len: int) -> dict[str, Any]:
    """Measured figures from the trainer's per-step JSON lines (pure; unit-tested).

    Raises:
        RuntimeError: fewer timed steps than 1.
    """
    steps = sorted((r for r in rows if r.get("event") is None and "step_time_s" in r), key=lambda r: r["step"])
    timed = steps[skip_steps:]
    if not timed:
        raise RuntimeError(f"the trainer reported {len(steps)} steps; need more than --skip-steps={skip_steps}")
    st = harness.summarize(r["step_time_s"] for r in timed)
    tokens_per_step = timed[-1]["global_batch"] * seq_len
    return {
        "steps": len(steps),
        "timed_steps": len(timed),
        "step_time_s_median": st.median,
        "step_time_s_p90": st.p90,
        "step_time_s_stats": st.to_dict(),
        "step_time_samples_s": [r["step_time_s"] for r in timed],
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / st.median,
        "peak_memory_bytes": max(int(r.get("peak_rss_bytes") or 0) for r in steps) or None,
        "peak_memory_kind": "rank-0 peak RSS",
        "loss_first": steps[0].get("loss"),
        "loss_last": steps[-1].get("loss"),
        "global_batch": timed[-1].get("global_batch"),
        "micro_batch": timed[-1].get("micro_batch"),
        "grad_accum": timed[-1].get("grad_accum"),
    }


def rel_error(estimate: Optional[float], measured: Optional[float]) -> Optional[float]:
    """estimate / measured − 1 (None when either is missing or measured is 0)."""
    if estimate is None or measured is None or measured == 0:
        return None
    return float(estimate) / float(measured) - 1.0


def load_calibration(path: Optional[str]) -> Optional[dict[str, Any]]:
    """Raw calibration fields from JSON (`dstoolkit.hardware.calibration.read_calibration_file`); 'auto' = newest
    benchmarks/results/calibration_<cpu|gpu>_*.json of this checkout, if any (else the spec's own calibration:
    cluster.calibration or the packaged reference for gpu: cpu)."""
    from dstoolkit.hardware.calibration import CalibrationInputError, read_calibration_file

    if not path:
        return None
    if path == "auto":
        import torch

        kind = "gpu" if torch.cuda.is_available() else "cpu"
        repo = pathlib.Path(__file__).resolve().parents[3]
        found = sorted((repo / "benchmarks" / "results").glob(f"calibration_{kind}_*.json"))
        if not found:
            return None
        path = str(found[-1])
    try:
        return read_calibration_file(path)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def calibration_for(raw: Optional[dict[str, Any]], precision: str):
    """A `dstoolkit.estimate.Calibration` from raw fields (wall clock, the run's precision)."""
    if not raw:
        return None
    from dstoolkit.hardware.calibration import CalibrationInputError, calibration_from_raw

    try:
        return calibration_from_raw(raw, precision)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def estimate_for(spec, shape, ds_config: dict, world_size: int, ep_size: int, calibration_raw) -> Optional[dict[str, Any]]:
    """The estimate for one config as a flat dict ({"error": ...} when the estimator refuses)."""
    try:
        from dstoolkit.estimate import estimate_run
        from dstoolkit.runplan import plan_from_spec
        from dstoolkit.hardware.calibration import calibration_label
    except ImportError as exc:  # pragma: no cover - estimator is part of the package
        return {"error": f"estimator unavailable: {exc}"}
    try:
        calibration = calibration_for(calibration_raw, spec.training.precision)
        at = {}  # the bench may run the config on other ranks than the spec's cluster
        if world_size != spec.cluster.world_size:
            at = {"world_size": world_size, "gpus_per_node": min(spec.cluster.gpus_per_node, world_size)}
        if calibration is not None:
            at["calibration"] = calibration
        plan = plan_from_spec(spec, ds_config, shape, ep=ep_size, **at)
        est = estimate_run(plan)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    peak = plan.gpu.peak_bf16_flops
    return {
        "step_time_s": est.step_time_s,
        "tokens_per_step": est.tokens_per_step,
        "tokens_per_s": est.tokens_per_step / est.step_time_s if est.step_time_s > 0 else None,
        "mfu": est.mfu,
        "memory_per_rank_bytes": est.memory.total,
        "flops_per_token": est.flops_per_token,
        "peak_flops_per_rank": peak,
        "calibrated": plan.calibration is not None,
        "calibration_source": ((calibration_raw or {}).get("_source") if calibration is not None
                               else calibration_label(spec) if plan.calibration is not None else None),
        "step_time_breakdown_s": est.step_time.model_dump(),
    }


def run_one(target: targets_mod.BenchTarget, *, steps: int, skip_steps: int, world_size: int, work_dir: pathlib.Path,
            timeout_s: float, calibration) -> dict[str, Any]:
    """Launch one config through the deepspeed launcher and build its record body."""
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec

    if target.spec_path is None:
        raise BenchInputError(f"config {target.name!r}: the trainer needs the model and seq_len; pass --spec SPEC.yaml")
    spec = load_spec(target.spec_path)
    shape = resolve_model(spec.model, target.spec_path.parent)
    run_dir = work_dir / target.name
    run_dir.mkdir(parents=True, exist_ok=True)
    ds_path = run_dir / "ds_config.json"
    ds_path.write_text(json.dumps(target.ds_config, indent=1))
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = trainer_command(ds_path, target.spec_path, steps, metrics, world_size, target.ep_size, harness.free_port())
    env = targets_mod.env_for_ranks()
    env.setdefault("LOCAL_SIZE", str(world_size))
    check_locks(who=f"bench train {target.name}")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=run_dir)
        rc, tail = proc.returncode, (proc.stderr + proc.stdout)[-2000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = 124, f"timed out after {timeout_s:.0f} s: {str(exc.stderr or '')[-1000:]}"
    wall = time.perf_counter() - t0
    remove_orphaned_buffers()  # /dev/shm buffers of ranks that died before the trainer unlinked them
    body: dict[str, Any] = {"config_name": target.name, "command": " ".join(cmd), "wall_s": wall, "ep_size": target.ep_size,
                            "world_size": world_size, "seq_len": spec.training.seq_len, "model": shape.name,
                            "zero_stage": int((target.ds_config.get("zero_optimization") or {}).get("stage", 0)),
                            "ds_config": target.ds_config}
    rows = harness.read_records(metrics) if metrics.exists() else []
    if rc != 0 or not rows:
        body.update({"status": "failed", "returncode": rc, "error_tail": tail})
        return body
    measured = summarize_metrics(rows, skip_steps, spec.training.seq_len)
    est = estimate_for(spec, shape, target.ds_config, world_size, target.ep_size, calibration)
    if est and "error" not in est and est.get("flops_per_token") and est.get("peak_flops_per_rank"):
        measured["mfu"] = measured["tokens_per_s"] * est["flops_per_token"] / (est["peak_flops_per_rank"] * world_size)
    else:
        measured["mfu"] = None
    err = None
    if est and "error" not in est:
        err = {
            "step_time_s": rel_error(est.get("step_time_s"), measured["step_time_s_median"]),
            "tokens_per_s": rel_error(est.get("tokens_per_s"), measured["tokens_per_s"]),
            "mfu": rel_error(est.get("mfu"), measured.get("mfu")),
            "memory_bytes": rel_error(est.get("memory_per_rank_bytes"), measured.get("peak_memory_bytes")),
        }
    body.update({"status": "ok", "measured": measured, "estimate": est, "error": err})
    return body


def run_train(items: Sequence[str], *, spec: Optional[str], strategies: Optional[list[str]], steps: int, skip_steps: int,
              world_size: int, out: Optional[str], resume: bool, timeout_s: float, calibration_path: Optional[str],
              progress: bool = True) -> list[dict[str, Any]]:
    """Run the train bench over every config; returns the records (also appended to ``out``)."""
    from dstoolkit.runtime.bench.comm import check_world_size

    if steps <= skip_steps:
        raise BenchInputError(f"--steps {steps} must exceed --skip-steps {skip_steps} (those steps are not timed)")
    if world_size < 1:
        raise BenchInputError(f"--world-size {world_size}: need at least 1 rank")
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    check_world_size(backend, world_size)
    calibration = load_calibration(calibration_path)
    with targets_mod.temp_work_dir() as tmp:
        tmp = pathlib.Path(tmp)
        tgts = targets_mod.resolve_targets(list(items), spec, strategies, tmp, world_size)
        cfg = {"bench": BENCH_NAME, "targets": [(t.name, t.ds_config, t.ep_size, str(t.spec_path)) for t in tgts],
               "steps": steps, "skip": skip_steps, "world": world_size,
               "calibration": calibration}
        cfg_hash = harness.config_hash(cfg)
        state = harness.open_run(out, BENCH_NAME, cfg_hash, resume=resume)
        todo = [t for t in tgts if t.name not in state.done_keys]
        if state.resumed:
            print(f"# resuming train run {state.run_id}: {len(state.done_keys)} configs done, {len(todo)} to go",
                  file=sys.stderr)
        env = harness.capture_env(world_size, backend, cfg)
        records = []
        with harness.progress_bar(len(todo), "bench train", enabled=progress) as update:
            for t in todo:
                body = run_one(t, steps=steps, skip_steps=skip_steps, world_size=world_size, work_dir=tmp,
                               timeout_s=timeout_s, calibration=calibration)
                env["load_avg"] = harness.load_average()
                rec = harness.base_record(BENCH_NAME, state.run_id, t.name, dict(env))
                rec.update(body)
                records.append(rec)
                if out:
                    harness.append_records(out, [rec])
                update(1)
        harness.close_run(out, BENCH_NAME, cfg_hash, state.run_id)
    if out and state.resumed:
        records = [r for r in harness.read_records(out) if r.get("run_id") == state.run_id and r.get("event") is None]
    return records


def _p(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Measured | estimate | error per config."""
    lines = ["# dstoolkit bench train: measured (estimate) error=estimate/measured-1; step times in s; memory: "
             "measured = rank-0 peak RSS, estimate = device bytes per rank",
             f"# {'config':<16} {'tok/s':>9} {'(est)':>9} {'err':>6} {'step med':>9} {'(est)':>9} {'err':>6} "
             f"{'p90':>7} {'mem GiB':>8} {'(est)':>7} {'MFU':>8} {'(est)':>8} {'loss':>13}"]
    for r in records:
        if r.get("status") != "ok":
            lines.append(f"  {r.get('config_name'):<16} FAILED (exit {r.get('returncode')}): "
                         f"{(r.get('error_tail') or '').strip().splitlines()[-1:] or ''}")
            continue
        m, e, err = r["measured"], r.get("estimate") or {}, r.get("error") or {}

        def g(d, k, fmt):
            v = d.get(k)
            return fmt % v if isinstance(v, (int, float)) else "-"

        mem = (lambda v: f"{v / 2**30:.2f}" if v else "-")
        lines.append(
            f"  {r['config_name']:<16} {g(m, 'tokens_per_s', '%.0f'):>9} {g(e, 'tokens_per_s', '%.0f'):>9} "
            f"{_p(err.get('tokens_per_s')):>6} {g(m, 'step_time_s_median', '%.4f'):>9} {g(e, 'step_time_s', '%.4f'):>9} "
            f"{_p(err.get('step_time_s')):>6} {g(m, 'step_time_s_p90', '%.4f'):>7} {mem(m.get('peak_memory_bytes')):>8} "
            f"{mem(e.get('memory_per_rank_bytes')):>7} {g(m, 'mfu', '%.2e'):>8} {g(e, 'mfu', '%.2e'):>8} "
            f"{g(m, 'loss_first', '%.2f')}->{g(m, 'loss_last', '%.2f')}")
        if e.get("error"):
            lines.append(f"    estimate unavailable: {e['error']}")
    return "\n".join(lines)


def cli_run(args) -> int:
    """`dstoolkit bench train` entry (called by dstoolkit.cli.bench)."""
    recs = run_train(args.targets, spec=args.spec, strategies=args.strategy, steps=args.steps, skip_steps=args.skip_steps,
                     world_size=args.world_size, out=args.out, resume=args.resume, timeout_s=args.timeout_s,
                     calibration_path=None if args.calibration == "none" else args.calibration, progress=args.progress)
    if args.format == "json":
        print(json.dumps(recs, indent=1, default=str))
    else:
        print(format_table(recs))
    return 0 if all(r.get("status") == "ok" for r in recs) else 1
