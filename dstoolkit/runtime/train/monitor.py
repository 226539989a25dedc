"""Training monitor: throughput, MFU, memory, communication share, loss trend, input wait -> bottleneck flags.

Every `every` steps it summarises the recorded steps and flags what it sees, with the numbers:
  * input-bound: the step waited on the data iterator for more than `input_bound_share` of its time;
  * comm-bound: more than `comm_bound_share` of the step was spent blocked in collectives (measured by the timed
    hooks of `dstoolkit.runtime.train.commtime`, else DeepSpeed's comms_logger when it is on);
  * idle compute: the process (or GPU) was busy less than `idle_util` of the time and neither of the above
    explains it.
MFU follows docs/anchors.md: achieved tokens/s x FLOPs per token / peak (PaLM App. B). Reports are written
through DeepSpeed's monitor backends (`engine.monitor.write_events`: csv, tensorboard, wandb as configured)
and as one compact line. The comm share is printed beside the estimate's exposed-comm share when the run has one.

With a `CrossRank` (dstoolkit.runtime.train.crossrank) every window also gathers each rank's step, compute,
collective wait, input wait and memory (one all_gather of a few floats), writes the per-rank table into the report
(the metrics JSONL's monitor event: `ranks`) and, when one rank or host stands out beyond the measured noise, a
second line naming it, how much slower than the median it is, and the reason class with its numbers.
No torch import at module level.
"""
from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

INPUT_BOUND_SHARE = 0.20
"""Input wait above this share of step time flags the data pipeline (a healthy loader prefetches: ~0)."""
COMM_BOUND_SHARE = 0.40
"""Exposed collective time above this share flags communication."""
IDLE_UTILIZATION = 0.50
"""Busy share below this (and not explained by input or comm) flags idle compute."""


@dataclass(frozen=True)
class StepSample:
    """What the trainer measured for one optimizer step."""

    step: int
    step_time_s: float
    input_wait_s: float
    tokens: int
    loss: float
    cpu_time_s: float
    """Process CPU time (user+sys) spent during the step."""
    comm_time_s: Optional[float] = None
    """Time blocked in collectives (`comm_wait_total_s` difference over the step; None when nothing measures it)."""


@dataclass(frozen=True)
class Flag:
    """One bottleneck the monitor sees."""

    name: str
    """input-bound | comm-bound | idle-compute | above-peak | nonfinite-loss."""
    evidence: str
    """The numbers behind the flag."""


