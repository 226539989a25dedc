"""`dstoolkit tune --force` (a new study in a folder that holds one, or other files) and a resumed study delete or
overwrite only the files tune wrote there, unchanged since: the folder's manifest (.dstoolkit-tune) lists each with its
SHA-256, as `dstoolkit generate`'s does. Anything else they would delete or overwrite is named, exit 2, nothing
changed.

Before: `tune spec.yaml --budget 2 --mode estimate -o . --force` in a folder holding the user's trials/notes.txt and
report.md removed trials/ (shutil.rmtree) and overwrote report.md, exit 0; a resumed study overwrote an edited
best_ds_config.json.
"""
from __future__ import annotations

import shutil

import pytest

from dstoolkit.cli import main
from dstoolkit.tune import TuneInputError, TuneOptions, run_study
MANIFEST_FILE = ".dstoolkit-tune"  # dstoolkit.tune.manifest.MANIFEST_FILE
from dstoolkit.tune.objective import TrialOutcome
from tests.unit.test_s29c_out_helpers import read_only, tree  # noqa: F401  (read_only: a fixture)

pytest.importorskip("optuna")

OUTPUTS = ["best_ds_config.json", "best_spec.yaml", "objective_vs_trial.png", "report.json", "report.md"]


def _tune(repo_root, out, *extra):
    return main(["tune", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--budget", "2", "--mode", "estimate",
                 "-o", str(out), "--no-progress", "--format", "json", *extra])


def _opts(repo_root, out, **kw):
    base = dict(spec_path=repo_root / "ds_configs" / "tiny_cpu.yaml", out_dir=out, budget=2, mode="estimate",
                progress=False)
    base.update(kw)
    return TuneOptions(**base)


def test_force_refuses_to_delete_or_overwrite_the_users_files(repo_root, tmp_path, monkeypatch, capsys):
    """The reported case: -o . --force beside the user's trials/notes.txt and report.md."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trials").mkdir()
    (tmp_path / "trials" / "notes.txt").write_text("my notes")
    (tmp_path / "report.md").write_text("# my report")
    before = tree(tmp_path)
    assert _tune(repo_root, ".", "--force") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("dstoolkit tune: error: --out .: --force would delete or overwrite 2 file(s) dstoolkit "
                            "tune did not write (or that were edited since it wrote them): report.md, "
                            "trials/notes.txt; move them out of the folder, or choose another --out (--force replaces "
                            "only tune's own files)\n")
    assert tree(tmp_path) == before


def test_force_writes_beside_files_it_does_not_touch(repo_root, tmp_path, capsys):
    """--force into a non-empty folder: files at names tune never writes stay as they are."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "spec.yaml").write_text("mine")
    assert _tune(repo_root, out, "--force") == 0
    assert (out / "spec.yaml").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST_FILE, "spec.yaml", "study.db", *OUTPUTS])


def test_force_replaces_a_study_tune_wrote(repo_root, tmp_path, capsys):
    out = tmp_path / "o"
    assert _tune(repo_root, out) == 0
    (out / "notes.txt").write_text("mine")  # a name tune never writes: kept
    assert _tune(repo_root, out, "--objective", "memory", "--force") == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert '"resumed": false' in capsys.readouterr().out


@pytest.mark.parametrize("name", ["best_ds_config.json", "report.md"])
def test_an_edited_output_is_never_overwritten(repo_root, tmp_path, capsys, name):
    out = tmp_path / "o"
    assert _tune(repo_root, out) == 0
    with open(out / name, "a") as fh:
        fh.write("\n# tuned by hand\n")
    capsys.readouterr()
    before = tree(tmp_path)
    assert _tune(repo_root, out, "--budget", "3") == 2  # a resume rewrites the outputs
    assert capsys.readouterr().err == (f"dstoolkit tune: error: --out {out}: {name} was not written by dstoolkit tune "
                                       "or was edited since, and resuming the study would overwrite it: move it out "
                                       "of the folder, then rerun\n")
    assert _tune(repo_root, out, "--objective", "memory", "--force") == 2
    assert capsys.readouterr().err == (f"dstoolkit tune: error: --out {out}: --force would delete or overwrite 1 "
                                       "file(s) dstoolkit tune did not write (or that were edited since it wrote "
                                       f"them): {name}; move them out of the folder, or choose another --out (--force "
                                       "replaces only tune's own files)\n")
    assert tree(tmp_path) == before


def test_resume_rewrites_unedited_outputs(repo_root, tmp_path):
    """Guard: a resumed study still rewrites its own outputs."""
    out = tmp_path / "o"
    first = run_study(_opts(repo_root, out))
    second = run_study(_opts(repo_root, out, budget=3))
    assert second.resumed and second.evaluated == 3 and first.evaluated == 2
    assert '"evaluated": 3' in (out / "report.json").read_text()


def _fake_real_trials(monkeypatch, interrupt_at=None):
    """Real mode without ranks: each trial writes what the trainer would into its folder."""
    from dstoolkit.tune import study

    calls = []

    def fake(space, chk, work_dir, **kw):
        calls.append(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / "ds_config.json").write_text("{}")
        (work_dir / "log.txt").write_text(f"trial {len(calls)}")
        if len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return TrialOutcome(status="ok", value=1000.0 + len(calls))

    monkeypatch.setattr(study, "run_real_trial", fake)
    monkeypatch.setattr("dstoolkit.tune.options._check_real_mode_possible", lambda spec: None)
    return calls


def test_force_deletes_trial_folders_tune_wrote_and_nothing_else(repo_root, tmp_path, monkeypatch):
    out = tmp_path / "o"
    calls = _fake_real_trials(monkeypatch)
    run_study(_opts(repo_root, out, mode="real"))
    assert calls and all((w / "log.txt").is_file() for w in calls)
    (out / "trials" / "0000" / "mine.txt").write_text("keep")
    before = tree(tmp_path)
    with pytest.raises(TuneInputError, match=r"--force would delete or overwrite 1 file\(s\) dstoolkit tune did not "
                                             r"write .*: trials/0000/mine\.txt; move them out"):
        run_study(_opts(repo_root, out, mode="real", objective="memory", force=True))
    assert tree(tmp_path) == before
    (out / "trials" / "0000" / "mine.txt").unlink()
    run_study(_opts(repo_root, out, mode="real", objective="memory", force=True))
    assert sorted(p.name for p in (out / "trials").iterdir()) == sorted(w.name for w in calls[-2:])


def test_an_interrupted_trials_files_are_tunes(repo_root, tmp_path, monkeypatch):
    out = tmp_path / "o"
    _fake_real_trials(monkeypatch, interrupt_at=1)
    with pytest.raises(KeyboardInterrupt):
        run_study(_opts(repo_root, out, mode="real"))
    assert (out / "trials" / "0000" / "log.txt").is_file()
    run_study(_opts(repo_root, out, force=True))  # an estimate-mode study: the interrupted trial's files deleted
    assert not (out / "trials").exists()


def test_a_folder_from_before_the_manifest(repo_root, tmp_path, capsys):
    """A study folder written by an older dstoolkit (no manifest): its study and outputs are tune's, as before;
    what is under trials/ cannot be told apart from the user's, so --force names it."""
    out = tmp_path / "o"
    assert _tune(repo_root, out) == 0
    (out / MANIFEST_FILE).unlink()
    assert _tune(repo_root, out, "--budget", "3") == 0  # resumed, outputs rewritten
    (out / MANIFEST_FILE).unlink()
    (out / "trials").mkdir()
    (out / "trials" / "x.txt").write_text("?")
    capsys.readouterr()
    assert _tune(repo_root, out, "--objective", "memory", "--force") == 2
    assert "trials/x.txt; move them out" in capsys.readouterr().err
    shutil.rmtree(out / "trials")
    assert _tune(repo_root, out, "--objective", "memory", "--force") == 0


def test_out_that_cannot_be_written_is_refused_before_the_spec(repo_root, tmp_path, capsys, read_only, monkeypatch):
    from dstoolkit.tune import options

    monkeypatch.setattr(options, "load_spec", lambda p: pytest.fail("spec loaded before --out was checked"))
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(ro)
    for out in (ro, ro / "t"):
        assert _tune(repo_root, out) == 2
        assert capsys.readouterr().err == (f"dstoolkit tune: error: --out {out}: the folder {ro} is not writable by "
                                           "this user (permissions, a read-only filesystem, an immutable flag), so "
                                           "nothing can be written there; give a path you can write to\n")


def test_a_command_studys_files_are_tunes(repo_root, tmp_path, monkeypatch, capsys):
    """`tune ... -- COMMAND`: command.json and each trials/cmd-NNNN/ folder are listed once written, so --force replaces
    them; a file of the user's in there is named instead."""
    from dstoolkit.tune import objective

    def fake(space, chk, work_dir, command, **kw):
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / "run.log").write_text(" ".join(command))
        return TrialOutcome(status="ok", value=1.0)

    monkeypatch.setattr(objective, "run_command_trial", fake)
    monkeypatch.setattr("dstoolkit.tune.options._check_real_mode_possible", lambda spec: None)
    out = tmp_path / "o"
    argv = ["tune", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--budget", "1", "--mode", "real", "-o", str(out),
            "--no-progress", "--format", "json"]
    assert main([*argv, "--", "python", "train.py", "{config}"]) == 0
    listed = (out / MANIFEST_FILE).read_text()
    assert "  command.json\n" in listed and "  trials/cmd-0000/run.log\n" in listed
    (out / "trials" / "cmd-0000" / "ckpt.pt").write_text("mine")
    capsys.readouterr()
    assert main([*argv, "--force", "--", "python", "other.py"]) == 2
    assert "trials/cmd-0000/ckpt.pt; move them out" in capsys.readouterr().err
    (out / "trials" / "cmd-0000" / "ckpt.pt").unlink()
    assert main([*argv, "--force", "--", "python", "other.py"]) == 0
    assert (out / "trials" / "cmd-0000" / "run.log").read_text() == "python other.py"
