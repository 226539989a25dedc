"""dstoolkit report: renders markdown + PNGs from JSON Lines, refuses to overwrite without --force."""
import json

import pytest

from dstoolkit.runtime.bench import harness, results_jsonl
from dstoolkit.cli import main


def _write_results(d):
    env = harness.capture_env(2, "gloo", {"t": 1})
    comm = []
    for op, factor in (("all_reduce", 1.0), ("all_gather", 0.5)):
        for size in (1024, 2048):
            t_us = 100.0 + size / 100
            algbw = size / (t_us * 1e-6) / 1e9
            comm.append({**results_jsonl.base_record("comm", "r1", f"{op}:{size}", env), "op": op, "size": size,
                         "count": size // 4, "type": "float", "time_us": t_us, "algbw": algbw, "busbw": algbw * factor,
                         "#wrong": 0, "backend": "gloo", "world_size": 2,
                         "busbw_stats": {"p10": algbw * factor * 0.9, "p90": algbw * factor * 1.1}})
    results_jsonl.append_records(d / "comm.jsonl", comm)
    st = lambda m: {"median": m}  # noqa: E731
    results_jsonl.append_records(d / "overlap.jsonl", [
        {**results_jsonl.base_record("overlap", "r2", f"z2|oc={oc}", env), "config_name": "zero2", "zero_stage": 2,
         "overlap_comm": bool(oc), "reduce_bucket_size": 1000, "compute_s": st(1.0), "comm_s": st(0.4),
         "overlapped_s": st(1.1), "exposed_comm_s": 0.1, "eta": 0.75, "compute_slowdown": 0.02}
        for oc in (0, 1)])
    results_jsonl.append_records(d / "train.jsonl", [
        {**results_jsonl.base_record("train", "r3", name, env), "config_name": name, "status": "ok",
         "measured": {"timed_steps": 3, "tokens_per_s": 500.0, "step_time_s_median": ms, "step_time_s_p90": ms * 1.1,
                      "peak_memory_bytes": 2**30, "mfu": 0.1, "loss_first": 7.6, "loss_last": 7.0},
         "estimate": {"step_time_s": es, "tokens_per_s": 450.0, "mfu": 0.09, "memory_per_rank_bytes": 2**29},
         "error": {"step_time_s": es / ms - 1, "tokens_per_s": -0.1, "memory_bytes": -0.5}}
        for name, ms, es in (("zero1", 1.0, 1.2), ("zero3", 2.0, 1.5))])


def test_report_renders_tables_and_plots(tmp_path, capsys):
    _write_results(tmp_path)
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"comm": 4, "overlap": 2, "train": 2}
    names = sorted(p.split("/")[-1] for p in out["plots"])
    assert names == ["report_comm_busbw.png", "report_overlap_eta.png", "report_train_step_time.png"]
    for p in out["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "| all_reduce | 1K |" in md and "busbw" in md
    assert "Worst step-time error: -25.0% (zero3)" in md
    assert "![busbw vs size](report_comm_busbw.png)" in md


def test_report_refuses_overwrite_and_empty_dirs(tmp_path, capsys):
    _write_results(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    assert main(["report", str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["report", str(tmp_path), "--force"]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_markdown_table_aligns_pads_and_renders_none_empty():
    from dstoolkit.runtime.bench.report import render_markdown_table

    lines = render_markdown_table([["a", 1, None], ["FAILED: x"]], ["name", ("n", "r"), ("note", "c")])
    assert lines == ["| name | n | note |", "|---|---:|:---:|", "| a | 1 |  |", "| FAILED: x |  |  |"]
    with pytest.raises(ValueError, match="3 cells for 2 columns"):
        render_markdown_table([[1, 2, 3]], ["a", "b"])


def test_atomic_write_replaces_whole_file_and_cleans_up_on_failure(tmp_path, monkeypatch):
    import os

    from dstoolkit.common import atomic
    from dstoolkit.runtime.bench.report import write_report

    target = tmp_path / "sub" / "r.md"
    write_report(target, ["# t", "", "x"])
    assert target.read_text() == "# t\n\nx\n"
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's private 0600

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic.atomic_write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "# t\n\nx\n"  # the old file, whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.md"]  # no temp file left
    assert os.path.exists(target)


def _umask() -> int:
    import os

    m = os.umask(0)
    os.umask(m)
    return m
