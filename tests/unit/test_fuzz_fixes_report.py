"""Fuzz fixes in the bench results files and `dstoolkit report`: an append after a cut-off line, unreadable lines
and wrong-typed records named by file and line, and outputs that would replace results, plots or folders."""
from __future__ import annotations

import json

from dstoolkit.cli import main
from dstoolkit.runtime.bench import results_jsonl

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _comm(op="all_reduce", size=1024, **kw):
    rec = {**results_jsonl.base_record("comm", "r1", f"{op}:{size}", {"config_hash": "h", "backend": "gloo",
                                                                       "world_size": 2}),
           "op": op, "size": size, "count": 256, "type": "float", "time_us": 100.0, "algbw": 0.01, "busbw": 0.01,
           "#wrong": 0, "backend": "gloo", "world_size": 2, "busbw_stats": {"p10": 0.009, "p90": 0.011}}
    rec.update(kw)
    return rec


def _lines(*recs):
    return "".join(json.dumps(r) + "\n" for r in recs)


def test_append_after_a_cut_off_line_starts_a_new_line(tmp_path):
    path = tmp_path / "t.jsonl"
    torn = '{"bench": "comm", "op": "all_red'
    path.write_text(_lines(_comm(size=1024), _comm(size=2048)) + torn)
    before = path.read_bytes()
    results_jsonl.append_records(path, [_comm(op="broadcast", size=2048)])
    assert path.read_bytes().startswith(before + b"\n")  # the cut-off line is kept, untouched
    recs = results_jsonl.read_records(path)
    assert [(r["op"], r["size"]) for r in recs] == [("all_reduce", 1024), ("all_reduce", 2048), ("broadcast", 2048)]
    assert [(b.line, b.reason.split(":")[0]) for b in recs.bad_lines] == [(3, "not JSON")]
    assert [n for _, n in recs.lines] == [1, 2, 4]
    # Appending to a file that ends in a newline adds no blank line.
    results_jsonl.append_records(path, [_comm(op="broadcast", size=4096)])
    assert path.read_text().count("\n\n") == 0


def test_a_bench_run_says_which_lines_of_its_results_file_it_cannot_read(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(_lines(_comm()) + '{"bench": "comm", "op": "all_red')
    state = results_jsonl.open_run(path, "comm", "h")
    assert state.resumed and state.done_keys == {"all_reduce:1024"}  # the interrupted run goes on
    assert capsys.readouterr().err == (
        f"# {path}: 1 line(s) could not be read as records and were skipped: {path} line 2 (cut off: the last line "
        "has no newline (an interrupted write?))\n")


def test_read_records_names_every_line_it_could_not_read(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(_lines({"a": 1}) + "not json\n[1, 2]\n\n42\n" + _lines({"a": 2}) + '{"a": 3, "to')
    recs = results_jsonl.read_records(path)
    assert [r["a"] for r in recs] == [1, 2]
    assert [(b.line, b.reason) for b in recs.bad_lines] == [
        (2, "not JSON: Expecting value"), (3, "a JSON array, not an object"), (5, "a JSON number, not an object"),
        (7, "cut off: the last line has no newline (an interrupted write?)")]
    assert recs.bad_lines_message(limit=2) == (
        f"4 line(s) could not be read as records and were skipped: {path} line 2 (not JSON: Expecting value); "
        f"{path} line 3 (a JSON array, not an object); and 2 more")
    assert results_jsonl.read_records(tmp_path / "x.jsonl").bad_lines_message() == ""


def test_report_lists_the_cut_off_line_and_shows_the_record_appended_after_it(tmp_path, capsys):
    path = tmp_path / "comm.jsonl"
    path.write_text(_lines(_comm(size=1024)) + '{"bench": "comm", "op": "all_red')
    results_jsonl.append_records(path, [_comm(op="broadcast", size=2048)])
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    assert out["counts"] == {"comm": 2}
    assert out["skipped"] == [f"{path} line 2: not JSON: Unterminated string starting at"]
    assert f"dstoolkit report: warning: left out {path} line 2: not JSON" in cap.err
    md = (tmp_path / "report.md").read_text()
    assert "| broadcast | 2K |" in md and "| all_reduce | 1K |" in md
    assert "## Left out (1)" in md and f"- {path} line 2: not JSON" in md


def test_report_leaves_out_wrong_typed_records_naming_file_and_line(tmp_path, capsys):
    path = tmp_path / "comm.jsonl"
    path.write_text(_lines(_comm(size=1024), _comm(size="1K"), _comm(op=["x"], size=2048),
                           _comm(op="all_gather", busbw="fast"), _comm(op="broadcast", size=4096)))
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"comm": 2}
    assert out["skipped"] == [
        f"{path} line 2: field \"size\" is '1K' (expected a whole number of bytes >= 1)",
        f"{path} line 3: field \"op\" is ['x'] (expected a string)",
        f"{path} line 4: field \"busbw\" is 'fast' (expected a number or null)"]
    md = (tmp_path / "report.md").read_text()
    assert "fast" not in md.split("## Left out")[0]
    assert [ln.split(" | ")[0] for ln in md.splitlines() if ln.startswith("| ") and " | 0 |" in ln] == [
        "| all_reduce", "| broadcast"]


def test_report_with_no_showable_record_names_the_first_bad_line(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("[1]\n" + _lines(_comm(size="1K")))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"dstoolkit report: error: RESULTS_DIR {str(tmp_path)!r} holds no record the report can show "
                   f"(*.jsonl): 2 line(s) left out, the first: {path} line 1: a JSON array, not an object; fix or "
                   "delete those lines, or rerun the bench with --out\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


def test_report_never_writes_over_a_results_file(tmp_path, capsys):
    path = tmp_path / "comm.jsonl"
    path.write_text(_lines(_comm()))
    before = path.read_bytes()
    assert main(["report", str(tmp_path), "-o", str(path), "--force"]) == 2
    assert "is the results file" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "new.jsonl"), "--force"]) == 2
    assert "a .jsonl name would make the report a results file" in capsys.readouterr().err
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm.jsonl"]


def test_report_refuses_to_replace_a_plot_without_force(tmp_path, capsys):
    (tmp_path / "comm.jsonl").write_text(_lines(_comm()))
    plot = tmp_path / "report_comm_busbw.png"
    plot.write_text("mine\n")
    assert main(["report", str(tmp_path)]) == 2
    assert f"{plot} exists (this report would replace it); pass --force" in capsys.readouterr().err
    assert plot.read_text() == "mine\n" and not (tmp_path / "report.md").exists()
    assert main(["report", str(tmp_path), "--force"]) == 0
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_report_to_a_folder_is_refused_and_leaves_nothing(tmp_path, capsys):
    (tmp_path / "comm.jsonl").write_text(_lines(_comm()))
    sub = tmp_path / "sub"
    sub.mkdir()
    assert main(["report", str(tmp_path), "-o", str(sub), "--force"]) == 2
    assert capsys.readouterr().err == (f"dstoolkit report: error: -o {sub}: is a folder; pass the markdown file to "
                                       f"write, e.g. -o {sub / 'report.md'}\n")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["comm.jsonl", "sub"]


def test_a_failed_report_write_removes_the_plots_it_made(tmp_path, monkeypatch, capsys):
    from dstoolkit.runtime.bench import report_render

    (tmp_path / "comm.jsonl").write_text(_lines(_comm()))

    def disk_full(path, text):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(report_render, "write_report", disk_full)
    assert main(["report", str(tmp_path)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm.jsonl"]
