"""benchmarks/layout_sweeps.py published_model_line: a source's own model's published error beside the estimator's
on the same rows (iteration-time and throughput MAPE), and the published figure read from the table."""
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402

SRC = {"published_model_error": {"model": "Sim", "metric": "MAPE of the iteration time", "multi_node": 0.1473,
                                 "cite": "a release"}}


def test_line_gives_both_mapes_over_the_rows_that_ran():
    rows = [{"predicted_step_s": 1.0, "measured_step_s": 1.25},  # time -20%, throughput +25%
            {"predicted_step_s": 2.0, "measured_step_s": 2.0},
            {"oom": True, "predicted_step_s": 1.0, "measured_step_s": None}]
    line = ls.published_model_line(SRC, rows, "multi_node", mape_loso=0.1)
    assert line == ("**The source's own model.** Sim reports a MAPE of the iteration time of 14.7% on these "
                    "multi-node measurements (a release). On the same 2 rows, from the spec alone: iteration-time MAPE "
                    "10.0%, throughput MAPE 12.5% in sample, 10.0% out of source.")


def test_no_line_without_a_published_figure_or_rows():
    rows = [{"predicted_step_s": 1.0, "measured_step_s": 1.0}]
    assert ls.published_model_line(SRC, rows, "single_node") is None
    assert ls.published_model_line({}, rows, "multi_node") is None
    assert ls.published_model_line(SRC, [], "multi_node") is None


def test_the_table_states_vtrains_published_errors():
    pub = ls.load()["sources"]["vtrain_micro24"]["published_model_error"]
    assert (pub["multi_node"], pub["single_node"]) == (0.1473, 0.0837)
    assert "14.73%" in pub["cite"] and "8.37%" in pub["cite"]


def _score(mape, ran, sp, regret):
    return {"mape": mape, "ran": ran, "spearman": sp, "top1_regret": regret, "best_marked": None, "marked": [],
            "regret_after_measuring": None, "refused": [], "false_oom": [], "missed_oom": [], "missed_oom_cautioned": []}


def test_by_source_rows_summarise_each_source_alone():
    groups = [{"id": "a1", "source": "a"}, {"id": "b1", "source": "b"}, {"id": "a2", "source": "a"}]
    scores = {"a1": _score(0.10, 4, 0.8, 0.02), "a2": _score(0.04, 2, None, 0.0), "b1": _score(0.05, 3, 1.0, 0.0)}
    rows = ls.by_source_rows(groups, scores, {})
    assert rows == [["a", "2", "6", "8.0%", "–", "0.800 (1)", "1.0% / 2.0%"],
                    ["b", "1", "3", "5.0%", "–", "1.000 (1)", "0.0% / 0.0%"]]
    loso = {g: {"score": scores[g]} for g in scores}
    assert ls.by_source_rows(groups, scores, loso)[0][4] == "8.0%"
