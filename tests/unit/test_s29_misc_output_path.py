"""An output under a path part that is a file (`-o notes.json/out.json`) is refused by `dstoolkit.common.atomic` with
one message naming that part and the fix, before anything is written.

Before, atomic_write_bytes's mkdir raised the bare OSError: `dstoolkit schema -o f.json/out.json` printed
"dstoolkit schema: error: f.json: File exists", and `-o f.json/sub/out.json` "f.json/sub: Not a directory";
`dstoolkit resolve` had its own copy of the check and the wording (now it asks atomic's, to name -o early).
"""
import os

import pytest

from dstoolkit.cli import main
from dstoolkit.common.atomic import FileInPathError, atomic_write_text, check_output_parents, file_in_path

TAIL = "is a file, not a folder, so nothing can be written under it; give a path in a folder"


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "f.json"
    f.write_text("{}")
    return f


@pytest.mark.parametrize("below", ["out.json", "sub/out.json", "sub/deeper/out.json"])
def test_atomic_write_names_the_file_in_the_path(tmp_path, blocker, below):
    out = blocker / below
    with pytest.raises(FileInPathError) as info:
        atomic_write_text(out, "x")
    assert str(info.value) == f"{out}: {blocker} {TAIL}"
    assert isinstance(info.value, NotADirectoryError)  # an OSError still, as the write itself would raise
    assert (info.value.path, info.value.blocker) == (out, blocker)
    assert blocker.read_text() == "{}" and sorted(os.listdir(tmp_path)) == ["f.json"]  # nothing written, no temp


def test_relative_path_and_the_callers_name(tmp_path, blocker, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert file_in_path("f.json/a/b.json") == blocker.relative_to(tmp_path)
    assert file_in_path("new/a/b.json") is None and file_in_path("b.json") is None
    with pytest.raises(FileInPathError, match=r"^-o f\.json/b\.json: f\.json is a file, not a folder, so nothing "
                                              r"can be written under it; give a path in a folder$"):
        check_output_parents("f.json/b.json", name="-o f.json/b.json")
    assert atomic_write_text("new/a/b.json", "x").read_text() == "x"  # missing folders are still created


@pytest.mark.parametrize("below", ["out.json", "sub/out.json"])
def test_schema_verb_prints_the_message_and_exits_2(tmp_path, blocker, capsys, below):
    out = blocker / below
    assert main(["schema", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit schema: error: -o {out}: {blocker} {TAIL}\n"


def test_resolve_names_minus_o_with_the_same_wording(tmp_path, blocker, capsys):
    src = tmp_path / "in.json"
    src.write_text('{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", '
                   '"gradient_accumulation_steps": "auto"}')
    out = blocker / "out.json"
    assert main(["resolve", str(src), "--world-size", "8", "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"dstoolkit resolve: error: -o {out}: {blocker} {TAIL}\n"
