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
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.jitlock import check_locks
from dstoolkit.runtime.train.shm import remove_orphaned_buffers

BENCH_NAME = "train"
# Markers in a failed run's output that mean the rank ran out of memory (torch CUDA OOM, host allocator).
OOM_MARKERS = ("out of memory", "OutOfMemoryError", "CUDA error: out of memory", "std::bad_alloc",
               "Cannot allocate memory")


def _failure(rc: int, tail: str, timeout_s: float, timed_out: bool) -> tuple[str, str]:
    """(status, one-line reason) for a failed run."""
    if timed_out:
        return "timeout", f"no result within {timeout_s:.0f} s (--trial-timeout)"
    low = tail.lower()
    if rc in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(m.lower() in low for m in OOM_MARKERS):
        why = next((ln.strip() for ln in tail.splitlines() if any(m.lower() in ln.lower() for m in OOM_MARKERS)),
                   f"a rank was killed (exit {rc}; the kernel OOM killer sends SIGKILL)")
        return "oom", why[:300]
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    first = next((ln for ln in lines if "training failed" in ln or "error:" in ln.lower()), None)
    return "error", (first or (lines[-1] if lines else f"exit code {rc}"))[:300] + f" (exit {rc})"


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher and every process under it. torchrun starts each rank in its own session, so
    killing the launcher's process group would leave the ranks running; psutil (a DeepSpeed dependency)
    walks the tree instead."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


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
                    world_size: int, ep_size: int, port: int, shrink: Optional[str] = None) -> list[str]:
    """The deepspeed launcher command for one config (as a generated launch.sh would run it). Paths are made
    absolute: the ranks run in the config's own working folder. `shrink` (a `--shrink` value) trains the
    spec's own transformers architecture, shrunk, with the experts data-parallel (--ep-size 1)."""
    ds_config_path, spec_path, metrics_out = (pathlib.Path(x).resolve() for x in (ds_config_path, spec_path, metrics_out))
    cmd = _deepspeed_cmd() + ["--num_gpus", str(world_size), "--master_port", str(port),
                              "--module", "dstoolkit.runtime.train.trainer",
                              "--deepspeed_config", str(ds_config_path), "--spec", str(spec_path),
                              "--steps", str(steps), "--metrics-out", str(metrics_out), "--no-progress"]
    if shrink:
        cmd += ["--shrink", shrink, "--ep-size", "1"]
    elif ep_size > 1:
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


NOMINAL = {"_source": "none"}
"""`--calibration none`: the hardware table's nominal rates (no calibration at all)."""


