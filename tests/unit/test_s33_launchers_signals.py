"""launch_hf.sh and the Megatron launch scripts stop the whole job on SIGTERM / SIGINT as launch.sh does (s33 ckpt
finding 1, the scripts the first fix left `exec`ing their launcher): one shell rule,
`generate.shell.run_forwarding_signals_lines`, checked with the stand-in torchrun of
tests/unit/test_s33_train_launch_signals.py (it exits 1 on SIGTERM after stopping its worker)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.shell import REAP_GRACE_S, run_forwarding_signals_lines
from tests.unit.test_s33_train_launch_signals import FAKE_TORCHRUN, _alive
from tests.signal_env import skip_if_sigint_ignored


@pytest.fixture(scope="module")
def zero1(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("gen") / "llama3"
    assert main(["generate", str(repo_root / "ds_configs" / "llama3_8b_1x8_h100.yaml"), "--out", str(out),
                 "--target", "hf", "--target", "megatron-lm"]) == 0
    return out / "zero1"


@pytest.mark.parametrize("script", ["launch_hf.sh", "launch_megatron_lm.sh"])
def test_generated_text_runs_the_launcher_under_the_signal_rule(zero1, script):
    text = (zero1 / script).read_text()
    assert "exec torchrun" not in text and 'exec "${CMD[@]}"' not in text
    assert "\n".join(run_forwarding_signals_lines("CMD", me=script)) in text


@pytest.mark.parametrize("script,args", [("launch_hf.sh", ["train.py"]), ("launch_megatron_lm.sh", [])])
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_the_launcher_and_its_worker(zero1, tmp_path, script, args, signum, code):
    skip_if_sigint_ignored(signum)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN)
    (bindir / "torchrun").chmod(0o755)
    pretrain = tmp_path / "pretrain_gpt.py"
    pretrain.write_text("")
    pid_file = tmp_path / "child.pid"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "CHILD_PID_FILE": str(pid_file),
           "PYTHON": sys.executable, "PRETRAIN": str(pretrain), "MOCK_DATA": "1"}
    proc = subprocess.Popen(["bash", str(zero1 / script), *args], cwd=tmp_path, env=env,
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
    assert not survived, f"the launcher's worker outlived {script}"
    assert proc.returncode == code, err
    assert f"{script}: interrupted by {signum.name}: the launcher and its ranks were stopped" in err
