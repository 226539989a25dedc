"""Multi-node scenarios shared by the tests (which assert) and benchmarks/multinode_*.py (which record figures).

Each scenario runs real DeepSpeed/torch.distributed jobs on test hosts and returns a dict of measured figures.
"""
from __future__ import annotations

import json
import pathlib
import time
from typing import Callable, Optional, Sequence

from dstoolkit.runtime.testhosts import jobs
from dstoolkit.runtime.testhosts.hosts import JobResult, TestHosts, wait_all

NPROC_PER_NODE = 2
"""Ranks per test host (the 2 nodes x 2 ranks layout of the issue)."""
PG_TIMEOUT_S = 10
"""Process-group timeout the fault runs set: a collective stuck on a cut link fails after this long."""
DETECT_SLACK_S = 30
"""Allowed time beyond PG_TIMEOUT_S for the launchers to notice the failed ranks and exit (teardown, logging)."""

def _check(res: JobResult, what: str) -> None:
    if not res.ok:
        raise AssertionError(f"{what} failed: rc={res.returncodes} timed_out={res.timed_out}\n{res.tail()}")


def fault_and_resume(hosts: TestHosts, workdir: pathlib.Path, fault: str, commands_for: Callable[..., list[list[str]]],
                     reference: dict[int, float], fault_after_steps: int = 4, env: Optional[dict] = None) -> dict:
    """Run, inject `fault` ("cut": link of host 1 down; "lost": SIGKILL everything on host 1), measure how long
    until every launcher has exited, restore, relaunch the same command with resume, compare with `reference`.

    commands_for(metrics, ckpt_dir, resume, slow) -> per-node argv (slow: a data delay so the fault lands mid-run).
    """
    metrics = workdir / f"{fault}.metrics.jsonl"
    ckpt = workdir / f"{fault}.ckpt"
    procs, logs, t0 = jobs.start_on_hosts(hosts, commands_for(metrics, ckpt, False, True), workdir, f"{fault}.run", env)
    try:
        reached = jobs.wait_for_lines(metrics, fault_after_steps, 600, procs)
        if not reached:
            raise AssertionError(f"{fault}: the job never reached step {fault_after_steps}\n"
                                 + JobResult([p.poll() for p in procs], 0, None, False, logs).tail())
        steps_before = len(jobs.read_losses(metrics))
        t_fault = time.monotonic()
        if fault == "cut":
            hosts.cut(1)
        elif fault == "lost":
            hosts.kill_host(1)
        else:
            raise ValueError(f"fault={fault!r}: use 'cut' or 'lost'")
        res = wait_all(procs, logs, PG_TIMEOUT_S + DETECT_SLACK_S + 60, t_fault)
    finally:
        for p in procs:
            jobs.kill_group(p)
        if fault == "cut":
            hosts.mend(1)
    before = jobs.read_losses(metrics)
    res2 = jobs.run_on_hosts(hosts, commands_for(metrics, ckpt, True, False), workdir, f"{fault}.resume", 600, env)
    _check(res2, f"{fault}: resume")
    got = jobs.read_losses(metrics)
    resumed_from = None
    for line in metrics.read_text().splitlines():
        if '"event": "resume"' in line:
            resumed_from = json.loads(line).get("step")
    common = [s for s in reference if s in got]
    diffs = [abs(got[s] - reference[s]) for s in common]
    return {
        "fault": fault,
        "steps_logged_before_fault": steps_before,
        "steps_logged_when_stopped": len(before),
        "resumed_from_step": resumed_from,
        "fault_returncodes": res.returncodes,
        "fault_timed_out": res.timed_out,
        "seconds_fault_to_all_exited": round(res.wall_s, 2),
        "seconds_fault_to_first_failure": None if res.first_exit_s is None else round(res.first_exit_s, 2),
        "seconds_fault_to_host0_exit": None if not res.exit_s or res.exit_s[0] is None else round(res.exit_s[0], 2),
        "pg_timeout_s": PG_TIMEOUT_S,
        "steps_compared": len(common),
        "steps_expected": len(reference),
        "max_abs_loss_diff": max(diffs) if diffs else None,
        "bitwise_equal": got == reference,
    }


