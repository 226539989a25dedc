"""launch.sh stops the whole job on SIGTERM / SIGINT (s33 ckpt finding 1), checked with stand-in launchers.

The deepspeed runner exits on SIGTERM without stopping its `deepspeed.launcher.launch` child, so a launch.sh that
`exec`s it left the ranks training (and saving checkpoints) after `kill <launch.sh pid>`; torchrun stops its
ranks but exits 1, not 143. The stand-ins below behave the same way: a `deepspeed` whose child outlives it, and a
`torchrun` that exits 1 on SIGTERM. tests/dist/test_s33_launch_signals.py sends the signal to real runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.shell import REAP_GRACE_S, run_forwarding_signals_lines
from tests.signal_env import skip_if_sigint_ignored

# like the deepspeed runner: a child that trains on (here: sleeps) and a parent that dies on SIGTERM alone
FAKE_DEEPSPEED = """#!/usr/bin/env bash
sleep 300 &
echo $! > "$CHILD_PID_FILE"
wait
"""
# like torchrun: passes the signal on to its worker, waits for it, exits 1
FAKE_TORCHRUN = """#!/usr/bin/env bash
sleep 300 &
child=$!
echo $child > "$CHILD_PID_FILE"
trap 'kill -TERM $child; wait $child; exit 1' TERM INT
wait
"""


@pytest.fixture(scope="module")
def zero2(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("gen") / "tiny"
    assert main(["generate", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--out", str(out)]) == 0
    return out / "zero2"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not yet reaped by init) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.parametrize("launcher,signum,code", [("deepspeed", signal.SIGTERM, 143),
                                                  ("torchrun", signal.SIGTERM, 143),
                                                  ("deepspeed", signal.SIGINT, 130)])
def test_signal_to_launch_sh_stops_every_process(zero2, tmp_path, launcher, signum, code):
    skip_if_sigint_ignored(signum)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("deepspeed", FAKE_DEEPSPEED), ("torchrun", FAKE_TORCHRUN)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "LAUNCHER": launcher,
           "CHILD_PID_FILE": str(pid_file), "PYTHON": sys.executable}
    proc = subprocess.Popen(["bash", str(zero2 / "launch.sh")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        child = int(pid_file.read_text())
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=REAP_GRACE_S + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.2)
    survived = _alive(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived, f"the launcher's child outlived launch.sh ({launcher}, {signum.name})"
    assert proc.returncode == code, err
    assert f"launch.sh: interrupted by {signum.name}: the launcher and its ranks were stopped" in err


def test_generated_text_never_execs_the_launcher(zero2):
    text = (zero2 / "launch.sh").read_text()
    assert 'exec "${CMD[@]}"' not in text
    assert "\n".join(run_forwarding_signals_lines("CMD", me="launch.sh")) in text
    assert "trap 'stop_job TERM 143' TERM" in text and "trap 'stop_job INT 130' INT" in text


def test_dstoolkit_train_waits_as_long_as_launch_sh():
    """One grace period for both: `dstoolkit train` reads it from the shell rule's owner."""
    import inspect

    from dstoolkit.cli import train

    # read when the verb runs, not when the parser is built (test_generate_cli's parser-imports test)
    assert inspect.signature(train.run_forwarding_signals).parameters["grace_s"].default is None
    assert "from dstoolkit.generate.shell import REAP_GRACE_S" in inspect.getsource(train.run_forwarding_signals)
