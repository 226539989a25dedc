"""`dstoolkit train --metrics-out` (and the trainer run directly) refuses, before any rank starts, a metrics file that
is one of the run's inputs (--spec / --config, through a link or a hard link) or an existing file that is not the
trainer's JSON Lines metrics (notes, a config over several lines): rank 0 appends to it, so it was spoilt. Was: only
the path's shape was checked; `--metrics-out spec.yaml` ran, appended JSON lines to the spec (exit 0), and the next
run refused the spec as a YAML syntax error. One rule with `bench --out` (`results_jsonl.jsonl_append_problem`)."""
import json
import os

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train import trainer

SPOIL = "an input of this run; the run appends its metrics there and would spoil it; nothing was written: give another file"


@pytest.fixture
def no_launch(monkeypatch):
    import dstoolkit.cli.train as verb

    def launch(*a, **k):
        raise AssertionError(f"ranks started: {a}")

    monkeypatch.setattr(verb.subprocess, "run", launch)


def _train(train_files, out, dry_run=False):
    spec, ds = train_files
    return main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out", str(out),
                 *(["--dry-run"] if dry_run else [])])


def _texts(tmp_path):
    return {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir()) if p.is_file()}


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("which", ["spec", "config"])
def test_metrics_out_is_an_input(tmp_path, train_files, no_launch, capsys, which, dry_run):
    spec, ds = train_files
    target, flag = (spec, "--spec") if which == "spec" else (ds, "--config")
    before = _texts(tmp_path)
    assert _train(train_files, target, dry_run) == 2
    err = capsys.readouterr().err
    assert err == (f"dstoolkit train: error: --metrics-out {target}: is the same file as {flag} {target}, {SPOIL}, "
                   f"e.g. --metrics-out {tmp_path / 'train_metrics.jsonl'}\n")
    assert _texts(tmp_path) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_metrics_out_is_an_input_under_another_name(tmp_path, train_files, no_launch, capsys, link):
    spec, ds = train_files
    other = tmp_path / "other.json"
    os.symlink(ds, other) if link == "symlink" else os.link(ds, other)
    before = ds.read_bytes()
    assert _train(train_files, other) == 2
    assert capsys.readouterr().err.startswith(f"dstoolkit train: error: --metrics-out {other}: is the same file as "
                                              f"--config {ds}, {SPOIL}")
    assert ds.read_bytes() == before


def test_metrics_out_is_notes(tmp_path, train_files, no_launch, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("note one\nnote two\n")
    assert _train(train_files, notes) == 2
    assert capsys.readouterr().err == (
        f"dstoolkit train: error: --metrics-out {notes}: none of its 2 line(s) is a dstoolkit train metrics "
        "record (2 of them not a JSON object; the first, line 1: not JSON: Expecting value); records appended would "
        "mix with it; nothing was written: give a new file to append the metrics to (or the metrics file of an "
        f"earlier run), e.g. --metrics-out {tmp_path / 'train_metrics.jsonl'}\n")
    assert notes.read_text() == "note one\nnote two\n"


def test_metrics_out_is_another_json_document(tmp_path, train_files, no_launch, capsys):
    doc = tmp_path / "train_metrics.jsonl"  # the suggestion then avoids the existing name
    doc.write_text(json.dumps({"zero_optimization": {"stage": 2}}, indent=2) + "\n")
    assert _train(train_files, doc) == 2
    assert capsys.readouterr().err == (
        f"dstoolkit train: error: --metrics-out {doc}: it is one JSON document over 5 lines, not JSON Lines of "
        "dstoolkit train metrics records; a record appended would make it invalid JSON; nothing was written: "
        "give a new file to append the metrics to (or the metrics file of an earlier run), e.g. --metrics-out "
        f"{tmp_path / 'train_metrics_metrics.jsonl'}\n")


def test_bench_records_are_not_metrics(tmp_path, train_files, no_launch, capsys):
    out = tmp_path / "comm.jsonl"
    out.write_text(json.dumps({"bench": "comm", "run_id": "a", "event": "run_done"}) + "\n")
    assert _train(train_files, out) == 2
    assert 'none of its 1 JSON record(s) is a dstoolkit train metrics record (no "event" or "step_time_s" ' \
           "field)" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["", "\n", '{"event": "model", "params": 10}\n{"step": 1, "loss": 5.5, '
                                  '"step_time_s": 0.1, "tokens_per_s": 640.0}\n{"step": 2, "lo'])
def test_an_earlier_runs_metrics_are_appended_to(tmp_path, train_files, capsys, text):
    out = tmp_path / "m.jsonl"
    out.write_text(text)
    assert _train(train_files, out, dry_run=True) == 0
    assert f"--metrics-out {out}" in capsys.readouterr().out
    assert out.read_text() == text


@pytest.mark.parametrize("which", ["spec", "config"])
def test_the_trainer_run_directly_names_its_own_flags(tmp_path, train_files, capsys, which):
    spec, ds = train_files
    target, flag = (spec, "--spec") if which == "spec" else (ds, "--deepspeed_config")
    before = target.read_bytes()
    rc = trainer.main(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "1", "--metrics-out",
                       str(target)])
    assert rc == 2
    assert capsys.readouterr().err == (f"dstoolkit.runtime.train.trainer: error: --metrics-out {target}: is the same "
                                       f"file as {flag} {target}, {SPOIL}, e.g. --metrics-out "
                                       f"{tmp_path / 'train_metrics.jsonl'}\n")
    assert target.read_bytes() == before
