"""The README's first command, `launch/demo.sh`, end to end on 2 gloo ranks: generate -> validate -> estimate
-> a short real run, with the estimate printed beside the measurement. Here the calibration says bf16 is slow
on this CPU (as on one without native bf16), so the demo must run fp32 from a copy of the spec."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest

from dstoolkit.hardware import calibration as cal
from tests.dist.locks import plant_lock, private_extensions

pytestmark = [pytest.mark.dist, pytest.mark.slow]
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_demo_runs_fp32_when_bf16_is_slow_and_prints_estimate_beside_measurement(tmp_path):
    slow = json.loads(cal.PACKAGED["cpu"].read_text())
    slow["slow_precisions"] = ["bf16"]
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    spec = tmp_path / "spec.yaml"
    shutil.copy(REPO / "ds_configs" / "tiny_cpu.yaml", spec)
    before = spec.read_text()
    env = dict(os.environ, DSTOOLKIT_CALIBRATION=str(tmp_path / "slow.json"), STEPS="3",
               DEMO_OUT_ROOT=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    env["TORCH_EXTENSIONS_DIR"] = str(private_extensions(tmp_path))
    ops = {f"demo_op_{age}_old": age_s for age, age_s in (("second", 1.0), ("minute", 60.0))}
    locks = [plant_lock(op, age_s, root=pathlib.Path(env["TORCH_EXTENSIONS_DIR"])) for op, age_s in ops.items()]
    proc = subprocess.run(["bash", str(REPO / "launch" / "demo.sh"), str(spec)], env=env, capture_output=True,
                          text=True, timeout=600)  # the locks: what a build killed by Ctrl-C leaves
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    for op, lock in zip(ops, locks):  # each removed before the ranks start, with a line naming it
        assert any(f"removed stale torch-extension lock for op {op} ({lock})" in ln for ln in out.splitlines()), op
        assert not lock.exists()
    assert "[demo] bf16 is slow on this CPU" in out and "the demo runs fp32 instead" in out
    assert "ZeRO-2, fp32, micro batch 4 x accum 1, seq 128" in out  # the estimate is of the fp32 run
    assert "[demo] step time: estimated " in out and ", measured " in out
    assert spec.read_text() == before  # the user's spec is not touched
    (copy,) = (tmp_path / "out").glob("*-input/spec.yaml")
    assert "precision: fp32" in copy.read_text()
    (run,) = [p for p in (tmp_path / "out").iterdir() if not p.name.endswith("-input")]
    assert json.loads((run / "zero2" / "ds_config.json").read_text()).get("bf16", {}).get("enabled") is not True
    rows = [json.loads(line) for line in (run / "zero2" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "step_time_s" in r]
    assert len(steps) == 3 and all(r["cpu_time_s"] > 0 for r in steps)
