"""What one trial measures: a short real 2-rank run (real mode) or the estimate alone (estimate mode).

With a user command (`dstoolkit tune ... -- <command>`) real mode runs that command instead of the example
trainer (`run_command_trial`).

No torch import at module level. Real mode launches the example trainer (`dstoolkit.runtime.train.trainer`, the same
entry generated launch.sh files use) for a few optimizer steps with the point's DeepSpeed JSON and a copy of
the spec fixing the point's recompute policy; the per-step metrics are summarised by the train bench
(`dstoolkit.runtime.bench.train_report.summarize_metrics`: warm-up steps dropped, median step time). A run that fails is a
`TrialOutcome` with status "oom", "timeout" or "error" and a one-line reason: it never raises.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import yaml

from dstoolkit.runtime.bench.usercmd import OOM_MARKERS, _failure, kill_tree  # noqa: F401  (moved to runtime)
from dstoolkit.runtime.train.shm import remove_orphaned_buffers
from dstoolkit.tune.space import PointCheck, TunePoint, TuneSpace, estimated_tokens_per_s, trial_spec_dict

OBJECTIVES = ("throughput", "memory")
MODES = ("real", "estimate")
DEFAULT_STEPS = 6  # optimizer steps per real trial: launch costs ~10 s, a tiny-model step well under 1 s
DEFAULT_SKIP_STEPS = 2  # first steps excluded (engine warm-up, lazy optimizer state; bench train's default)
DEFAULT_TRIAL_TIMEOUT_S = 300.0  # a real trial slower than this is recorded as "timeout"
LAUNCHERS = ("torchrun", "deepspeed")  # torchrun starts 2 ranks in ~8-10 s here, the deepspeed launcher 13-22 s


@dataclass
class TrialOutcome:
    """The result of evaluating one point."""

    status: str
    """ok | pruned | oom | timeout | error"""
    value: Optional[float] = None
    """The objective: tokens/s (throughput) or bytes per rank (memory); None unless ok."""
    reason: str = ""
    """Why it was pruned or failed (one line)."""
    code: str = ""
    """Short group for the reason (rule:batch, memory, validate, oom, timeout, error)."""
    measured: dict[str, Any] = field(default_factory=dict)
    estimate: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_summary(spec, check: PointCheck) -> dict[str, Any]:
    """The estimate of a checked point as plain numbers (empty when there is none)."""
    est = check.estimate
    if est is None:
        return {}
    return {"step_time_s": est.step_time_s, "tokens_per_s": estimated_tokens_per_s(spec, est),
            "memory_per_rank_bytes": est.memory_per_rank_bytes, "mfu": est.mfu, "fits": est.fits,
            "host_memory_per_rank_bytes": est.host_memory_per_rank_bytes, "source": est.source,
            # the sweep's own rule (generate.costing: peak + allowance + headroom <= device memory)
            "within_headroom": est.within_headroom, "headroom_bytes": est.headroom_bytes,
            "device_memory_bytes": est.device_memory_bytes}


def objective_from_estimate(objective: str, est: dict[str, Any]) -> float:
    """Estimate-mode objective: estimated tokens/s, or estimated device bytes per rank."""
    return float(est["tokens_per_s"] if objective == "throughput" else est["memory_per_rank_bytes"])


def objective_from_measured(objective: str, measured: dict[str, Any]) -> Optional[float]:
    """Real-mode objective: measured tokens/s, or rank 0's peak memory (RSS on CPU)."""
    v = measured.get("tokens_per_s") if objective == "throughput" else measured.get("peak_memory_bytes")
    return float(v) if v else None


def direction(objective: str) -> str:
    """optuna direction for an objective."""
    return "maximize" if objective == "throughput" else "minimize"