# --------------------------------------------------------------------------------------------------
# Generated launch files (dstoolkit generate) on test hosts
# --------------------------------------------------------------------------------------------------

def two_node_spec_text(name: str = "two_node_cpu", preset: str = "tiny", ep: str = "1", zero_stage: str = "auto",
                       global_batch: int = 16, seq_len: int = 64, micro_batch: str = "4",
                       precision: str = "bf16") -> str:
    """A 2 nodes x 2 ranks (gpu: cpu) spec like the bundled tiny_cpu one, for generation in a test folder
    (tests pass runtime.cpu_precision.precision_for_this_cpu(): fp32 where this CPU's bf16 GEMM is the slow generic
    one)."""
    return (
        f"name: {name}\nmodel:\n  preset: {preset}\ncluster:\n  nodes: 2\n  gpus_per_node: 2\n  gpu: cpu\n"
        f"training:\n  seq_len: {seq_len}\n  global_batch: {global_batch}\n  micro_batch: {micro_batch}\n"
        f"  precision: {precision}\n  optimizer: adamw\n  lr: 0.001\n  activation_checkpointing: none\n"
        f"  tp: 1\n  pp: 1\n  ep: {ep}\n  zero_stage: {zero_stage}\n  offload: false\n  zeropp: false\n"
    )


