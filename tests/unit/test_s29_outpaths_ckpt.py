"""`dstoolkit ckpt reshard --out` / `ckpt export --hf` under a path part that is a file: refused at the start (before
torch, the checkpoint's tensors or DeepSpeed's converter are touched) with `dstoolkit.common.atomic`'s one wording,
naming the flag, exit 2, nothing written. `to_universal` / `export_hf` called directly refuse it the same way.

Before, both ran the whole conversion and then failed at their mkdir: "error: D/f.json/univ: Not a directory",
"error: D/f.json/hf.partial: Not a directory".
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.common.atomic import FileInPathError

pytest.importorskip("torch")

UNDER_A_FILE = "is a file, not a folder, so nothing can be written under it; give a path in a folder"


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@pytest.fixture
def blocker(tmp_path):
    d = tmp_path / "D"
    d.mkdir()
    f = d / "f.json"
    f.write_text("{}")
    return f


@pytest.fixture
def zero2(tmp_path):
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    return _zero2(tmp_path / "ck")


@pytest.fixture
def zero0(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from tests.unit.test_ckpt_fuzz_export import _zero0

    return _zero0(tmp_path / "ck0")[0]


@pytest.fixture
def no_conversion(monkeypatch):
    """The output check comes first: reaching the converter fails the test."""
    from dstoolkit.runtime.ckpt import export, reshard

    def never(*a, **k):
        raise AssertionError("the checkpoint was read before the output was checked")

    monkeypatch.setattr(reshard, "inspect_checkpoint", never)
    monkeypatch.setattr(export, "inspect_checkpoint", never)


@pytest.mark.parametrize("below", ["univ", "sub/univ"])
def test_reshard_out_under_a_file(tmp_path, blocker, zero2, capsys, below):
    out = blocker / below
    before = _tree(tmp_path)
    assert main(["ckpt", "reshard", str(zero2), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit ckpt reshard: error: --out {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("below", ["hf", "sub/hf"])
def test_export_hf_under_a_file(tmp_path, blocker, zero0, capsys, below):
    out = blocker / below
    before = _tree(tmp_path)
    assert main(["ckpt", "export", str(zero0), "--hf", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit ckpt export: error: --hf {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


def test_library_calls_refuse_before_reading_the_checkpoint(tmp_path, blocker, zero2, no_conversion):
    from dstoolkit.runtime.ckpt.export import export_hf
    from dstoolkit.runtime.ckpt.reshard import to_universal

    before = _tree(tmp_path)
    with pytest.raises(FileInPathError) as info:
        to_universal(zero2, blocker / "u")
    assert str(info.value) == f"--out {blocker / 'u'}: {blocker} {UNDER_A_FILE}"
    with pytest.raises(FileInPathError) as info:
        export_hf(zero2, blocker / "hf")
    assert str(info.value) == f"--hf {blocker / 'hf'}: {blocker} {UNDER_A_FILE}"
    assert _tree(tmp_path) == before
