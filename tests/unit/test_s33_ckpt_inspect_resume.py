"""`dstoolkit ckpt inspect` of a `dstoolkit train` --checkpoint-dir agrees with what `--resume` loads (s33 findings 7
and 9's fallback).

Before: (a) with `latest` naming an older tag (the usual DeepSpeed way to go back) inspect showed that tag and said
nothing, while `dstoolkit train --resume` loads the newest intact one; (b) a tag without dstoolkit_manifest.json was
"complete yes" although the trainer rejects it ("the save did not finish"): `verify_manifest` applies that rule to
the trainer's format, but inspect called it before the format was known; (9) when the newest tag was incomplete
(exit 1), inspect did not name the older tag --resume falls back to. Now the trainer's own rule and choice are asked
(`manifest.verify_manifest` with the trainer's format; `resume_check.pick_resume` over `CheckpointManager`), and a
note says which tag --resume would load when it is not the one shown.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.cli import main
from dstoolkit.runtime.train.ckpt import CheckpointManager, verify

pytest.importorskip("torch")

MANIFEST = "dstoolkit_manifest.json"


def _trainer_dir(tmp_path: Path) -> Path:
    """A --checkpoint-dir as `dstoolkit train` leaves it: step_00000003/, step_00000006/ (each a ZeRO-2 tag of 2
    ranks with its manifest) and `latest` naming the newest."""
    from tests.unit.test_ckpt_fuzz_inspect import TAG, _zero2

    root = tmp_path / "ck"
    root.mkdir()
    for step in (3, 6):
        src = _zero2(tmp_path / f"src{step}", manifest=True)
        shutil.move(str(src / TAG), str(root / f"step_{step:08d}"))
    (root / "latest").write_text("step_00000006")
    return root


def _inspect(root: Path, capsys, *extra: str) -> tuple[int, str]:
    rc = main(["ckpt", "inspect", str(root), *extra])
    return rc, capsys.readouterr().out


def test_latest_naming_an_older_tag_says_which_tag_resume_loads(tmp_path, capsys):
    root = _trainer_dir(tmp_path)
    (root / "latest").write_text("step_00000003")
    rc, out = _inspect(root, capsys)
    assert rc == 0 and "tag          step_00000003" in out
    assert CheckpointManager(root).latest_valid().tag == "step_00000006"  # the trainer's own choice
    assert ("`dstoolkit train --resume` would load step_00000006 (step 6), not step_00000003: the newest intact tag; "
            f"the trainer does not follow {root / 'latest'}, which names step_00000003") in out
    rc, out = _inspect(root, capsys, "--format", "json")
    assert json.loads(out)["resume_tag"] == "step_00000006"


def test_no_note_when_resume_loads_the_tag_shown(tmp_path, capsys):
    root = _trainer_dir(tmp_path)
    rc, out = _inspect(root, capsys)
    assert rc == 0 and "--resume" not in out and "complete     yes" in out


def test_a_tag_without_its_manifest_is_incomplete_as_the_trainer_says(tmp_path, capsys):
    root = _trainer_dir(tmp_path)
    (root / "step_00000006" / MANIFEST).unlink()
    reason = verify(root / "step_00000006")  # the trainer rejects it
    assert reason is not None and "the save did not finish" in reason
    for given in (root, root / "step_00000006"):  # the root, or the tag folder itself
        info = inspect_checkpoint(given)
        assert not info.complete and info.format == "dstoolkit-trainer"
        (problem,) = info.problems
        assert problem.file == str(root / "step_00000006" / MANIFEST)
        assert problem.problem == "is missing: the save did not finish (the trainer writes it last)"
    rc, out = _inspect(root, capsys)
    assert rc == 1
    assert "manifest     NOT VERIFIED: dstoolkit_manifest.json is missing" in out
    assert ("`dstoolkit train --resume` would load step_00000003 (step 3), not step_00000006: it skips what is not "
            "intact (step_00000006: the problems below)") in out


def test_an_incomplete_newest_tag_names_the_tag_resume_falls_back_to(tmp_path, capsys):
    root = _trainer_dir(tmp_path)
    f = root / "step_00000006" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[:100])
    rc, out = _inspect(root, capsys)
    assert rc == 1 and "`dstoolkit train --resume` would load step_00000003 (step 3)" in out


def test_no_loadable_tag_is_said(tmp_path, capsys):
    root = _trainer_dir(tmp_path)
    for tag in ("step_00000003", "step_00000006"):
        f = root / tag / "mp_rank_00_model_states.pt"
        f.write_bytes(f.read_bytes()[:100])
    rc, out = _inspect(root, capsys)
    assert rc == 1 and "`dstoolkit train --resume` would load no checkpoint from here: " in out
    assert "found no checkpoint it can load (2 rejected" in out