def _launch_cmd(launcher: str, ranks: int, port: int, ds_path: pathlib.Path, spec_path: pathlib.Path, steps: int,
                metrics: pathlib.Path, ep: int, peak_flops: float, shrink: Optional[str] = None) -> list[str]:
    if launcher == "deepspeed":
        cmd = trainer_command(ds_path, spec_path, steps, metrics, ranks, ep, port, shrink=shrink)
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "-m", "dstoolkit.runtime.train.trainer",
               "--deepspeed_config", str(ds_path), "--spec", str(spec_path), "--steps", str(steps),
               "--metrics-out", str(metrics), "--no-progress"]
        if shrink:
            cmd += ["--shrink", shrink, "--ep-size", "1"]
        elif ep > 1:
            cmd += ["--ep-size", str(ep)]
    # The peak only feeds the trainer's MFU line; passing it skips the trainer's matmul probe (seconds per run).
    return cmd + ["--peak-flops", repr(float(peak_flops)), "--no-spike-guard"]


STALE_LOCK_GRACE_S = 5.0  # a live holder of a torch-extension lock on a warm cache releases it well within this
# The one implementation of the torch-extension lock check lives in dstoolkit.runtime.jitlock (re-exported here).
from dstoolkit.runtime.jitlock import check_locks, clear_stale_extension_locks, torch_extensions_dir  # noqa: E402,F401
from dstoolkit.runtime.bench import harness, results_jsonl
from dstoolkit.runtime.bench.train import trainer_command
from dstoolkit.runtime.bench.train_report import summarize_metrics
from dstoolkit.runtime.bench.usercmd import run_command


def run_real_trial(space: TuneSpace, check: PointCheck, work_dir: pathlib.Path, *, objective: str = "throughput",
                   ranks: int = 2, steps: int = DEFAULT_STEPS, skip_steps: int = DEFAULT_SKIP_STEPS,
                   timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S, launcher: str = "torchrun",
                   extra_env: Optional[dict[str, str]] = None, shrink: Optional[str] = None) -> TrialOutcome:
    """Run one checked point for real on `ranks` local ranks and measure it.

    Args:
        space: The space (spec, shape) the point belongs to.
        check: The point's passed pre-run check (its DeepSpeed JSON and estimate).
        work_dir: Folder for the trial's ds_config.json, spec copy, metrics and log (created).
        objective: "throughput" (tokens/s) or "memory" (peak bytes).
        ranks: Local ranks to launch (the spec's world size).
        steps: Optimizer steps to run; the first `skip_steps` are not timed.
        timeout_s: Wall-clock limit; past it the ranks are killed and the trial is a "timeout".
        launcher: "torchrun" or "deepspeed".
        extra_env: Extra environment for the ranks.
        shrink: A trainer `--shrink` value: train the spec's own transformers architecture, shrunk.

    Returns:
        A `TrialOutcome` (never raises for a failed run).
    """

    # The ranks run in work_dir: every path they get must not depend on the caller's working directory
    # (a relative --out would otherwise point them at work_dir/work_dir/...).
    work_dir = pathlib.Path(work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    ds_path = work_dir / "ds_config.json"
    ds_path.write_text(json.dumps(check.ds_config, indent=1) + "\n")
    spec_path = work_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(trial_spec_dict(space.spec, check.point), sort_keys=False))
    metrics = work_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    peak = space.spec.cluster.gpu_spec.peak_bf16_flops
    cmd = _launch_cmd(launcher, ranks, harness.free_port(), ds_path, spec_path, steps, metrics,
                      check.point.candidate.ep, peak, shrink=shrink)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per rank (the deepspeed launcher does not set it)
    env["LOCAL_SIZE"] = str(ranks)
    env.update(extra_env or {})
    est = estimate_summary(space.spec, check)
    check_locks(who=f"tune trial {work_dir.name}")
    t0 = time.perf_counter()
    started_epoch_s = time.time()
    removed_locks: list[str] = []
    timed_out = False
    log_path = work_dir / "log.txt"
    with open(log_path, "w") as log:
        # Own session: a Ctrl-C in the terminal reaches the tuner, which then kills the whole tree (kill_tree).
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work_dir,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            rc = proc.wait()
            removed_locks = clear_stale_extension_locks(started_epoch_s)
        except BaseException:  # KeyboardInterrupt / SIGTERM: take the ranks down with us, then propagate
            kill_tree(proc.pid)
            proc.wait()
            clear_stale_extension_locks(started_epoch_s)
            remove_orphaned_buffers()
            raise
    wall = time.perf_counter() - t0
    remove_orphaned_buffers()  # /dev/shm buffers of ranks that died before the trainer unlinked them
    tail = log_path.read_text(errors="replace")[-4000:]
    rows = results_jsonl.read_records(metrics) if metrics.exists() else []
    if rc != 0 or timed_out or not rows:
        status, reason = _failure(rc, tail, timeout_s, timed_out)
        if rc == 0 and not timed_out:
            status, reason = "error", "the trainer exited 0 but wrote no metrics"
        if timed_out and removed_locks:
            reason += f"; removed {len(removed_locks)} torch-extension lock(s) the killed ranks left behind"
        return TrialOutcome(status=status, reason=reason, code=status, estimate=est, wall_s=wall,
                            measured={"returncode": rc, "command": " ".join(cmd)})
    try:
        measured = summarize_metrics(rows, skip_steps, space.spec.training.seq_len)
    except RuntimeError as exc:
        return TrialOutcome(status="error", reason=str(exc), code="error", estimate=est, wall_s=wall)
    measured["command"] = " ".join(cmd)
    measured["load_avg"] = harness.load_average()
    ran = next((r for r in rows if r.get("event") == "model"), None)
    if ran is not None:  # what the trainer built (class, parameters, shrunk sizes)
        measured["model_ran"] = {k: ran.get(k) for k in ("builder", "model_type", "model_class", "params",
                                                          "shrunk_sizes", "seq_len") if k in ran}
    value = objective_from_measured(objective, measured)
    if value is None:
        return TrialOutcome(status="error", reason=f"no {objective} figure in the trainer's metrics", code="error",
                            measured=measured, estimate=est, wall_s=wall)
    return TrialOutcome(status="ok", value=value, measured=measured, estimate=est, wall_s=wall)


