"""Finding 15 of the s32 review (the runtime nits): the full-disk fix names how many checkpoints are kept in words
that read for both callers ("keep fewer checkpoints (a lower --keep-checkpoints)" / "(a lower Guard(keep=...))",
not "(keep=)"), and resume_check.py has no third blank line between top-level definitions (flake8 E303)."""
from __future__ import annotations

import errno
from pathlib import Path

import dstoolkit.runtime.train.resume_check as resume_check
from dstoolkit.runtime.train.ckpt import save_failure_message
from dstoolkit.runtime.train.names import CLI, GUARD


def test_full_disk_fix_reads_for_the_cli_and_for_guard(tmp_path):
    err = OSError(errno.ENOSPC, "No space left on device")
    final, staged = tmp_path / "step_00000002", tmp_path / ".staging" / "step_00000002"
    cli = save_failure_message(final, staged, err, CLI)
    guard = save_failure_message(final, staged, err, GUARD)
    assert "keep fewer checkpoints (a lower --keep-checkpoints), or give --checkpoint-dir" in cli
    assert "keep fewer checkpoints (a lower Guard(keep=...)), or give checkpoint_dir" in guard
    assert "(keep=)" not in guard


def test_resume_check_has_no_extra_blank_line():
    assert "\n\n\n\n" not in Path(resume_check.__file__).read_text()