def generate(spec_path: pathlib.Path, out_dir: pathlib.Path, strategies: Sequence[str]) -> pathlib.Path:
    """Run `dstoolkit generate SPEC --out DIR --strategy ...` (the CLI when present, else the same core calls)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("dstoolkit.cli.generate") is not None:
        argv = [sys.executable, "-m", "dstoolkit", "generate", str(spec_path), "--out", str(out_dir)]
        for s in strategies:
            argv += ["--strategy", s]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=str(jobs.REPO))
        if r.returncode != 0:
            raise AssertionError(f"dstoolkit generate failed (rc={r.returncode}):\n{r.stdout}\n{r.stderr}")
    else:  # TODO(#9): drop once `dstoolkit generate` (cli/generate.py) is committed
        from dstoolkit.generate.core import generate as gen, write_generated
        from dstoolkit.models import resolve_model
        from dstoolkit.spec import load_spec

        spec = load_spec(spec_path)
        write_generated(gen(spec, resolve_model(spec.model, spec.base_dir), list(strategies)), out_dir)
    return out_dir


def launch_dry_run(strategy_dir: pathlib.Path, env: dict, args: Sequence[str] = ()) -> list[str]:
    """The command the generated launch.sh would exec with `args`, as an argv (DRY_RUN=1 prints it %q-quoted)."""
    import os
    import shlex
    import subprocess

    full = dict(os.environ)
    full.update(jobs.base_env())
    full.update(env)
    full["DRY_RUN"] = "1"
    r = subprocess.run(["bash", str(strategy_dir / "launch.sh"), *args], capture_output=True, text=True, env=full, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"launch.sh DRY_RUN failed (rc={r.returncode}): {r.stderr}")
    return shlex.split(r.stdout.strip().splitlines()[-1])


def trainer_extra(ckpt: Optional[pathlib.Path] = None, save_every: int = 0, resume: bool = False,
                  extra: Sequence[str] = ()) -> list[str]:
    """Trainer flags the tests add to the generated command (checkpointing, resume, quiet)."""
    out = ["--no-progress"]
    if ckpt is not None:
        out += ["--checkpoint-dir", str(ckpt), "--save-every", str(save_every)]
    if resume:
        out.append("--resume")
    return out + list(extra)


def node_commands(hosts: TestHosts, strategy_dir: pathlib.Path, launcher: str, metrics: pathlib.Path, steps: int,
                  extra: Sequence[str] = (), hostfile: Optional[pathlib.Path] = None,
                  env: Optional[dict] = None) -> list[list[str]]:
    """Per-node argv from the generated launch.sh (DRY_RUN) for `launcher` = torchrun | deepspeed.

    The generated hostfile names placeholder hosts (node-0, node-1); the test writes one naming the test
    hosts' addresses, which is what a user does. NO_SSH=1 makes launch.sh's deepspeed branch the launcher's
    per-node form (`--no_ssh --node_rank K`, DeepSpeed 0.19.8). `extra` goes to launch.sh as arguments, which
    it passes on to the trainer; `env` (e.g. DIST_TIMEOUT_S) overrides launch.sh's environment.
    """
    argvs = []
    for k in range(2):
        e = {"LAUNCHER": launcher, "NODE_RANK": str(k), "MASTER_ADDR": hosts.addrs[0],
               "MASTER_PORT": str(jobs.MASTER_PORT), "METRICS_OUT": str(metrics), "STEPS": str(steps),
               # not the cwd: the test's own folder, one per run (the trainer saves its last step, and a second
               # run into the same folder without --resume is refused)
               "NO_SSH": "1", "CKPT_DIR": str(metrics.parent / f"checkpoints_{metrics.stem}")}
        if hostfile is not None:
            e["HOSTFILE"] = str(hostfile)
        e.update(env or {})
        argv = launch_dry_run(strategy_dir, e, extra)
        if launcher == "deepspeed" and argv[argv.index("--node_rank") + 1] != str(k):
            raise AssertionError(f"launch.sh with NO_SSH=1 NODE_RANK={k} did not give --node_rank {k}: {argv}")
        argvs.append(argv)
    return argvs


# --------------------------------------------------------------------------------------------------
# Throttled link: `dstoolkit bench comm` across hosts
# --------------------------------------------------------------------------------------------------

def rate_bytes_per_s(rate: str) -> float:
    """tc rate text (1gbit, 200mbit, 500kbit) -> bytes/s (tc: k/m/g are powers of 1000 for bit rates)."""
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", rate.lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use NNN[k|m|g]bit")
    mult = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    return float(m.group(1)) * mult / 8


def bench_comm_across_hosts(hosts: TestHosts, workdir: pathlib.Path, tag: str, ops: str = "all_reduce",
                            sizes: str = "16M", nproc: int = NPROC_PER_NODE, iters: int = 3, reps: int = 3,
                            timeout_s: float = 240) -> list[dict]:
    """`dstoolkit bench comm` under torchrun on both hosts (it detects RANK/WORLD_SIZE); rank 0's JSON rows."""
    script = ["-m", "dstoolkit", "bench", "comm", "--ops", ops, "--sizes", sizes, "--backend", "gloo",
              "--iters", str(iters), "--warmup", "1", "--reps", str(reps), "--format", "json", "--no-progress",
              "--out", str(workdir / f"{tag}.jsonl")]
    argvs = [jobs.torchrun_node_argv(k, 2, nproc, hosts.addrs[0], script) for k in range(2)]
    res = jobs.run_on_hosts(hosts, argvs, workdir, tag, timeout_s)
    _check(res, f"bench comm ({tag})")
    rows = [r for r in (json.loads(line) for line in (workdir / f"{tag}.jsonl").read_text().splitlines() if line.strip())
            if r.get("event") is None and "busbw" in r]
    if not rows:
        raise AssertionError(f"bench comm ({tag}) wrote no rows\n{res.tail()}")
    return rows


# --------------------------------------------------------------------------------------------------
# Cross-rank monitor: a throttled host, link or input names its rank/host (issue 28)
# --------------------------------------------------------------------------------------------------

BOTTLENECK_MODEL = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                    "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024}
"""~1.8M parameters: a ZeRO-2 step moves a few MB of gradients, so a 100 Mbit/s link costs tenths of a second,
while compute stays ~0.1 s per step on 2 shared cores."""
MONITOR_EVERY = 3
"""Steps per monitor window (the cross-rank gather runs once per window)."""