def run_estimate_trial(space: TuneSpace, check: PointCheck, objective: str) -> TrialOutcome:
    """Estimate mode: the estimate is the measurement."""
    est = estimate_summary(space.spec, check)
    return TrialOutcome(status="ok", value=objective_from_estimate(objective, est), estimate=est)


def run_command_trial(space: TuneSpace, check: PointCheck, work_dir: pathlib.Path, command: list[str], *,
                      objective: str = "throughput", ranks: int = 2, steps: int = DEFAULT_STEPS,
                      skip_steps: int = DEFAULT_SKIP_STEPS, timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S,
                      extra_env: Optional[dict[str, str]] = None) -> TrialOutcome:
    """Real mode with the user's own command (`dstoolkit tune ... -- <command>`): the point's DeepSpeed JSON
    (and its HF / Accelerate forms) fill the command's placeholders, the run is measured by the DeepSpeed
    engine hook (`dstoolkit.runtime.bench.usercmd.run_command`) and stopped after `steps` optimizer steps.
    DSTOOLKIT_SPEC points the ranks at a spec copy with the point's fields (for DstoolkitCallback / Guard's
    estimate). Never raises for a failed run."""

    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path = work_dir / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(trial_spec_dict(space.spec, check.point), sort_keys=False))
    est = estimate_summary(space.spec, check)
    env = {"DSTOOLKIT_SPEC": str(spec_path.resolve()), **(extra_env or {})}
    body = run_command(command, check.ds_config, work_dir, steps=steps, skip_steps=skip_steps, world_size=ranks,
                       timeout_s=timeout_s, seq_len=space.spec.training.seq_len, extra_env=env,
                       who=f"tune trial {work_dir.name}")
    info = {"returncode": body["returncode"], "command": body["command"], "placeholders": body["placeholders"],
            "log": body["log"]}
    if body["status"] != "ok":
        return TrialOutcome(status=body["status"], reason=body["reason"], code=body["status"], estimate=est,
                            wall_s=body["wall_s"], measured=info)

    measured = {**body["measured"], **info, "load_avg": harness.load_average()}
    value = objective_from_measured(objective, measured)
    if value is None:
        return TrialOutcome(status="error", reason=f"no {objective} figure in the run's metrics", code="error",
                            measured=measured, estimate=est, wall_s=body["wall_s"])
    return TrialOutcome(status="ok", value=value, measured=measured, estimate=est, wall_s=body["wall_s"])
