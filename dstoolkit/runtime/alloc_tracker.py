"""Continuous CPU memory peak: a counting wrapper around torch's CPU allocator (every allocation and free, every
thread), with the phase each maximum was reached in.

What torch 2.13 offers on CPU, and why this module exists:

* c10's ``ProfiledCPUMemoryReporter`` (c10/core/CPUAllocator.h) keeps a running count of live bytes, but only
  while the profiler's ``profile_memory`` is on *for the allocating thread* (or under the C++-only flag
  ``caffe2_report_cpu_memory_usage``, which logs every allocation and cannot be set from Python). With
  ``torch.profiler.profile(profile_memory=True)`` the count covers the profiling thread only (gloo's worker
  threads allocate outside it), and with ``_ExperimentalConfig(profile_all_threads=True)`` no memory event is
  recorded at all (checked on torch 2.13.0+cpu: 0 ``[memory]`` events in the trace). It has no maximum either.
* ``torch.accelerator.memory_stats`` / ``torch.cpu`` have no CPU allocator statistics in this version.

So this module compiles (once, g++ against torch's own c10 headers and libc10, a few seconds; cached under
``$XDG_CACHE_HOME/dstoolkit/alloc_tracker/<hash>/``) a small allocator that forwards to the current CPU allocator
and is installed with ``c10::SetCPUAllocator`` (every ``at::empty`` on CPU, from any thread, asks
``c10::GetCPUAllocator()``). It keeps, under one mutex, the live bytes it handed out, their maximum, the phase
id current when the maximum was reached, and a maximum per phase id. Phases are ids the caller sets
(``set_phase``); the id is process-global, so an allocation on a gloo worker thread is charged to the phase the
main thread is in. Storages allocated before ``install()`` are not counted (their frees are ignored).

Not counted: memory not obtained through the c10 CPU allocator (oneDNN scratchpads, gloo's own buffers, the
Python heap), as in every torch allocator statistic.

Usage::

    tr = AllocTracker.install()        # once per process, before building the model
    base = tr.live_bytes()
    tr.reset_peak()
    with tr.phase("forward"):
        ...
    tr.peak_bytes() - base, tr.peak_phase()
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pathlib
import subprocess
import tempfile
from dataclasses import dataclass

MAX_PHASES = 64
"""Phase ids the native side keeps a maximum for (0 = "untagged")."""

_SRC = r"""
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace {
constexpr int kPhases = %(MAX_PHASES)d;
std::mutex mu;
std::unordered_map<void*, size_t> sizes;
int64_t live = 0, peak = 0;
int phase = 0, peak_phase = 0;
int64_t phase_max[kPhases] = {0};
int64_t n_alloc = 0, n_free = 0;
c10::Allocator* inner = nullptr;
c10::DeleterFnPtr inner_deleter = nullptr;

void tracked_free(void* p) {
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = sizes.find(p);
    if (it != sizes.end()) { live -= static_cast<int64_t>(it->second); sizes.erase(it); ++n_free; }
  }
  inner_deleter(p);
}

struct Tracking final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr d = inner->allocate(n);
    void* p = d.get();
    if (p == nullptr || d.get_context() != p || d.get_deleter() != inner_deleter) return d;  // not ours to wrap
    d.release_context();
    {
      std::lock_guard<std::mutex> g(mu);
      sizes[p] = n;
      live += static_cast<int64_t>(n);
      ++n_alloc;
      if (live > peak) { peak = live; peak_phase = phase; }
      if (live > phase_max[phase]) phase_max[phase] = live;
    }
    return {p, p, &tracked_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner->copy_data(dest, src, count);
  }
};
Tracking* tracker = nullptr;
}  // namespace

