"""`dstoolkit resolve -o OUT`: an OUT that is a folder (with or without --force), or that lies under a file, is
refused with an error naming the -o value, not an OSError about a temporary file."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main

HF = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "bf16": {"enabled": "auto"}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "in.json"
    p.write_text(json.dumps(HF))
    return p


def resolve(src, out, *flags):
    return main(["resolve", str(src), "--world-size", "8", "--precision", "bf16", "-o", str(out), *flags])


@pytest.mark.parametrize("force", [["--force"], []])
def test_output_folder_is_refused(tmp_path, src, capsys, force):
    out = tmp_path / "dir"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert resolve(src, out, *force) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"dstoolkit resolve: error: -o {out} is a folder, not a file: give the path of the config "
                            f"file to write, e.g. {out}/ds_config.json\n")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]  # nothing written, no temporary file left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "in.json"]


def test_output_under_a_file_is_refused(tmp_path, src, capsys):
    out = tmp_path / "in.json" / "sub" / "out.json"
    assert resolve(src, out, "--force") == 2
    assert capsys.readouterr().err == (f"dstoolkit resolve: error: -o {out}: {src} is a file, not a folder, so "
                                       "nothing can be written under it; give a path in a folder\n")


def test_file_in_a_new_folder_is_written(tmp_path, src):
    out = tmp_path / "new" / "sub" / "out.json"
    assert resolve(src, out) == 0
    assert json.loads(out.read_text())["train_batch_size"] == 64
