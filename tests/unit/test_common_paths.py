"""common.paths.input_file_problem: one wording, every verb, for an input path that is not a file."""
from __future__ import annotations

import os

import pytest

from dstoolkit.common.paths import input_file_problem


def test_a_file_a_folder_a_missing_path_and_a_fifo(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("model: tiny\n")
    assert input_file_problem(f) is None
    assert input_file_problem(str(f)) is None
    assert input_file_problem(tmp_path) == "is a folder, not a file"
    assert input_file_problem(tmp_path / "nope.yaml") == "no such file"
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert input_file_problem(fifo) == "is not a regular file"
