"""dstoolkit.runtime.train.shm: which /dev/shm buffers are a job's, which are orphaned, and that removal spares live ones."""
from __future__ import annotations

import mmap
import os

from dstoolkit.runtime.train import shm


def make(dirpath, name, size=4096):
    p = dirpath / name
    p.write_bytes(b"\0" * size)
    return p


def test_job_prefix_matches_deepspeeds_name(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    # shm.cpp: "%s_%d_%s_%s" % (SHM_BUFFER_NAME, getuid(), addr, port), then "_%d" % rank
    assert shm.job_prefix() == f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29500_"


def test_unlink_job_buffers_takes_only_that_job(tmp_path):
    uid = os.getuid()
    a0 = make(tmp_path, f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_111_0")
    a1 = make(tmp_path, f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_111_1")
    other_port = make(tmp_path, f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_1110_0")
    unrelated = make(tmp_path, "something_else")
    removed = shm.unlink_job_buffers("127.0.0.1", "111", shm_dir=tmp_path)
    assert sorted(removed) == sorted([a0.name, a1.name])
    assert other_port.exists() and unrelated.exists()
    assert shm.unlink_job_buffers("127.0.0.1", "111", shm_dir=tmp_path) == []


def test_orphan_sweep_spares_mapped_buffers_and_other_users(tmp_path):
    """A buffer this process maps is live; an unmapped one is orphaned; another uid's is never touched."""
    uid = os.getuid()
    shm_dir = tmp_path / "shm"
    shm_dir.mkdir()
    live = make(shm_dir, f"deepspeed_allreduce_buffer_{uid}_h_1_0")
    dead = make(shm_dir, f"deepspeed_allreduce_buffer_{uid}_h_2_0")
    foreign = make(shm_dir, f"deepspeed_allreduce_buffer_{uid + 1}_h_3_0")
    # a fake /proc whose one process maps `live` the way /proc/<pid>/maps shows a /dev/shm mapping
    proc = tmp_path / "proc"
    (proc / "123").mkdir(parents=True)
    (proc / "123" / "maps").write_text(
        f"7f0000000000-7f0004200000 rw-s 00000000 00:19 42   {shm.SHM_DIR}/{live.name}\n"
        "7f0010000000-7f0010001000 r-xp 00000000 08:01 7    /usr/lib/libc.so.6\n")
    (proc / "self").mkdir()  # non-numeric entries are skipped
    old = os.stat(dead).st_mtime - 2 * shm.ORPHAN_MIN_AGE_S
    for p in (live, dead, foreign):
        os.utime(p, (old, old))
    # utime leaves ctime at now: the age test takes the later of the two, so ask "as of" a minute on
    later = os.stat(dead).st_ctime + shm.ORPHAN_MIN_AGE_S
    assert shm.orphaned_buffers(shm_dir, proc, now_s=later) == [dead]
    assert shm.orphaned_buffers(shm_dir, proc) == []  # changed just now (ctime): maybe a job creating it
    assert shm.remove_orphaned_buffers(shm_dir, proc, min_age_s=0.0) == [dead.name]
    assert live.exists() and foreign.exists() and not dead.exists()


def test_a_buffer_created_a_moment_ago_is_not_orphaned(tmp_path):
    """Between DeepSpeed's shm_open and its mmap a live job's buffer is mapped by nobody: too young to remove."""
    young = make(tmp_path, f"deepspeed_allreduce_buffer_{os.getuid()}_h_4_0")
    proc = tmp_path / "proc"
    proc.mkdir()
    assert shm.remove_orphaned_buffers(tmp_path, proc) == []
    assert young.exists()
    assert shm.orphaned_buffers(tmp_path, proc, now_s=os.stat(young).st_ctime + shm.ORPHAN_MIN_AGE_S) == [young]


def test_mapped_shm_names_sees_a_real_mapping(tmp_path):
    """Against the real /proc: a file this process maps from /dev/shm is reported as mapped."""
    name = f"dstoolkit_test_{os.getpid()}"
    path = shm.SHM_DIR / name
    if not shm.SHM_DIR.is_dir():
        import pytest

        pytest.skip("no /dev/shm")
    path.write_bytes(b"\0" * 4096)
    try:
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
            m[0] = 1
            assert name in shm.mapped_shm_names()
        assert name not in shm.mapped_shm_names()
    finally:
        path.unlink()
