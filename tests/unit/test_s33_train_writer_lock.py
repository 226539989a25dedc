"""One writer per --checkpoint-dir (s33 ckpt finding 2). Before: two runs wrote one folder at once, replacing each
other's tags, both exit 0. Global rank 0 takes `.dstoolkit-writer.lock`; a live holder is refused (one line naming
it and the fix, exit 2 in `dstoolkit train`'s pre-flight), a dead one's lock is taken over with a note."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train.writer_lock import WRITER_LOCK, live_writer_refusal, read_holder, take


@pytest.fixture
def other_process():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def _lock_of(root, pid, host=None, process_start=None):
    root.mkdir(parents=True, exist_ok=True)
    (root / WRITER_LOCK).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                                "process_start": process_start, "taken": time.time()}))


def test_take_and_release(tmp_path):
    lock, problem = take(tmp_path / "ck")
    assert problem is None and read_holder(tmp_path / "ck").pid == os.getpid()
    lock.release()
    assert not (tmp_path / "ck" / WRITER_LOCK).exists()


def test_a_live_writer_is_refused_naming_it_and_the_fix(tmp_path, other_process):
    ck = tmp_path / "ck"
    _lock_of(ck, other_process.pid)
    lock, problem = take(ck)
    assert lock is None
    assert problem.startswith(f"--checkpoint-dir {ck}: another run is writing checkpoints there (pid "
                              f"{other_process.pid} on host {socket.gethostname()}, since ")
    assert f"or stop it (kill {other_process.pid}), or give this run another --checkpoint-dir" in problem
    assert json.loads((ck / WRITER_LOCK).read_text())["pid"] == other_process.pid  # untouched


def test_a_dead_writers_lock_is_taken_over_with_a_note(tmp_path, other_process):
    ck = tmp_path / "ck"
    other_process.kill()
    other_process.wait()
    _lock_of(ck, other_process.pid)
    notes = []
    lock, problem = take(ck, note=notes.append)
    assert problem is None and read_holder(ck).pid == os.getpid()
    assert notes and "taking over the writer lock of a run that is gone" in notes[0]
    lock.release()


def test_a_reused_pid_is_not_the_writer(tmp_path, other_process):
    _lock_of(tmp_path, other_process.pid, process_start=1.0)  # the pid lives, but started long after the lock
    assert live_writer_refusal(tmp_path) is None


def test_another_hosts_lock_is_refused_with_how_to_clear_it(tmp_path):
    _lock_of(tmp_path, 12345, host="node-elsewhere")
    problem = live_writer_refusal(tmp_path)
    assert "pid 12345 on host node-elsewhere" in problem and "stop it on node-elsewhere" in problem
    assert f"delete {tmp_path / WRITER_LOCK}" in problem


def test_dstoolkit_train_preflight_refuses_before_any_rank(tmp_path, repo_root, other_process, capsys):
    ck = tmp_path / "ck"
    _lock_of(ck, other_process.pid)
    rc = main(["train", "--spec", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--config",
               str(repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"), "--steps", "2",
               "--dry-run", "--", "--checkpoint-dir", str(ck), "--resume"])
    err = capsys.readouterr().err
    assert rc == 2 and "another run is writing checkpoints there" in err and err.count("\n") == 1, err
