"""benchmarks/layout_sweeps.py single_node: a source's one-node rows (no network), estimated as its groups' rows."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import layout_sweeps as ls  # noqa: E402


def _one(doc, entry_id, rows):
    (e,) = [e for e in doc["single_node"] if e["id"] == entry_id]
    return {**doc, "single_node": [{**e, "rows": rows(e["rows"])}]}


def test_error_is_measured_over_predicted_step_and_the_row_is_estimated_on_one_node(tmp_path):
    doc = _one(ls.load(), "prequel_18b_l10_one_node", lambda rows: rows)
    (a,) = ls.single_node(doc, tmp_path)
    assert a["measured_step_s"] == 205.52
    assert a["error"] == pytest.approx(205.52 / a["predicted_step_s"] - 1)
    (spec,) = sorted(tmp_path.iterdir())
    text = spec.read_text(encoding="utf-8")
    assert "nodes: 1\n" in text and "n_layer: 10\n" in text and "global_batch: 512\n" in text


def test_a_row_that_does_not_fill_the_node_is_refused(tmp_path):
    doc = _one(ls.load(), "prequel_18b_l10_one_node", lambda rows: [{**rows[0], "tp": 4}])
    with pytest.raises(SystemExit, match="tp\\*pp\\*dp must fill the one node"):
        ls.single_node(doc, tmp_path)


def test_report_puts_the_source_multi_node_mean_beside_the_one_node_row():
    one = [{"id": "x", "source": "s", "row": 0, "text": "| a |", "micro_batch": 2, "global_batch": 512,
            "measured_step_s": 110.0, "predicted_step_s": 100.0, "error": 0.1}]
    groups = [{"id": "g", "source": "s"}, {"id": "h", "source": "other"}]
    rows = {"g": [{"measured_step_s": 120.0, "predicted_step_s": 100.0},
                  {"measured_step_s": 100.0, "predicted_step_s": 100.0}],
            "h": [{"measured_step_s": 300.0, "predicted_step_s": 100.0}]}
    text = "\n".join(ls.single_node_lines(one, groups, rows))
    # the source's own rows only: (20% + 0%) / 2
    assert "| x | 2 | 512 | 110.00 | 100.00 | 10.0% | 10.0% | \\| a \\| |" in text
