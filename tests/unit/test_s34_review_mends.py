"""s34 review mends (the Guard ones, 3 and 4, are in test_s34_helpers_guard.py): (1) `dstoolkit train -- --metrics X` got past cli.train.VERB_OWNED through argparse's prefix
matching (the trainer's parser took --metrics as --metrics-out); (2) quoted booleans were warnings for DeepSpeed 0.16
too, which read fp16 / bf16 raw ("false" is truthy there); (3) a Guard whose constructor failed after taking the
writer lock kept the folder locked for the life of the process; (4) leaving `with Guard(...)` saved a checkpoint
although the Guard never stepped (an engine already at step 5); (9) a spec finding's field was dropped when its path
was a prefix of a field the message names (training.tp inside training.tp_comm_overlap)."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.cli import main  # noqa: E402
from dstoolkit.validate.findings import Finding  # noqa: E402


@pytest.mark.parametrize("extra", [["--metrics", "x.jsonl"], ["--step", "9"], ["--metrics-o=x.jsonl"]])
def test_abbreviated_trainer_flags_are_refused(repo_root, tmp_path, capsys, extra):
    spec = repo_root / "ds_configs" / "tiny_cpu.yaml"
    cfg = repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"
    rc = main(["train", "--spec", str(spec), "--config", str(cfg), "--steps", "3", "--dry-run",
               "--metrics-out", str(tmp_path / "m.jsonl"), "--", *extra])
    assert rc == 2
    assert f"unrecognized arguments: {' '.join(extra)}" in capsys.readouterr().err


def test_quoted_boolean_is_an_error_for_deepspeed_016(tmp_path, capsys):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "false"},
                             "bf16": {"enabled": True}}))
    assert main(["validate", str(p)]) == 0
    assert "warning[DS102]: fp16.enabled = 'false': a quoted boolean" in capsys.readouterr().out
    assert main(["validate", str(p), "--deepspeed-version", "0.16"]) == 1
    assert "error[DS102]: fp16.enabled = 'false': expected a boolean" in capsys.readouterr().out


def test_field_prefix_of_another_field_is_still_named():
    f = Finding(file="s.yaml", pointer="/training/tp", line=3, column=1, severity="error", code="LY009",
                message="training.tp_comm_overlap needs tp > 1", suggestion=None, path="training.tp")
    assert f.format_text() == "s.yaml:3:1: error[LY009]: training.tp: training.tp_comm_overlap needs tp > 1"
    g = Finding(file="s.yaml", pointer="/training/tp", line=3, column=1, severity="error", code="LY001",
                message="training.tp * training.pp = 1 * 3 = 3 does not divide", suggestion=None, path="training.tp")
    assert g.format_text() == "s.yaml:3:1: error[LY001]: training.tp * training.pp = 1 * 3 = 3 does not divide"