def load_calibration(path: Optional[str]) -> Optional[dict[str, Any]]:
    """Raw calibration fields for `--calibration`: None for 'auto' or unset, i.e. the spec's own calibration
    (`dstoolkit.hardware.calibration.calibration_for_spec`: cluster.calibration, DSTOOLKIT_CALIBRATION, or this
    machine's for gpu: cpu), the one every other estimate (`estimate`, `tune`, the HF callback, the trainer's
    MFU) uses; `NOMINAL` for 'none'; else the file's fields (`read_calibration_file`).

    'auto' used to mean the newest benchmarks/results/calibration_<cpu|gpu>_*.json of the checkout: a file
    measured on another machine, which made the bench's estimate disagree with the tuner's for the same
    config (the user-script configs: 20,843 vs 7,652 tok/s here)."""
    from dstoolkit.hardware.calibration import CalibrationInputError, read_calibration_file

    if not path or str(path).strip().lower() == "auto":
        return None
    if str(path).strip().lower() in ("none", "off", "false"):
        return NOMINAL
    try:
        return read_calibration_file(path)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def calibration_for(raw: Optional[dict[str, Any]], precision: str):
    """A `dstoolkit.estimate.Calibration` from raw fields (wall clock, the run's precision)."""
    if not raw or raw is NOMINAL:
        return None
    from dstoolkit.hardware.calibration import CalibrationInputError, calibration_from_raw

    try:
        return calibration_from_raw(raw, precision)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def estimate_for(spec, shape, ds_config: dict, world_size: int, ep_size: int, calibration_raw,
                 probe: bool = True) -> Optional[dict[str, Any]]:
    """The estimate for one config as a flat dict ({"error": ...} when the estimator refuses). `probe=False`
    (inside a training rank): the spec's calibration is never probed for, only read from the cache."""
    try:
        from dstoolkit.estimate import estimate_run
        from dstoolkit.estimate.step_time import peak_flops
        from dstoolkit.runplan import plan_from_spec
        from dstoolkit.hardware.calibration import calibration_for_spec, calibration_label
    except ImportError as exc:  # pragma: no cover - estimator is part of the package
        return {"error": f"estimator unavailable: {exc}"}
    try:
        calibration = calibration_for(calibration_raw, spec.training.precision)
        at = {}  # the bench may run the config on other ranks than the spec's cluster
        if world_size != spec.cluster.world_size:
            at = {"world_size": world_size, "gpus_per_node": min(spec.cluster.gpus_per_node, world_size)}
        if calibration is not None or calibration_raw is NOMINAL:
            at["calibration"] = calibration  # else plan_from_spec's default: the spec's own calibration
        elif not probe:
            at["calibration"] = calibration_for_spec(spec, probe=False)
        plan = plan_from_spec(spec, ds_config, shape, ep=ep_size, **at)
        est = estimate_run(plan)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    peak = peak_flops(plan)  # the estimator's own MFU peak (the monitor divides by the same)
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
                               else calibration_label(spec) if plan.calibration is not None
                               else "nominal hardware-table rates"),
        "step_time_breakdown_s": est.step_time.model_dump(),
    }


def _describe_shrunk_run(spec, shrunk, world_size: int) -> None:
    """Make `spec` describe what a shrunk run trains, so the estimate beside it is of the same run: the
    capped seq_len, pure data parallelism (the trainer: tp = pp = ep = 1), and this machine's hardware (a
    strategy generated for a GPU cluster runs shrunk on the local CPU ranks)."""
    import torch

    spec.training.seq_len = shrunk.seq_len  # the trainer caps it the same way
    for key in ("tp", "pp", "ep"):
        setattr(spec.training, key, 1)
    if not torch.cuda.is_available() and get_gpu_name(spec) != "cpu":
        from dstoolkit.spec.model import ClusterSpec

        spec.cluster = ClusterSpec(nodes=1, gpus_per_node=world_size, gpu="cpu")


def get_gpu_name(spec) -> str:
    gpu = spec.cluster.gpu
    return (gpu if isinstance(gpu, str) else gpu.name).strip().lower()


def run_one(target: targets_mod.BenchTarget, *, steps: int, skip_steps: int, world_size: int, work_dir: pathlib.Path,
            timeout_s: float, calibration, shrink=None) -> dict[str, Any]:
    """Launch one config through the deepspeed launcher and build its record body (`shrink`: the
    `ShrinkSizes` of a shrunk run of the spec's own architecture)."""
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec

    if target.spec_path is None:
        raise BenchInputError(f"config {target.name!r}: the trainer needs the model and seq_len; pass --spec SPEC.yaml")
    spec = load_spec(target.spec_path)
    shrunk = None
    if shrink is not None:
        from dstoolkit.runtime.shrink import ShrinkError, prepare_shrunk_run

        try:
            shrunk = prepare_shrunk_run(spec, target.spec_path.parent, shrink)
        except ShrinkError as exc:
            raise BenchInputError(f"config {target.name!r} (spec {target.spec_path}): --shrink: {exc}") from None
        shape = shrunk.shape
        _describe_shrunk_run(spec, shrunk, world_size)
    else:
        shape = resolve_model(spec.model, target.spec_path.parent)
    run_dir = work_dir / target.name
    run_dir.mkdir(parents=True, exist_ok=True)
    ds_path = run_dir / "ds_config.json"
    ds_path.write_text(json.dumps(target.ds_config, indent=1))
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    cmd = trainer_command(ds_path, target.spec_path, steps, metrics, world_size, target.ep_size, harness.free_port(),
                          shrink=shrink.to_arg() if shrink is not None else None)
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
    if shrunk is not None:
        body["shrink"] = {**shrunk.record(), "config_changes": target.shrunk_changes}
    ran = next((r for r in rows if r.get("event") == "model"), None)
    if ran is not None:  # what the trainer built: class and parameter count
        body["model_ran"] = {k: ran.get(k) for k in ("builder", "model_type", "model_class", "params")}
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


