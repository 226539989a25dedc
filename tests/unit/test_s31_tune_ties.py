"""`tune --mode estimate` breaks estimate ties as `sweep` does: the simpler layout wins (fuzz s31 #14: before, ties
went to the alphabetically first label, and tiny_cpu's best was ZeRO-1 with CPU optimizer offload, which estimates
the same tokens/s as ZeRO-1 without it)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.sweep_explain import simplicity_key, tie_groups

REPO = Path(__file__).resolve().parents[2]


def test_simplicity_orders_offload_micro_batch_stage_and_model_parallelism():
    plain = Candidate(zero_stage=1, micro_batch=4)
    assert simplicity_key(plain) < simplicity_key(Candidate(zero_stage=1, micro_batch=4, offload_optimizer=True))
    assert simplicity_key(plain) < simplicity_key(Candidate(zero_stage=1, micro_batch=2))
    assert simplicity_key(plain) < simplicity_key(Candidate(zero_stage=2, micro_batch=4))
    assert simplicity_key(plain) < simplicity_key(Candidate(zero_stage=1, micro_batch=4, tp=2))
    assert tie_groups([9777.4, 9781.0, 9830.0]) == [0, 0, 1]  # one relative-tolerance rule (0.5% of the leader)


def test_tune_estimate_mode_picks_the_simpler_of_tied_layouts(tmp_path):
    out = tmp_path / "t"
    p = subprocess.run([sys.executable, "-m", "dstoolkit", "tune", str(REPO / "ds_configs" / "tiny_cpu.yaml"),
                        "--mode", "estimate", "--budget", "3", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    best = json.loads((out / "best_ds_config.json").read_text())
    assert "offload_optimizer" not in best["zero_optimization"]
    assert "best: trial #0 zero1 tp1 pp1 mb4 ckpt=none" in p.stdout
