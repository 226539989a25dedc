"""`dstoolkit bench ... --out FILE`: records are appended only to a new file or to a results file of dstoolkit bench,
and an --out that cannot be written is refused before any rank starts (exit 2, naming --out, nothing written).

Before:
- `bench comm ... -o keep.json` with keep.json a user's multi-line DeepSpeed JSON printed "4 line(s) could not be
  read as records and were skipped", appended a record line and exited 0: keep.json was no longer valid JSON;
- `bench comm ... -o rodir/c.jsonl` (a read-only folder) ran both ranks, then "failed: a rank failed:
  PermissionError: [Errno 1] Operation not permitted: 'rodir/c.jsonl'", exit 1;
- `--out new/` appended to a file named "new"; `--out -` to a file named "-"; a dangling link made its target.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.bench import results_jsonl
from tests.unit.test_fuzz_fixes_report import _comm, _lines
from tests.unit.test_s29c_out_helpers import read_only, tree  # noqa: F401  (read_only: a fixture)

DS_JSON = '{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 2}\n}\n'
FIX = "nothing was written: give a new file to append the records to (or a results file of dstoolkit bench), e.g. "


@pytest.fixture
def no_ranks(monkeypatch):
    """The --out checks come first: starting the ranks fails the test."""
    from dstoolkit.runtime.bench import comm

    def never(opts):
        raise AssertionError("ranks started")

    monkeypatch.setattr(comm, "run_comm", never)


def _bench(out) -> int:
    return main(["bench", "comm", "--world-size", "2", "--ops", "all_reduce", "--sizes", "1K", "--iters", "2",
                 "--warmup", "1", "--reps", "1", "--backend", "gloo", "--no-progress", "-o", str(out)])


@pytest.mark.parametrize("text,why", [
    (DS_JSON, "it is one JSON document over 4 lines, not JSON Lines of dstoolkit bench records; a record appended "
              "would make it invalid JSON"),
    ('[\n' + json.dumps(_comm()) + '\n]\n', "it is one JSON document over 3 lines, not JSON Lines of dstoolkit bench "
                                            "records; a record appended would make it invalid JSON"),
    ("train: fast\nnotes: mine\n",
     "none of its 2 line(s) is a dstoolkit bench record (2 of them not a JSON object; the first, line 1: not JSON: "
     "Expecting value); records appended would mix with it"),
    ('{"train_batch_size": 8}\n', 'none of its 1 JSON record(s) is a dstoolkit bench record (no "bench" field); '
                                  "records appended would mix with another tool's data"),
    ('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n',
     'none of its 2 JSON record(s) is a dstoolkit bench record (no "bench" field); records appended would mix with '
     "another tool's data"),
])
def test_out_that_is_not_a_results_file_is_refused_before_the_ranks(tmp_path, capsys, no_ranks, text, why):
    keep = tmp_path / "keep.json"
    keep.write_text(text)
    before = tree(tmp_path)
    assert _bench(keep) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit bench: error: --out {keep}: {why}; {FIX}{tmp_path / 'keep.jsonl'}\n"
    assert tree(tmp_path) == before


def test_the_suggested_name_is_a_new_file(tmp_path, capsys, no_ranks):
    keep = tmp_path / "keep.jsonl"
    keep.write_text(DS_JSON)
    assert _bench(keep) == 2
    assert capsys.readouterr().err.endswith(f"e.g. {tmp_path / 'keep_bench.jsonl'}\n")


@pytest.mark.parametrize("text", [
    "",  # empty
    "\n\n",  # blank lines only
    _lines(_comm(size=1024), _comm(size=2048)),  # a results file
    _lines(_comm(size=1024), _comm(size=2048)) + '{"bench": "comm", "op": "all_red',  # ... cut off by an interrupt
    '{"bench": "comm", "op": "all_red\n' + _lines(_comm(size=2048)),  # ... a cut line, then a resumed run
])
def test_results_files_are_still_appended_to(tmp_path, text):
    """Guard (passes before the change too): a results file, even with a cut-off line, is appended to."""
    path = tmp_path / "r.jsonl"
    path.write_text(text)
    state = results_jsonl.open_run(path, "comm", "h")  # asks check_results_file
    results_jsonl.append_records(path, [results_jsonl.base_record("comm", state.run_id, "k", {})])
    assert path.read_text().startswith(text)


def test_the_cli_passes_a_results_file_with_a_cut_off_last_line(tmp_path, monkeypatch, capsys):
    """Guard: the check lets a real results file through to the ranks."""
    from dstoolkit.runtime.bench import comm

    seen = []
    monkeypatch.setattr(comm, "run_comm", lambda opts: seen.append(opts.out) or [])
    path = tmp_path / "r.jsonl"
    path.write_text(_lines(_comm()) + '{"bench": "comm", "op": "all_red')
    assert _bench(path) == 0
    assert seen == [str(path)]


@pytest.mark.parametrize("resume", [True, False])
def test_open_run_refuses_a_json_document_resume_or_not(tmp_path, resume):
    """The library's own entry (ranks under a launcher call it): --no-resume used to skip reading the file."""
    keep = tmp_path / "keep.json"
    keep.write_text(DS_JSON)
    with pytest.raises(results_jsonl.NotResultsFileError,
                       match=r"^.*keep\.json: it is one JSON document over 4 lines, not JSON Lines"):
        results_jsonl.open_run(keep, "comm", "h", resume=resume)
    assert keep.read_text() == DS_JSON


