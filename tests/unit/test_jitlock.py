"""dstoolkit.runtime.jitlock with real holder processes: a live holder is waited on (message, timeout), a
killed one leaves a stale lock that the next check removes with a message naming the op."""
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

from dstoolkit.runtime import jitlock

# A holder the way torch takes it: torch.utils.file_baton.FileBaton keeps the O_EXCL lock fd open until release.
HOLDER = textwrap.dedent("""
    import os, sys, time
    lock = sys.argv[1]
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    print("held", flush=True)
    time.sleep(600)
""")


def _lock(root: pathlib.Path, op: str) -> pathlib.Path:
    d = root / "py311_cpu" / op
    d.mkdir(parents=True)
    return d / "lock"


def _start_holder(lock: pathlib.Path, cwd=None) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True, cwd=cwd)
    assert p.stdout.readline().strip() == "held"
    return p


def test_live_holder_waited_on_then_killed_holder_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "cpu_adam")
    holder = _start_holder(lock)
    try:
        msgs = []
        t0 = time.monotonic()
        rep = jitlock.check_locks(min_age_s=0.0, wait_timeout_s=1.0, log=msgs.append, who="job")
        assert time.monotonic() - t0 >= 1.0
        assert rep.still_held == [str(lock)] and lock.exists() and not rep.removed
        assert any("waiting up to 1 s" in m and "op cpu_adam" in m and f"pid {holder.pid}" in m for m in msgs), msgs
        assert any("gave up waiting" in m and "cpu_adam" in m for m in msgs), msgs
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock.exists()  # the killed holder left its lock behind
    past = time.time() - 120
    os.utime(lock, (past, past))
    msgs = []
    rep = jitlock.check_locks(wait_timeout_s=1.0, log=msgs.append, who="job")
    assert rep.removed == [str(lock)] and not lock.exists()
    assert len(msgs) == 1 and "removed stale torch-extension lock for op cpu_adam" in msgs[0], msgs
    assert "no live process" in msgs[0]


def test_holder_released_during_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "deepspeed_shm_comm")
    # A "build" running in the build dir (like ninja), which releases the lock after ~1 s.
    code = "import os,time,sys; time.sleep(1.0); os.remove('lock')"
    lock.write_text("")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=lock.parent)
    try:
        msgs = []
        rep = jitlock.check_locks(min_age_s=0.0, wait_timeout_s=30, log=msgs.append)
    finally:
        p.wait()
    assert rep.waited == [str(lock)] and not rep.still_held and not rep.removed
    assert "works in its build dir" in msgs[0] and "released" in msgs[-1], msgs


def test_young_unheld_lock_is_judged_once_old_enough(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "fused_adam")
    lock.write_text("")
    rep = jitlock.check_locks(min_age_s=0.6, wait_timeout_s=0.1, log=None)
    assert rep.removed == [str(lock)] and not rep.still_held


def test_compiler_naming_the_op_counts_as_holder(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = _lock(tmp_path, "cpu_adam")
    lock.write_text("")
    # torch passes -DTORCH_EXTENSION_NAME=<op> to every compile of the op, run by ninja in the op's build dir
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-DTORCH_EXTENSION_NAME=cpu_adam"],
                         cwd=lock.parent)
    # the same op compiled for another TORCH_EXTENSIONS_DIR (another job on the machine; CI 2026-12-06: a helper's
    # DeepSpeed run built deepspeed_shm_comm while test_holder_released_during_wait waited) is not this lock's holder
    other = tmp_path / "other" / "cpu_adam"
    other.mkdir(parents=True)
    q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-DTORCH_EXTENSION_NAME=cpu_adam"],
                         cwd=other)
    try:
        time.sleep(0.3)
        holders = jitlock.lock_holders(lock)
        assert any(f"pid {p.pid}" in h and "builds it" in h for h in holders), holders
        assert not any(f"pid {q.pid}" in h for h in holders), holders
    finally:
        for x in (p, q):
            x.kill()
            x.wait()
    assert jitlock.lock_holders(lock) == []


