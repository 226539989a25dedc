"""`ckpt reshard --out` / `ckpt export --hf` into a place the checks pass but no folder can be made (s33 finding 6).

Before: `/proc/x` and `/sys/x` (writable by os.access as root, yet no folder can be made there) failed in
`atomic_output_folder`'s mkdtemp, and the message named the internal temporary folder
(`/proc/.x.dstoolkit-partial-<host>-<pid>-<random>: No such file or directory`), with no fix. Now it is the shared
`dstoolkit.common.atomic.OutputWriteError` wording: the flag and the path the user gave, the OS's reason, the fix.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dstoolkit.runtime.ckpt.outputs import PARTIAL_MARK, atomic_output_folder


def _enter(out: Path, flag: str) -> str:
    with pytest.raises(OSError) as err:
        with atomic_output_folder(out, flag, needs=0):
            pass
    return str(err.value)


def test_a_folder_that_cannot_be_made_names_the_flag_the_path_and_the_fix(tmp_path, monkeypatch):
    import tempfile

    def refuse(prefix="", dir=None, **_):
        raise OSError(errno.EPERM, "Operation not permitted", os.path.join(dir, prefix + "abc"))

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    out = tmp_path / "out"
    msg = _enter(out, "--out")
    assert msg == (f"--out {out}: cannot be written (Operation not permitted); nothing was changed: give a path in a "
                   "folder you can write to")
    assert PARTIAL_MARK not in msg
    assert not out.exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_proc_is_named_as_given(capsys):
    msg = _enter(Path("/proc/x"), "--hf")
    assert msg.startswith("--hf /proc/x: cannot be written (")
    assert "give a path in a folder you can write to" in msg and PARTIAL_MARK not in msg


def test_a_write_refused_inside_the_temporary_folder_names_the_output(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError) as err:
        with atomic_output_folder(out, "--out", needs=0) as tmp:
            raise PermissionError(errno.EACCES, "Permission denied", str(tmp / "zero" / "fp32.pt"))
    assert str(err.value).startswith(f"--out {out}: cannot be written (Permission denied)")
    assert PARTIAL_MARK not in str(err.value)
    assert [p for p in tmp_path.iterdir()] == []  # the temporary folder is removed


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError, match="elsewhere"):
        with atomic_output_folder(tmp_path / "out", "--out", needs=0):
            raise FileNotFoundError(errno.ENOENT, "No such file", str(tmp_path / "elsewhere"))
