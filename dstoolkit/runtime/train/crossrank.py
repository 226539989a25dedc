"""Cross-rank view: which rank (and host) holds the job back, and why.

In synchronous data-parallel training every rank's step takes as long as the slowest one's, so step times alone
name nobody. What differs is how each rank spends the step: its own work (compute, waiting for its input) and the
time it is blocked in collectives waiting for the others. Every monitor window each rank contributes a few floats
(`RankWindow.vector`: step, compute, collective wait, input wait, memory, link probe) in ONE all_gather; rank 0
then diagnoses:

  * compute-bound host: the rank whose compute per step is the highest is more than `noise` above the median
    rank's (the others show the difference as collective wait);
  * input-bound: the same, with its excess in input wait rather than compute;
  * slow link / collective wait: no rank's own work stands out, the ranks wait in collectives, and the link probe
    out of one host is more than `link_noise` slower than out of the others. The probe (multi-host jobs only):
    each rank receives `probe_bytes` from the rank with its local index on the previous host, one sending host at
    a time (a one-float barrier before each turn), so a receive time measures the link out of the sending host.

No line is printed below the thresholds, and a culprit is only named once it has stood out in `PERSIST_WINDOWS`
windows in a row (`Persistence`): one noisy window on a loaded machine is no bottleneck. `noise` sits above the
spread measured with nothing throttled (tests/dist/test_crossrank_monitor.py prints it per window). The pure part (diagnose) imports nothing; gathering
imports torch.
"""
from __future__ import annotations

import fcntl
import math
import os
import socket
import statistics
import struct
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional, Sequence

NOISE_FRACTION = 0.5
"""A rank's own work (compute + input wait) per step must exceed the median of the other ranks' by this fraction
to be named. Measured with nothing throttled, 2 test hosts x 2 ranks on 2 shared cores (load 10-24 from other
jobs, 2026-12), two test runs: 6.2% / 0.8% and 9.5% / 45.1% per window; the throttled cases it must catch were
79-544% (a host at 0.1 CPU) and 108-339% (a 0.3 s input delay on one rank). On a machine this loaded the margin
is thin (45% vs 50%, 79% vs 50%); a quiet machine's spread is smaller."""
LINK_NOISE_FRACTION = 1.0
"""The probe out of one host must take this fraction longer than the fastest other host's (2x) to name a link."""
MIN_LINK_STEP_SHARE = 0.05
"""... and that extra probe time must be at least this share of the median step: a few-ms probe on a healthy link
varies 3-4x from window to window (measured: 9 ms vs 2 ms in a 305 ms step), which is no slow link."""
MIN_COMM_SHARE = 0.10
"""A link is only named when the median rank spends at least this share of its step blocked in collectives."""
PROBE_BYTES = 1 << 20
"""Link-probe payload per rank and window (1 MiB: ~1 ms on a healthy 10 Gbit/s link, 40 ms at 200 Mbit/s)."""

PERSIST_WINDOWS = 2
"""Windows in a row the same culprit (`culprit`) must stand out in before it is named. Measured with nothing
throttled (2 test hosts x 2 ranks on 2 shared cores, 3-step windows, CI 2026-12-06): one window put a rank's own
work 50.5% above the others' median (compute 35 ms vs 23 ms in a 69 ms step), the next 7.4%; the throttled cases
stood out in every window after the change."""

FIELDS = ("step_s", "compute_s", "comm_s", "input_s", "mem_bytes", "probe_s")


