"""s31 fixes of `dstoolkit train` on real 2-rank gloo runs (tiny_cpu spec): SIGTERM / Ctrl-C stop the launcher and
both ranks (exit 143 / 130, one line, no per-rank traceback); a --resume from a ZeRO-2 checkpoint with a ZeRO-3 config
is refused with exit 2 before any rank starts, and by the ranks themselves when the trainer is launched directly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstoolkit.runtime.train.launch import run_local

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "ds_configs" / "tiny_cpu.yaml"
GEN = ROOT / "ds_configs" / "generated" / "tiny_cpu"
DSTOOLKIT = [sys.executable, "-m", "dstoolkit"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _trainer_pids(marker: str) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["cmdline"])
            if "dstoolkit.runtime.train.trainer" in " ".join(p.info["cmdline"] or []) and marker in
            " ".join(p.info["cmdline"] or [])]


def _signalled_run(tmp_path: Path, sig: int, group: bool) -> tuple[int, str, list[int]]:
    metrics = tmp_path / "m.jsonl"
    proc = subprocess.Popen([*DSTOOLKIT, "train", "--spec", str(SPEC), "--config", str(GEN / "zero2" / "ds_config.json"),
                             "--steps", "2000", "--metrics-out", str(metrics), "--", "--no-progress"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a Ctrl-C to it never reaches pytest
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (metrics.is_file() and '"step": 2' in metrics.read_text()):
            time.sleep(0.2)
        assert metrics.is_file(), "the run never trained"
        (os.killpg if group else os.kill)(proc.pid, sig)
        out, _ = proc.communicate(timeout=60)
        time.sleep(1)
        return proc.returncode, out, _trainer_pids(str(metrics))
    finally:
        for pid in _trainer_pids(str(metrics)):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_to_the_command_stops_the_launcher_and_both_ranks(tmp_path):
    rc, out, left = _signalled_run(tmp_path, signal.SIGTERM, group=False)  # kill / timeout: the main PID only
    assert left == []  # before: torchrun and both ranks kept training, children of PID 1
    assert rc == 143, out[-2000:]  # before: -15
    assert out.rstrip().splitlines()[-1] == ("dstoolkit train: error: interrupted by SIGTERM: the launcher and its "
                                             "ranks were stopped")


def test_ctrl_c_exits_130_without_a_traceback_per_rank(tmp_path):
    rc, out, left = _signalled_run(tmp_path, signal.SIGINT, group=True)  # a terminal's Ctrl-C: the whole group
    assert left == [] and rc == 130, out[-2000:]
    assert "KeyboardInterrupt" not in out  # before: a ~30-line traceback from each rank
    assert out.rstrip().splitlines()[-1].startswith("dstoolkit train: error: interrupted by SIGINT")


def test_resume_with_another_zero_stage_is_refused_before_and_by_the_ranks(tmp_path):
    ck, z3 = tmp_path / "ck", str(GEN / "zero3" / "ds_config.json")
    first = subprocess.run([*DSTOOLKIT, "train", "--spec", str(SPEC), "--config", str(GEN / "zero2" / "ds_config.json"),
                            "--steps", "2", "--metrics-out", str(tmp_path / "a.jsonl"), "--", "--checkpoint-dir",
                            str(ck), "--save-every", "2", "--no-progress"], env=ENV, capture_output=True, text=True,
                           timeout=90)
    assert first.returncode == 0, first.stderr[-2000:]
    fixed = ("--resume would load step_00000002, saved at ZeRO-2, dp 2, but this run is ZeRO-3; DeepSpeed loads a "
             "ZeRO checkpoint only at the stage and data-parallel size it was saved at. Resume with a ZeRO-2 config")
    t0 = time.monotonic()
    pre = subprocess.run([*DSTOOLKIT, "train", "--spec", str(SPEC), "--config", z3, "--steps", "4", "--metrics-out",
                          str(tmp_path / "b.jsonl"), "--", "--checkpoint-dir", str(ck), "--resume"], env=ENV,
                         capture_output=True, text=True, timeout=60)
    assert pre.returncode == 2 and fixed in pre.stderr, pre.stderr[-2000:]  # before: exit 1, AssertionError per rank
    assert not (tmp_path / "b.jsonl").exists() and time.monotonic() - t0 < 30  # no rank started
    direct = run_local(["--deepspeed_config", z3, "--spec", str(SPEC), "--steps", "4", "--metrics-out",
                        str(tmp_path / "c.jsonl"), "--checkpoint-dir", str(ck), "--resume"], timeout_s=90)
    assert direct.returncode != 0
    assert f"dstoolkit.runtime.train.trainer: error: --checkpoint-dir {ck}: {fixed}" in direct.stderr
    assert "AssertionError" not in direct.stderr
    assert json.loads((ck / "step_00000002" / "dstoolkit_manifest.json").read_text())["step"] == 2  # untouched