@dataclass(frozen=True)
class MonitorReport:
    """Summary over the last `steps` steps."""

    step: int
    steps: int
    tokens_per_s: float
    mfu: Optional[float]
    peak_rss_bytes: int
    device_mem_bytes: Optional[int]
    step_time_s: float
    input_wait_s: float
    input_wait_share: float
    comm_share: Optional[float]
    utilization: float
    loss: float
    loss_trend_per_step: float
    """Least-squares slope of the loss over the window (negative = improving)."""
    flags: list[Flag] = field(default_factory=list)
    peak_flops_per_rank: Optional[float] = None
    """The per-rank peak MFU divides by."""
    peak_label: Optional[str] = None
    """What that peak is."""
    estimated_comm_share: Optional[float] = None
    """The estimate's exposed communication / step time for this run (None when not given)."""
    ranks: Optional[list[dict]] = None
    """Per-rank window table (`crossrank.RankWindow.as_dict` rows) when the cross-rank view is on."""
    bottleneck: Optional[dict] = None
    """`crossrank.Bottleneck.as_dict` when one rank or host stands out beyond the noise, else None."""
    bottleneck_line: Optional[str] = None
    """The line naming it (printed after `line()`)."""

    def line(self) -> str:
        """Compact one-line form for logs."""
        mfu = f"{self.mfu * 100:.2f}%" if self.mfu is not None else "n/a"
        if self.mfu is not None and self.peak_flops_per_rank:
            mfu += f" of {self.peak_flops_per_rank / 1e9:,.1f} GFLOP/s"
        comm = f"{self.comm_share * 100:.0f}% measured" if self.comm_share is not None else "n/a"
        if self.estimated_comm_share is not None:
            comm += f" (estimate {self.estimated_comm_share * 100:.0f}%)"
        flags = ",".join(f.name for f in self.flags) or "ok"
        return (f"[monitor] step {self.step} | {self.tokens_per_s:,.0f} tok/s | MFU {mfu} | "
                f"rss {self.peak_rss_bytes / 2**20:.0f} MiB | step {self.step_time_s * 1000:.0f} ms | "
                f"input {self.input_wait_share * 100:.0f}% | comm {comm} | util {self.utilization * 100:.0f}% | "
                f"loss {self.loss:.4f} ({self.loss_trend_per_step:+.4f}/step) | {flags}")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["flags"] = [asdict(f) for f in self.flags]
        return d

    def events(self) -> list[tuple[str, float, int]]:
        """(name, value, step) tuples for DeepSpeed's MonitorMaster.write_events."""
        ev = [("Monitor/tokens_per_s", self.tokens_per_s, self.step),
              ("Monitor/step_time_s", self.step_time_s, self.step),
              ("Monitor/input_wait_share", self.input_wait_share, self.step),
              ("Monitor/utilization", self.utilization, self.step),
              ("Monitor/peak_rss_bytes", float(self.peak_rss_bytes), self.step),
              ("Monitor/loss", self.loss, self.step),
              ("Monitor/loss_trend_per_step", self.loss_trend_per_step, self.step)]
        if self.mfu is not None:
            ev.append(("Monitor/mfu", self.mfu, self.step))
        if self.comm_share is not None:
            ev.append(("Monitor/comm_share", self.comm_share, self.step))
        for f in self.flags:
            ev.append((f"Monitor/flag_{f.name}", 1.0, self.step))
        return ev


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def cpu_time_s() -> float:
    t = os.times()
    return t.user + t.system


def comms_logger_total_s() -> Optional[float]:
    """Cumulative collective time recorded by DeepSpeed's comms_logger, or None when it is disabled.

    DeepSpeed's timed_op appends `timers(log_name).elapsed(reset=False)`, which is the *running total* (ms)
    for that log name, so the total per name is its largest recorded value.
    """
    try:
        from deepspeed.comm.comm import comms_logger
    except Exception:
        return None
    if not comms_logger.enabled:
        return None
    total_ms = 0.0
    for sizes in comms_logger.comms_dict.values():
        total_ms += max((max(rec[1]) for rec in sizes.values() if rec[1]), default=0.0)
    return total_ms / 1000.0


def comm_wait_total_s() -> Optional[float]:
    """Cumulative seconds blocked in collectives: the timed hooks (`commtime.install_comm_timer`) when installed,
    else DeepSpeed's comms_logger when enabled, else None."""
    from dstoolkit.runtime.train.commtime import comm_timer_total_s

    total = comm_timer_total_s()
    return total if total is not None else comms_logger_total_s()


def estimated_comm_share(spec: Any, shape: Any, ds_config: dict, world: int, on_cuda: bool) -> Optional[float]:
    """The estimate's exposed communication / step time for this run (`estimate_run`'s step_time.comm_exposed_s),
    for the monitor line beside the measured share. None when the run is not the spec's cluster (a GPU spec shrunk
    onto CPU ranks) or the estimator refuses it. On CPU the calibration is the cached one, never a probe (the
    job's ranks hold the cores)."""
    from dstoolkit.estimate import estimate_run
    from dstoolkit.hardware import calibration as cal
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runplan import plan_from_spec

    try:
        gpu = get_gpu(spec.cluster.gpu)
        if spec.cluster.world_size != world or (gpu.name == "cpu") == on_cuda:
            return None
        calib = None
        if gpu.name == "cpu":
            path = cal.calibration_path(getattr(spec.cluster, "calibration", None), "cpu", spec.base_dir, probe=False)
            precision = spec.training.precision
            calib = cal.load_calibration(path, precision) if path is not None else None
        est = estimate_run(plan_from_spec(spec, ds_config, shape, calibration=calib))
        return est.step_time.comm_exposed_s / est.step_time_s if est.step_time_s > 0 else None
    except Exception:  # noqa: BLE001 - the line then shows the measured share alone
        return None


