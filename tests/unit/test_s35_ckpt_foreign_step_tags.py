"""s35 ckpt finding 2: step_* tag folders saved by a loop of one's own (engine.save_checkpoint(dir, tag="step_2"),
no dstoolkit manifest anywhere) were shown as a plain DeepSpeed checkpoint, 'complete yes', without a word that the
trainer's manifest is absent, so nothing was verified beyond the zip archives, and that `dstoolkit train --resume`
refuses the folder (its pre-flight takes every step_* tag without a manifest for an unfinished save). Now inspect
says both (CheckpointInfo.manifest_absent, a `manifest     none: ...` line and a note). A folder the trainer made
(a tag there has its manifest) keeps the trainer's rule: a tag missing its manifest is incomplete (1b37299).
A real 2-rank save of such a folder: tests/dist/test_s35_ckpt_offload_reoffload.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.cli import main

pytest.importorskip("torch")

ABSENT = ("none: no step_* tag here has dstoolkit_manifest.json, so these are DeepSpeed tags saved outside `dstoolkit "
          "train` and file sizes and SHA-256 cannot be verified; checked instead: each torch file's zip end record and "
          "CRC, and that every rank's file is there")


def _user_dir(tmp_path: Path, tag: str = "step_2") -> Path:
    """A user's loop's checkpoint root: `tag`/ (a ZeRO-2 tag of 2 ranks, no manifest) and `latest` naming it."""
    from tests.unit.test_ckpt_fuzz_inspect import TAG, _zero2

    root = _zero2(tmp_path / "user")
    (root / TAG).rename(root / tag)
    (root / "latest").write_text(tag)
    return root


def _note(root: Path, tag: str) -> str:
    return (f"`dstoolkit train --resume` does not load {tag}: it resumes only the step_* tags it saved, each with "
            f"its dstoolkit_manifest.json, and takes these for unfinished saves. Load it with DeepSpeed's "
            f"engine.load_checkpoint({str(root)!r}, tag={tag!r}) in your own loop, or `dstoolkit ckpt export` / "
            "`reshard` it")


@pytest.mark.parametrize("given", ["root", "tag"])
def test_step_tags_without_any_manifest_are_deepspeed_tags_said_unverified(tmp_path, given):
    root = _user_dir(tmp_path)
    info = inspect_checkpoint(root if given == "root" else root / "step_2")
    assert (info.format, info.tag, info.step, info.dp, info.zero_stage) == ("deepspeed-zero", "step_2", 3, 2, 2)
    assert info.complete and info.problems == []
    assert info.manifest_verified is None and info.manifest_absent == ABSENT
    assert info.notes == [_note(root, "step_2")]


def test_screen_and_json_of_a_users_step_tag(tmp_path, capsys):
    root = _user_dir(tmp_path, "step_00000100")  # even the trainer's own 8-digit form
    assert main(["ckpt", "inspect", str(root)]) == 0
    out = capsys.readouterr().out
    assert "  format       deepspeed-zero\n" in out
    assert f"  manifest     {ABSENT}\n" in out
    assert f"  note         {_note(root, 'step_00000100')}\n" in out and out.endswith("  complete     yes\n")
    assert main(["ckpt", "inspect", str(root), "--no-crc", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["manifest_absent"] == ABSENT.replace("zip end record and CRC", "zip end record (CRC skipped: --no-crc)")
    assert d["manifest_verified"] is None and d["resume_tag"] is None


def test_deepspeed_default_tags_get_no_manifest_line(tmp_path):
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    info = inspect_checkpoint(_zero2(tmp_path / "ds"))  # global_step3: DeepSpeed's own naming, nothing to say
    assert info.manifest_absent is None and info.notes == [] and info.complete


def test_a_trainer_folder_keeps_the_trainers_rule(tmp_path):
    """One tag with its manifest marks the folder as the trainer's: a step_* tag there without one is incomplete
    (the save did not finish), not a user's tag."""
    from tests.unit.test_ckpt_fuzz_inspect import TAG, _zero2

    root = tmp_path / "ck"
    root.mkdir()
    for step, manifest in ((3, True), (6, False)):
        src = _zero2(tmp_path / f"src{step}", manifest=manifest)
        shutil.move(str(src / TAG), str(root / f"step_{step:08d}"))
    (root / "latest").write_text("step_00000006")
    info = inspect_checkpoint(root)
    assert info.format == "dstoolkit-trainer" and not info.complete and info.manifest_absent is None
    assert [p.problem for p in info.problems] == ["is missing: the save did not finish (the trainer writes it last)"]


def test_the_trainer_names_its_tags_with_the_prefix_inspect_tells_apart():
    """The trainer imports its tag prefix from ckpt.names (one owner); the tags it names start with it."""
    from dstoolkit.ckpt.names import TRAINER_TAG_PREFIX
    from dstoolkit.runtime.train.ckpt import tag_for

    assert tag_for(100) == f"{TRAINER_TAG_PREFIX}00000100"
