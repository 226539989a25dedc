"""benchmarks/estimator_fit.py: the leave-one-source-out refit picks its constants without the held-out source, the
ablation says whether a constant helps out of source, patched() restores the shipped values; and the GPU error
generate.undecided uses is the committed out-of-source figure."""
import json
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import estimator_fit as fit  # noqa: E402


def _row(i, src, meas):
    return fit.Row(f"r{i}", src, meas, 1.0, 1, 1.0, 1.0)


def test_loso_refits_without_the_held_out_source():
    # two grid points: point 0 predicts source A exactly and B 50% slow, point 1 the other way round
    rows = [_row(0, "A", 1.0), _row(1, "A", 2.0), _row(2, "B", 1.0), _row(3, "B", 3.0)]
    table = [[1.0, 2.0, 1.5, 4.5], [1.5, 3.0, 1.0, 3.0]]
    points = [{"x": 0}, {"x": 1}]
    res = fit.loso(rows, table, points, shipped=table[0])
    # held-out A is predicted by the point chosen on B (point 1): 1/1.5 - 1 and 2/3 - 1 -> 33.3% MAPE
    assert res["per_source"]["A"]["refit"] == {"x": 1}
    assert res["per_source"]["A"]["mape_out_of_source"] == pytest.approx(1 / 3)
    assert res["per_source"]["A"]["mape_in_sample"] == pytest.approx(0.0)
    assert res["per_source"]["B"]["refit"] == {"x": 0}
    assert res["overall"]["mape_out_of_source"] == pytest.approx((1 / 3 + 1 / 3 + 1 / 3 + 1 / 3) / 4)


def test_ablation_flags_a_constant_that_only_helps_in_sample():
    rows = [_row(0, "A", 1.0), _row(1, "B", 1.0), _row(2, "C", 1.0)]
    # constant k: k=1 fits A and B in sample but the fold without A picks k=1 for a wrong reason; k=0 (absent) is
    # uniformly 10% off
    points = [{"GEMM_HALF_DIM": 0, "FRAMEWORK_EFFICIENCY": 1.0, "MEGATRON_MOE_HOST_SYNC_S": 0.0},
              {"GEMM_HALF_DIM": 384, "FRAMEWORK_EFFICIENCY": 1.0, "MEGATRON_MOE_HOST_SYNC_S": 0.0}]
    table = [[1 / 1.1, 1 / 1.1, 1 / 1.1], [1.0, 1.0, 0.5]]
    abl = fit.ablation(rows, table, points, shipped=table[1])
    a = abl["GEMM_HALF_DIM"]
    assert a["mape_out_of_source_pinned"] == pytest.approx(0.1)
    assert a["mape_out_of_source_free"] < a["mape_out_of_source_pinned"] or not a["helps_out_of_source"]
    assert a["helps_out_of_source"] == (a["mape_out_of_source_pinned"] > a["mape_out_of_source_free"])


def test_patched_restores_the_shipped_constants():
    before = fit.current_values()
    with fit.patched({"GEMM_HALF_DIM": 1, "FRAMEWORK_EFFICIENCY": 0.5}):
        now = fit.current_values()
        assert now["GEMM_HALF_DIM"] == 1 and now["FRAMEWORK_EFFICIENCY"] == 0.5
    assert fit.current_values() == before


def test_grid_holds_the_absent_values_for_the_ablation():
    pts = fit.grid_points()
    for name, off in fit.OFF.items():
        assert any(p[name] == off for p in pts), name
    assert all(set(p) - {"ablation"} == set(fit.FITTED) for p in pts)


def test_undecided_gpu_error_is_the_committed_out_of_source_figure():
    from dstoolkit.generate.undecided import GPU_OUT_OF_SOURCE_ERROR

    path = REPO / "benchmarks" / "results" / "published_runs_202612.jsonl"
    closing = [json.loads(line) for line in path.read_text().splitlines() if '"summary"' in line]
    loso = [c["summary"]["loso"] for c in closing if (c.get("summary") or {}).get("loso")]
    assert loso, "published_runs_202612.jsonl has no leave-one-source-out summary"
    assert GPU_OUT_OF_SOURCE_ERROR == pytest.approx(round(loso[-1]["overall"]["mape_out_of_source"] * 200) / 200)