def test_no_locks_no_messages(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "absent"))
    rep = jitlock.check_locks(log=None)
    assert rep.messages == [] and rep.removed == []


def _aged(lock: pathlib.Path, age_s: float) -> None:
    lock.write_text("")
    t = time.time() - age_s
    os.utime(lock, (t, t))


def test_stale_lock_removed_whatever_its_age(tmp_path, monkeypatch):
    """A lock no live process holds is removed on two looks STALE_CONFIRM_S apart: a second old or a minute old."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    young, old = _lock(tmp_path, "op_second_old"), _lock(tmp_path, "op_minute_old")
    _aged(young, 1.0)
    _aged(old, 60.0)
    msgs = []
    rep = jitlock.check_locks(wait_timeout_s=5.0, log=msgs.append, who="job")
    print("\n".join(msgs))
    assert sorted(rep.removed) == sorted([str(young), str(old)]) and not young.exists() and not old.exists()
    assert any("op op_second_old" in m and "removed stale" in m and " s old" in m for m in msgs), msgs
    (line,) = [m for m in msgs if "op op_minute_old" in m and "removed stale" in m]
    assert 60 <= int(line.split(" s old")[0].rsplit(" ", 1)[1]) < 120, line


def test_rank_guard_reports_a_live_build_then_removes_its_lock_once_the_builder_is_killed(tmp_path, capfd):
    """Inside a rank (guard_jit_waits): torch's baton wait says what it waits for (op, path, age, the live
    holder) every REPORT_EVERY_S; the holder SIGKILLed, its lock is removed with a line and the wait ends."""
    from torch.utils.file_baton import FileBaton

    assert jitlock.guard_jit_waits("test")
    lock = _lock(tmp_path, "op_live_then_killed")
    holder = _start_holder(lock)
    try:
        killer = subprocess.Popen([sys.executable, "-c", f"import os,time,signal; time.sleep(6); "
                                                         f"os.kill({holder.pid}, signal.SIGKILL)"])
        t0 = time.monotonic()
        FileBaton(str(lock)).wait()  # guarded: returns once the stale lock is gone
        waited = time.monotonic() - t0
        killer.wait()
    finally:
        holder.kill()
        holder.wait()
    err = capfd.readouterr().err
    print(err)
    assert not lock.exists() and 6.0 <= waited < 30, waited
    lines = err.splitlines()
    waits = [ln for ln in lines if "waiting" in ln and "op op_live_then_killed" in ln]
    assert len(waits) >= 2 and f"pid {holder.pid}" in waits[0] and str(lock) in waits[0] and " s old" in waits[0]
    assert any("removed stale torch-extension lock for op op_live_then_killed" in ln for ln in lines), lines


def test_pin_ninja_puts_the_interpreters_ninja_first(tmp_path, monkeypatch):
    """Two ninja versions on one machine rebuild each other's ops (log v5 vs v7): ranks pin the venv's one."""
    import shutil

    from dstoolkit.runtime import jitlock

    venv_bin, system_bin = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for d in (venv_bin, system_bin):
        d.mkdir(parents=True)
        (d / "ninja").write_text("#!/bin/sh\n")
        (d / "ninja").chmod(0o755)
    monkeypatch.setattr(jitlock.sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", f"{system_bin}:/bin")
    assert jitlock.pin_ninja() == str(venv_bin / "ninja")
    assert shutil.which("ninja") == str(venv_bin / "ninja")
    assert jitlock.pin_ninja() is None  # already first: PATH unchanged
    assert jitlock.os.environ["PATH"] == f"{venv_bin}:{system_bin}:/bin"
    (venv_bin / "ninja").unlink()
    monkeypatch.setenv("PATH", f"{system_bin}:/bin")
    assert jitlock.pin_ninja() is None and jitlock.os.environ["PATH"] == f"{system_bin}:/bin"