def run_one_command(target: targets_mod.BenchTarget, command: Sequence[str], *, steps: int, skip_steps: int,
                    world_size: int, work_dir: pathlib.Path, timeout_s: float, calibration) -> dict[str, Any]:
    """One config through the user's command (`run_command`); the estimate beside it when a spec is known."""
    spec = shape = None
    if target.spec_path is not None:
        from dstoolkit.models import resolve_model
        from dstoolkit.spec import load_spec

        spec = load_spec(target.spec_path)
        shape = resolve_model(spec.model, target.spec_path.parent)
    run_dir = work_dir / target.name
    extra = {"DSTOOLKIT_SPEC": str(target.spec_path)} if target.spec_path else None
    res = run_command(command, target.ds_config, run_dir, steps=steps, skip_steps=skip_steps, world_size=world_size,
                      timeout_s=timeout_s, seq_len=spec.training.seq_len if spec else None, extra_env=extra,
                      who=f"bench train {target.name}")
    body: dict[str, Any] = {"config_name": target.name, "command": res["command"], "placeholders": res["placeholders"],
                            "wall_s": res["wall_s"], "world_size": world_size, "ep_size": target.ep_size,
                            "zero_stage": int((target.ds_config.get("zero_optimization") or {}).get("stage", 0)),
                            "ds_config": target.ds_config, "user_command": True}
    if res["status"] != "ok":
        body.update({"status": "failed", "failure": res["status"], "reason": res["reason"],
                     "returncode": res["returncode"], "error_tail": res.get("error_tail", res["reason"])})
        return body
    measured = res["measured"]
    est = estimate_for(spec, shape, target.ds_config, world_size, target.ep_size, calibration) if spec else None
    measured["mfu"] = None
    err = None
    if est and "error" not in est:
        if measured.get("tokens_per_s") and est.get("flops_per_token") and est.get("peak_flops_per_rank"):
            measured["mfu"] = measured["tokens_per_s"] * est["flops_per_token"] / (est["peak_flops_per_rank"] * world_size)
        err = {"step_time_s": rel_error(est.get("step_time_s"), measured.get("step_time_s_median")),
               "tokens_per_s": rel_error(est.get("tokens_per_s"), measured.get("tokens_per_s")),
               "mfu": rel_error(est.get("mfu"), measured.get("mfu")),
               "memory_bytes": rel_error(est.get("memory_per_rank_bytes"), measured.get("peak_memory_bytes"))}
    body.update({"status": "ok", "measured": measured, "estimate": est, "error": err})
    return body


