"""DeepSpeed's CPU shared-memory all-reduce buffers, and removing them so they cannot pile up in /dev/shm.

DeepSpeed 0.19.8's CPU communication op (ops/csrc/cpu/comm/shm.cpp, `shm_initialize`) creates one
POSIX shared-memory file per rank, ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
(~66 MB each), when all ranks of a job are on one host (LOCAL_SIZE == world size). Its `shared_close`, the only
`shm_unlink`, is never called: every run leaves its files behind, clean exits included, and every run with a
new master port adds new ones. /dev/shm is RAM, so a machine that launches many short jobs (a tuner, a test
suite, a benchmark grid) fills its memory: after ~170 runs here, 22 GB of 24 GB were leaked buffers and jobs
slowed down and timed out under memory pressure.

Two remedies, no torch import:
- `unlink_job_buffers` right after every rank has mapped every other rank's buffer (after the rendezvous and
  a barrier): the mappings stay valid for the job's lifetime, only the names go (the trainer does this);
- `remove_orphaned_buffers` for jobs that died before that: removes this user's buffers that no live process
  maps (read from /proc/<pid>/maps) and that are older than ORPHAN_MIN_AGE_S, so a running job's buffers are
  never touched, not even in the moment between their creation and their mapping.
"""
from __future__ import annotations

import os
import pathlib
import time
from typing import Optional

SHM_DIR = pathlib.Path("/dev/shm")
BUFFER_PREFIX = "deepspeed_allreduce_buffer"
"""SHM_BUFFER_NAME in DeepSpeed's ops/csrc/cpu/comm/shm.cpp."""


def job_prefix(addr: Optional[str] = None, port: Optional[str] = None, uid: Optional[int] = None) -> str:
    """File-name prefix of one job's buffers (addr/port default to MASTER_ADDR/MASTER_PORT, as DeepSpeed reads them)."""
    addr = os.environ.get("MASTER_ADDR", "") if addr is None else addr
    port = os.environ.get("MASTER_PORT", "") if port is None else str(port)
    return f"{BUFFER_PREFIX}_{os.getuid() if uid is None else uid}_{addr}_{port}_"


def job_buffers(addr: Optional[str] = None, port: Optional[str] = None, shm_dir: pathlib.Path = SHM_DIR) -> list[pathlib.Path]:
    """This job's buffer files that exist now."""
    prefix = job_prefix(addr, port)
    try:
        return sorted(p for p in shm_dir.iterdir() if p.name.startswith(prefix))
    except OSError:  # no /dev/shm (not Linux)
        return []


def unlink_job_buffers(addr: Optional[str] = None, port: Optional[str] = None,
                       shm_dir: pathlib.Path = SHM_DIR) -> list[str]:
    """Remove the names of this job's buffers. Call only once every local rank has finished DeepSpeed's
    distributed initialisation (e.g. after a barrier): a rank still opening a peer's buffer by name would wait
    for it forever. Returns the names removed (another rank may have removed some first)."""
    return _unlink_each(job_buffers(addr, port, shm_dir))


def _unlink_each(paths: list[pathlib.Path]) -> list[str]:
    """Unlink each path; returns the names removed (ones already gone are skipped)."""
    removed = []
    for p in paths:
        try:
            p.unlink()
            removed.append(p.name)
        except FileNotFoundError:
            pass
    return removed


def mapped_shm_names(proc_dir: pathlib.Path = pathlib.Path("/proc")) -> set[str]:
    """Names of /dev/shm files that some live process maps (from /proc/<pid>/maps; unreadable ones skipped)."""
    names: set[str] = set()
    for pid_dir in proc_dir.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            text = (pid_dir / "maps").read_text(errors="replace")
        except OSError:  # the process ended, or belongs to someone we may not inspect
            continue
        for line in text.splitlines():
            i = line.find(str(SHM_DIR) + "/")
            if i >= 0:
                names.add(line[i + len(str(SHM_DIR)) + 1:].split(" (deleted)")[0].strip())
    return names


ORPHAN_MIN_AGE_S = 60.0
"""A buffer younger than this (by its last change) is never orphaned: between DeepSpeed's `shm_open(O_CREAT)` and
its `mmap` (shm.cpp `shared_create`) a live job's new buffer is mapped by nobody, and a sweep run by another job on
the same machine at that moment would unlink it, leaving its peers waiting for the name forever. A dead job's
buffers are removed by a later sweep."""


def orphaned_buffers(shm_dir: pathlib.Path = SHM_DIR, proc_dir: pathlib.Path = pathlib.Path("/proc"),
                     min_age_s: float = ORPHAN_MIN_AGE_S, now_s: Optional[float] = None) -> list[pathlib.Path]:
    """This user's DeepSpeed buffers that no live process maps and that nothing changed in the last `min_age_s`."""
    mine = f"{BUFFER_PREFIX}_{os.getuid()}_"
    now_s = time.time() if now_s is None else now_s
    files = []
    try:
        for p in shm_dir.iterdir():
            if not p.name.startswith(mine):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:  # unlinked since the listing
                continue
            if now_s - max(st.st_mtime, st.st_ctime) >= min_age_s:
                files.append(p)
    except OSError:
        return []
    if not files:
        return []
    in_use = mapped_shm_names(proc_dir)
    return sorted(p for p in files if p.name not in in_use)


def remove_orphaned_buffers(shm_dir: pathlib.Path = SHM_DIR, proc_dir: pathlib.Path = pathlib.Path("/proc"),
                            min_age_s: float = ORPHAN_MIN_AGE_S) -> list[str]:
    """Remove `orphaned_buffers`; returns the names removed."""
    return _unlink_each(orphaned_buffers(shm_dir, proc_dir, min_age_s))


def unlink_after_rendezvous() -> list[str]:
    """On every rank, right after `deepspeed.init_distributed` on CPU: a barrier (every rank has mapped every
    buffer by then), then local rank 0 of each host unlinks the job's buffers there (`unlink_job_buffers`; every
    rank does when LOCAL_RANK is not set). The job keeps working on its mappings. Returns the names removed."""
    import torch.distributed as dist

    dist.barrier()
    if os.environ.get("LOCAL_RANK", "0") != "0":
        return []
    return unlink_job_buffers()
