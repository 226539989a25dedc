"""SIGTERM to a real generated launch.sh (the deepspeed launcher, 2 gloo ranks) stops every rank (s33 ckpt finding 1).

Before: launch.sh `exec`ed the deepspeed runner, which exits on SIGTERM without stopping `deepspeed.launcher.launch`;
the ranks trained on, re-parented to init, and kept saving checkpoint tags. tests/unit/test_s33_train_launch_signals.py
checks the same rule with stand-in launchers (torchrun and SIGINT too)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.cpu_precision import precision_for_this_cpu
from dstoolkit.runtime.train.launch import free_port
from tests.procs import processes_naming

pytestmark = pytest.mark.dist

START_TIMEOUT_S = 300  # first use on a fresh machine JIT-compiles shm_comm (~30-50 s)


def test_sigterm_to_launch_sh_stops_the_ranks(tmp_path, repo_root):
    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text()
    spec = tmp_path / "tiny_cpu.yaml"
    spec.write_text(text.replace("  precision: bf16\n", f"  precision: {precision_for_this_cpu('bf16')}\n"))
    assert main(["generate", str(spec), "--out", str(tmp_path / "gen")]) == 0
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "STEPS": "500", "SAVE_EVERY": "1", "MASTER_PORT": str(free_port()), "CKPT_DIR": str(ckpt),
           "METRICS_OUT": str(tmp_path / "m.jsonl")}
    log = open(tmp_path / "launch.log", "w")
    proc = subprocess.Popen(["bash", str(tmp_path / "gen" / "zero2" / "launch.sh"), "--no-progress"], cwd=tmp_path,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (ckpt / "latest").is_file():
            assert proc.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint saved in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    tags = sorted(p.name for p in ckpt.glob("step_*"))
    time.sleep(5)
    left = [f"{pid}: {line[:200]}" for pid, line in processes_naming(str(ckpt)).items()]
    for line in left:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    out = (tmp_path / "launch.log").read_text()
    assert not left, f"processes outlived launch.sh: {left}"
    assert sorted(p.name for p in ckpt.glob("step_*")) == tags, "a checkpoint tag appeared after launch.sh ended"
    assert rc == 143, out[-3000:]
    assert "launch.sh: interrupted by SIGTERM: the launcher and its ranks were stopped" in out