def run_train(items: Sequence[str], *, spec: Optional[str], strategies: Optional[list[str]], steps: int, skip_steps: int,
              world_size: int, out: Optional[str], resume: bool, timeout_s: float, calibration_path: Optional[str],
              progress: bool = True, command: Optional[Sequence[str]] = None,
              shrink: Optional[str] = None) -> list[dict[str, Any]]:
    """Run the train bench over every config; returns the records (also appended to ``out``). With `command`
    (the user's launch with placeholders) each config runs that command instead of the example trainer.
    With `shrink` (a `--shrink` value: 'auto' or sizes, `dstoolkit.runtime.shrink.parse_shrink`) the trainer
    trains the spec's own transformers architecture shrunk, each config's batch fitted to the ranks
    (`fit_batch`), and the estimate beside it is the shrunk model's at the run's sequence length."""
    from dstoolkit.runtime.bench.comm import check_world_size
    from dstoolkit.runtime.shrink import ShrinkError, parse_shrink

    try:
        sizes = parse_shrink(shrink)
    except ShrinkError as exc:
        raise BenchInputError(str(exc)) from None
    if sizes is not None and command:
        raise BenchInputError("--shrink trains the example trainer's model; a command after `--` builds its own "
                              "model: drop --shrink, or drop the command")

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
        tgts = targets_mod.resolve_targets(list(items), spec, strategies, tmp, world_size, shrink=sizes)
        cfg = {"bench": BENCH_NAME, "targets": [(t.name, t.ds_config, t.ep_size, str(t.spec_path)) for t in tgts],
               "steps": steps, "skip": skip_steps, "world": world_size,
               "calibration": calibration, "command": list(command or [])}
        if sizes is not None:
            cfg["shrink"] = sizes.to_arg()
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
                if command:
                    body = run_one_command(t, command, steps=steps, skip_steps=skip_steps, world_size=world_size,
                                           work_dir=tmp, timeout_s=timeout_s, calibration=calibration)
                else:
                    body = run_one(t, steps=steps, skip_steps=skip_steps, world_size=world_size, work_dir=tmp,
                                   timeout_s=timeout_s, calibration=calibration, shrink=sizes)
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
        ran, sh = r.get("model_ran") or {}, r.get("shrink")
        if sh:
            sizes = " ".join(f"{k}={v}" for k, v in (sh.get("shrunk_sizes") or {}).items() if v is not None)
            changes = "; ".join(f"{k} {a}->{b}" for k, (a, b) in (sh.get("config_changes") or {}).items())
            lines.append(f"    ran {ran.get('model_class') or sh.get('model_type')} ({(ran.get('params') or 0) / 1e6:.2f}M "
                         f"params) shrunk: {sizes} seq_len={sh.get('seq_len')}" + (f"; config: {changes}" if changes else ""))
    return "\n".join(lines)


def cli_run(args) -> int:
    """`dstoolkit bench train` entry (called by dstoolkit.cli.bench)."""
    recs = run_train(args.targets, spec=args.spec, strategies=args.strategy, steps=args.steps, skip_steps=args.skip_steps,
                     world_size=args.world_size, out=args.out, resume=args.resume, timeout_s=args.timeout_s,
                     calibration_path=args.calibration, progress=args.progress,
                     command=getattr(args, "command", None) or None, shrink=getattr(args, "shrink", None))
    if args.format == "json":
        print(json.dumps(recs, indent=1, default=str))
    else:
        print(format_table(recs))
    return 0 if all(r.get("status") == "ok" for r in recs) else 1


# ---------------------------------------------------------------------------------------------------------------
# The user's own command (`dstoolkit bench train CONFIG... -- <command>`, `dstoolkit tune ... -- <command>`)
# ---------------------------------------------------------------------------------------------------------------
#
# How a run of an arbitrary command is measured without touching its code: a `sitecustomize.py` is written
# next to the run and put first on PYTHONPATH, so every Python process the command starts (torchrun, accelerate
# launch, the deepspeed launcher, the ranks) imports it. With DSTOOLKIT_METRICS set it installs a post-import
# hook on `deepspeed.runtime.engine` that wraps `DeepSpeedEngine.forward/backward/step`: at every optimizer
# step (the accumulation boundary, `engine.global_steps` advancing) rank 0 appends one JSON line
# {"step", "step_time_s", "tokens", "samples", "loss", "peak_memory_bytes", "micro_batch", "grad_accum",
# "global_batch", "world_size"} to $DSTOOLKIT_METRICS. tokens = the input_ids elements rank 0's forward saw
# in the step x data-parallel ranks. With DSTOOLKIT_STOP_AFTER=N every rank leaves after optimizer step N
# (barrier, then exit 0): warm-up + K timed steps, then stop, whatever the script's own step count.
# A command that never builds a DeepSpeed engine gets no hook lines; then HF Trainer's final log line
# ('train_samples_per_second') is read from the output instead.

