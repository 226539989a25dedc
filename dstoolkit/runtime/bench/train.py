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
The figures and the table: `dstoolkit.runtime.bench.train_report`; the user's own command (`-- <command>`):
`dstoolkit.runtime.bench.usercmd`.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, results_jsonl, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.train_estimate import estimate_for, load_calibration
from dstoolkit.runtime.bench.train_report import format_table, rel_error, summarize_metrics
from dstoolkit.runtime.bench.usercmd import resolve_user_config, run_command
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


def run_one(target: targets_mod.BenchTarget, *, steps: int, skip_steps: int, world_size: int, work_dir: pathlib.Path,
            timeout_s: float, calibration, shrink=None) -> dict[str, Any]:
    """Launch one config through the deepspeed launcher and build its record body (`shrink`: the
    `ShrinkSizes` of a shrunk run of the spec's own architecture)."""
    from dstoolkit.runtime.bench.train_precheck import spec_and_shape

    spec, shape, shrunk = spec_and_shape(target, world_size, shrink)
    run_dir = work_dir / target.name
    run_dir.mkdir(parents=True, exist_ok=True)
    ds_path = run_dir / "ds_config.json"
    # the example trainer is no HF Trainer: it gets the "auto" values made concrete (and the record says how)
    resolved, assumed = resolve_user_config(target.ds_config, command=[], spec=spec, world_size=world_size,
                                            hidden_size=getattr(shape, "hidden_size", None))
    ds_path.write_text(json.dumps(resolved, indent=1))
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
    if assumed:
        body["estimate_assumed"] = assumed
    rows = results_jsonl.read_records(metrics) if metrics.exists() else []
    if shrunk is not None:
        body["shrink"] = {**shrunk.record(), "config_changes": target.shrunk_changes}
    ran = next((r for r in rows if r.get("event") == "model"), None)
    if ran is not None:  # what the trainer built: class and parameter count
        body["model_ran"] = {k: ran.get(k) for k in ("builder", "model_type", "model_class", "params")}
    if rc != 0 or not rows:
        body.update({"status": "failed", "returncode": rc, "error_tail": tail})
        return body
    measured = summarize_metrics(rows, skip_steps, spec.training.seq_len)
    est = estimate_for(spec, shape, resolved, world_size, target.ep_size, calibration)
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
    resolved, assumed = resolve_user_config(target.ds_config, command=command, spec=spec, world_size=world_size,
                                            hidden_size=getattr(shape, "hidden_size", None))
    res = run_command(command, target.ds_config, run_dir, steps=steps, skip_steps=skip_steps, world_size=world_size,
                      timeout_s=timeout_s, seq_len=spec.training.seq_len if spec else None, extra_env=extra,
                      who=f"bench train {target.name}", resolved=resolved)
    body: dict[str, Any] = {"config_name": target.name, "command": res["command"], "placeholders": res["placeholders"],
                            "wall_s": res["wall_s"], "world_size": world_size, "ep_size": target.ep_size,
                            "zero_stage": int((target.ds_config.get("zero_optimization") or {}).get("stage", 0)),
                            "ds_config": target.ds_config, "user_command": True}
    if assumed:
        body["estimate_assumed"] = assumed
    if res["status"] != "ok":
        body.update({"status": "failed", "failure": res["status"], "reason": res["reason"],
                     "returncode": res["returncode"], "error_tail": res.get("error_tail", res["reason"])})
        return body
    measured = res["measured"]
    est = estimate_for(spec, shape, resolved, world_size, target.ep_size, calibration) if spec else None
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
    With `shrink` (a `--shrink` value: 'auto' or sizes, `dstoolkit.runtime.shrink_sizes.parse_shrink`) the trainer
    trains the spec's own transformers architecture shrunk, each config's batch fitted to the ranks
    (`fit_batch`), and the estimate beside it is the shrunk model's at the run's sequence length."""
    from dstoolkit.runtime.bench.ranks import check_world_size
    from dstoolkit.runtime.shrink_sizes import ShrinkError, parse_shrink

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
        tgts = targets_mod.resolve_targets(list(items), spec, strategies, tmp, world_size, shrink=sizes,
                                            cpu=backend == "gloo")
        if not command:  # before anything is launched: the estimate per rank against this host's RAM share
            from dstoolkit.runtime.bench.train_precheck import check_targets_fit

            for note in check_targets_fit(tgts, world_size, calibration, shrink=sizes):
                print(f"# note: {note}; the run and its estimate are at {world_size} ranks", file=sys.stderr)
        cfg = {"bench": BENCH_NAME, "targets": [(t.name, t.ds_config, t.ep_size, str(t.spec_path)) for t in tgts],
               "steps": steps, "skip": skip_steps, "world": world_size,
               "calibration": calibration, "command": list(command or [])}
        if sizes is not None:
            cfg["shrink"] = sizes.to_arg()
        cfg_hash = harness.config_hash(cfg)
        state = results_jsonl.open_run(out, BENCH_NAME, cfg_hash, resume=resume)
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
                rec = results_jsonl.base_record(BENCH_NAME, state.run_id, t.name, dict(env))
                rec.update(body)
                records.append(rec)
                if out:
                    results_jsonl.append_records(out, [rec])
                update(1)
        results_jsonl.close_run(out, BENCH_NAME, cfg_hash, state.run_id)
    return results_jsonl.run_rows(out, state, records)


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