@dataclass(frozen=True)
class RankWindow:
    """One rank's means per step over a monitor window."""

    rank: int
    node: int
    """Host index (order of first appearance of the host label over ranks)."""
    host: str
    step_s: float
    compute_s: float
    """step_s - comm_s - input_s: the time the rank worked (forward, backward, optimizer, host overheads)."""
    comm_s: float
    """Time blocked in collectives (the comm timer: exposed communication)."""
    input_s: float
    """Time waiting for the next batch."""
    mem_bytes: float
    """Peak memory (device when on a GPU, else the process's peak RSS)."""
    probe_s: Optional[float] = None
    """Receive time of the link probe from the previous host (None: single host or no probe)."""
    probe_from_node: Optional[int] = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Bottleneck:
    """The rank (and host) that holds the job back, the reason class and its evidence."""

    kind: str
    """compute | input | link."""
    rank: int
    node: int
    host: str
    slower_pct: float
    """How much slower than the median rank (compute/input: its own work; link: its probe vs the other hosts')."""
    evidence: str
    whole_host: bool = True
    """compute: every rank of its host is slow (a throttled / shared host), not this rank alone."""
    windows: int = 1
    """Monitor windows in a row this culprit has stood out in (`Persistence`)."""
    input_measured: bool = True
    """False where the loop could not time its input wait (`StepWindows.step` without input_s): a slow data
    loader then shows as compute, and the line says so instead of naming input 0 ms."""

    def line(self, step: int) -> str:
        what = {"compute": "compute-bound host" if self.whole_host else
                "compute-bound rank (its host's other ranks are not slow)", "input": "input-bound rank",
                "link": "slow link / collective wait"}[self.kind]
        if self.kind == "compute" and not self.input_measured:
            what += " or its input (input wait not measured: waiting for data counts as compute)"
        who = (f"host {self.host} (node {self.node})" if self.kind == "link"
               else f"rank {self.rank} on host {self.host} (node {self.node})")
        if self.kind == "link":
            how = f"its uplink is {1 + self.slower_pct / 100:.1f}x slower than the other hosts'"
        else:
            how = f"is {self.slower_pct:.0f}% slower than the median rank"
        seen = f" ({self.windows} windows in a row)" if self.windows > 1 else ""
        return f"[monitor] step {step} | bottleneck: {who} {how}: {what}{seen} | {self.evidence}"

    def as_dict(self) -> dict:
        return asdict(self)


def _ms(s: float) -> str:
    return f"{s * 1000:.0f} ms"


def med_own_others(ranks: Sequence[RankWindow], me: RankWindow) -> float:
    """Median own work (compute + input wait) of the ranks on other hosts than `me` (all others when one host)."""
    others = [r for r in ranks if r.node != me.node] or [r for r in ranks if r.rank != me.rank]
    return statistics.median(r.compute_s + r.input_s for r in others)


def own_work_excess(ranks: Sequence[RankWindow]) -> tuple[int, float]:
    """(index of the rank with the most own work per step, its excess over the median of the other ranks)."""
    own = [r.compute_s + r.input_s for r in ranks]
    i = max(range(len(ranks)), key=own.__getitem__)
    med = statistics.median(o for j, o in enumerate(own) if j != i)
    return i, (own[i] / med - 1 if med > 0 else 0.0)


def unmeasured(r: RankWindow) -> bool:
    """A rank whose window timings hold a NaN (nothing measured): it cannot be compared with the others."""
    return any(math.isnan(getattr(r, f)) for f in ("step_s", "compute_s", "comm_s", "input_s"))