def _slope(ys: list[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx = (n - 1) / 2
    my = sum(ys) / n
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den


class Monitor:
    """Accumulates StepSamples and emits a MonitorReport every `every` steps."""

    def __init__(self, every: int, *, flops_per_token: Optional[float], peak_flops: Optional[float],
                 peak_label: str = "given peak", world_size: int = 1, threads: int = 1, ds_monitor: Any = None,
                 input_bound_share: float = INPUT_BOUND_SHARE, comm_bound_share: float = COMM_BOUND_SHARE,
                 idle_utilization: float = IDLE_UTILIZATION, cross_rank: Any = None,
                 estimated_comm_share: Optional[float] = None) -> None:
        self.check_every(every)
        from dstoolkit.runtime.train.spike import SettingError, check_int

        check_int("world_size", world_size, 1, "ranks the global tokens/s is shared by", where="monitor")
        for name, value in (("flops_per_token", flops_per_token), ("peak_flops", peak_flops)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise SettingError(name, value, "must be a finite number > 0, or None (no MFU)", where="monitor")
        self.every = every
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        """Peak FLOP/s of ONE rank; MFU divides the global rate by world_size x peak."""
        self.peak_label = peak_label
        """What the peak is (e.g. this machine's measured GEMM peak, or a GPU's datasheet peak)."""
        self.world_size = world_size
        self.threads = max(1, threads)
        self.ds_monitor = ds_monitor
        self.input_bound_share = input_bound_share
        self.comm_bound_share = comm_bound_share
        self.idle_utilization = idle_utilization
        self.cross_rank = cross_rank
        """A `crossrank.CrossRank` (every rank calls `record`, so every rank joins the gather), or None."""
        self.estimated_comm_share = estimated_comm_share
        self.samples: list[StepSample] = []
        self.reports: list[MonitorReport] = []

    @staticmethod
    def check_every(every: object) -> None:
        """`every` (optimizer steps per report) must be a whole number >= 1 (`SettingError` names it)."""
        from dstoolkit.runtime.train.spike import check_int

        check_int("monitor_every", every, 1, "optimizer steps per monitor report", where="monitor")

    def record(self, sample: StepSample) -> Optional[MonitorReport]:
        """Add one step; every `every` steps the report. A time that is not a finite number >= 0 (or a step time
        of 0) is an error naming the field: the window's shares and rates would be meaningless."""
        for name in ("step_time_s", "input_wait_s", "cpu_time_s", "comm_time_s"):
            v = getattr(sample, name)
            if v is None and name == "comm_time_s":
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0) or (name == "step_time_s" and v == 0):
                raise ValueError(f"monitor: step {sample.step}: {name}={v!r} must be a finite number of seconds "
                                 f"{'> 0' if name == 'step_time_s' else '>= 0'} (a timing the trainer could not take)")
        self.samples.append(sample)
        if len(self.samples) < self.every:
            return None
        report = self._summarise(self.samples)
        if self.cross_rank is not None:
            report = self._cross_rank(report, self.samples)
        self.samples = []
        self.reports.append(report)
        if self.ds_monitor is not None and getattr(self.ds_monitor, "enabled", False):
            self.ds_monitor.write_events(report.events())
        return report

    def _summarise(self, samples: list[StepSample]) -> MonitorReport:
        wall = sum(s.step_time_s for s in samples)
        wait = sum(s.input_wait_s for s in samples)
        tokens = sum(s.tokens for s in samples)
        cpu = sum(s.cpu_time_s for s in samples)
        tps = tokens / wall if wall > 0 else 0.0
        mfu = None
        flags: list[Flag] = []
        if self.flops_per_token and self.peak_flops:
            achieved = tps * self.flops_per_token / self.world_size  # model FLOP/s per rank (docs/anchors.md MFU)
            if achieved > self.peak_flops:
                # a peak the run beats is no peak (stale calibration, probed under load): from here on the
                # achieved rate is the peak, so MFU stays <= 1 by construction, and the flag says so
                flags.append(Flag("above-peak",
                                  f"achieved {achieved / 1e9:.1f} GFLOP/s per rank > the peak "
                                  f"{self.peak_flops / 1e9:.1f} GFLOP/s ({self.peak_label}); the peak is raised "
                                  "to the achieved rate (re-probe the machine on a quiet CPU)"))
                self.peak_flops, self.peak_label = achieved, "achieved rate (the given peak was exceeded)"
            mfu = achieved / self.peak_flops
        comm_share = None
        if all(s.comm_time_s is not None for s in samples):
            comm_share = sum(s.comm_time_s for s in samples) / wall if wall > 0 else 0.0
        wait_share = wait / wall if wall > 0 else 0.0
        util = self._utilization(cpu, wall)
        if wait_share > self.input_bound_share:
            flags.append(Flag("input-bound",
                              f"steps waited {wait:.3f} s of {wall:.3f} s on the data iterator "
                              f"({wait_share * 100:.0f}% > {self.input_bound_share * 100:.0f}%)"))
        if comm_share is not None and comm_share > self.comm_bound_share:
            flags.append(Flag("comm-bound",
                              f"collectives took {comm_share * 100:.0f}% of step time "
                              f"(> {self.comm_bound_share * 100:.0f}%, measured)"))
        if not [f for f in flags if f.name != "above-peak"] and util < self.idle_utilization:
            hint = ("" if comm_share is not None else
                    "; comms_logger is off, so time blocked in collectives counts here (enable it to attribute)")
            flags.append(Flag("idle-compute",
                              f"compute busy {util * 100:.0f}% of wall time (< {self.idle_utilization * 100:.0f}%) "
                              f"with no input or comm wait to explain it{hint}"))
        losses = [s.loss for s in samples]
        bad = [s.step for s in samples if not math.isfinite(s.loss)]
        if bad:
            flags.append(Flag("nonfinite-loss", f"loss not finite at step(s) {', '.join(map(str, bad))}; the trend "
                                                "is over the finite ones"))
        return MonitorReport(
            step=samples[-1].step, steps=len(samples), tokens_per_s=tps, mfu=mfu,
            peak_rss_bytes=peak_rss_bytes(), device_mem_bytes=_device_mem_bytes(),
            step_time_s=wall / len(samples), input_wait_s=wait / len(samples), input_wait_share=wait_share,
            comm_share=comm_share, utilization=util, loss=losses[-1],
            loss_trend_per_step=_slope([x for x in losses if math.isfinite(x)]),
            estimated_comm_share=self.estimated_comm_share,
            flags=flags, peak_flops_per_rank=self.peak_flops if mfu is not None else None,
            peak_label=self.peak_label if mfu is not None else None)

    def _cross_rank(self, report: MonitorReport, samples: list[StepSample]) -> MonitorReport:
        import dataclasses

        n = len(samples)
        comm = sum(s.comm_time_s or 0.0 for s in samples) / n
        mem = report.device_mem_bytes if report.device_mem_bytes is not None else report.peak_rss_bytes
        ranks = self.cross_rank.exchange(report.step_time_s, comm, report.input_wait_s, mem)
        found = self.cross_rank.diagnose(ranks)
        return dataclasses.replace(report, ranks=[r.as_dict() for r in ranks],
                                   bottleneck=None if found is None else found.as_dict(),
                                   bottleneck_line=None if found is None else found.line(report.step))

    def _utilization(self, cpu_s: float, wall_s: float) -> float:
        gpu = _gpu_utilization()
        if gpu is not None:
            return gpu
        return min(1.0, cpu_s / (wall_s * self.threads)) if wall_s > 0 else 0.0


def _device_mem_bytes() -> Optional[int]:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
    except Exception:
        pass
    return None


def _gpu_utilization() -> Optional[float]:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.utilization() / 100.0
    except Exception:
        pass
    return None


class Timer:
    """Wall-clock stopwatch accumulating into `.total_s`."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> "Timer":
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total_s += time.perf_counter() - self._t0
