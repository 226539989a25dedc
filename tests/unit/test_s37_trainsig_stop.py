"""`dstoolkit train` stops the whole launched tree on SIGTERM / SIGINT / SIGHUP (s37 area A finding 1).

Before: the signal went to the launcher process only. On one node the deepspeed runner has no handler
(deepspeed/launcher/runner.py `main` installs `sigkill_handler` only for a multi-node pdsh launch) and died without
passing it to `deepspeed.launcher.launch`, so the ranks trained on for the 30 s grace, were SIGKILLed (leaving the
writer lock behind), and the command still said "the launcher and its ranks were stopped" -- also when the run had
finished inside that window. The stand-in tree below behaves as the deepspeed launcher does: a runner that dies on
the signal alone, a launch.py that stops its rank on SIGTERM / SIGINT, and a rank that notes the first signal it gets.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dstoolkit.cli import train as train_cli
from tests.procs import processes_naming

FAKE = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    role, out, mode, metrics = sys.argv[1:5]
    me = [sys.executable, __file__]
    if role == "runner":  # deepspeed's runner on one node: no handler, dies on the signal alone
        subprocess.Popen([*me, "launch", out, mode, metrics])
        time.sleep(300)
    elif role == "launch":  # deepspeed.launcher.launch: stops its rank on SIGTERM / SIGINT (sigkill_handler)
        rank = subprocess.Popen([*me, "rank", out, mode, metrics])
        def stop(signum, frame):
            rank.terminate(); rank.wait(); sys.exit(1)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        open(os.path.join(out, "launch.pid"), "w").write(str(os.getpid()))
        while rank.poll() is None:  # launch.py polls (a handler's rank.wait() inside a wait() would deadlock)
            time.sleep(0.1)
        sys.exit(rank.returncode)
    else:  # a rank
        def note(signum, frame):
            try:  # the first signal only (launch.py's SIGTERM follows the group's SIGINT)
                fd = os.open(os.path.join(out, "rank.signal"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                os.write(fd, signal.Signals(signum).name.encode()); os.close(fd)
            except FileExistsError:
                pass
            os._exit(0)
        if mode == "ignore":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(s, note)
        with open(metrics, "a") as fh:
            fh.write(json.dumps({"step": 1, "loss": 4.0, "step_time_s": 0.1, "tokens_per_s": 10.0}) + "\\n")
            if mode == "done":  # finished; the teardown (end_ranks) is still under way when the signal comes
                fh.write(json.dumps({"step": 2, "loss": 3.5, "step_time_s": 0.1, "tokens_per_s": 12.0}) + "\\n")
                fh.write(json.dumps({"event": "done", "steps": 2, "final_loss": 3.5, "world_size": 2}) + "\\n")
        open(os.path.join(out, "rank.pid"), "w").write(str(os.getpid()))
        time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie not yet reaped by init counts as gone
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _launch(train_files, tmp_path, mode: str, grace_s: float, extra=()):
    """`dstoolkit train` (in a child process) over the stand-in deepspeed tree."""
    spec, ds = train_files
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    metrics = tmp_path / "m.jsonl"
    code = textwrap.dedent(f"""
        import functools, sys
        from dstoolkit.cli import main, train
        train.run_forwarding_signals = functools.partial(train.run_forwarding_signals, grace_s={grace_s})
        train.launch_command = lambda args: [sys.executable, {str(fake)!r}, "runner", {str(tmp_path)!r}, {mode!r},
                                             args.metrics_out]
        sys.exit(main(["train", "--spec", {str(spec)!r}, "--config", {str(ds)!r}, "--steps", "2",
                       "--metrics-out", {str(metrics)!r}, *{list(extra)!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    for name in ("rank.pid", "launch.pid"):
        while not ((tmp_path / name).is_file() and (tmp_path / name).read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    return proc, int((tmp_path / "rank.pid").read_text()), int((tmp_path / "launch.pid").read_text())


def _finish(proc, signums, pause_s: float = 0.0):
    """Send `signums` to the command (`pause_s` apart); (exit code, stdout, stderr, seconds from the first signal)."""
    t0 = time.monotonic()
    for i, signum in enumerate(signums):
        if i:
            time.sleep(pause_s)
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=90)  # the stand-ins inherit its pipes: EOF once every one of them ended
    return proc.returncode, out, err, time.monotonic() - t0


def _left(*pids):
    time.sleep(0.3)
    return [p for p in pids if _alive(p)]


@pytest.fixture(autouse=True)
def kill_what_this_test_started(tmp_path):
    """At teardown (also after a failure): SIGKILL every process whose command line names this test's folder."""
    yield
    for pid in processes_naming(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_the_signal_reaches_every_rank_at_once(train_files, tmp_path, signum, code):
    proc, rank, launch = _launch(train_files, tmp_path, "train", grace_s=20,
                                 extra=["--", "--checkpoint-dir", str(tmp_path / "ck")])
    rc, _, err, took_s = _finish(proc, [signum])
    left = _left(rank, launch)
    # before: the rank never saw the signal (SIGKILLed after the 20 s grace; SIGHUP: this command died, rank orphaned)
    assert (tmp_path / "rank.signal").read_text() == signal.Signals(signum).name
    assert left == []
    assert took_s < 10
    assert rc == code
    assert err.strip().splitlines()[-1] == (
        f"dstoolkit train: error: interrupted by {signal.Signals(signum).name}: the launcher and its "
        "ranks were stopped; rerun with `-- --resume` (and the same --checkpoint-dir) to continue from its last "
        "checkpoint")


def test_a_run_finished_before_the_signal_took_effect_is_reported_finished(train_files, tmp_path):
    proc, rank, launch = _launch(train_files, tmp_path, "done", grace_s=20)
    rc, out, err, _ = _finish(proc, [signal.SIGTERM])
    assert _left(rank, launch) == []
    # before: "interrupted by SIGTERM: the launcher and its ranks were stopped", exit 143
    assert rc == 0
    assert err.strip().splitlines()[-1] == (
        "dstoolkit train: note: SIGTERM came after the run had finished (its 'done' record: step 2); its metrics and "
        "checkpoints are complete")
    assert "           completed: True" in out.splitlines()
    assert "          final_loss: 3.5" in out.splitlines()


def test_what_outlives_the_grace_is_killed_and_said(train_files, tmp_path):
    proc, rank, launch = _launch(train_files, tmp_path, "ignore", grace_s=1)
    rc, _, err, took_s = _finish(proc, [signal.SIGTERM])
    left = _left(rank, launch)
    assert left == [] and rc == 143 and took_s < 15
    # launch.py's handler waits on the rank that ignores SIGTERM: both are killed after the grace
    # (before: "the launcher and its ranks were stopped")
    assert err.strip().splitlines()[-1] == (
        "dstoolkit train: error: interrupted by SIGTERM: 2 process(es) of the launch were still running "
        "after the 1 s grace and were killed (SIGKILL)")


def test_a_second_signal_kills_what_is_left_at_once(train_files, tmp_path):
    proc, rank, launch = _launch(train_files, tmp_path, "ignore", grace_s=60)
    rc, _, err, took_s = _finish(proc, [signal.SIGTERM, signal.SIGTERM], pause_s=1.0)
    left = _left(rank, launch)
    assert left == [] and rc == 143 and took_s < 15
    assert err.strip().splitlines()[-1] == (
        "dstoolkit train: error: interrupted by SIGTERM: a second signal killed (SIGKILL) the 2 "
        "process(es) of the launch still running")


def test_run_records_leaves_out_a_last_line_cut_off_mid_write(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"event": "model"}\n{"step": 7, "loss": 1.0}\n{"step": 8, "lo')
    steps, events = train_cli.run_records(str(path))
    assert (steps, events) == ([{"step": 7, "loss": 1.0}], [{"event": "model"}])
    path.write_text('{"step": 7, "lo\n{"step": 8}\n')  # cut off inside the file: not a killed writer's
    with pytest.raises(json.JSONDecodeError):
        train_cli.run_records(str(path))
