"""`dstoolkit schema -o DIR` with DIR an existing folder names -o and the fix (dstoolkit.common.atomic's
check_output_path), and writes nothing. Before: "dstoolkit schema: error: DIR is a directory", no flag, no fix."""
from __future__ import annotations

import os

import pytest

from dstoolkit.cli import main

FIX = "is a folder, not a file, so no file can be written in its place; give the path of the file to write (a file " \
      "inside it, or a new name)"


@pytest.mark.parametrize("flag", ["-o", "--out", "--output"])
def test_schema_into_a_folder_names_minus_o_and_the_fix(tmp_path, capsys, flag):
    (tmp_path / "keep.txt").write_text("x")
    assert main(["schema", flag, str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit schema: error: -o {tmp_path}: {FIX}\n"
    assert sorted(os.listdir(tmp_path)) == ["keep.txt"]  # nothing written beside it, no temporary file


def test_schema_to_a_file_in_that_folder_still_writes(tmp_path, capsys):
    out = tmp_path / "deepspeed_config.schema.json"
    assert main(["schema", "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out}\n"
    assert out.read_text().startswith("{")