COMMAND_PLACEHOLDERS = {
    "config": "the run's DeepSpeed JSON (every value concrete)",
    "hf_config": "the same JSON in the HF Trainer form: batch, precision, clipping and optimizer values 'auto'",
    "accelerate_config": "an `accelerate launch --config_file` YAML (DeepSpeed, {world_size} local processes)",
    "micro_batch": "train_micro_batch_size_per_gpu", "grad_accum": "gradient_accumulation_steps",
    "global_batch": "train_batch_size", "precision": "bf16 | fp16 | fp32",
    "precision_flag": "--bf16 | --fp16 | nothing (the argument is dropped)",
    "max_steps": "optimizer steps of the run (warm-up + timed)", "world_size": "ranks", "nproc": "ranks",
    "port": "a free TCP port for the rendezvous", "out": "the run's own folder",
}

HOOK_SOURCE = r'''
# Written by dstoolkit (dstoolkit/runtime/bench/train.py): per-step metrics of DeepSpeed engines. Inert unless
# DSTOOLKIT_METRICS is set.
import os as _os
import sys as _sys


def _dstoolkit_patch(mod):
    import json, time
    E = getattr(mod, "DeepSpeedEngine", None)
    if E is None or getattr(E, "_dstoolkit_hooked", False):
        return
    E._dstoolkit_hooked = True
    path = _os.environ["DSTOOLKIT_METRICS"]
    stop = int(_os.environ.get("DSTOOLKIT_STOP_AFTER") or 0)
    st = {"t": None, "tokens": 0, "samples": 0, "loss": None}
    fwd, bwd, stp = E.forward, E.backward, E.step

    def _rank():
        try:
            import torch.distributed as d
            return d.get_rank() if d.is_initialized() else int(_os.environ.get("RANK", "0"))
        except Exception:
            return 0

    def forward(self, *a, **k):
        if st["t"] is None:
            st["t"] = time.perf_counter()
        x = k.get("input_ids")
        if x is None:
            x = next((v for v in a if hasattr(v, "numel") and hasattr(v, "dim")), None)
        if x is not None and hasattr(x, "numel"):
            st["tokens"] += int(x.numel())
            st["samples"] += int(x.shape[0]) if x.dim() else 1
        return fwd(self, *a, **k)

    def backward(self, loss, *a, **k):
        try:
            st["loss"] = float(loss.detach().float().item())
        except Exception:
            pass
        return bwd(self, loss, *a, **k)

    def step(self, *a, **k):
        before = self.global_steps
        out = stp(self, *a, **k)
        if self.global_steps == before:
            return out
        now = time.perf_counter()
        if _rank() == 0:
            try:
                import torch
                if torch.cuda.is_available():
                    peak = int(torch.cuda.max_memory_allocated())
                else:
                    import resource
                    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
            except Exception:
                peak = None
            dp = int(getattr(self, "dp_world_size", 1) or 1)
            row = {"step": int(self.global_steps), "step_time_s": now - (st["t"] or now),
                   "tokens": st["tokens"] * dp, "samples": st["samples"] * dp, "loss": st["loss"],
                   "peak_memory_bytes": peak, "micro_batch": self.train_micro_batch_size_per_gpu(),
                   "grad_accum": self.gradient_accumulation_steps(), "global_batch": self.train_batch_size(),
                   "world_size": int(_os.environ.get("WORLD_SIZE", "1")),
                   "skipped_steps": int(getattr(self, "skipped_steps", 0) or 0)}
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        st.update(t=now, tokens=0, samples=0)
        if stop and self.global_steps >= stop:
            if _rank() == 0:
                with open(path, "a") as f:
                    f.write(json.dumps({"event": "stop", "step": int(self.global_steps)}) + "\n")
            try:
                import torch.distributed as d
                if d.is_initialized():
                    d.barrier()
            except Exception:
                pass
            _sys.stdout.flush()
            _sys.stderr.flush()
            _os._exit(0)
        return out

    E.forward, E.backward, E.step = forward, backward, step


if _os.environ.get("DSTOOLKIT_METRICS"):
    import importlib.abc as _abc
    import importlib.machinery as _mach

    class _DstoolkitFinder(_abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "deepspeed.runtime.engine":
                return None
            _sys.meta_path.remove(self)
            spec = _mach.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _dstoolkit_patch(module)
            spec.loader.exec_module = exec_module
            return spec

    _sys.meta_path.insert(0, _DstoolkitFinder())
'''


