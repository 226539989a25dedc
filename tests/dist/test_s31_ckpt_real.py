"""s31 findings 6, 7, 16a, 16b on real checkpoints (`dstoolkit train`, 2 gloo ranks, 2 steps).

- reshard interrupted by SIGINT / SIGTERM mid-conversion (DeepSpeed's real ds_to_universal, held after its first
  pass has written its temporary files, then signalled): exit 130, no OUT, no temporary left (before: OUT/<tag>/{tmp,
  zero} left, rerun refused "already exists"); killed by SIGKILL: the rerun removes the leftover, says so, and writes
  a complete universal checkpoint;
- reshard / export into a full 2 MiB tmpfs (root only; skipped where mount is not allowed): one line, exit 1;
- ZeRO-3 inspect: "master float32" (before "master ?"); ZeRO-0 inspect: optimizer bytes = torch's own count of the
  optimizer tensors inside mp_rank_00_model_states.pt (before 0).
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.signal_env import skip_if_sigint_ignored

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "ds_configs" / "generated" / "tiny_cpu"
HF_CONFIG = REPO / "tests" / "golden" / "hf_configs" / "llama-3.2-1b.json"
CLI = [sys.executable, "-m", "dstoolkit"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _train(out: Path, stage: int, *extra: str, spec: Path = REPO / "ds_configs" / "tiny_cpu.yaml") -> Path:
    proc = subprocess.run([*CLI, "train", "--spec", str(spec), "--config", str(GEN / f"zero{stage}" / "ds_config.json"),
                           "--steps", "2", "--", "--checkpoint-dir", str(out), "--save-every", "2", "--no-progress",
                           *extra], env=ENV, capture_output=True, text=True, timeout=240,
                          cwd=out.parent)  # its default --metrics-out lands beside the checkpoints, not in the checkout
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("z3") / "ck", 3)


@pytest.fixture(scope="module")
def hf_zero0(tmp_path_factory):
    d = tmp_path_factory.mktemp("z0")
    spec = d / "spec.yaml"
    spec.write_text(f"name: hf_tiny\nmodel: {{hf_config: {HF_CONFIG}}}\ncluster: {{nodes: 1, gpus_per_node: 2, "
                    "gpu: cpu}\ntraining: {seq_len: 64, global_batch: 8, micro_batch: 4, precision: bf16, "
                    "optimizer: adamw, lr: 0.003, activation_checkpointing: none, tp: 1, pp: 1, ep: 1, "
                    "zero_stage: 0}\n")
    return _train(d / "ck", 0, "--shrink", "auto", spec=spec)


def _partials(out: Path) -> list[str]:
    return glob.glob(str(out.parent / f".{out.name}.dstoolkit-partial-*"))


HOLD_MID_CONVERSION = """
import os, sys, time
from pathlib import Path
from deepspeed.checkpoint import ds_to_universal as converter
first_pass = converter._do_parallel_work
def held(*args, **kwargs):
    result = first_pass(*args, **kwargs)
    Path(os.environ["HELD_MARKER"]).touch()
    time.sleep(120)  # the test signals the process here, inside ds_to_universal.main
    return result
converter._do_parallel_work = held
from dstoolkit.cli import main
sys.exit(main())
"""
"""Runs the CLI with DeepSpeed's converter held after its first pass (its temporary files written): the signal lands
mid-conversion on every machine. Before, the test signalled once it saw files, and on a fast machine the conversion
could finish between two polls (CI at 99335ee: exit 0, a complete OUT)."""


def _reshard_signalled(ck: Path, out: Path, sig: int) -> subprocess.CompletedProcess:
    """Run the CLI, held mid-conversion, and send `sig` once it is held (its temporary folder holds files)."""
    marker = out.parent / f"{out.name}.held"
    p = subprocess.Popen([sys.executable, "-c", HOLD_MID_CONVERSION, "ckpt", "reshard", str(ck), "--out", str(out)],
                         env=dict(ENV, HELD_MARKER=str(marker)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=REPO)
    deadline = time.time() + 120
    while p.poll() is None and time.time() < deadline and not marker.exists():
        time.sleep(0.01)
    assert marker.exists(), f"the conversion never reached its first pass (exit {p.poll()})"
    assert [f for part in _partials(out) for f in glob.glob(f"{part}/*/*/*")], "no temporary files at the signal"
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_reshard_interrupted_leaves_nothing_and_reruns(zero3, tmp_path, sig):
    skip_if_sigint_ignored(sig)
    out = tmp_path / "uni"
    proc = _reshard_signalled(zero3, out, sig)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"dstoolkit ckpt reshard: interrupted; nothing was written to {out} (rerun the same command)")
    assert not out.exists() and _partials(out) == []


def test_reshard_killed_leftover_is_removed_by_the_rerun(zero3, tmp_path):
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    out = tmp_path / "uni"
    proc = _reshard_signalled(zero3, out, signal.SIGKILL)
    assert proc.returncode == -9 and not out.exists()
    left = _partials(out)
    assert len(left) == 1
    rerun = subprocess.run([*CLI, "ckpt", "reshard", str(zero3), "--out", str(out)], env=ENV, capture_output=True,
                           text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"removed {left[0]}: the temporary folder of an earlier run that was killed" in rerun.stderr
    assert _partials(out) == [] and inspect_checkpoint(out).complete


def test_zero3_master_is_float32(zero3):
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    assert inspect_checkpoint(zero3).dtypes == {"model": "bfloat16", "optimizer": "float32", "master": "float32"}


def test_zero0_optimizer_bytes_are_torchs_count(hf_zero0):
    import torch

    from dstoolkit.ckpt.inspect import inspect_checkpoint

    info = inspect_checkpoint(hf_zero0)
    f = info.tag_dir / "mp_rank_00_model_states.pt"
    states = torch.load(f, map_location="cpu", weights_only=False)
    seen: dict[int, int] = {}

    def walk(o):
        if isinstance(o, torch.Tensor):
            seen[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
        elif isinstance(o, dict):
            [walk(v) for v in o.values()]
        elif isinstance(o, (list, tuple)):
            [walk(v) for v in o]

    walk(states["optimizer"])
    assert info.zero_stage == 0 and info.optimizer_state_bytes == sum(seen.values()) > 0
    assert info.model_state_bytes == f.stat().st_size - info.optimizer_state_bytes
    assert info.dtypes["master"] == "float32"


@pytest.fixture
def full_tmpfs(tmp_path):
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and mount (a 2 MiB tmpfs)")
    try:
        (mnt / "filler").write_bytes(b"\0" * (1800 * 1024))
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("verb", ["reshard", "export"])
def test_full_disk_is_one_line(hf_zero0, zero3, full_tmpfs, verb):
    out = full_tmpfs / "out"
    args = ["reshard", str(zero3), "--out"] if verb == "reshard" else ["export", str(hf_zero0), "--hf"]
    proc = subprocess.run([*CLI, "ckpt", *args, str(out)], env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dstoolkit ckpt {verb}: failed: {out}: no space left on device: the output needs about ")
    assert "Traceback" not in proc.stderr and "check the checkpoint" not in proc.stderr
    assert sorted(p.name for p in full_tmpfs.iterdir()) == ["filler"]