def diagnose(ranks: Sequence[RankWindow], *, noise: float = NOISE_FRACTION, link_noise: float = LINK_NOISE_FRACTION,
             min_comm_share: float = MIN_COMM_SHARE, probe_bytes: int = PROBE_BYTES,
             input_measured: bool = True) -> Optional[Bottleneck]:
    """The bottleneck of one window, or None when nothing stands out beyond the noise thresholds. Ranks with a NaN
    timing (`unmeasured`) are left out of the comparison, and the evidence names them. `input_measured` False: the
    input wait was not timed (its zeros are no measurement; `Bottleneck.input_measured`)."""
    left_out = [r.rank for r in ranks if unmeasured(r)]
    if left_out:
        found = diagnose([r for r in ranks if not unmeasured(r)], noise=noise, link_noise=link_noise,
                         min_comm_share=min_comm_share, probe_bytes=probe_bytes, input_measured=input_measured)
        if found is None:
            return None
        return replace(found, evidence=f"{found.evidence}; rank(s) {', '.join(map(str, left_out))} left out: "
                                       "NaN timings (nothing measured)")
    if len(ranks) < 2:
        return None
    med_step = statistics.median(r.step_s for r in ranks)
    med_comm = statistics.median(r.comm_s for r in ranks)
    i, excess = own_work_excess(ranks)
    slow = ranks[i]
    others = [r for j, r in enumerate(ranks) if j != i]  # "the median rank": the median of the other ranks
    med_compute = statistics.median(r.compute_s for r in others)
    med_input = statistics.median(r.input_s for r in others)
    others_wait = statistics.median(r.comm_s for r in others)
    if excess > noise:
        if slow.input_s - med_input > slow.compute_s - med_compute:
            return Bottleneck("input", slow.rank, slow.node, slow.host, excess * 100,
                              f"input wait {_ms(slow.input_s)}/step vs median {_ms(med_input)}; compute "
                              f"{_ms(slow.compute_s)} vs {_ms(med_compute)}; the other ranks wait "
                              f"{_ms(others_wait)}/step in collectives")
        same_host = [r for r in ranks if r.node == slow.node]
        host_compute = statistics.mean(r.compute_s for r in same_host)
        whole = all(r.compute_s + r.input_s > (1 + noise) * med_own_others(ranks, r) for r in same_host)
        inp = f"input {_ms(slow.input_s)}" if input_measured else "input wait not measured (counted as compute)"
        return Bottleneck("compute", slow.rank, slow.node, slow.host, excess * 100,
                          f"compute {_ms(slow.compute_s)}/step vs median {_ms(med_compute)} (its host's "
                          f"{len(same_host)} rank(s): {_ms(host_compute)}); {inp}; the other "
                          f"ranks wait {_ms(others_wait)}/step in collectives", whole_host=whole,
                          input_measured=input_measured)
    probes = [r for r in ranks if r.probe_s is not None and r.probe_from_node is not None]
    if not probes or med_step <= 0 or med_comm / med_step < min_comm_share:
        return None
    by_node: dict[int, list[float]] = {}
    for r in probes:
        by_node.setdefault(r.probe_from_node, []).append(r.probe_s)
    if len(by_node) < 2:
        return None
    out_s = {n: statistics.mean(v) for n, v in by_node.items()}
    worst = max(out_s, key=out_s.get)
    best_other = min(v for n, v in out_s.items() if n != worst)
    ratio = out_s[worst] / best_other - 1 if best_other > 0 else 0.0
    if ratio <= link_noise or out_s[worst] - best_other < MIN_LINK_STEP_SHARE * med_step:
        return None
    host_rank = min((r for r in ranks if r.node == worst), key=lambda r: r.rank)
    rate = probe_bytes / out_s[worst] / 1e6 if out_s[worst] > 0 else float("inf")
    return Bottleneck("link", host_rank.rank, worst, host_rank.host, ratio * 100,
                      f"link probe ({probe_bytes / 2**20:.0f} MiB per rank) out of this host {_ms(out_s[worst])} "
                      f"({rate:.0f} MB/s) vs {_ms(best_other)} out of the others; ranks wait {_ms(med_comm)} of "
                      f"{_ms(med_step)} per step in collectives ({med_comm / med_step:.0%}); compute "
                      f"{_ms(med_compute)} median, no rank above it by more than {noise:.0%}")


def culprit(b: Bottleneck) -> tuple[str, int]:
    """What must repeat from window to window: the kind and the host for compute and link (on a throttled host its
    ranks take turns being the slowest), the kind and the rank for input."""
    return (b.kind, b.rank if b.kind == "input" else b.node)


class Persistence:
    """Names a window's bottleneck only when the same culprit stood out in the `windows` windows before it too
    (counting this one); a window with nothing found, or another culprit, starts the count again."""

    def __init__(self, windows: int = PERSIST_WINDOWS) -> None:
        if windows < 1:
            raise ValueError(f"persistence windows={windows} must be >= 1 (1: name every window's culprit)")
        self.windows = windows
        self._key: Optional[tuple[str, int]] = None
        self._run = 0

    def __call__(self, found: Optional[Bottleneck]) -> Optional[Bottleneck]:
        if found is None:
            self._key, self._run = None, 0
            return None
        key = culprit(found)
        self._run = self._run + 1 if key == self._key else 1
        self._key = key
        return replace(found, windows=self._run) if self._run >= self.windows else None


