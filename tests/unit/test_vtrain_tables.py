"""The vTrain measurements (Bang et al., MICRO'24) in the benchmarks: the layout-sweep table's vtrain_micro24 rows are
the committed CSV's rows, each number as printed, and benchmarks/small_model_sweeps.py reads every single-node row."""
import csv
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402
import small_model_sweeps as sms  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "vtrain"


def _csv_lines(name: str) -> list[str]:
    return (DATA / name).read_text(encoding="utf-8-sig").splitlines()[1:]


def test_layout_sweep_rows_are_the_multi_node_csv_as_printed():
    doc = ls.load()
    groups = [g for g in doc["groups"] if g["source"] == "vtrain_micro24"]
    rows = [(g, r) for g in groups for r in g["rows"]]
    lines = _csv_lines("ground_truth_multi.csv")
    assert len(lines) == 109 and len(rows) == 108  # one layout timed twice: a repeatability pair, not a row
    by_line = {r["text"]: (g, r) for g, r in rows}
    with (DATA / "ground_truth_multi.csv").open(encoding="utf-8-sig", newline="") as fh:
        fields = list(csv.DictReader(fh))
    for line, f in zip(lines, fields):
        if line not in by_line:
            pair = doc["repeatability"]["vtrain_micro24"][0]
            assert line in pair["text"] and float(f["iteration time (ms)"]) / 1e3 in (pair["a_s"], pair["b_s"])
            continue
        g, r = by_line[line]
        assert (r["tp"], r["dp"], r["pp"], r["micro_batch"], r["global_batch"]) == tuple(
            int(f[k]) for k in ("tensor parallelism", "data parallelism", "pipeline parallelism", "micro batch",
                                "global batch"))
        assert r["sec_per_iter"] == round(float(f["iteration time (ms)"]) / 1e3, 5)
        assert g["nodes"] * doc["common"]["vtrain_micro24"]["gpus_per_node"] == int(f["# GPUs"])
        assert (g["model"]["n_embd"], g["model"]["n_layer"], g["model"]["n_head"]) == tuple(
            int(f[k]) for k in ("hidden size", "# layers", "attention heads"))


def test_small_model_sweeps_reads_every_single_node_row_with_the_sources_facts():
    runs = sms.runs()
    assert len(runs) == len(_csv_lines("ground_truth_single.csv")) == 1440
    common = ls.load()["common"]["vtrain_micro24"]
    first = runs[0]
    assert first["gpu"] == common["gpu"] and first["execution"] == common["execution"]
    assert first["nodes"] == 1 and first["recompute"] == "full" and first["precision"] == "fp16"
    # the file's first row: 2 GPUs, global batch 16, micro batch 8, hidden 1024, 16 heads, 24 layers, seq 1024,
    # tp 1, dp 1, pp 2, 372.160408 ms
    assert (first["gpus_per_node"], first["global_batch"], first["micro_batch"], first["seq_len"]) == (2, 16, 8, 1024)
    assert (first["layout"]["tp"], first["layout"]["pp"]) == (1, 2)
    assert first["model"] == {"model_type": "gpt2", "n_embd": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 50257,
                              "n_positions": 1024}
    assert first["measured_step_s"] == 0.372160408
    assert len({r["group"] for r in runs}) == 144
