"""benchmarks/published_runs.py on a table marked `held_out: true` (benchmarks/data/held_out_runs.yaml): nothing is
fitted on it, so it reports no split into training / held-out thirds, its page names that table and its specs
folder, and its specs say which table generated them."""
import pathlib
import sys

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import published_runs_report as report  # noqa: E402
import published_runs_specs as prs  # noqa: E402
from published_runs_summary import summarize_rows  # noqa: E402


def _row(rid, err, held_out):
    return {"id": rid, "model": "m", "gpus": 8, "gpu": "H100-SXM", "micro_batch": 1, "global_batch": 8,
            "seq_len": 4096, "precision": "fp8", "recompute": "none", "inexpressible": [], "assumed": [], "held_out": held_out,
            "layout": {"tp": 1, "pp": 1, "zero_stage": 1}, "fits": True, "error": err,
            "published_tokens_per_s_per_gpu": 100.0, "predicted_tokens_per_s_per_gpu": 100.0 * (1 + err),
            "published_efficiency": 0.5 + err, "predicted_efficiency": 0.5 + 2 * err, "source": "s",
            "memory_per_rank_gib": 10.0, "gpu_memory_gib": 80.0}


ROWS = [_row("a", 0.1, False), _row("b", -0.2, False), _row("c", 0.05, True), _row("d", 0.3, True)]
ENV = {"git_commit": "abc", "timestamp_utc": "t", "python": "3.11"}


def test_held_out_table_is_marked_and_gets_its_own_specs_folder():
    doc = prs.load_table(prs.HELD_OUT_TABLE)
    assert prs.is_held_out_table(doc) and not prs.is_held_out_table(prs.load_table())
    assert prs.specs_dir_for(doc) == prs.HELD_OUT_SPECS_DIR and prs.specs_dir_for({}) == prs.SPECS_DIR


def test_no_thirds_split_on_a_held_out_table():
    assert set(summarize_rows(ROWS)["split"]) == {"train", "held_out"}
    s = summarize_rows(ROWS, split=False)
    assert s["split"] is None and s["mape"] == (0.1 + 0.2 + 0.05 + 0.3) / 4


def test_page_names_the_table_and_says_held_out():
    s = summarize_rows(ROWS, split=False)
    s["sources"] = 1
    md = report.render_md(ROWS, s, ENV, {}, None, table="benchmarks/data/held_out_runs.yaml",
                          specs_dir="benchmarks/specs/held_out", held_out=True)
    assert md.startswith("# Held-out published runs vs the estimator")
    assert "over `benchmarks/data/held_out_runs.yaml`" in md and "(`benchmarks/specs/held_out/`)" in md
    assert "no constant was ever fitted on these rows" in md and "i % 3" not in md
    assert "- `d`: +30.0%" in md  # more than 15% off, with no training / held-out third label
    fitted = report.render_md(ROWS, dict(summarize_rows(ROWS), sources=1), ENV, {}, None)
    assert "over `benchmarks/data/published_runs.yaml`" in fitted and "i % 3 == 2" in fitted


def test_spec_header_names_its_table(tmp_path):
    doc = prs.load_table(prs.HELD_OUT_TABLE)
    run = doc["runs"][0]
    path = prs.write_spec(run, doc["sources"][run["source"]], tmp_path, prs.HELD_OUT_TABLE)
    text = path.read_text(encoding="utf-8")
    assert "from benchmarks/data/held_out_runs.yaml; edit the table" in text
    assert yaml.safe_load(text)["name"] == run["id"]