def table_lines(ranks: Sequence[RankWindow]) -> list[str]:
    """The per-rank table as text (for logs; the metrics JSONL gets `as_dict` rows)."""
    out = [f"{'rank':>4} {'node':>4} {'host':<28} {'step':>8} {'compute':>8} {'comm':>8} {'input':>8} {'mem MiB':>8} {'probe':>8}"]
    for r in ranks:
        probe = _ms(r.probe_s) if r.probe_s is not None else "-"
        out.append(f"{r.rank:>4} {r.node:>4} {r.host:<28} {_ms(r.step_s):>8} {_ms(r.compute_s):>8} {_ms(r.comm_s):>8} "
                   f"{_ms(r.input_s):>8} {r.mem_bytes / 2**20:>8.0f} {probe:>8}")
    return out


# ---------------------------------------------------------------------------------------------------------------
# the torch side: host labels, the probe, the gather


def _iface_addr(ifname: str) -> Optional[str]:
    """IPv4 address of a network interface (SIOCGIFADDR), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def host_label() -> str:
    """This host's name, with the address of the interface the process group uses when one is named
    (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME): containers and network namespaces often share a hostname."""
    name = socket.gethostname()
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        ifname = (os.environ.get(var) or "").split(",")[0]
        if ifname:
            addr = _iface_addr(ifname)
            if addr:
                return f"{name}/{addr}"
    return name


class CrossRank:
    """Gathers `RankWindow`s every monitor window (all ranks call `exchange`; every rank gets the table)."""

    def __init__(self, *, probe_bytes: int = PROBE_BYTES, noise: float = NOISE_FRACTION,
                 link_noise: float = LINK_NOISE_FRACTION, persist_windows: int = PERSIST_WINDOWS) -> None:
        import torch.distributed as dist

        from dstoolkit.runtime.train.commtime import TIMER

        self.dist, self.timer = dist, TIMER
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.noise, self.link_noise = noise, link_noise
        self.persistence = Persistence(persist_windows)
        with self.timer.paused():
            labels: list = [None] * self.world
            dist.all_gather_object(labels, host_label())  # once: host labels do not change
        order = list(dict.fromkeys(labels))
        self.hosts = labels
        self.nodes = [order.index(h) for h in labels]
        self.n_nodes = len(order)
        members = [[r for r in range(self.world) if self.nodes[r] == n] for n in range(self.n_nodes)]
        me = self.nodes[self.rank]
        local = members[me].index(self.rank)
        self.probe_bytes = probe_bytes if self.n_nodes > 1 else 0
        prev_node, next_node = (me - 1) % self.n_nodes, (me + 1) % self.n_nodes
        # local index j on host n sends to local index j on host n+1 (when that host has one)
        self.send_to = members[next_node][local] if local < len(members[next_node]) else None
        self.recv_from = members[prev_node][local] if local < len(members[prev_node]) else None
        self.probe_from_node = prev_node

    def _probe(self) -> Optional[float]:
        import torch

        if not self.probe_bytes:
            return None
        dist = self.dist
        buf = torch.zeros(self.probe_bytes // 4, dtype=torch.float32)
        me, dt = self.nodes[self.rank], None
        # One host sends at a time: with both directions of a link busy at once, the ACKs of one direction queue
        # behind the data of the other on a throttled uplink, and both directions look slow.
        for sender in range(self.n_nodes):
            dist.all_reduce(torch.zeros(1))  # everyone starts this host's turn together
            if me == sender and self.send_to is not None:
                dist.send(buf, self.send_to)
            elif me == (sender + 1) % self.n_nodes and self.recv_from is not None:
                t0 = time.perf_counter()
                dist.recv(torch.empty_like(buf), self.recv_from)
                dt = time.perf_counter() - t0
        return dt

    def exchange(self, step_s: float, comm_s: float, input_s: float, mem_bytes: float) -> list[RankWindow]:
        """One window: the probe (multi-host), then one all_gather of six floats per rank."""
        import torch

        with self.timer.paused():
            probe = self._probe()
            compute = max(0.0, step_s - comm_s - input_s)
            mine = torch.tensor([step_s, compute, comm_s, input_s, float(mem_bytes),
                                 -1.0 if probe is None else probe], dtype=torch.float64)
            rows = [torch.zeros_like(mine) for _ in range(self.world)]
            self.dist.all_gather(rows, mine)
        out = []
        for r, row in enumerate(rows):
            v = row.tolist()
            out.append(RankWindow(rank=r, node=self.nodes[r], host=self.hosts[r], step_s=v[0], compute_s=v[1],
                                  comm_s=v[2], input_s=v[3], mem_bytes=v[4],
                                  probe_s=None if v[5] < 0 else v[5],
                                  probe_from_node=None if v[5] < 0 else (self.nodes[r] - 1) % self.n_nodes))
        return out

    def diagnose(self, ranks: Sequence[RankWindow], input_measured: bool = True) -> Optional[Bottleneck]:
        """This window's bottleneck once its culprit has persisted (`Persistence`); call once per window."""
        return self.persistence(diagnose(ranks, noise=self.noise, link_noise=self.link_noise,
                                         probe_bytes=self.probe_bytes or PROBE_BYTES, input_measured=input_measured))


