"""Measured exposed communication: timed hooks around `torch.distributed`'s collectives (no DeepSpeed switch).

`install_comm_timer()` wraps the collective and point-to-point functions of `torch.distributed` (and their
`distributed_c10d` originals, which DeepSpeed's `TorchBackend`, HF/accelerate and plain scripts all end up calling)
so that each process accumulates the wall time it spends blocked in them:

  * a synchronous call: its whole duration (on gloo/CPU the transfer and the reduction run on the calling thread;
    time waiting for a late peer counts too: that is what the step loses);
  * an `async_op=True` call: the launch, plus the time later blocked in the returned work's `wait()` (the part of
    the transfer that compute did not hide).

That sum per step is the step's exposed communication, what `comm_exposed_s` in the estimate predicts. Nested
calls (all_gather_object calls all_gather) count once. The monitor's own gather runs inside `paused()` and is not
counted. Install before `deepspeed.init_distributed`: DeepSpeed looks some functions up once at init.
Torch is imported inside the functions only.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Optional

COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "_reduce_scatter_base", "all_gather", "all_gather_into_tensor", "_all_gather_base",
               "all_gather_coalesced", "all_gather_object", "broadcast", "broadcast_object_list", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "gather", "scatter", "send", "recv", "isend",
               "irecv", "batch_isend_irecv")
"""`torch.distributed` functions that move data between ranks or wait for them."""


class _State(threading.local):
    depth = 0
    paused = 0


class CommTimer:
    """Cumulative seconds this process spent blocked in collectives (`total_s`)."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self.calls = 0
        self._tls = _State()
        self._lock = threading.Lock()
        self.installed = False

    def _add(self, dt: float) -> None:
        with self._lock:
            self.total_s += dt

    def wrap(self, fn: Any) -> Any:
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            tls = timer._tls
            if tls.depth or tls.paused:
                return fn(*args, **kwargs)
            tls.depth += 1
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                tls.depth -= 1
                timer._add(time.perf_counter() - t0)
                timer.calls += 1
            if out is not None and hasattr(out, "wait") and not isinstance(out, (list, tuple)):
                return _TimedWork(out, timer)
            if isinstance(out, list) and out and all(hasattr(w, "wait") for w in out):  # batch_isend_irecv
                return [_TimedWork(w, timer) for w in out]
            return out

        timed.__wrapped__ = fn
        timed.__name__ = getattr(fn, "__name__", "collective")
        timed.__doc__ = getattr(fn, "__doc__", None)
        timed._dstoolkit_comm_timed = True
        return timed

    @contextlib.contextmanager
    def paused(self):
        """Collectives inside are not counted (the monitor's own exchange)."""
        self._tls.paused += 1
        try:
            yield
        finally:
            self._tls.paused -= 1


class _TimedWork:
    """A collective's work handle whose `wait()` time is counted; everything else is the handle's own."""

    def __init__(self, work: Any, timer: CommTimer) -> None:
        self._work = work
        self._timer = timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        if self._timer._tls.paused:
            return self._work.wait(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._timer._add(time.perf_counter() - t0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


TIMER = CommTimer()
"""The process's one timer (one set of hooks per process)."""


def install_comm_timer() -> CommTimer:
    """Wrap torch.distributed's collectives once per process; returns the timer. Safe to call again."""
    if TIMER.installed:
        return TIMER
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in COLLECTIVES:
        for mod in (dist, c10d):
            fn = getattr(mod, name, None)
            if fn is None or getattr(fn, "_dstoolkit_comm_timed", False):
                continue
            setattr(mod, name, TIMER.wrap(fn))
    TIMER.installed = True
    return TIMER


def comm_timer_total_s() -> Optional[float]:
    """Seconds blocked in collectives so far, or None when the hooks are not installed in this process."""
    return TIMER.total_s if TIMER.installed else None