def install_hook(run_dir: pathlib.Path) -> pathlib.Path:
    """Write the metrics hook (`HOOK_SOURCE`) as <run_dir>/_dstoolkit_hook/sitecustomize.py; returns the folder
    to put first on PYTHONPATH."""
    d = run_dir / "_dstoolkit_hook"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(HOOK_SOURCE)
    return d


def precision_of(ds_config: dict) -> str:
    if (ds_config.get("bf16") or {}).get("enabled"):
        return "bf16"
    if (ds_config.get("fp16") or {}).get("enabled"):
        return "fp16"
    return "fp32"


def hf_form(ds_config: dict) -> dict:
    """The DeepSpeed JSON as HF Trainer wants it: the values TrainingArguments also sets are "auto" (HF fills
    them from --per_device_train_batch_size, --gradient_accumulation_steps, --bf16/--fp16, --max_grad_norm, the
    learning rate flags); a concrete value that disagrees with them makes HF refuse the config. The ZeRO section
    and everything else stay as generated, so the tuned ZeRO knobs (bucket sizes, overlap_comm) reach the run.
    (`dstoolkit.generate.hf_targets.build_hf_ds_config` builds the HF file from a strategy instead; it sets the
    bucket sizes to "auto", which HF fills from the hidden size: right for `generate`, but it would
    undo the tuner's bucket-scale choice.)"""
    cfg = json.loads(json.dumps(ds_config))
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "gradient_clipping"):
        cfg[k] = "auto"
    for k in ("bf16", "fp16"):
        if k in cfg:
            cfg[k] = {**cfg[k], "enabled": "auto"}
    opt = cfg.get("optimizer")
    if isinstance(opt, dict):
        params = dict(opt.get("params") or {})
        for k in ("lr", "betas", "eps", "weight_decay"):
            params[k] = "auto"
        opt["params"] = params
    sch = cfg.get("scheduler")
    if isinstance(sch, dict):
        sch["params"] = {k: "auto" for k in (sch.get("params") or {})}
    return cfg


def accelerate_yaml(hf_json: pathlib.Path, world_size: int, port: int) -> str:
    """An `accelerate launch --config_file` file: DeepSpeed with the HF-form JSON, local processes."""
    import torch

    cpu = not torch.cuda.is_available()
    return "\n".join([
        "compute_environment: LOCAL_MACHINE", "distributed_type: DEEPSPEED", "deepspeed_config:",
        f"  deepspeed_config_file: {hf_json}", "  zero3_init_flag: false", "machine_rank: 0",
        "main_training_function: main", "num_machines: 1", f"num_processes: {world_size}",
        "main_process_ip: 127.0.0.1", f"main_process_port: {port}", "rdzv_backend: static",
        f"use_cpu: {'true' if cpu else 'false'}", "same_network: true", ""])


