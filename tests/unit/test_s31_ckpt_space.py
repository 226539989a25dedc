"""A disk that fills while `ckpt export` / `ckpt reshard` write (s31 finding 7): one line naming the output, "no
space left on device" and about how many bytes the output needs; exit 1; no partial output left.

Before: export printed a full traceback ending in `SafetensorError: ... No space left on device (os error 28)`;
reshard said "DeepSpeed's ds_to_universal failed: RuntimeError: [enforce fail at inline_container.cc:672] ...
unexpected pos ...; check the checkpoint with `dstoolkit ckpt inspect`", blaming the (healthy) source. torch's zip
writer turns ENOSPC into that RuntimeError, so a full filesystem is also recognised by what shutil.disk_usage
says after the failure (faked here; a real 2 MiB tmpfs: tests/dist/test_s31_ckpt_real.py).
"""
from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from dstoolkit.cli import main

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

Usage = namedtuple("Usage", "total used free")
TORCH_ENOSPC = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}"))


def _converter(monkeypatch, exc: BaseException) -> None:
    from deepspeed.checkpoint import ds_to_universal

    def convert(args):
        Path(args.output_folder, "tmp").mkdir(parents=True)
        Path(args.output_folder, "tmp", "slice.pt").write_bytes(b"x" * 1000)
        raise exc

    monkeypatch.setattr(ds_to_universal, "main", convert)


def _full_disk(monkeypatch, free: int = 4096) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(2 << 20, (2 << 20) - free, free))


def test_reshard_full_disk_names_the_output_and_the_bytes(tmp_path, monkeypatch, capsys):
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    from dstoolkit.ckpt.inspect import inspect_checkpoint

    ck = _zero2(tmp_path / "ck")
    info = inspect_checkpoint(ck)
    needs = int(info.model_state_bytes + 2.5 * info.optimizer_state_bytes)
    _converter(monkeypatch, RuntimeError(TORCH_ENOSPC))
    _full_disk(monkeypatch)
    out = tmp_path / "uni"
    assert main(["ckpt", "reshard", str(ck), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"dstoolkit ckpt reshard: failed: {out}: no space left on device: the output needs about "
                   f"{needs:,} bytes ({needs / 2**20:.1f} MiB), the filesystem of {tmp_path} has 4,096 bytes "
                   "(0.0 MiB) free (the partial output removed); nothing was written: free the space, or give "
                   "--out a folder on a larger filesystem")
    assert not out.exists() and _siblings(out) == []


def test_reshard_enospc_anywhere_in_the_chain_is_a_full_disk(tmp_path, monkeypatch, capsys):
    """ENOSPC itself (a quota, say, with the filesystem not full) is recognised too."""
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    _converter(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    out = tmp_path / "uni"
    assert main(["ckpt", "reshard", str(_zero2(tmp_path / "ck")), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out}: no space left on device: the output needs about" in err and len(err.splitlines()) == 1
    assert "check the checkpoint" not in err and not out.exists() and _siblings(out) == []


def test_reshard_other_converter_failure_still_names_the_converter(tmp_path, monkeypatch, capsys):
    """Plenty of space: DeepSpeed's own failure is reported as before (exit 2), and nothing is left."""
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    _converter(monkeypatch, KeyError("param_slice_mappings"))
    out = tmp_path / "uni"
    assert main(["ckpt", "reshard", str(_zero2(tmp_path / "ck")), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "DeepSpeed's ds_to_universal failed: KeyError: 'param_slice_mappings'" in err
    assert "no space" not in err and not out.exists() and _siblings(out) == []


def test_export_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    import safetensors
    from tests.unit.test_ckpt_fuzz_export import _zero0

    ck, masters = _zero0(tmp_path / "ck")

    def save_file(sd, path, metadata=None):
        Path(path).write_bytes(b"x" * 1000)
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(st, "save_file", save_file)
    out = tmp_path / "hf"
    assert main(["ckpt", "export", str(ck), "--hf", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    needs = sum(m.numel() * 4 for m in masters.values()) + 2**16  # fp32 weights + room for the header and config
    assert err.startswith(f"dstoolkit ckpt export: failed: {out}: no space left on device: the output needs about "
                          f"{needs:,} bytes")
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "give --hf a folder" in err
    assert not out.exists() and _siblings(out) == []
