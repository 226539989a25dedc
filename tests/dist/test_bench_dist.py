"""Real 2-rank gloo runs of the three benches and the report (marker dist; one launch per bench, shared)."""
import json
import math

import pytest

from dstoolkit.runtime.bench import results_jsonl
from dstoolkit.cli import main

pytestmark = pytest.mark.dist

COMM_COLUMNS = ("size", "count", "type", "time_us", "algbw", "busbw", "#wrong")


def _json_out(capsys):
    out = capsys.readouterr().out
    return json.loads(out[out.index("["):])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return tmp_path_factory.mktemp("bench_results")


def test_comm_bench_two_ranks_correct_and_resumable(results, capsys):
    out = results / "comm.jsonl"
    argv = ["bench", "comm", "--backend", "gloo", "--world-size", "2", "--sizes", "1K,256K", "--iters", "2",
            "--reps", "3", "--warmup", "1", "--out", str(out), "--format", "json", "--no-progress"]
    assert main(argv) == 0
    rows = _json_out(capsys)
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
    assert len(rows) == 10
    for r in rows:
        for col in COMM_COLUMNS:
            assert col in r, col
        assert r["#wrong"] == 0
        assert r["time_us"] > 0 and len(r["samples_us"]) == 3
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9, rel=1e-9)
        factor = {"all_reduce": 1.0, "broadcast": 1.0}.get(r["op"], 0.5)  # n = 2
        assert r["busbw"] == pytest.approx(r["algbw"] * factor, rel=0.05)  # medians of per-sample busbw
        assert r["env"]["world_size"] == 2 and r["env"]["torch"]

    # Simulate an interrupt: drop the run_done marker and the last row, then rerun the same command.
    lines = out.read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "run_done"
    out.write_text("\n".join(lines[:-2]) + "\n")
    assert main(argv) == 0
    capsys.readouterr()
    recs = results_jsonl.read_records(out)
    run_ids = {r["run_id"] for r in recs}
    assert len(run_ids) == 1, "the rerun resumed the interrupted run"
    keys = [r["key"] for r in recs if r.get("event") is None]
    assert len(keys) == 10 and len(set(keys)) == 10, "only the missing row was measured again"
    assert recs[-1].get("event") == "run_done"


@pytest.fixture(scope="module")
def zero_config(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    path = d / "zero2.json"
    path.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}))
    return path


@pytest.mark.slow
def test_overlap_bench_two_ranks(results, zero_config, capsys):
    out = results / "overlap.jsonl"
    rc = main(["bench", "overlap", str(zero_config), "--model", "tiny", "--bucket-sizes", "1e6", "--overlap", "on",
               "--steps", "2", "--warmup", "1", "--seq-len", "32", "--out", str(out), "--format", "json", "--no-progress"])
    assert rc == 0
    (rec,) = _json_out(capsys)
    for key in ("compute_s", "comm_s", "overlapped_s", "exposed_comm_s", "eta", "eta_raw", "compute_slowdown",
                "comm_calls", "env"):
        assert key in rec, key
    assert 0.0 <= rec["eta"] <= 1.0
    assert rec["eta_profiler"] is None or 0.0 <= rec["eta_profiler"] <= 1.0
    assert rec["overlap_comm"] is True and rec["reduce_bucket_size"] == 1_000_000
    # ZeRO-2 of a 3.95M-parameter model with 1e6-element buckets issues several gradient collectives
    assert rec["comm_bytes_per_step"] > 0 and sum(c["count"] for c in rec["comm_calls"]) >= 2
    assert rec["comm_s"]["median"] > 0 and rec["compute_s"]["median"] > 0


@pytest.mark.slow
def test_train_bench_two_ranks_with_estimate(results, zero_config, repo_root, capsys):
    out = results / "train.jsonl"
    rc = main(["bench", "train", str(zero_config), "--spec", str(repo_root / "ds_configs" / "tiny_cpu.yaml"),
               "--steps", "3", "--skip-steps", "1", "--out", str(out), "--format", "json", "--no-progress"])
    assert rc == 0
    (rec,) = _json_out(capsys)
    assert rec["status"] == "ok", rec.get("error_tail")
    m = rec["measured"]
    assert m["timed_steps"] == 2 and m["step_time_s_median"] > 0 and m["step_time_s_p90"] >= m["step_time_s_median"]
    from dstoolkit.spec import load_spec

    spec = load_spec(repo_root / "ds_configs" / "tiny_cpu.yaml")
    assert rec["seq_len"] == spec.training.seq_len
    assert m["global_batch"] == 8 and m["tokens_per_step"] == 8 * spec.training.seq_len  # mb 4 x 2 ranks
    assert m["peak_memory_bytes"] > 0 and math.isfinite(m["loss_last"])
    assert "deepspeed" in rec["command"] and "dstoolkit.runtime.train.trainer" in rec["command"]
    est = rec["estimate"]
    assert "error" not in est, est
    assert est["step_time_s"] > 0 and rec["error"]["step_time_s"] == pytest.approx(
        est["step_time_s"] / m["step_time_s_median"] - 1)


def test_report_renders_from_bench_results(results, capsys):
    assert main(["report", str(results), "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["counts"]) >= {"comm"}
    md = (results / "report.md").read_text()
    assert "## Collectives" in md and "#wrong" in md
    for p in info["plots"]:
        assert open(p, "rb").read(4) == b"\x89PNG"