def command_values(ds_config: dict, run_dir: pathlib.Path, *, world_size: int, steps: int) -> dict[str, str]:
    """Write the run's target files and return every placeholder's value."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ds_path = run_dir / "ds_config.json"
    ds_path.write_text(json.dumps(ds_config, indent=1) + "\n")
    hf_path = run_dir / "hf_ds_config.json"
    hf_path.write_text(json.dumps(hf_form(ds_config), indent=1) + "\n")
    port = harness.free_port()
    acc_path = run_dir / "accelerate_config.yaml"
    acc_path.write_text(accelerate_yaml(hf_path.resolve(), world_size, port))
    mb = int(ds_config.get("train_micro_batch_size_per_gpu") or 1)
    ga = int(ds_config.get("gradient_accumulation_steps") or 1)
    prec = precision_of(ds_config)
    return {"config": str(ds_path.resolve()), "hf_config": str(hf_path.resolve()),
            "accelerate_config": str(acc_path.resolve()), "micro_batch": str(mb), "grad_accum": str(ga),
            "global_batch": str(int(ds_config.get("train_batch_size") or mb * ga * world_size)),
            "precision": prec, "precision_flag": {"bf16": "--bf16", "fp16": "--fp16"}.get(prec, ""),
            "max_steps": str(steps), "world_size": str(world_size), "nproc": str(world_size), "port": str(port),
            "out": str(run_dir.resolve())}


def fill_command(template: Sequence[str], values: dict[str, str]) -> list[str]:
    """Fill {name} placeholders in each argument (str.format_map; {{ }} for literal braces). An argument that
    is only a placeholder whose value is empty (e.g. {precision_flag} at fp32) is dropped.

    Raises:
        BenchInputError: an unknown placeholder.
    """
    out = []
    for arg in template:
        try:
            filled = arg.format_map(values)
        except KeyError as exc:
            raise BenchInputError(f"command argument {arg!r}: unknown placeholder {{{exc.args[0]}}}; known: "
                                  + ", ".join("{" + k + "}" for k in COMMAND_PLACEHOLDERS)) from None
        except (ValueError, IndexError) as exc:
            raise BenchInputError(f"command argument {arg!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
        if filled == "" and arg.strip():
            continue
        out.append(filled)
    return out


def placeholders_used(template: Sequence[str]) -> list[str]:
    import string

    used = []
    for arg in template:
        for _, name, _, _ in string.Formatter().parse(arg):
            if name and name not in used:
                used.append(name)
    return used


def summarize_hook_rows(rows: Sequence[dict[str, Any]], skip_steps: int) -> dict[str, Any]:
    """Measured figures from the hook's per-step lines (pure).

    Raises:
        RuntimeError: no timed step.
    """
    steps = sorted((r for r in rows if r.get("event") is None and "step_time_s" in r), key=lambda r: r["step"])
    timed = steps[skip_steps:]
    if not timed:
        raise RuntimeError(f"the command completed {len(steps)} optimizer steps; need more than --skip-steps="
                           f"{skip_steps}")
    st = harness.summarize(r["step_time_s"] for r in timed)
    tokens = [r.get("tokens") or 0 for r in timed]
    tok_step = sorted(tokens)[len(tokens) // 2]
    samples = sorted(r.get("samples") or 0 for r in timed)[len(timed) // 2]
    peaks = [int(r["peak_memory_bytes"]) for r in steps if r.get("peak_memory_bytes")]
    return {
        "source": "deepspeed engine hook", "steps": len(steps), "timed_steps": len(timed),
        "step_time_s_median": st.median, "step_time_s_p90": st.p90, "step_time_s_stats": st.to_dict(),
        "step_time_samples_s": [r["step_time_s"] for r in timed],
        "tokens_per_step": tok_step or None, "tokens_per_s": (tok_step / st.median) if tok_step else None,
        "samples_per_s": (samples / st.median) if samples else None,
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_kind": "rank-0 peak RSS" if peaks and not _on_cuda() else "rank-0 torch.cuda.max_memory_allocated",
        "loss_first": steps[0].get("loss"), "loss_last": steps[-1].get("loss"),
        "global_batch": timed[-1].get("global_batch"), "micro_batch": timed[-1].get("micro_batch"),
        "grad_accum": timed[-1].get("grad_accum"),
    }


def _on_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def hf_log_metrics(text: str, seq_len: Optional[int]) -> Optional[dict[str, Any]]:
    """Fallback: HF Trainer's final `{'train_runtime': ..., 'train_samples_per_second': ...}` line."""
    import re

    m = re.findall(r"'train_samples_per_second':\s*'?([0-9.eE+-]+)", text)
    if not m:
        return None
    sps = float(m[-1])
    loss = re.findall(r"'train_loss':\s*'?([0-9.eE+-]+)", text)
    return {"source": "HF Trainer log (no DeepSpeed engine step seen)", "samples_per_s": sps,
            "tokens_per_s": sps * seq_len if seq_len else None, "loss_last": float(loss[-1]) if loss else None,
            "peak_memory_bytes": None}


