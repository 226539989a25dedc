"""An output that cannot be written is refused at the start of each verb with the one wording of
`dstoolkit.common.atomic`, naming the verb's flag, exit 2, no traceback, nothing written.

Before:
- `dstoolkit report RESULTS -o f.json/sub/report.md` printed "error: D/f.json/sub: Not a directory" (its own check
  looked at the immediate parent only; `-o f.json/report.md` had a third wording, "...; pick a report path in a
  folder");
- `dstoolkit bench ... --out f.json/sub/r.jsonl` had its own copy of the check ("...; pick a results path in a
  folder");
- `dstoolkit tune ... --out f.json/t` printed "error: D/f.json/t: Not a directory" after loading the spec, and
  `--out f.json` "exists and is not a folder" (no fix);
- an atomic write to a path that is an existing folder raised a bare IsADirectoryError naming the temporary file
  ("[Errno 21] Is a directory: '.../.folder.x1y2.tmp' -> 'folder'"); a report plot that is a folder printed it.
The ckpt verbs: test_s29_outpaths_ckpt.py.
"""
from __future__ import annotations

import os

import pytest

from dstoolkit.cli import main
from dstoolkit.common.atomic import (OutputIsFolderError, atomic_write_bytes, atomic_write_text, check_output_path,
                                     FileInPathError)
from tests.unit.test_fuzz_fixes_report import _comm, _lines

UNDER_A_FILE = "is a file, not a folder, so nothing can be written under it; give a path in a folder"
A_FOLDER = ("is a folder, not a file, so no file can be written in its place; give the path of the file to write "
            "(a file inside it, or a new name)")


def _tree(root) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for a folder): what "nothing written" compares."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "f.json"
    f.write_text("{}")
    return f


# ---------------------------------------------------------------------------------------------------------------
# atomic.py: a path that is an existing folder


@pytest.mark.parametrize("write", [lambda p: atomic_write_text(p, "x"), lambda p: atomic_write_bytes(p, b"x")])
def test_atomic_write_to_a_folder_is_refused_with_one_message(tmp_path, write):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    before = _tree(tmp_path)
    with pytest.raises(OutputIsFolderError) as info:
        write(folder)
    assert str(info.value) == f"{folder}: {A_FOLDER}"
    assert isinstance(info.value, IsADirectoryError) and info.value.path == folder  # an OSError, as os.replace's
    assert _tree(tmp_path) == before  # the folder as it was, no temporary file beside it


def test_check_output_path_names_the_callers_flag(tmp_path, blocker, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir("out")
    with pytest.raises(OutputIsFolderError, match=r"^-o out: is a folder, not a file, so no file can be written in "
                                                  r"its place; give the path of the file to write \(a file inside it, "
                                                  r"or a new name\)$"):
        check_output_path("out", name="-o out")
    with pytest.raises(FileInPathError, match=rf"^-o f\.json/x: f\.json {UNDER_A_FILE}$"):
        check_output_path("f.json/x", name="-o f.json/x")
    check_output_path("out/new.md")
    check_output_path("f.json")  # an existing file is replaced (the verbs ask --force first)


def test_a_link_to_a_folder_is_still_replaced_not_refused(tmp_path):
    """Guard, passes before the change too: os.replace replaces a link itself, so the folder check skips links."""
    folder = tmp_path / "real"
    folder.mkdir()
    link = tmp_path / "link"
    link.symlink_to(folder, target_is_directory=True)
    atomic_write_text(link, "x")
    assert not link.is_symlink() and link.read_text() == "x" and folder.is_dir() and not any(folder.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# dstoolkit report -o


@pytest.fixture
def results(tmp_path):
    d = tmp_path / "res"
    d.mkdir()
    (d / "comm.jsonl").write_text(_lines(_comm()))
    return d


@pytest.mark.parametrize("below", ["report.md", "sub/report.md", "sub/deeper/report.md"])
def test_report_out_under_a_file(tmp_path, blocker, results, capsys, below):
    out = blocker / below
    before = _tree(tmp_path)
    assert main(["report", str(results), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit report: error: -o {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


def test_report_plot_that_is_a_folder_with_force(tmp_path, results, capsys):
    pytest.importorskip("matplotlib")
    plot = results / "report_comm_busbw.png"
    plot.mkdir()
    before = _tree(tmp_path)
    assert main(["report", str(results), "--force"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err == f"dstoolkit report: error: {plot}: {A_FOLDER}\n"
    assert _tree(tmp_path) == before  # no report.md, no temporary file in the results folder


# ---------------------------------------------------------------------------------------------------------------
# dstoolkit bench --out


@pytest.mark.parametrize("below", ["r.jsonl", "sub/r.jsonl"])
def test_bench_out_under_a_file(tmp_path, blocker, capsys, monkeypatch, below):
    from dstoolkit.runtime.bench import comm

    def no_ranks(opts):
        raise AssertionError("ranks started")

    monkeypatch.setattr(comm, "run_comm", no_ranks)
    out = blocker / below
    before = _tree(tmp_path)
    argv = ["bench", "comm", "--ops", "all_reduce", "--sizes", "1K", "--backend", "gloo", "--out", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit bench: error: --out {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


# ---------------------------------------------------------------------------------------------------------------
# dstoolkit tune --out (a folder)


@pytest.fixture
def no_spec_load(monkeypatch):
    """The --out check comes first: loading the spec (and its space) fails the test."""
    from dstoolkit.tune import study

    def load(opts):
        raise AssertionError("spec loaded before --out was checked")

    monkeypatch.setattr(study, "_load_space", load)


def _tune(repo_root, out):
    return main(["tune", str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml"), "--budget", "1", "--mode", "estimate",
                 "--out", str(out)])


@pytest.mark.parametrize("below", ["t", "sub/t"])
def test_tune_out_under_a_file(tmp_path, blocker, capsys, repo_root, no_spec_load, below):
    out = blocker / below
    before = _tree(tmp_path)
    assert _tune(repo_root, out) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit tune: error: --out {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


def test_tune_out_that_is_a_file(tmp_path, blocker, capsys, repo_root, no_spec_load):
    before = _tree(tmp_path)
    assert _tune(repo_root, blocker) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"dstoolkit tune: error: --out {blocker}: is a file, not a folder; give the study's "
                            "folder (a new one, or the --out of the study to resume)\n")
    assert _tree(tmp_path) == before
