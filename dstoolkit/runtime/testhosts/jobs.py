"""Start jobs per node on test hosts (torchrun form, deepspeed --no_ssh form) or on one host, and read metrics."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Optional, Sequence

from dstoolkit.runtime.testhosts.hosts import REPO, JobResult, TestHosts, free_port, kill_group, wait_all

VENV_BIN = pathlib.Path(sys.executable).parent
PY = sys.executable
MASTER_PORT = 29500
"""Rendezvous port on host 0. Each test run has namespaces of its own, so a fixed port cannot collide."""


def base_env() -> dict:
    """Environment every rank gets: our venv first on PATH, the repo importable, one BLAS thread per rank."""
    from dstoolkit.common.cpu_env import CPU_RANK_ENV

    return {
        **CPU_RANK_ENV,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"),
        "PYTHONUNBUFFERED": "1",
    }


def read_losses(path: pathlib.Path) -> dict[int, float]:
    """step -> loss from a metrics JSON Lines file; a step logged twice (re-run after a resume) keeps its last value."""
    out: dict[int, float] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        rec = json.loads(line)
        if "loss" in rec and "step" in rec and "event" not in rec:  # events (spike, resume, ...) are not steps
            out[int(rec["step"])] = float(rec["loss"])
    return out


def torchrun_node_argv(node_rank: int, nnodes: int, nproc: int, master_addr: str, script_argv: Sequence[str],
                       port: int = MASTER_PORT) -> list[str]:
    """torchrun's per-node form (static rendezvous on host 0)."""
    return [str(VENV_BIN / "torchrun"), "--nnodes", str(nnodes), "--node_rank", str(node_rank),
            "--nproc_per_node", str(nproc), "--master_addr", master_addr, "--master_port", str(port), *script_argv]


def ds_launcher_node_argv(hostfile: pathlib.Path, node_rank: int, master_addr: str, script_argv: Sequence[str],
                          port: int = MASTER_PORT) -> list[str]:
    """The deepspeed launcher's per-node form in 0.19.8: `--hostfile H --no_ssh --node_rank k --master_addr A`."""
    return [str(VENV_BIN / "deepspeed"), "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(node_rank),
            "--master_addr", master_addr, "--master_port", str(port), *script_argv]


def run_on_hosts(hosts: TestHosts, argvs: Sequence[Sequence[str]], logdir: pathlib.Path, tag: str,
                 timeout_s: float, env: Optional[dict] = None) -> JobResult:
    """Run argvs[k] on host k, all at once; wait (bounded), kill leftovers."""
    logdir.mkdir(parents=True, exist_ok=True)
    e = base_env()
    e.update(env or {})
    logs = [logdir / f"{tag}.node{k}.log" for k in range(len(argvs))]
    t0 = time.monotonic()
    procs = [hosts.popen(k, argv, e, logs[k]) for k, argv in enumerate(argvs)]
    try:
        return wait_all(procs, logs, timeout_s, t0)
    finally:
        for p in procs:
            kill_group(p)


def start_on_hosts(hosts: TestHosts, argvs: Sequence[Sequence[str]], logdir: pathlib.Path, tag: str,
                   env: Optional[dict] = None) -> tuple[list[subprocess.Popen], list[pathlib.Path], float]:
    """Start argvs[k] on host k and return at once (fault tests act on the running job)."""
    logdir.mkdir(parents=True, exist_ok=True)
    e = base_env()
    e.update(env or {})
    logs = [logdir / f"{tag}.node{k}.log" for k in range(len(argvs))]
    t0 = time.monotonic()
    return [hosts.popen(k, argv, e, logs[k]) for k, argv in enumerate(argvs)], logs, t0


def run_single_host(nproc: int, script_argv: Sequence[str], logdir: pathlib.Path, tag: str, timeout_s: float) -> JobResult:
    """The reference: all ranks on one host (this namespace's loopback), torchrun --standalone-style."""
    logdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(base_env())
    log = logdir / f"{tag}.log"
    argv = [str(VENV_BIN / "torchrun"), "--nnodes", "1", "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), *script_argv]
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        p = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True)
    try:
        return wait_all([p], [log], timeout_s, t0)
    finally:
        kill_group(p)


def wait_for_lines(path: pathlib.Path, n: int, timeout_s: float, procs: Sequence[subprocess.Popen] = ()) -> bool:
    """Wait until `path` has at least n JSON lines (or a process exited, or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and len(read_losses(path)) >= n:
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.1)
    return False