def bottleneck_job(hosts: TestHosts, workdir: pathlib.Path, tag: str, steps: int,
                   extra: Sequence[str] = ()) -> tuple[list[list[str]], pathlib.Path]:
    """Per-host torchrun argv of the example trainer (ZeRO-2 bf16, fp32 where bf16 is slow here; 2 hosts x 2
    ranks) and its metrics path."""
    import yaml

    from dstoolkit.runtime.cpu_precision import precision_for_this_cpu

    workdir.mkdir(parents=True, exist_ok=True)
    # the delays and throttles are sized against a ~0.1 s step: on a CPU without native bf16 the bf16 step takes
    # seconds and would hide them, so the job runs fp32 there
    prec = precision_for_this_cpu("bf16")
    spec = {"name": "crossrank", "model": BOTTLENECK_MODEL, "cluster": {"nodes": 2, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 2, "precision": prec, "lr": 0.001,
                         "activation_checkpointing": "none", "zero_stage": 2}}
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": prec == "bf16"}}
    (workdir / f"{tag}.spec.yaml").write_text(yaml.safe_dump(spec))
    (workdir / f"{tag}.ds.json").write_text(json.dumps(ds))
    metrics = workdir / f"{tag}.metrics.jsonl"
    script = ["-m", "dstoolkit.runtime.train.trainer", "--deepspeed_config", str(workdir / f"{tag}.ds.json"),
              "--spec", str(workdir / f"{tag}.spec.yaml"), "--steps", str(steps), "--metrics-out", str(metrics),
              "--monitor-every", str(MONITOR_EVERY), "--no-progress", "--no-spike-guard", *extra]
    return [jobs.torchrun_node_argv(k, 2, NPROC_PER_NODE, hosts.addrs[0], script) for k in range(2)], metrics


def monitor_events(metrics: pathlib.Path) -> list[dict]:
    if not metrics.exists():
        return []
    out = []
    for line in metrics.read_text().splitlines():
        if '"event": "monitor"' in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written
                pass
    return out


def bottleneck_phases(hosts: TestHosts, workdir: pathlib.Path, tag: str,
                      phases: Sequence[tuple[str, Optional[Callable[[], None]], Optional[Callable[[], None]]]],
                      windows_per_phase: int = 2, extra: Sequence[str] = (), timeout_s: float = 600) -> dict:
    """One training job; each phase applies its throttle, lets one window pass (the change lands mid-window),
    keeps the monitor reports of the next `windows_per_phase` windows, then undoes it. The first window is
    warm-up. Returns {phase: [monitor events]} and the node logs' bottleneck lines."""
    per_phase = 1 + windows_per_phase
    steps = MONITOR_EVERY * (1 + per_phase * len(phases))
    argvs, metrics = bottleneck_job(hosts, workdir, tag, steps, extra)
    procs, logs, t0 = jobs.start_on_hosts(hosts, argvs, workdir, tag)
    out: dict = {"steps": steps}
    try:
        def wait_windows(n: int) -> list[dict]:
            deadline = time.monotonic() + timeout_s
            while len(monitor_events(metrics)) < n:
                if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                    raise AssertionError(f"{tag}: {len(monitor_events(metrics))} of {n} monitor windows\n"
                                         + JobResult([p.poll() for p in procs], 0, None, False, logs).tail())
                time.sleep(0.2)
            return monitor_events(metrics)

        done = 1
        wait_windows(done)  # warm-up
        for name, apply, undo in phases:
            if apply is not None:
                apply()
            try:
                done += per_phase
                out[name] = wait_windows(done)[done - windows_per_phase:done]
            finally:
                if undo is not None:
                    undo()
        res = wait_all(procs, logs, timeout_s, t0)
        _check(res, tag)
    finally:
        for p in procs:
            jobs.kill_group(p)
    out["lines"] = [line for p in logs if p.exists() for line in p.read_text(errors="replace").splitlines()
                    if "bottleneck:" in line or "[monitor]" in line]
    return out
