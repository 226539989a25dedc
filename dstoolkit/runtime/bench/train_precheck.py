"""What `bench train` checks before it launches anything: the spec and model each config trains (shrunk with
--shrink), the spec's cluster against the ranks the bench runs, and the estimated memory per rank against this
host's RAM share (CPU ranks all live in this machine's memory: a config that cannot fit would be OOM-killed, and on a
shared node the kill can take other jobs with it).
"""
from __future__ import annotations

import os
from typing import Any, Optional

from dstoolkit.runtime.bench.harness import BenchInputError

GiB = 2**30


def spec_and_shape(target, world_size: int, shrink=None) -> tuple[Any, Any, Any]:
    """(spec, model shape, ShrunkRun or None) of what `target` trains on `world_size` ranks; with `shrink` the
    spec describes the shrunk run (`train_estimate._describe_shrunk_run`)."""
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec

    if target.spec_path is None:
        raise BenchInputError(f"config {target.name!r}: the trainer needs the model and seq_len; pass --spec SPEC.yaml")
    spec = load_spec(target.spec_path)
    if shrink is None:
        return spec, resolve_model(spec.model, target.spec_path.parent), None
    from dstoolkit.runtime.bench.train_estimate import _describe_shrunk_run
    from dstoolkit.runtime.shrink_run import prepare_shrunk_run
    from dstoolkit.runtime.shrink_sizes import ShrinkError

    try:
        shrunk = prepare_shrunk_run(spec, target.spec_path.parent, shrink)
    except ShrinkError as exc:
        raise BenchInputError(f"config {target.name!r} (spec {target.spec_path}): --shrink: {exc}") from None
    _describe_shrunk_run(spec, shrunk, world_size)
    return spec, shrunk.shape, shrunk


CGROUP_LIMITS = (("cgroup v2", "/sys/fs/cgroup/memory.max"),
                 ("cgroup v1", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""Where a container's (Slurm, Kubernetes, docker) memory limit is read: above it the kernel kills the job."""

UNLIMITED = 2**60
"""A limit at or above this is 'no limit' (cgroup v1 writes 9223372036854771712, v2 the word max)."""


def physical_ram_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_ram(limits=None, physical: Optional[int] = None) -> tuple[int, Optional[str]]:
    """(bytes, where they come from) of the memory this job may use: the physical RAM, or a cgroup memory limit
    below it ('cgroup v2 memory limit in /sys/fs/cgroup/memory.max (physical RAM 23.0 GiB)'; None for physical RAM).
    `limits`: (name, path) pairs to read (default `CGROUP_LIMITS`); an absent or unreadable file, 'max' and
    unlimited values are skipped."""
    ram = physical if physical is not None else physical_ram_bytes()
    best, source = ram, None
    for name, path in (CGROUP_LIMITS if limits is None else limits):
        try:
            with open(path) as f:
                text = f.read().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if not text.isdigit():  # 'max' (v2: no limit) or anything unexpected
            continue
        value = int(text)
        if 0 < value < min(best, UNLIMITED):
            best, source = value, f"{name} memory limit in {path} (physical RAM {ram / GiB:.1f} GiB)"
    return best, source


def host_ram_bytes() -> int:
    """The memory this job may use: physical RAM, or a container's cgroup limit below it (`host_ram`)."""
    return host_ram()[0]


def cluster_mismatch(spec, world_size: int, cuda: bool) -> Optional[str]:
    """'spec X describes 1 x 8 H100-SXM (8 ranks); bench train runs 2 CPU ranks here' when they differ, else None."""
    from dstoolkit.runtime.bench.train_estimate import get_gpu_name

    gpu = get_gpu_name(spec)
    kind = "GPU" if cuda else "CPU"
    if spec.cluster.world_size == world_size and (gpu == "cpu") == (not cuda):
        return None
    name = spec.cluster.gpu if isinstance(spec.cluster.gpu, str) else spec.cluster.gpu.name
    return (f"spec {spec.name} describes {spec.cluster.describe(name)} ({spec.cluster.world_size} ranks); bench train "
            f"runs {world_size} {kind} ranks here (--world-size {world_size})")


def memory_problem(spec, shape, est: Optional[dict], world_size: int, host_bytes: int,
                   shrunk: bool, host_source: Optional[str] = None) -> Optional[str]:
    """Why a config must not start on CPU ranks: the estimated memory per rank exceeds this host's RAM share (host RAM
    / ranks); None when it fits or when there is no estimate. `host_source` names a cgroup limit that set
    `host_bytes` (`host_ram`)."""
    if not est or "error" in est or not est.get("memory_per_rank_bytes"):
        return None
    per_rank = int(est["memory_per_rank_bytes"])
    share = host_bytes // max(1, world_size)
    if per_rank <= share:
        return None
    fix = ("a smaller --shrink (e.g. fewer layers or a smaller hidden size)" if shrunk else
           "--shrink auto with an hf_config model, or a smaller spec (a CPU spec such as ds_configs/tiny_cpu.yaml)")
    limit = f"; {host_bytes / GiB:.1f} GiB is the {host_source}" if host_source else ""
    return (f"spec {spec.name} trains {shape.name} at seq_len {spec.training.seq_len}: the estimate needs "
            f"~{per_rank / GiB:.1f} GiB per rank > this host's RAM share {share / GiB:.1f} GiB "
            f"({host_bytes / GiB:.1f} GiB / {world_size} ranks{limit}); not launched (it would be killed for memory): "
            f"use {fix}")


def check_targets_fit(tgts, world_size: int, calibration, shrink=None, host_bytes: Optional[int] = None,
                      cuda: Optional[bool] = None) -> list[str]:
    """Refuse (BenchInputError, exit 2), before anything is launched, a config whose estimate per rank exceeds this
    host's RAM share when the ranks run on CPU. Returns the notes to print (the spec's cluster differs from the ranks
    the bench runs), one per spec."""
    from dstoolkit.runtime.bench.train_estimate import estimate_for
    from dstoolkit.runtime.bench.usercmd import resolve_user_config

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    host, source = (host_bytes, None) if host_bytes is not None else host_ram()
    notes: dict[str, str] = {}
    for t in tgts:
        if t.spec_path is None:
            continue
        spec, shape, shrunk = spec_and_shape(t, world_size, shrink)
        if shrunk is None:
            note = cluster_mismatch(spec, world_size, cuda)
            if note:
                notes.setdefault(str(t.spec_path), note)
        if cuda:
            continue
        resolved, _ = resolve_user_config(t.ds_config, command=[], spec=spec, world_size=world_size,
                                          hidden_size=getattr(shape, "hidden_size", None))
        problem = memory_problem(spec, shape, estimate_for(spec, shape, resolved, world_size, t.ep_size, calibration),
                                 world_size, host, shrunk is not None, source)
        if problem:
            mismatch = notes.get(str(t.spec_path))
            raise BenchInputError(f"config {t.name!r}: {problem}" + (f" ({mismatch})" if mismatch else ""))
    return list(notes.values())
