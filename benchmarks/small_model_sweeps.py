"""Small models on one node at many layouts against the estimator: where a step is fixed costs, not FLOPs.

Reads benchmarks/data/vtrain/ground_truth_single.csv, the single-node measurements published with vTrain (Bang et
al., MICRO'24; VIA-Research/vTrain data/ground_truth_single.csv at f8dda84, copied byte for byte): 1440 Megatron-DeepSpeed
iterations of GPT models with hidden 1024 or 2048 and 12-24 layers (0.2-1.3B parameters), sequence 1024, on 2, 4 or
8 A100s of one node, at every tp x pp x dp x micro batch x global batch the authors ran. The cluster and execution
facts are those of the multi-node set in benchmarks/data/layout_sweeps.yaml (source vtrain_micro24, `common`), the
only other place they are stated. A group is one model on one GPU count at one global batch (its layouts differ in
tp, pp, dp and micro batch), scored as benchmarks/layout_sweeps.py scores a group (MAPE, Spearman of the order,
top-1 regret), plus the error by micro batch and by hidden size, where fixed per-kernel and per-micro-batch costs
show. None of these rows enters any fitted constant, so the figures are out of sample.

    python benchmarks/small_model_sweeps.py            # ~20 s on 2 cores

Specs go to a temporary folder (--specs-dir keeps them). Outputs benchmarks/results/small_model_sweeps_<tag>.{jsonl,md}.
"""
from __future__ import annotations

import argparse
import collections
import csv
import datetime as _dt
import json
import pathlib
import sys
import tempfile
from typing import Any, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402
from dstoolkit.runtime.bench.report import render_markdown_table, write_report  # noqa: E402

CSV = REPO / "benchmarks" / "data" / "vtrain" / "ground_truth_single.csv"
SOURCE = "vtrain_micro24"
VOCAB = 50257
"""vTrain's src/config.py default vocab_size; its configs do not set one."""


def runs(path: pathlib.Path = CSV, table: pathlib.Path = ls.TABLE) -> list[dict[str, Any]]:
    """Every CSV row as a published_runs-shaped run, with the source's common cluster and execution facts."""
    common = ls.load(table)["common"][SOURCE]
    out = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            n = int(r["# GPUs"])
            tp, pp, dp = (int(r[k]) for k in ("tensor parallelism", "pipeline parallelism", "data parallelism"))
            if tp * pp * dp != n:
                raise SystemExit(f"{path.name} row {i + 2}: tp*pp*dp = {tp * pp * dp} != {n} GPUs")
            h, layers, heads, seq = (int(r[k]) for k in ("hidden size", "# layers", "attention heads", "sequence length"))
            group = f"gpt_h{h}_l{layers}_{n}gpu_gbs{r['global batch']}"
            g = {"id": group, "source": SOURCE, "precision": "fp16",
                 "model": {"model_type": "gpt2", "n_embd": h, "n_layer": layers, "n_head": heads, "vocab_size": VOCAB,
                           "n_positions": seq}}
            row = {"tp": tp, "pp": pp, "micro_batch": int(r["micro batch"]), "global_batch": int(r["global batch"]),
                   "text": ",".join(r.values())}
            # one node of n GPUs at this row's sequence length; the source's other facts as layout_sweeps reads them
            run = ls._run(f"{group}_tp{tp}_pp{pp}_dp{dp}_mb{row['micro_batch']}", g,
                          {**common, "gpus_per_node": n, "seq_len": seq}, row, 1)
            out.append({**run, "group": group, "oom": False, "hidden": h,
                        "measured_step_s": float(r["iteration time (ms)"]) / 1e3})
    return out


def _mape(errs: list[float]) -> Optional[float]:
    return sum(abs(e) for e in errs) / len(errs) if errs else None


