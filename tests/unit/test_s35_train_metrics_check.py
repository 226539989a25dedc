"""The --metrics-out pre-flight (`trainer_inputs.metrics_out_check` on `results_jsonl.jsonl_append_check`).

Was (s35 findings 1 and 2): the check read the whole existing file (twice: its text and `read_records`), in
`dstoolkit train` twice more (the verb's own call and `check_launch`'s) and again on every rank: 2.5 s per read for a
93 MB metrics file. Now it reads at most 64 KiB from each end, once per launch (the verb's pre-flight; or global rank
0 of a launch without it). And a file whose only line is a first record cut off by a killed run was refused as 'not
metrics'; it is accepted with a note, and the new records start on a line of their own."""
import argparse
import builtins
import io
import json
import os

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.bench import results_jsonl
from dstoolkit.runtime.train import trainer_inputs as ti
from dstoolkit.runtime.train.run_state import MetricsWriter

STEP = '{"step": 1, "loss": 5.5, "step_time_s": 0.1, "tokens_per_s": 640.0}\n'
NOTE_TAIL = ("a run killed while writing its first record; it stays as it is (the file is only appended to) and the "
             "records appended start on a line of their own")


@pytest.fixture
def reads(monkeypatch):
    """Bytes read from each file (by path) through open()."""
    got: dict[str, int] = {}
    real = builtins.open

    def opened(file, mode="r", *a, **k):
        fh = real(file, mode, *a, **k)
        if "r" in mode and isinstance(file, (str, os.PathLike)):
            key = os.fspath(file)
            inner_read = fh.read

            def read(*ra):
                data = inner_read(*ra)
                got[key] = got.get(key, 0) + len(data)
                return data

            try:
                fh.read = read
            except AttributeError:
                pass
        return fh

    monkeypatch.setattr(builtins, "open", opened)
    monkeypatch.setattr(io, "open", opened)
    return got


def _big_metrics(path, mb=4):
    path.write_text('{"event": "model", "params": 10}\n' + STEP * (mb * 1024 * 1024 // len(STEP)))
    return path


def test_a_long_metrics_file_is_read_at_its_ends_only(tmp_path, reads):
    out = _big_metrics(tmp_path / "m.jsonl")
    assert ti.metrics_out_check(str(out), {}).problem is None
    assert 0 < reads.get(str(out), 0) <= 128 * 1024  # was: the whole 4 MB, twice


def test_dstoolkit_train_reads_the_metrics_file_once(tmp_path, train_files, reads, capsys):
    spec, ds = train_files
    out = _big_metrics(tmp_path / "m.jsonl")
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out", str(out),
               "--dry-run"])
    assert rc == 0, capsys.readouterr().err
    assert 0 < reads.get(str(out), 0) <= 128 * 1024  # was: 4 whole reads (verb, check_launch: text + records each)


@pytest.mark.parametrize("env", [{"RANK": "1", "DSTOOLKIT_TRAIN_PREFLIGHT_DONE": "1"},
                                 {"RANK": "0", "DSTOOLKIT_TRAIN_PREFLIGHT_DONE": "1"}])
def test_ranks_skip_the_check_the_verb_did(tmp_path, monkeypatch, env):
    notes = tmp_path / "notes.txt"
    notes.write_text("note one\nnote two\n")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    args = argparse.Namespace(metrics_out=str(notes), deepspeed_config=str(tmp_path / "ds.json"),
                              spec=str(tmp_path / "s.yaml"), checkpoint_dir=None, monitor_dir=None)
    assert ti.check_output_paths(args) == ()  # the verb's pre-flight checked it once
    monkeypatch.setenv("RANK", env["RANK"])  # a direct launch: every rank checks (s35 review finding 9)
    monkeypatch.delenv("DSTOOLKIT_TRAIN_PREFLIGHT_DONE", raising=False)
    with pytest.raises(ti.UsageError, match="none of its 2 line"):
        ti.check_output_paths(args)


