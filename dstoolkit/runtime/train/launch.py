"""Launch the example trainer on local ranks (torchrun or the deepspeed launcher) and read its metrics.

Used by `dstoolkit train`, the dist tests and the benchmarks. No torch import.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Sequence

Launcher = Literal["torchrun", "deepspeed"]
TRAINER_MODULE = "dstoolkit.runtime.train.trainer"


def free_port() -> int:
    """A free TCP port on localhost (bind to port 0), so parallel launches never collide."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on localhost: every socket stays bound until all are chosen, since the kernel
    may hand a port just released to the next bind (two free_port() calls in a row can return the same port, and
    two ranks listening on it fail with EADDRINUSE)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_command(trainer_args: Sequence[str], *, nproc: int = 2, launcher: Launcher = "torchrun",
                   port: Optional[int] = None) -> list[str]:
    """The launcher command (an argv list, never a shell string) for `nproc` local ranks."""
    bindir = Path(sys.executable).parent
    port = port or free_port()
    if launcher == "deepspeed":
        return [str(bindir / "deepspeed"), "--num_gpus", str(nproc), "--master_port", str(port),
                "--module", TRAINER_MODULE, *trainer_args]
    if launcher == "torchrun":
        return [str(bindir / "torchrun"), "--nproc_per_node", str(nproc), "--master_port", str(port),
                "-m", TRAINER_MODULE, *trainer_args]
    raise ValueError(f"launcher={launcher!r}: use 'torchrun' or 'deepspeed'")


def check_extension_locks(who: str = "dstoolkit train") -> None:
    """Before a launch: remove stale torch-extension locks, wait (with a message) on live ones
    (dstoolkit.runtime.jitlock)."""
    from dstoolkit.runtime.jitlock import check_locks

    check_locks(who=who)


def launch_env(nproc: int, launcher: Launcher) -> dict:
    """Environment for local CPU ranks: one OpenMP thread per rank; LOCAL_SIZE for the deepspeed launcher."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # the deepspeed launcher does not set it (torchrun does)
    if launcher == "deepspeed":
        env.setdefault("LOCAL_SIZE", str(nproc))
    return env


def start_local(trainer_args: Sequence[str], *, nproc: int = 2, launcher: Launcher = "torchrun",
                log_path: Optional[Path] = None) -> subprocess.Popen:
    """Start a launch in the background (output to `log_path` or discarded)."""
    check_extension_locks()
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    return subprocess.Popen(launch_command(trainer_args, nproc=nproc, launcher=launcher),
                            env=launch_env(nproc, launcher), stdout=out, stderr=subprocess.STDOUT)


def run_local(trainer_args: Sequence[str], *, nproc: int = 2, launcher: Launcher = "torchrun",
              timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run a launch to completion, capturing its output (text)."""
    check_extension_locks()
    return subprocess.run(launch_command(trainer_args, nproc=nproc, launcher=launcher),
                          env=launch_env(nproc, launcher), capture_output=True, text=True, timeout=timeout_s)


@dataclass
class Metrics:
    """A metrics JSON-lines file split into step records and events."""

    steps: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    lines: list[dict] = field(default_factory=list)

    def of(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]


def read_metrics(path: str | os.PathLike) -> Metrics:
    m = Metrics()
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        m.lines.append(d)
        (m.events if "event" in d else m.steps).append(d)
    return m