def run_command(template: Sequence[str], ds_config: dict, run_dir: pathlib.Path, *, steps: int, skip_steps: int,
                world_size: int, timeout_s: float, seq_len: Optional[int] = None,
                extra_env: Optional[dict[str, str]] = None, who: str = "bench train") -> dict[str, Any]:
    """Run the user's command once for `ds_config` and measure it (never raises for a failed run).

    Returns:
        {"status": "ok"|"oom"|"timeout"|"error", "reason", "returncode", "command" (filled argv as a string),
         "placeholders" {name: value} (the ones the command uses), "measured" (when ok), "wall_s", "log"}.
    """
    values = command_values(ds_config, run_dir, world_size=world_size, steps=steps)
    cmd = fill_command(template, values)
    used = {k: values[k] for k in placeholders_used(template)}
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    hook = install_hook(run_dir)
    env = targets_mod.env_for_ranks()
    env["PYTHONPATH"] = os.pathsep.join([str(hook)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["DSTOOLKIT_METRICS"] = str(metrics.resolve())
    env["DSTOOLKIT_STOP_AFTER"] = str(steps)
    env.setdefault("LOCAL_SIZE", str(world_size))
    env.update(extra_env or {})
    check_locks(who=who)
    log_path = run_dir / "log.txt"
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        log.write(f"# dstoolkit: {' '.join(cmd)}\n# placeholders set: {json.dumps(used)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=run_dir,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            rc = proc.wait()
        except BaseException:
            kill_tree(proc.pid)
            proc.wait()
            remove_orphaned_buffers()
            raise
    wall = time.perf_counter() - t0
    remove_orphaned_buffers()
    if timed_out:
        check_locks(who=who, since_s=time.time() - wall - 1, min_age_s=2.0, wait_timeout_s=5.0)
    text = log_path.read_text(errors="replace")
    tail = text[-4000:]
    rows = harness.read_records(metrics) if metrics.exists() else []
    body: dict[str, Any] = {"command": " ".join(cmd), "placeholders": used, "returncode": rc, "wall_s": wall,
                            "log": str(log_path)}
    measured = None
    if rc == 0 and not timed_out:
        try:
            measured = summarize_hook_rows(rows, skip_steps) if rows else hf_log_metrics(text, seq_len)
        except RuntimeError as exc:
            body.update(status="error", reason=str(exc), error_tail=tail[-2000:])
            return body
    if measured is None:
        status, reason = _failure(rc, tail, timeout_s, timed_out)
        if rc == 0 and not timed_out:
            status, reason = "error", ("the command exited 0 but no DeepSpeed engine step was seen and no HF Trainer "
                                       "train_samples_per_second line was printed")
        body.update(status=status, reason=reason, error_tail=tail[-2000:])
        return body
    if measured.get("tokens_per_s") is None and measured.get("samples_per_s") and seq_len:
        measured["tokens_per_s"] = measured["samples_per_s"] * seq_len
    body.update(status="ok", reason="", measured=measured)
    return body