class StepWindows:
    """The cross-rank view for loops that have no `Monitor` (the HF callback, `Guard` around a user's loop): feed
    each optimizer step's wall time; every `every` steps it returns a monitor record with the measured comm share
    (the comm timer) and, with several ranks, the gathered per-rank table and the bottleneck. Every rank must call
    `step` at the same steps (the gather is collective). The first step (one-time set-up: kernels built, memory
    first touched, a rank's late start) is left out of the windows."""

    def __init__(self, every: int, *, cross: Optional[CrossRank] = None) -> None:
        from dstoolkit.runtime.train.commtime import install_comm_timer

        if every <= 0:
            raise ValueError(f"cross-rank window every={every} must be > 0 steps")
        self.every, self.cross = every, cross
        self.timer = install_comm_timer()
        self._comm0 = self.timer.total_s
        self._steps: list[tuple[float, float]] = []
        self._first = True
        self._input_measured = True

    def step(self, step: int, step_s: float, input_s: Optional[float] = None,
             mem_bytes: float = 0.0) -> Optional[dict]:
        """`input_s`: the step's input wait where the loop times it; None: not measured (in any step of a window:
        the window's input counts as compute and its bottleneck line says so, `Bottleneck.input_measured`)."""
        now_comm = self.timer.total_s
        if self._first:
            self._first, self._comm0 = False, now_comm
            return None
        self._input_measured = self._input_measured and input_s is not None
        self._steps.append((step_s, input_s or 0.0))
        if len(self._steps) < self.every:
            return None
        n = len(self._steps)
        wall = sum(s for s, _ in self._steps)
        comm = now_comm - self._comm0
        inp = sum(i for _, i in self._steps)
        measured, self._input_measured = self._input_measured, True
        self._steps, self._comm0 = [], now_comm
        rec: dict = {"event": "cross_rank", "step": step, "steps": n, "step_time_s": wall / n,
                     "comm_share": comm / wall if wall > 0 else None, "input_measured": measured, "ranks": None,
                     "bottleneck": None, "bottleneck_line": None}
        if self.cross is not None:
            ranks = self.cross.exchange(wall / n, comm / n, inp / n, mem_bytes)
            found = self.cross.diagnose(ranks, input_measured=measured)
            rec.update(ranks=[r.as_dict() for r in ranks], bottleneck=None if found is None else found.as_dict(),
                       bottleneck_line=None if found is None else found.line(step))
        return rec
