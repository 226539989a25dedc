"""Harness core: statistics, resumable append-only JSON Lines, environment capture."""
import json

import pytest

from dstoolkit.runtime.bench import harness, results_jsonl, stats


def test_summarize_matches_numpy_percentiles():
    import numpy as np

    rng = np.random.default_rng(0)
    xs = rng.lognormal(size=37).tolist()
    st = stats.summarize(xs)
    assert st.n == 37
    assert st.median == pytest.approx(np.percentile(xs, 50))
    assert st.p10 == pytest.approx(np.percentile(xs, 10))
    assert st.p90 == pytest.approx(np.percentile(xs, 90))
    assert st.iqr == pytest.approx(np.percentile(xs, 75) - np.percentile(xs, 25))
    assert st.rel_spread == pytest.approx((st.p90 - st.p10) / st.median)


def test_summarize_refuses_empty():
    with pytest.raises(ValueError, match="at least one sample"):
        stats.summarize([])


def test_time_repeated_gives_one_sample_per_rep_after_warmup():
    calls = []
    samples = harness.time_repeated(lambda: calls.append(1), warmup=3, reps=4, inner=5, sync=lambda: None)
    assert len(samples) == 4
    assert len(calls) == 3 + 4 * 5
    assert all(s >= 0 for s in samples)
    with pytest.raises(harness.BenchInputError, match="reps"):
        harness.time_repeated(lambda: None, warmup=0, reps=0)


def test_append_never_rewrites_and_skips_torn_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    results_jsonl.append_records(path, [{"a": 1}])
    results_jsonl.append_records(path, [{"a": 2}])
    with open(path, "a") as fh:
        fh.write('{"a": 3, "torn')  # an interrupted write
    recs = results_jsonl.read_records(path)
    assert [r["a"] for r in recs] == [1, 2]
    assert [(b.line, b.reason) for b in recs.bad_lines] == [
        (3, "cut off: the last line has no newline (an interrupted write?)")]
    assert path.read_text().startswith('{"a": 1}')


def test_interrupted_run_resumes_and_completed_run_starts_fresh(tmp_path):
    path = tmp_path / "r.jsonl"
    first = results_jsonl.open_run(path, "comm", "h1")
    assert not first.resumed and not first.done_keys
    env = {"config_hash": "h1"}
    results_jsonl.append_records(path, [results_jsonl.base_record("comm", first.run_id, "k1", env),
                                  results_jsonl.base_record("comm", first.run_id, "k2", env)])
    # No run_done marker: the same command resumes the same run and skips k1, k2.
    again = results_jsonl.open_run(path, "comm", "h1")
    assert again.resumed and again.run_id == first.run_id and again.done_keys == {"k1", "k2"}
    # A different config never resumes someone else's run.
    assert not results_jsonl.open_run(path, "comm", "other").resumed
    assert not results_jsonl.open_run(path, "comm", "h1", resume=False).resumed
    results_jsonl.close_run(path, "comm", "h1", first.run_id)
    after = results_jsonl.open_run(path, "comm", "h1")
    assert not after.resumed and after.run_id != first.run_id


def test_run_rows_of_a_resumed_run_include_the_interrupted_part(tmp_path):
    path = tmp_path / "r.jsonl"
    env = {"config_hash": "h1"}
    first = results_jsonl.open_run(path, "train", "h1")
    k1 = results_jsonl.base_record("train", first.run_id, "k1", env)
    results_jsonl.append_records(path, [k1])
    assert results_jsonl.run_rows(path, first, [k1]) == [k1]  # a fresh run: the rows it measured
    again = results_jsonl.open_run(path, "train", "h1")
    k2 = results_jsonl.base_record("train", again.run_id, "k2", env)
    results_jsonl.append_records(path, [k2])
    rows = results_jsonl.run_rows(path, again, [k2])  # resumed: k1 (written before the interrupt) and k2
    assert [r["key"] for r in rows] == ["k1", "k2"]
    results_jsonl.close_run(path, "train", "h1", again.run_id)
    assert [r["key"] for r in results_jsonl.run_rows(path, again, [k2])] == ["k1", "k2"]  # the marker is no row
    assert results_jsonl.run_rows(None, again, [k2]) == [k2]


def test_env_capture_has_versions_hardware_commit_and_hash():
    env = harness.capture_env(2, "gloo", {"x": 1})
    for key in ("torch", "deepspeed", "transformer_engine", "cpu_model", "gpu_model", "world_size", "git_commit",
                "config_hash", "load_avg", "timestamp_utc"):
        assert key in env
    assert env["world_size"] == 2
    assert env["torch"] and env["torch"].startswith("2.")
    assert env["config_hash"] == harness.config_hash({"x": 1}) != harness.config_hash({"x": 2})
    json.dumps(env)  # serialisable


def test_config_hash_ignores_key_order():
    assert harness.config_hash({"a": 1, "b": [1, 2]}) == harness.config_hash({"b": [1, 2], "a": 1})


def test_spearman_ranks_with_ties_and_constant_input():
    import math

    from dstoolkit.runtime.bench.stats import spearman

    assert abs(spearman([1, 2, 3, 4], [10, 20, 30, 40]) - 1.0) < 1e-12
    assert abs(spearman([1, 2, 3, 4], [4, 3, 2, 1]) + 1.0) < 1e-12
    # ranks 1,2,3 vs 1,3,2: 1 - 6*2/(3*8) = 0.5
    assert abs(spearman([1, 2, 3], [1, 3, 2]) - 0.5) < 1e-12
    # ties share the average rank: [1, 2.5, 2.5, 4] vs [1, 2, 3, 4]
    assert abs(spearman([1, 5, 5, 9], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-12
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
