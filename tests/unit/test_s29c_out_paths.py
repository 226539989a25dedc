"""One rule for output paths, in `dstoolkit.common.atomic` (and `runtime/ckpt/outputs.py` for the ckpt folders):
a file output ending with a separator names a folder and is refused; '-' is stdout where a verb supports it (schema)
and refused elsewhere; a dangling link or a folder this user cannot write in is refused before any work, naming the
flag; a write that fails anyway names the target (and the flag), never the temporary file. Exit 2, nothing written.

Before:
- `resolve in.json -o newA/`, `schema -o newB/`, `report res -o newC/` wrote a FILE named newA / newB / newC;
- `schema -o /proc/x.json` -> "error: /proc/.x.json.d9veys9x.tmp: No such file or directory"; a read-only folder:
  resolve -> ".r.json.xxxx.tmp: Operation not permitted", report -> ".r_comm_busbw.png.xxxx.tmp: ...";
- `schema -o -` wrote a file named "-";
- `ckpt export ck --hf rodir/hf` ran the whole reconstruction, then "rodir/hf.partial: Operation not permitted";
  `ckpt export --hf dangling` converted, then "dangling.partial: Not a directory"; `ckpt reshard ck -o dangling`
  loaded the tensors, then "dangling: File exists".
"""
from __future__ import annotations

import errno
import json

import pytest

from dstoolkit.cli import main
from dstoolkit.common import atomic
from tests.unit.test_fuzz_fixes_report import _comm, _lines
from tests.unit.test_s29_outpaths_ckpt import no_conversion, zero0, zero2  # noqa: F401  (fixtures)
from tests.unit.test_s29c_out_helpers import read_only, tree  # noqa: F401  (read_only: a fixture)

UNWRITABLE = ("is not writable by this user (permissions, a read-only filesystem, an immutable flag), so nothing can "
              "be written there; give a path you can write to")
DANGLING = "which does not exist, so writing there would not make what was asked; remove the link, or give another path"
AUTO_JSON = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto", "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}


@pytest.fixture
def work(tmp_path, monkeypatch):
    """tmp_path as the working folder, holding a config with "auto" values and a results folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.json").write_text(json.dumps(AUTO_JSON))
    (tmp_path / "res").mkdir()
    (tmp_path / "res" / "comm.jsonl").write_text(_lines(_comm()))
    return tmp_path


def _resolve(out, *extra):
    return main(["resolve", "in.json", "-o", out, "--world-size", "2", *extra])


def _schema(out):
    return main(["schema", "-o", out])


def _report(out):
    pytest.importorskip("matplotlib")
    return main(["report", "res", "-o", out])


# ---------------------------------------------------------------------------------------------------------------
# a trailing separator names a folder


@pytest.mark.parametrize("verb,run,suggest", [
    ("resolve", _resolve, "ds_config.json"),
    ("schema", _schema, "deepspeed_config.schema.json"),
    ("report", _report, "report.md"),
])
def test_file_output_ending_with_a_separator_is_refused(work, capsys, verb, run, suggest):
    before = tree(work)
    assert run("newA/") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"dstoolkit {verb}: error: -o newA/: ends with '/', so it names a folder, not a file; "
                            f"give the path of the file to write, e.g. newA/{suggest}\n")
    assert tree(work) == before  # no file named newA


def test_atomic_write_to_a_path_ending_with_a_separator(tmp_path):
    with pytest.raises(atomic.FolderPathError) as info:
        atomic.atomic_write_text(f"{tmp_path}/new/", "x")
    assert str(info.value) == (f"{tmp_path}/new/: ends with '/', so it names a folder, not a file; give the path of "
                               "the file to write (a file inside it, or the name without the '/')")
    assert isinstance(atomic.FolderPathError(tmp_path), IsADirectoryError)
    assert tree(tmp_path) == {}


def test_folder_outputs_take_a_trailing_separator(tmp_path):
    """Guard: where the output is a folder, new/ is that folder (ckpt, tune, generate)."""
    atomic.check_output_folder(f"{tmp_path}/new/", name="--hf new/")
    atomic.check_output_parents(f"{tmp_path}/new/")


# ---------------------------------------------------------------------------------------------------------------
# '-'


def test_schema_dash_is_stdout(work, capsys):
    assert _schema("-") == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["$schema"].startswith("https://json-schema.org/")
    assert not (work / "-").exists()


@pytest.mark.parametrize("verb,run", [("resolve", _resolve), ("report", _report)])
def test_dash_is_refused_where_stdout_is_not_supported(work, capsys, verb, run):
    before = tree(work)
    assert run("-") == 2
    assert capsys.readouterr().err == (f"dstoolkit {verb}: error: -o -: '-' (stdout) is not supported for this "
                                       "output; give the path of the file to write (./- for a file named '-')\n")
    assert tree(work) == before


def test_dot_slash_dash_is_a_file(work, capsys):
    assert _schema("./-") == 0
    assert (work / "-").is_file()


# ---------------------------------------------------------------------------------------------------------------
# unwritable folders and dangling links: refused before any work


@pytest.mark.parametrize("verb,run,name", [
    ("resolve", _resolve, "r.json"),
    ("schema", _schema, "s.json"),
    ("report", _report, "r.md"),
])
@pytest.mark.parametrize("below", ["", "sub/"])
def test_file_output_in_a_read_only_folder(work, capsys, read_only, verb, run, name, below):
    (work / "rodir").mkdir()
    read_only(work / "rodir")
    before = tree(work)
    assert run(f"rodir/{below}{name}") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit {verb}: error: -o rodir/{below}{name}: the folder rodir {UNWRITABLE}\n"
    assert tree(work) == before


@pytest.mark.parametrize("verb,run,name", [("resolve", _resolve, "r.json"), ("schema", _schema, "s.json")])
def test_file_output_that_is_a_dangling_link(work, capsys, verb, run, name):
    (work / name).symlink_to("gone/x.json")
    before = tree(work)
    assert run(name) == 2
    assert capsys.readouterr().err == (f"dstoolkit {verb}: error: -o {name}: is a link to gone/x.json, {DANGLING}\n")
    assert tree(work) == before


def test_resolve_checks_the_output_before_the_work(work, capsys, read_only, monkeypatch):
    """resolve refuses before it reads CONFIG: the filled values are never computed."""
    from dstoolkit.cli import resolve

    monkeypatch.setattr(resolve, "resolve_auto", lambda *a, **k: pytest.fail("resolved before -o was checked"))
    (work / "rodir").mkdir()
    read_only(work / "rodir")
    assert _resolve("rodir/r.json") == 2


# ---------------------------------------------------------------------------------------------------------------
# a write that fails anyway names the target, not its temporary file


def test_a_failed_write_names_the_target_and_the_flag(work, capsys, monkeypatch):
    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", no_space)  # the disk filled while the temporary file was written
    assert _schema("s.json") == 2
    assert capsys.readouterr().err == ("dstoolkit schema: error: -o s.json: cannot be written (No space left on "
                                       "device); nothing was changed: give a path in a folder you can write to\n")
    assert sorted(p.name for p in work.iterdir()) == ["in.json", "res"]  # no temporary file left


def test_schema_into_proc(capsys):
    """/proc refuses new files even to root (os.access says it is writable): the write's error, naming -o."""
    import os

    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    assert _schema("/proc/x.json") == 2
    err = capsys.readouterr().err
    assert err.startswith("dstoolkit schema: error: -o /proc/x.json: "), err
    assert ".tmp" not in err, err
    as_root = err.endswith("cannot be written (No such file or directory); nothing was changed: give a path in a "
                           "folder you can write to\n")
    assert as_root or err.endswith(f"the folder /proc {UNWRITABLE}\n"), err


