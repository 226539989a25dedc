"""An output folder that cannot be created is one line, exit 2, before any rank starts (s33 ckpt finding 5).
Before: `--checkpoint-dir /proc/x` or `--metrics-out /proc/x/m.jsonl` passed the pre-flight and every rank died with
a FileNotFoundError traceback (exit 1)."""
from __future__ import annotations

import pytest

from dstoolkit.cli import main


def _train(repo_root, *extra, metrics="m.jsonl"):
    return main(["train", "--spec", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--config",
                 str(repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"), "--steps", "2",
                 "--metrics-out", metrics, "--dry-run", "--", *extra])


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--monitor-dir"])
def test_an_output_folder_that_cannot_be_made(repo_root, tmp_path, capsys, flag):
    rc = _train(repo_root, flag, "/proc/x/y", metrics=str(tmp_path / "m.jsonl"))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{flag} /proc/x/y: cannot create the folder /proc/x (" in err and "give a path where you can" in err


def test_a_metrics_folder_that_cannot_be_made(repo_root, capsys):
    rc = _train(repo_root, metrics="/proc/x/m.jsonl")
    err = capsys.readouterr().err
    assert rc == 2 and "--metrics-out /proc/x/m.jsonl: cannot create the folder /proc/x (" in err, err


def test_the_probe_leaves_nothing_behind(repo_root, tmp_path, capsys):
    assert _train(repo_root, "--checkpoint-dir", str(tmp_path / "a" / "b"), metrics=str(tmp_path / "n" / "m.jsonl")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []
