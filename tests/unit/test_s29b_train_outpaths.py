"""`dstoolkit train` refuses an output path it cannot write before any rank starts: exit 2, one line naming the flag,
the path part in the way and the fix. Was: no check; the ranks started, rank 0 failed on its first write with a bare
OS error (`--metrics-out FILE/m.jsonl`: FileExistsError; `--metrics-out DIR`: IsADirectoryError;
`--checkpoint-dir FILE/ck`: NotADirectoryError; `--checkpoint-dir FILE`: FileExistsError), the peer with a gloo
"Connection closed by peer", 85-96 lines of launcher output with 3 tracebacks after 6-11 s, and the verb exited 1
("the run wrote no metrics"), the code of a failed run, not of bad input. The trainer run directly (its ranks) says
the same (`trainer_inputs.check_output_paths`, called by `read_inputs`)."""
import os

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train import trainer

UNDER_A_FILE = "is a file, not a folder, so nothing can be written under it; give a path in a folder"
A_FOLDER = ("is a folder, not a file, so no file can be written in its place; give the path of the file to write "
            "(a file inside it, or a new name)")


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if a rank would start (the verb's launcher call)."""
    import dstoolkit.cli.train as verb

    def launch(*a, **k):
        raise AssertionError(f"ranks started: {a}")

    monkeypatch.setattr(verb.subprocess, "run", launch)


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("a file, not a folder\n")
    return f


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _train(train_files, *args, dry_run=False):
    spec, ds = train_files
    return main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", *(["--dry-run"] if dry_run else []),
                 *args])


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("below", ["m.jsonl", "sub/m.jsonl", "sub/deeper/m.jsonl"])
def test_metrics_out_under_a_file(tmp_path, train_files, blocker, no_launch, capsys, below, dry_run):
    out = blocker / below
    before = _tree(tmp_path)
    assert _train(train_files, "--metrics-out", str(out), dry_run=dry_run) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit train: error: --metrics-out {out}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


def test_metrics_out_that_is_a_folder(tmp_path, train_files, no_launch, capsys):
    d = tmp_path / "metrics"
    d.mkdir()
    before = _tree(tmp_path)
    assert _train(train_files, "--metrics-out", str(d)) == 2
    assert capsys.readouterr().err == f"dstoolkit train: error: --metrics-out {d}: {A_FOLDER}\n"
    assert _tree(tmp_path) == before


def test_metrics_out_that_is_a_link_to_a_folder(tmp_path, train_files, no_launch, capsys):
    d = tmp_path / "metrics"
    d.mkdir()
    link = tmp_path / "m.jsonl"
    link.symlink_to(d)
    assert _train(train_files, "--metrics-out", str(link)) == 2
    assert capsys.readouterr().err == (f"dstoolkit train: error: --metrics-out {link}: is a link to a folder, not a "
                                       "file; give the path of the JSON-lines file to append to (a file inside it, or "
                                       "a new name)\n")


def test_metrics_out_empty(train_files, no_launch, capsys):
    assert _train(train_files, "--metrics-out", "") == 2
    assert capsys.readouterr().err == ("dstoolkit train: error: --metrics-out '': empty; give the path of the "
                                       "JSON-lines file to append to, e.g. train_metrics.jsonl\n")


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--monitor-dir"])
@pytest.mark.parametrize("below", ["ck", "sub/ck"])
def test_output_folder_under_a_file(tmp_path, train_files, blocker, no_launch, capsys, flag, below):
    folder = blocker / below
    before = _tree(tmp_path)
    assert _train(train_files, "--metrics-out", str(tmp_path / "m.jsonl"), "--", flag, str(folder),
                  *(["--save-every", "1"] if flag == "--checkpoint-dir" else [])) == 2
    assert capsys.readouterr().err == f"dstoolkit train: error: {flag} {folder}: {blocker} {UNDER_A_FILE}\n"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("flag", ["--checkpoint-dir", "--monitor-dir"])
def test_output_folder_that_is_a_file(tmp_path, train_files, blocker, no_launch, capsys, flag):
    before = _tree(tmp_path)
    assert _train(train_files, "--metrics-out", str(tmp_path / "m.jsonl"), "--", flag, str(blocker)) == 2
    assert capsys.readouterr().err == (f"dstoolkit train: error: {flag} {blocker}: is a file, not a folder; give a "
                                       "new or existing folder to write into (or move the file away)\n")
    assert _tree(tmp_path) == before


def test_writable_outputs_pass_the_preflight(tmp_path, train_files, capsys):
    ck = tmp_path / "ck"
    ck.mkdir()  # an existing checkpoint folder (a --resume) is fine, and so are folders still to be made
    assert _train(train_files, "--metrics-out", str(tmp_path / "new" / "m.jsonl"), "--", "--checkpoint-dir", str(ck),
                  "--monitor-dir", str(tmp_path / "mon" / "csv"), dry_run=True) == 0
    assert "--checkpoint-dir" in capsys.readouterr().out


def test_the_trainer_run_directly_says_the_same(tmp_path, train_files, blocker, capsys):
    spec, ds = train_files
    out = blocker / "m.jsonl"
    rc = trainer.main(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "1", "--metrics-out", str(out)])
    assert rc == 2
    assert capsys.readouterr().err == (f"dstoolkit.runtime.train.trainer: error: --metrics-out {out}: {blocker} "
                                       f"{UNDER_A_FILE}\n")
    assert not os.path.exists(out)
