"""Test hosts (network namespaces from launch/testhosts.sh) and per-node job control, for multi-node tests and benchmarks.

`TestHosts` brings N hosts up under a name unique to this run and always tears them down; `NodeJob` starts
one command per host (`ip netns exec`) and waits with a hard deadline, killing everything it started on
timeout. Traffic stays inside the namespaces: the hosts have only their private /24 and loopback.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import time
import uuid
from typing import Optional, Sequence

from dstoolkit.runtime.train.launch import free_port  # noqa: F401  (re-exported for the multinode scenarios)

REPO = pathlib.Path(__file__).resolve().parents[3]
TESTHOSTS = REPO / "launch" / "testhosts.sh"
IFNAME = "tb0"
"""Link name on every test host (testhosts.sh TESTHOSTS_IF default), so GLOO_SOCKET_IFNAME is the same everywhere."""


def unavailable_reason() -> Optional[str]:
    """Why test hosts cannot be made here (None when they can): needs root, iproute2 and netns support."""
    if os.geteuid() != 0:
        return "multi-node tests need root to create network namespaces (ip netns); not root here"
    if shutil.which("ip") is None:
        return "multi-node tests need iproute2's `ip` (not found on PATH)"
    if shutil.which("tc") is None:
        return "multi-node tests need iproute2's `tc` (not found on PATH)"
    probe = f"dstkprobe-{uuid.uuid4().hex[:8]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` is unavailable here: {r.stderr.strip() or r.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


PREFIX = "dstk"
"""Name prefix of test hosts made by this module: dstk<creator pid>x<random>-h<k>."""


def reap_stale() -> list[str]:
    """Remove test hosts (of this module's naming) whose creating process no longer exists; returns their names."""
    import re

    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    names = {m.group(1): int(m.group(2)) for line in r.stdout.splitlines()
             if (m := re.match(rf"^({PREFIX}(\d+)x[0-9a-f]{{4}})-(?:h\d+|sw)\b", line))}
    gone = [n for n, pid in names.items() if not pathlib.Path(f"/proc/{pid}").exists()]
    for n in gone:
        subprocess.run(["bash", str(TESTHOSTS), "down", "2", n], capture_output=True, timeout=120)
    return gone


class TestHosts:
    """N test hosts named `<name>-h<k>` with addresses 10.213.7.(k+1), built by launch/testhosts.sh."""

    __test__ = False  # not a pytest test class

    def __init__(self, n: int, name: Optional[str] = None) -> None:
        self.n = n
        # Unique per run (creator pid + random), so parallel test runs never share a namespace; the pid also
        # lets a later run reap hosts whose creator was killed before its teardown ran (`reap_stale`).
        self.name = name or f"{PREFIX}{os.getpid()}x{uuid.uuid4().hex[:4]}"
        self.addrs = [self._sh("addr", str(k)).strip() for k in range(n)]
        self.ifname = IFNAME

    def _sh(self, *args: str, check: bool = True) -> str:
        r = subprocess.run(["bash", str(TESTHOSTS), *args], capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"testhosts.sh {' '.join(args)} failed (rc={r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def ns(self, k: int) -> str:
        return f"{self.name}-h{k}"

    def up(self) -> "TestHosts":
        self._sh("up", str(self.n), self.name)
        return self

    def down(self) -> None:
        for k in range(self.n):
            self.unlimit_cpu(k)
        self._sh("down", str(self.n), self.name, check=False)

    def throttle(self, rate: str) -> None:
        """tbf-limit every host's uplink (both directions of every inter-host path) to `rate`, e.g. '1gbit'."""
        self._sh("throttle", rate, str(self.n), self.name)

    def unthrottle(self) -> None:
        self._sh("unthrottle", str(self.n), self.name)

    def throttle_host(self, k: int, rate: str) -> None:
        """tbf-limit host k's uplink only (its egress: traffic out of host k), as `throttle` does for every host."""
        subprocess.run(["ip", "netns", "exec", self.ns(k), "tc", "qdisc", "replace", "dev", self.ifname, "root",
                        "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"], check=True, capture_output=True,
                       timeout=60)

    def unthrottle_host(self, k: int) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns(k), "tc", "qdisc", "del", "dev", self.ifname, "root"],
                       capture_output=True, timeout=60)

    def limit_cpu(self, k: int, cpus: float) -> pathlib.Path:
        """Cap everything running inside host k at `cpus` CPUs together (a throttled or oversubscribed host): a
        cgroup of its own (v1 cpu controller: cfs_quota_us / cfs_period_us, or v2 cpu.max) holding host k's
        processes. Returns the cgroup folder; `unlimit_cpu` moves the processes back and removes it."""
        period = 100_000
        quota = max(1000, int(cpus * period))
        v1 = pathlib.Path("/sys/fs/cgroup/cpu")
        root = v1 if (v1 / "cgroup.procs").exists() else pathlib.Path("/sys/fs/cgroup")
        cg = root / f"{self.ns(k)}-cpu"
        cg.mkdir(exist_ok=True)
        if (cg / "cpu.cfs_quota_us").exists():
            (cg / "cpu.cfs_period_us").write_text(str(period))
            (cg / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (cg / "cpu.max").write_text(f"{quota} {period}")
        for pid in self.pids(k):
            try:
                (cg / "cgroup.procs").write_text(str(pid))
            except OSError:  # exited meanwhile
                pass
        return cg

    def unlimit_cpu(self, k: int) -> None:
        v1 = pathlib.Path("/sys/fs/cgroup/cpu")
        root = v1 if (v1 / "cgroup.procs").exists() else pathlib.Path("/sys/fs/cgroup")
        cg = root / f"{self.ns(k)}-cpu"
        if not cg.exists():
            return
        for pid in (cg / "cgroup.procs").read_text().split():
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        try:
            cg.rmdir()
        except OSError:
            pass

    def cut(self, k: int) -> None:
        """Take host k's link down (`ip link set tb0 down` inside it)."""
        self._sh("cut", str(k), self.name)

    def mend(self, k: int) -> None:
        self._sh("mend", str(k), self.name)

    def pids(self, k: int) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", self.ns(k)], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def kill_host(self, k: int) -> int:
        """SIGKILL every process inside host k (a lost host); returns how many were killed."""
        n = 0
        for pid in self.pids(k):
            try:
                os.kill(pid, signal.SIGKILL)
                n += 1
            except ProcessLookupError:
                pass
        return n

    def popen(self, k: int, argv: Sequence[str], env: dict, log: pathlib.Path, cwd: Optional[str] = None
              ) -> subprocess.Popen:
        """Start argv on host k (own process group) with env added to ours, stdout+stderr to log."""
        full = dict(os.environ)
        full.update({"GLOO_SOCKET_IFNAME": self.ifname, "OMP_NUM_THREADS": "1"})
        full.update(env)
        fh = open(log, "ab")
        return subprocess.Popen(["ip", "netns", "exec", self.ns(k), *argv], env=full, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=cwd or str(REPO), start_new_session=True)


@dataclasses.dataclass
class JobResult:
    """How a multi-process job ended."""

    returncodes: list[Optional[int]]
    """Exit status per started command (None: still running at the deadline, then killed)."""
    wall_s: float
    """Seconds from start to the last exit (or to the deadline)."""
    first_exit_s: Optional[float]
    """Seconds from start to the first non-zero exit; None when all succeeded."""
    timed_out: bool
    logs: list[pathlib.Path]
    exit_s: list[Optional[float]] = dataclasses.field(default_factory=list)
    """Seconds from start to each command's exit (None: killed at the deadline)."""

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    def tail(self, n: int = 30) -> str:
        out = []
        for p in self.logs:
            lines = p.read_text(errors="replace").splitlines() if p.exists() else []
            out.append(f"--- {p.name} ---\n" + "\n".join(lines[-n:]))
        return "\n".join(out)


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL a started command and everything in its process group (only what we started)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        pass


def wait_all(procs: Sequence[subprocess.Popen], logs: Sequence[pathlib.Path], timeout_s: float,
             t0: Optional[float] = None) -> JobResult:
    """Wait for every process up to timeout_s (from t0), then kill whatever is left."""
    t0 = time.monotonic() if t0 is None else t0
    first_fail: Optional[float] = None
    exits: list[Optional[float]] = [None] * len(procs)
    while True:
        rcs = [p.poll() for p in procs]
        now = time.monotonic() - t0
        for i, rc in enumerate(rcs):
            if rc is not None and exits[i] is None:
                exits[i] = now
        if first_fail is None and any(rc not in (None, 0) for rc in rcs):
            first_fail = now
        if all(rc is not None for rc in rcs):
            return JobResult(rcs, now, first_fail, False, list(logs), exits)
        if now > timeout_s:
            for p in procs:
                kill_group(p)
            return JobResult([None if rc is None else rc for rc in rcs], now, first_fail, True, list(logs), exits)
        time.sleep(0.2)

