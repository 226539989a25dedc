"""`dstoolkit report` never shows a row under another run's environment (s36 finding 1): rows measured at other
commits get their own environment line, table and summary; a busbw of Infinity is left out like one of "fast"."""
from __future__ import annotations

import json

from dstoolkit.cli import main
from dstoolkit.runtime.bench import results_jsonl

ENV = {"backend": "gloo", "world_size": 2, "torch": "2.13.0+cpu", "deepspeed": "0.19.8", "transformer_engine": None,
       "cpu_model": "Xeon", "gpu_model": None, "cpu_count": 2, "load_avg": [1.0, 1.0, 1.0]}


def _env(commit: str, when: str, load: float = 1.0) -> dict:
    return {**ENV, "git_commit": commit, "timestamp_utc": when, "load_avg": [load, 1.0, 1.0]}


def _train(name: str, err: float, commit: str, when: str, run: str = "r1") -> dict:
    return {**results_jsonl.base_record("train", run, name, _env(commit, when)), "config_name": name,
            "measured": {"step_time_s_median": 1.0}, "estimate": {"step_time_s": 1.0 + err},
            "error": {"step_time_s": err}}


def _comm(size: int, commit: str, when: str, **kw) -> dict:
    return {**results_jsonl.base_record("comm", "r-" + commit, f"all_reduce:{size}", _env(commit, when)),
            "op": "all_reduce", "size": size, "count": size // 4, "type": "float", "time_us": 100.0, "algbw": 0.01,
            "busbw": 0.01, "#wrong": 0, "backend": "gloo", "world_size": 2, **kw}


def _write(path, *recs) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def _section(md: str, head: str) -> str:
    return md.split(head, 1)[1].split("\n## ", 1)[0]


def test_train_rows_of_two_commits_get_one_env_line_and_summary_each(tmp_path, capsys):
    _write(tmp_path / "train_1_old.jsonl", _train("a", -0.30, "aaaaaaaaaaaa1111", "2026-11-29T20:00:00+00:00"),
           _train("b", -0.10, "aaaaaaaaaaaa1111", "2026-11-29T20:00:00+00:00"))
    _write(tmp_path / "train_2_new.jsonl", _train("c", 0.05, "bbbbbbbbbbbb2222", "2026-12-01T19:00:00+00:00"))
    assert main(["report", str(tmp_path), "--include", "train_*.jsonl", "-o", str(tmp_path / "r.md")]) == 0
    capsys.readouterr()
    body = _section((tmp_path / "r.md").read_text(), "## Training throughput")
    lines = body.splitlines()
    envs = [ln for ln in lines if ln.startswith("_Environment")]
    assert [e.split("commit ")[1].split(",")[0] for e in envs] == ["aaaaaaaaaaaa", "bbbbbbbbbbbb"]
    assert [e.split("measured ")[1] for e in envs] == ["2026-11-29T20:00:00+00:00._", "2026-12-01T19:00:00+00:00._"]
    assert [ln for ln in lines if ln.startswith("### ")] == [
        "### commit aaaaaaaaaaaa, measured 2026-11-29", "### commit bbbbbbbbbbbb, measured 2026-12-01"]
    assert [ln for ln in lines if ln.startswith("Worst")] == [
        "Worst step-time error: -30.0% (a); mean absolute error 20.0% over 2 configs.",
        "Worst step-time error: +5.0% (c); mean absolute error 5.0% over 1 configs."]
    # each row sits between its own env line and the next sub-head
    old, new = body.split("### commit bbbbbbbbbbbb")
    assert [ln.split(" | ")[0] for ln in old.splitlines() if ln.startswith("| ") and "%" in ln] == ["| a", "| b"]
    assert [ln.split(" | ")[0] for ln in new.splitlines() if ln.startswith("| ") and "%" in ln] == ["| c"]


def test_one_environment_keeps_the_single_env_line_and_states_its_runs_and_time_span(tmp_path, capsys):
    _write(tmp_path / "train.jsonl", _train("a", -0.2, "cccccccccccc", "2026-12-01T19:14:45+00:00", run="r1"),
           _train("b", 0.1, "cccccccccccc", "2026-12-01T19:15:31+00:00", run="r2"))
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.md")]) == 0
    capsys.readouterr()
    body = _section((tmp_path / "r.md").read_text(), "## Training throughput")
    assert "### " not in body
    assert [ln for ln in body.splitlines() if ln.startswith("_Environment")] == [
        "_Environment: torch 2.13.0+cpu, deepspeed 0.19.8, TE none, Xeon (2 CPUs), backend gloo, world size 2, "
        "commit cccccccccccc, 1-min load avg 1.00–1.00, measured 2026-12-01T19:14:45+00:00 to "
        "2026-12-01T19:15:31+00:00 (2 runs)._"]
    assert "mean absolute error 15.0% over 2 configs." in body


def test_comm_rows_of_one_backend_from_two_commits_get_a_table_each(tmp_path, capsys):
    _write(tmp_path / "comm.jsonl", _comm(1024, "dddddddddddd", "2026-11-29T16:00:00+00:00"),
           _comm(2048, "eeeeeeeeeeee", "2026-11-29T18:00:00+00:00"))
    assert main(["report", str(tmp_path), "-o", str(tmp_path / "r.md")]) == 0
    capsys.readouterr()
    lines = _section((tmp_path / "r.md").read_text(), "## Collectives").splitlines()
    heads = [i for i, ln in enumerate(lines) if ln.startswith("### ")]
    assert [lines[i] for i in heads] == ["### gloo, 2 ranks, float, commit dddddddddddd, measured 2026-11-29",
                                         "### gloo, 2 ranks, float, commit eeeeeeeeeeee, measured 2026-11-29"]
    first, second = lines[heads[0]:heads[1]], lines[heads[1]:]
    assert "commit dddddddddddd" in first[1] and [ln.split(" | ")[1] for ln in first if ln.startswith("| all")] == ["1K"]
    assert "commit eeeeeeeeeeee" in second[1] and [ln.split(" | ")[1] for ln in second if ln.startswith("| all")] == ["2K"]


def test_a_busbw_of_infinity_is_left_out_and_named_like_fast(tmp_path, capsys):
    path = tmp_path / "comm.jsonl"
    path.write_text(json.dumps(_comm(1024, "f" * 12, "2026-11-29T16:00:00+00:00")) + "\n"
                    + json.dumps(_comm(2048, "f" * 12, "2026-11-29T16:00:00+00:00", busbw=float("inf"))) + "\n")
    assert "Infinity" in path.read_text()
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"comm": 1}
    assert out["skipped"] == [f'{path} line 2: field "busbw" is inf (expected a number or null)']
    md = (tmp_path / "report.md").read_text()
    assert "inf" not in md.split("## Left out")[0] and "| all_reduce | 2K |" not in md
