"""A --resume of another model's checkpoint on 2 real gloo ranks (s33 ckpt finding 4c): a TinyTransformer ZeRO-2
checkpoint resumed by a --shrink llama run is one line naming the first differing parameter, exit 2, and leaves no
llama config.json beside the TinyTransformer tags (before: ~30 KB of load_state_dict missing / unexpected keys per
rank with tracebacks, and `setup()` had already written config.json). The same model resumes (the manifest's "run", written
from the real engine, matches the engine that reads it: no false refusal)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstoolkit.runtime.cpu_precision import precision_for_this_cpu

pytestmark = pytest.mark.dist

RUN_TIMEOUT_S = 300


def test_resume_of_another_models_checkpoint_is_one_line_and_writes_nothing(tmp_path, repo_root):
    precision = precision_for_this_cpu("bf16")
    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text().replace(
        "  precision: bf16\n", f"  precision: {precision}\n")
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(text)
    llama = tmp_path / "llama.yaml"
    llama.write_text(text.replace("preset: tiny", f"hf_config: {repo_root / 'tests/golden/hf_configs/llama-3.2-1b.json'}"))
    ds = json.loads((repo_root / "ds_configs/generated/tiny_cpu/zero2/ds_config.json").read_text())
    ds["bf16"]["enabled"] = precision == "bf16"
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    ck = tmp_path / "ck"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def train(spec: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dstoolkit", "train", "--spec", str(spec), "--config",
                               str(tmp_path / "ds.json"), "--steps", str(steps), "--nproc", "2", "--metrics-out", str(tmp_path / "m.jsonl"), "--",
                               "--checkpoint-dir", str(ck), "--no-progress", *extra],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)

    first = train(tiny, 2)
    assert first.returncode == 0, first.stderr[-3000:]
    before = sorted(p.name for p in ck.iterdir())
    other = train(llama, 4, "--shrink", "auto", "--resume")
    # each rank refuses (exit 2) before DeepSpeed's load; torchrun reports its children's failure as its own exit 1
    # (the pre-flight builds no model, so it cannot compare parameters before the ranks start); rank 0 says it, once
    # (s35: each rank printed it; trainer.say_usage_error)
    assert other.returncode == 1, other.stderr[-3000:]
    assert other.stderr.count("--resume would load step_00000002, saved from another model: parameter ") == 1
    assert "exitcode  : 2" in other.stderr and "Missing key(s)" not in other.stderr
    assert sorted(p.name for p in ck.iterdir()) == before and not (ck / "config.json").exists()
    same = train(tiny, 3, "--resume")
    assert same.returncode == 0, same.stderr[-3000:]
    assert "resumed from step_00000002" in same.stderr
