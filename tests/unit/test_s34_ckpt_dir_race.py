"""s34 fresh-clone CI (8e2f2c4): tests/dist/test_generated_runs.py[tiny_moe_cpu-zero2-ep] failed once with
'--checkpoint-dir checkpoints: is a file, not a folder' in an empty folder. Every rank ran check_output_paths: rank 0's
probe_folder_creation made `checkpoints` and removed it, while rank 1's `exists()` saw it and its `is_dir()` then
did not. Now one stat decides (a folder that vanishes is not a file) and only rank 0 probes."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from dstoolkit.runtime.train import trainer_inputs as ti


def _args(tmp_path, **kw):
    base = dict(metrics_out=str(tmp_path / "m.jsonl"), deepspeed_config=str(tmp_path / "ds.json"),
                spec=str(tmp_path / "s.yaml"), checkpoint_dir=str(tmp_path / "checkpoints"), monitor_dir=None)
    return argparse.Namespace(**{**base, **kw})


def test_a_folder_that_vanishes_between_two_looks_is_not_a_file(tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    real_is_dir = Path.is_dir
    # the other rank's probe removes the folder right after this rank saw it exist
    monkeypatch.setattr(Path, "is_dir", lambda self: False if self.name == "checkpoints" else real_is_dir(self))
    monkeypatch.setattr(Path, "exists", lambda self: True if self.name == "checkpoints" else os.path.exists(self))
    ti.check_output_paths(_args(tmp_path))  # was: UsageError '... is a file, not a folder'


def test_a_real_file_is_still_refused(tmp_path):
    (tmp_path / "checkpoints").write_text("x")
    with pytest.raises(ti.UsageError, match="--checkpoint-dir .*checkpoints: is a file, not a folder"):
        ti.check_output_paths(_args(tmp_path))


def test_only_rank_0_probes_folder_creation(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(ti, "probe_folder_creation", lambda folder, name: made.append(folder))
    monkeypatch.setenv("RANK", "1")
    ti.check_output_paths(_args(tmp_path))
    assert made == []
    monkeypatch.setenv("RANK", "0")
    ti.check_output_paths(_args(tmp_path))
    assert Path(tmp_path / "checkpoints") in made