def test_the_verb_tells_its_ranks_the_check_was_done(tmp_path, train_files, monkeypatch):
    import dstoolkit.cli.train as verb

    seen = {}

    def launch(cmd, env, **k):
        seen.update(env)
        return 0, None

    monkeypatch.setattr(verb, "run_forwarding_signals", launch)
    spec, ds = train_files
    main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out",
          str(tmp_path / "m.jsonl")])
    assert seen.get("DSTOOLKIT_TRAIN_PREFLIGHT_DONE") == "1"


@pytest.mark.parametrize("cut", ['{"event": "model", "params": 1', '{"ev', "{", '{"step": 3, "lo'])
def test_a_file_of_one_cut_off_first_record_is_accepted_with_a_note(tmp_path, train_files, capsys, cut):
    spec, ds = train_files
    out = tmp_path / "m.jsonl"
    out.write_text(cut)
    for resume in ([], ["--", "--resume", "--checkpoint-dir", str(tmp_path / "ck")]):
        rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out", str(out),
                   "--dry-run", *resume])
        err = capsys.readouterr().err
        assert (rc, err) == (0, f"dstoolkit train: note: --metrics-out {out}: its only line is cut off "
                                f"({cut!r}): {NOTE_TAIL}\n")  # was: refused, exit 2
    assert out.read_text() == cut


@pytest.mark.parametrize("text, why", [
    ("hello world", "none of its 1 line(s) is a dstoolkit train metrics record (1 of them not a JSON object; the "
                    "first, line 1: cut off"),
    ('{"bench": "comm", "run_id": "a", "ev', "none of its 1 line(s) is a dstoolkit train metrics record"),
    ('{"zero_optimization": {"stage": 2}}', 'none of its 1 JSON record(s) is a dstoolkit train metrics record'),
    ('note\n{"event": "mo', "none of its 2 line(s)"),
])
def test_a_cut_off_line_that_is_not_metrics_is_still_refused(tmp_path, text, why):
    out = tmp_path / "m.jsonl"
    out.write_text(text)
    found = ti.metrics_out_check(str(out), {})
    assert found.problem.startswith(f"--metrics-out {out}: {why}")
    assert found.note is None


def test_the_new_records_start_on_a_line_of_their_own(tmp_path):
    out = tmp_path / "m.jsonl"
    out.write_text('{"event": "mo')
    w = MetricsWriter(str(out), True)
    w.write({"event": "model", "params": 1})
    w.close()
    assert out.read_text() == '{"event": "mo\n{"event": "model", "params": 1}\n'  # was: one spoilt line
    assert [r["event"] for r in results_jsonl.read_records(out)] == ["model"]


def test_long_files_that_are_not_metrics_are_refused(tmp_path):
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"rows": [{"step_time_s": i} for i in range(20000)]}, indent=2) + "\n")
    found = ti.metrics_out_check(str(doc), {})
    assert "it is one JSON document over many lines (its first line is not JSON on its own, its last a bare })" \
        in found.problem
    notes = tmp_path / "notes.txt"
    notes.write_text("a note\n" * 40000)
    found = ti.metrics_out_check(str(notes), {})
    assert "none of the 18724 line(s) in its first and last 64 KiB is a dstoolkit train metrics record (18724 of " \
           "them not a JSON object; the first, line 1: not JSON: Expecting value)" in found.problem


def test_a_whole_foreign_record_without_its_newline_is_not_taken_for_a_cut_one(tmp_path):
    """s35 review finding 10: a complete JSON object that is not a trainer record, with no final newline, was
    accepted as 'a run killed while writing its first record'; only a line that is not JSON on its own is cut off."""
    whole = tmp_path / "other.jsonl"
    whole.write_text('{"step": 3, "loss": 1.25}')
    assert ti.metrics_out_check(str(whole), {}).problem is not None
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"step": 3, "lo')
    check = ti.metrics_out_check(str(cut), {})
    assert check.problem is None and "cut off" in check.note