def test_atomic_write_error_is_an_oserror_naming_the_target(tmp_path, monkeypatch):
    def fail(*a, **k):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(tmp_path / ".r.json.x1y2.tmp"))

    monkeypatch.setattr(atomic.os, "replace", fail)
    with pytest.raises(atomic.OutputWriteError) as info:
        atomic.atomic_write_text(tmp_path / "r.json", "x")
    assert str(info.value) == (f"{tmp_path / 'r.json'}: cannot be written (Operation not permitted); nothing was "
                               "changed: give a path in a folder you can write to")
    assert isinstance(info.value, OSError) and info.value.errno == errno.EPERM
    assert info.value.filename == str(tmp_path / "r.json")
    assert tree(tmp_path) == {}


# ---------------------------------------------------------------------------------------------------------------
# ckpt export --hf / reshard --out


@pytest.mark.parametrize("below", ["hf", "sub/hf"])
def test_export_into_a_read_only_folder(tmp_path, zero0, capsys, read_only, no_conversion, below):  # noqa: F811
    ro = tmp_path / "rodir"
    ro.mkdir()
    read_only(ro)
    before = tree(tmp_path)
    assert main(["ckpt", "export", str(zero0), "--hf", str(ro / below)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit ckpt export: error: --hf {ro / below}: the folder {ro} {UNWRITABLE}\n"
    assert tree(tmp_path) == before


def test_reshard_into_a_read_only_folder(tmp_path, zero2, capsys, read_only, no_conversion):  # noqa: F811
    ro = tmp_path / "rodir"
    ro.mkdir()
    read_only(ro)
    before = tree(tmp_path)
    assert main(["ckpt", "reshard", str(zero2), "--out", str(ro / "u")]) == 2
    assert capsys.readouterr().err == f"dstoolkit ckpt reshard: error: --out {ro / 'u'}: the folder {ro} {UNWRITABLE}\n"
    assert tree(tmp_path) == before


@pytest.mark.parametrize("verb,flag,fixture", [("export", "--hf", "zero0"), ("reshard", "--out", "zero2")])
@pytest.mark.parametrize("below", ["", "/sub/out"])
def test_ckpt_output_that_is_a_dangling_link(tmp_path, capsys, request, no_conversion,  # noqa: F811
                                              verb, flag, fixture, below):
    src = request.getfixturevalue(fixture)
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    before = tree(tmp_path)
    out = f"{link}{below}"
    assert main(["ckpt", verb, str(src), flag, out]) == 2
    where = "is" if not below else f"{link} is"
    assert capsys.readouterr().err == (f"dstoolkit ckpt {verb}: error: {flag} {out}: {where} a link to "
                                       f"{tmp_path / 'nowhere'}, {DANGLING}\n")
    assert tree(tmp_path) == before