extern "C" {
int dstk_install() {
  if (tracker) return 1;
  inner = c10::GetCPUAllocator();
  c10::DataPtr probe = inner->allocate(64);
  if (probe.get() != probe.get_context()) return -1;
  inner_deleter = probe.get_deleter();
  tracker = new Tracking();
  c10::SetCPUAllocator(tracker, /*priority=*/255);
  return c10::GetCPUAllocator() == tracker ? 0 : -2;
}
int64_t dstk_live() { std::lock_guard<std::mutex> g(mu); return live; }
int64_t dstk_peak() { std::lock_guard<std::mutex> g(mu); return peak; }
int dstk_peak_phase() { std::lock_guard<std::mutex> g(mu); return peak_phase; }
int64_t dstk_phase_max(int i) { std::lock_guard<std::mutex> g(mu); return (i >= 0 && i < kPhases) ? phase_max[i] : -1; }
int64_t dstk_count(int frees) { std::lock_guard<std::mutex> g(mu); return frees ? n_free : n_alloc; }
void dstk_reset_peak() {
  std::lock_guard<std::mutex> g(mu);
  peak = live; peak_phase = phase;
  for (int i = 0; i < kPhases; ++i) phase_max[i] = 0;
  phase_max[phase] = live;
}
int dstk_set_phase(int i) {
  std::lock_guard<std::mutex> g(mu);
  if (i < 0 || i >= kPhases) return -1;
  int old = phase; phase = i;
  if (live > phase_max[i]) phase_max[i] = live;  // the level the phase starts at belongs to it too
  return old;
}
}
""" % {"MAX_PHASES": MAX_PHASES}


class AllocTrackerError(RuntimeError):
    """The tracker could not be built or installed (message says why and what to do)."""


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(pathlib.Path.home() / ".cache")
    return pathlib.Path(root) / "dstoolkit" / "alloc_tracker"


def build_library(torch) -> pathlib.Path:
    """Compile the tracker against this torch (cached by source + torch version + ABI); return the .so path."""
    inc = pathlib.Path(torch.__file__).parent / "include"
    lib = pathlib.Path(torch.__file__).parent / "lib"
    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    key = hashlib.sha256(f"{_SRC}|{torch.__version__}|{abi}|{inc}".encode()).hexdigest()[:16]
    out = _cache_dir() / key / "libdstk_alloc_tracker.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = pathlib.Path(tmp) / "tracker.cpp"
        src.write_text(_SRC)
        so = pathlib.Path(tmp) / out.name
        cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{inc}",
               str(src), f"-L{lib}", "-lc10", f"-Wl,-rpath,{lib}", "-o", str(so)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except FileNotFoundError:
            raise AllocTrackerError(f"the continuous memory tracker needs a C++ compiler: {cxx!r} not found "
                                    "(install g++ or set CXX)") from None
        if r.returncode != 0:
            raise AllocTrackerError(f"building the allocator tracker failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
        os.replace(so, out)  # atomic: two ranks building at once both end with a complete file
    return out


@dataclass(frozen=True)
class PhasePeak:
    """The maximum live bytes (relative to a base) and where it was reached."""

    peak_bytes: int
    peak_phase: str
    phase_max_bytes: dict
    """Per phase name: the maximum live bytes (relative to the base) while that phase was current."""
    allocations: int
    frees: int


class AllocTracker:
    """Python handle on the installed native tracker (one per process)."""

    _instance: "AllocTracker | None" = None

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        for name, res, args in (("dstk_install", ctypes.c_int, []), ("dstk_live", ctypes.c_int64, []),
                                ("dstk_peak", ctypes.c_int64, []), ("dstk_peak_phase", ctypes.c_int, []),
                                ("dstk_phase_max", ctypes.c_int64, [ctypes.c_int]),
                                ("dstk_count", ctypes.c_int64, [ctypes.c_int]),
                                ("dstk_reset_peak", None, []), ("dstk_set_phase", ctypes.c_int, [ctypes.c_int])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._ids: dict[str, int] = {"untagged": 0}
        self._names: list[str] = ["untagged"]

    @classmethod
    def install(cls) -> "AllocTracker":
        """Build (if needed), load and install the tracker as the CPU allocator; idempotent."""
        if cls._instance is not None:
            return cls._instance
        import torch  # noqa: F401 - loads libc10 first, so the tracker binds to the same allocator registry

        lib = ctypes.CDLL(str(build_library(torch)), mode=ctypes.RTLD_GLOBAL)
        inst = cls(lib)
        rc = lib.dstk_install()
        if rc not in (0, 1):
            raise AllocTrackerError(f"installing the allocator tracker failed (code {rc}): the current CPU "
                                    "allocator does not hand out plain data pointers")
        cls._instance = inst
        return inst

    def _id(self, name: str) -> int:
        if name not in self._ids:
            if len(self._names) >= MAX_PHASES:
                raise AllocTrackerError(f"more than {MAX_PHASES - 1} phase names: {self._names}")
            self._ids[name] = len(self._names)
            self._names.append(name)
        return self._ids[name]

    def live_bytes(self) -> int:
        return int(self._lib.dstk_live())

    def peak_bytes(self) -> int:
        return int(self._lib.dstk_peak())

    def reset_peak(self) -> None:
        """Peak and per-phase maxima restart from the live bytes now."""
        self._lib.dstk_reset_peak()

    def set_phase(self, name: str) -> str:
        """Make `name` the current phase; returns the previous phase's name."""
        return self._names[self._lib.dstk_set_phase(self._id(name))]

    @contextlib.contextmanager
    def phase(self, name: str):
        prev = self.set_phase(name)
        try:
            yield
        finally:
            self.set_phase(prev)

    def result(self, base_bytes: int = 0) -> PhasePeak:
        """The peak since the last `reset_peak`, minus `base_bytes` (what was live before the measured code)."""
        per = {}
        for i, n in enumerate(self._names):
            v = int(self._lib.dstk_phase_max(i))
            if v > 0:
                per[n] = v - base_bytes
        return PhasePeak(peak_bytes=self.peak_bytes() - base_bytes,
                         peak_phase=self._names[self._lib.dstk_peak_phase()], phase_max_bytes=per,
                         allocations=int(self._lib.dstk_count(0)), frees=int(self._lib.dstk_count(1)))


__all__ = ["AllocTracker", "AllocTrackerError", "PhasePeak", "build_library", "MAX_PHASES"]