def by(rows: list[dict[str, Any]], key) -> list[list[Any]]:
    """Signed mean and MAPE of the throughput error per value of key(row)."""
    acc: dict[Any, list[float]] = collections.defaultdict(list)
    for r in rows:
        if r.get("predicted_step_s"):
            acc[key(r)].append(r["measured_step_s"] / r["predicted_step_s"] - 1.0)
    return [[k, len(v), f"{sum(v) / len(v):+.1%}", f"{_mape(v):.1%}"] for k, v in sorted(acc.items())]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=ls.RESULTS_DIR)
    ap.add_argument("--tag", default=_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m"))
    ap.add_argument("--specs-dir", type=pathlib.Path, default=None, help="keep the per-row specs here")
    args = ap.parse_args(argv)
    env = ls.harness.capture_env(1, "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        specs = args.specs_dir or pathlib.Path(tmp)
        rows = []
        for run in runs():
            row = ls.estimate_row(run, ls.write_spec(run, specs))
            row.update(group=run["group"], hidden=run["hidden"])
            rows.append(row)
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    scores = {g: ls.score_group(rs) for g, rs in groups.items()}
    summary = ls.summarize(scores)
    args.out.mkdir(parents=True, exist_ok=True)
    jsonl = args.out / f"small_model_sweeps_{args.tag}.jsonl"
    jsonl.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
    lines = ["# Small models on one node: measured layouts vs the estimator", "",
             f"`benchmarks/small_model_sweeps.py` over `benchmarks/data/vtrain/ground_truth_single.csv` (vTrain, Bang et "
             f"al., MICRO'24: Megatron-DeepSpeed GPT, hidden 1024/2048, 12-24 layers, sequence 1024, 2-8 A100s of one node): "
             f"{len(rows)} measured iterations in {len(groups)} groups (one model, GPU count and global batch). "
             "Error = predicted tokens/s ÷ measured − 1 (positive: the estimate is too fast). Out of sample: no row "
             "enters a fitted constant.", "",
             f"_Estimator at commit {str(env.get('git_commit'))[:12]}, {env.get('timestamp_utc')}._", "", "## Summary", ""]
    lines += render_markdown_table([
        ["throughput MAPE (all rows)", f"{summary['mape_rows']:.1%}"],
        [f"mean within-group Spearman ({summary['spearman_groups']} groups of ≥ 3)", f"{summary['mean_spearman_groups_ge3']:.3f}"],
        ["mean / worst top-1 regret", f"{summary['mean_top1_regret']:.1%} / {summary['max_top1_regret']:.1%}"],
        [f"measured best among the layouts marked undecided (within {summary['undecided_error']:.1%} of the fastest "
         f"estimate; generate/undecided.py)", f"{summary['undecided_best_marked']} of {summary['undecided_groups']}"],
        ["mean share of a group's layouts marked", f"{summary['undecided_share_marked']:.1%}"],
        ["mean / worst regret after `tune --mode real` measures the marked ones",
         f"{summary['mean_regret_after_measuring']:.1%} / {summary['max_regret_after_measuring']:.1%}"],
        ["layouts refused / predicted not to fit", f"{sum(len(s['refused']) for s in scores.values())} / "
                                                  f"{sum(len(s['false_oom']) for s in scores.values())}"],
    ], ["figure", ("value", "r")])
    line = ls.published_model_line(ls.load()["sources"][SOURCE], rows, "single_node")
    if line:
        lines += ["", line]
    for title, key in (("micro batch", lambda r: r["micro_batch"]), ("hidden size", lambda r: r["hidden"]),
                       ("tp x pp", lambda r: f"tp{r['layout']['tp']} pp{r['layout']['pp']}"),
                       ("tp x micro batch", lambda r: f"tp{r['layout']['tp']} mb{r['micro_batch']:02d}")):
        lines += ["", f"## Error by {title}", ""]
        lines += render_markdown_table(by(rows, key), [title, ("rows", "r"), ("signed mean", "r"), ("MAPE", "r")])
    write_report(args.out / f"small_model_sweeps_{args.tag}.md", lines)
    print(f"wrote {jsonl}, {args.out / f'small_model_sweeps_{args.tag}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