@pytest.mark.parametrize("given,message", [
    ("new/", "--out new/: ends with '/', so it names a folder, not a file; give the path of the file to write, e.g. "
             "new/comm.jsonl"),
    ("-", "--out -: '-' (stdout) is not supported for this output; give the path of the file to write (./- for a "
          "file named '-')"),
])
def test_out_that_names_no_file_is_refused(tmp_path, monkeypatch, capsys, no_ranks, given, message):
    monkeypatch.chdir(tmp_path)
    assert _bench(given) == 2
    assert capsys.readouterr().err == f"dstoolkit bench: error: {message}\n"
    assert tree(tmp_path) == {}


def test_out_that_is_a_dangling_link_is_refused(tmp_path, monkeypatch, capsys, no_ranks):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.jsonl").symlink_to("gone/c.jsonl")
    assert _bench("c.jsonl") == 2
    assert capsys.readouterr().err == ("dstoolkit bench: error: --out c.jsonl: is a link to gone/c.jsonl, which does "
                                       "not exist, so writing there would not make what was asked; remove the link, "
                                       "or give another path\n")
    assert tree(tmp_path) == {"c.jsonl": b"gone/c.jsonl"}


def test_out_in_a_read_only_folder_is_refused_before_the_ranks(tmp_path, monkeypatch, capsys, no_ranks, read_only):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rodir").mkdir()
    read_only(tmp_path / "rodir")
    assert _bench("rodir/c.jsonl") == 2
    assert capsys.readouterr().err == (
        "dstoolkit bench: error: --out rodir/c.jsonl: the folder rodir is not writable by this user (permissions, a "
        "read-only filesystem, an immutable flag), so nothing can be written there; give a path you can write to\n")
    assert tree(tmp_path) == {"rodir": None}


def test_out_that_is_a_read_only_results_file_is_refused(tmp_path, monkeypatch, capsys, no_ranks, read_only):
    """Records are appended: the file itself must be writable (its folder need not be)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.jsonl").write_text(_lines(_comm()))
    read_only(tmp_path / "c.jsonl")
    assert _bench("c.jsonl") == 2
    assert capsys.readouterr().err == (
        "dstoolkit bench: error: --out c.jsonl: the file c.jsonl is not writable by this user (permissions, a "
        "read-only filesystem, an immutable flag), so nothing can be written there; give a path you can write to\n")
