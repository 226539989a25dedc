"""`dstoolkit ckpt inspect` / `reshard --to` wording (s33 finding 9).

Before: a torch file that GREW (bytes appended, `truncate -s` larger) was called "truncated (N bytes, no zip end
record)", since zipfile looks for the end record in the last 64 KiB only; the header said "manifest SHA-256
MISMATCH" whatever the manifest check found (a missing file, a manifest that is not JSON); and `--to zero=0` got
"'0' is not a positive integer" where zero=4 gets "a universal checkpoint loads into ZeRO stages 1-3 only".
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.ckpt.layout import Target, check_target, parse_target
from dstoolkit.ckpt.torchzip import check_archive
from dstoolkit.cli import main

pytest.importorskip("torch")


def _ck(tmp_path, manifest=True):
    from tests.unit.test_ckpt_fuzz_inspect import TAG, _zero2

    root = _zero2(tmp_path / "ck", manifest=manifest)
    return root, root / TAG


@pytest.mark.parametrize("extra", [100, 200_000])  # inside and beyond the 64 KiB zipfile searches
def test_a_grown_file_is_not_called_truncated(tmp_path, extra):
    root, tag = _ck(tmp_path, manifest=False)
    f = tag / "mp_rank_00_model_states.pt"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size + extra)
    problem = check_archive(f)
    if problem is not None:  # zipfile takes trailing bytes inside its window as a comment-less archive
        assert "truncated" not in problem
        assert problem.startswith(f"has {extra} bytes after its zip end record (at byte {size} of {size + extra}): "
                                  "the file grew after the save")


def test_a_grown_file_with_a_manifest(tmp_path):
    root, tag = _ck(tmp_path)
    f = tag / "mp_rank_00_model_states.pt"
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size + 200_000)
    (problem,) = inspect_checkpoint(root).problems
    assert "truncated" not in problem.problem
    assert problem.problem.endswith(f"is {size + 200_000} bytes, the manifest says {size}")


def test_a_cut_file_is_still_truncated(tmp_path):
    root, tag = _ck(tmp_path, manifest=False)
    f = tag / "mp_rank_00_model_states.pt"
    f.write_bytes(f.read_bytes()[:-30])
    assert check_archive(f).startswith(f"is truncated ({f.stat().st_size} bytes, no zip end record)")


def _header(root, capsys) -> str:
    assert main(["ckpt", "inspect", str(root)]) == 1
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  manifest ")]
    return line.split(None, 1)[1]


def test_the_manifest_header_names_what_was_found(tmp_path, capsys):
    root, tag = _ck(tmp_path)
    mpath = tag / "dstoolkit_manifest.json"
    good = mpath.read_text()
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert _header(root, capsys) == "NOT VERIFIED: 1 file missing"
    mpath.write_text("{not json")
    assert _header(root, capsys) == "NOT VERIFIED: dstoolkit_manifest.json is not valid JSON"
    files = json.loads(good)["files"]
    files.pop("zero_pp_rank_1_mp_rank_00_optim_states.pt")
    files["mp_rank_00_model_states.pt"]["sha256"] = "0" * 64
    mpath.write_text(json.dumps({"format": 1, "files": files}))
    assert _header(root, capsys) == "NOT VERIFIED: 1 file failing SHA-256"
    mpath.write_text(json.dumps({"format": 1, "files": []}))
    assert _header(root, capsys) == "NOT VERIFIED: dstoolkit_manifest.json is damaged"


def test_zero_0_gets_the_stages_a_universal_checkpoint_loads_into(tmp_path, capsys):
    assert parse_target("zero=0") == Target(zero=0)

    class Dense:
        tp, pp, ep, num_experts = 1, 1, None, None
    (problem, fix), = check_target(Dense, Target(zero=0))
    assert "a universal checkpoint loads into ZeRO stages 1-3 only" in problem and fix == "resume at zero=1, 2 or 3"
    with pytest.raises(CkptError, match="not a positive integer"):
        parse_target("world=0")
    with pytest.raises(CkptError) as e:
        parse_target("zero=-1")
    assert e.value.fix == "give zero=1, 2 or 3"
