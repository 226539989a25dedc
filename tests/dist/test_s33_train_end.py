"""A real generated launch.sh with its default SAVE_EVERY (s33 ckpt findings 3 and 8): a 3-step run leaves a
checkpoint of step 3 (before: none, and --resume restarted from step 0), and a --resume with --steps 3 says in one
line that there is nothing to train, exit 0, with strict JSON in the metrics file (before: `"final_loss": NaN`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.cpu_precision import precision_for_this_cpu
from dstoolkit.runtime.train.launch import free_port

pytestmark = pytest.mark.dist

RUN_TIMEOUT_S = 300


def _strict(path: Path) -> list[dict]:
    def no_constant(c):
        raise ValueError(f"{path}: {c} is not JSON")

    return [json.loads(line, parse_constant=no_constant) for line in path.read_text().splitlines() if line.strip()]


def test_default_launch_saves_at_the_end_and_resume_at_the_end_says_so(tmp_path, repo_root):
    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text()
    spec = tmp_path / "tiny_cpu.yaml"
    spec.write_text(text.replace("  precision: bf16\n", f"  precision: {precision_for_this_cpu('bf16')}\n"))
    assert main(["generate", str(spec), "--out", str(tmp_path / "gen")]) == 0
    script = tmp_path / "gen" / "zero2" / "launch.sh"
    assert 'SAVE_EVERY="${SAVE_EVERY:-1000}"' in script.read_text()  # the default the finding was about
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "STEPS": "3", "CKPT_DIR": str(ckpt), "METRICS_OUT": str(tmp_path / "m.jsonl")}

    def launch(*extra):
        return subprocess.run(["bash", str(script), "--no-progress", *extra], cwd=tmp_path,
                              env={**env, "MASTER_PORT": str(free_port())}, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)

    first = launch()
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000003"]
    again = launch("--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step_00000003 is already at step 3 >= --steps 3: nothing to train" in again.stderr
    rows = _strict(tmp_path / "m.jsonl")
    done = [r for r in rows if r.get("event") == "done"]
    assert [d["steps"] for d in done] == [3, 3] and done[-1]["final_loss"] is None
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_00000003"]  # nothing saved again
