"""docs/tune.md describes what tune does now (review s32 #9) and labels the tune-vs-grid table with the commit and
seeding it was measured with, so it does not read as this code's."""
from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_tune_doc_describes_current_behaviour():
    text = " ".join((ROOT / "docs" / "tune.md").read_text().split())
    for phrase in ("one point per distinct layout", "default DeepSpeed settings", "memory headroom",
                   "passed over for the N% memory headroom", "\"caution\" note", "JSON `notes`",
                   "another `--seed` is refused (exit 2)", "130 Ctrl-C, 143 SIGTERM",
                   "`best_spec.yaml` keeps the spec's", "refused with the cluster to set",
                   "data parallel only (tp = pp = 1)", "not measurable by tune"):
        assert phrase in text, phrase
    assert "more (up to half) when several points are estimated within 5% of the best" not in text


def test_tune_vs_grid_table_names_the_commit_and_seeding_it_was_measured_with():
    text = " ".join((ROOT / "docs" / "tune.md").read_text().split())
    head, _, table = text.partition("<!-- BEGIN generated: tune-vs-grid")
    assert "Measured at commit f8cf594 (2026-11-29) with the seeding of that time" in head
    assert "not a reading of this code's tuner" in head and "| budget 3 |" in table
    bench = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    assert "(measured at f8cf594, with the seeding before f636ae9; not rerun since)" in bench
