"""SIGTERM to a real `dstoolkit train --launcher deepspeed` (2 gloo ranks) stops the ranks at once (s37 area A
finding 1). Before: only the deepspeed runner got it and died (runner.py installs its handler for a multi-node pdsh
launch only); `deepspeed.launcher.launch` and the ranks trained and saved on for 30 s, were SIGKILLed and left the
writer lock behind. tests/unit/test_s37_trainsig_stop.py checks the rule with a stand-in tree (SIGINT, SIGHUP too)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.procs import processes_naming

pytestmark = pytest.mark.dist

START_TIMEOUT_S = 300  # first use on a fresh machine JIT-compiles shm_comm (~30-50 s)


def test_sigterm_to_dstoolkit_train_deepspeed_stops_the_ranks_at_once(train_files, tmp_path):
    spec, ds = train_files
    ckpt, metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "dstoolkit", "train", "--spec", str(spec), "--config", str(ds),
                             "--steps", "500", "--launcher", "deepspeed", "--metrics-out", str(metrics), "--",
                             "--checkpoint-dir", str(ckpt), "--save-every", "1", "--data-delay-s", "0.3",
                             "--no-progress"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (ckpt / "latest").is_file():
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint saved in time"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    tags = sorted(p.name for p in ckpt.glob("step_*"))
    time.sleep(2)
    left = list(processes_naming(str(ckpt)))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived dstoolkit train: {left}"
    assert took_s < 20, err[-3000:]  # before: 30 s of training on, then SIGKILL
    assert proc.returncode == 143, err[-3000:]
    assert sorted(p.name for p in ckpt.glob("step_*")) == tags, "a checkpoint tag appeared after the command ended"
    assert not (ckpt / ".dstoolkit-writer.lock").exists()  # rank 0 released it on SIGTERM (writer_lock.py)
    assert err.strip().splitlines()[-1] == (
        "dstoolkit train: error: interrupted by SIGTERM: the launcher and its ranks were stopped; rerun with "
        "`-- --resume` (and the same --checkpoint-dir) to continue from its last checkpoint")
