"""Published training runs against the estimator: predicted tokens/s per GPU beside what the sources measured.

Reads benchmarks/data/published_runs.yaml (measured runs from papers, framework READMEs and vendor tables, each
with its layout and its published figure normalised to tokens/s per GPU), writes one spec per run
(benchmarks/specs/published/<id>.yaml by default; the cluster-model fields — framework, overlap flags, pipeline
schedule and virtual stages, cp, attention_impl — come from the row's layout and execution: facts), runs the public estimator on each
(`python -m dstoolkit estimate SPEC --format json`, the CLI, so a restructuring of estimate/ underneath does not
break this script), and reports per run:

* predicted tokens/s/GPU = tokens_per_step / step_time_s / GPUs, beside the published figure, error = predicted ÷
  published − 1;
* efficiency on a bf16-peak basis for both: tokens/s/GPU × the estimator's model FLOPs per token ÷ the GPU's bf16
  peak (one FLOP count for both sides, so only the throughput differs);
* whether the estimator says the layout fits (every source really ran its layout, so "does not fit" is a false OOM),
  and whether the estimator kept the layout it was given;
* the `assumed` and `inexpressible` flags of the table row (closest expressible layout used).

Summary: MAPE of tokens/s/GPU, Spearman of tokens/s and of efficiency, the layouts predicted not to fit, the ten
worst rows. Outputs benchmarks/results/published_runs_<yyyymm>.{jsonl,md,png} (JSON Lines appended, markdown and
plot rewritten) through dstoolkit.runtime.bench (capture_env, render_markdown_table, write_report, save_figure).

    python benchmarks/published_runs.py                 # all runs, 2 estimator processes at a time (~4 min on 2 cores)
    python benchmarks/published_runs.py --only llama3   # runs whose id contains "llama3"
    python benchmarks/published_runs.py --render-from benchmarks/results/published_runs_202612.jsonl

Nothing here changes or calibrates the estimator: it is measured as it stands. With --loso (default) it also
reports leave-one-source-out figures: every fitted constant (benchmarks/estimator_fit.py) refitted on a grid without
the held-out source, per source and overall, in sample beside out of source, and whether each constant helps out of
source at all (pinned at its absent value, the others refitted).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import pathlib
import sys
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from dstoolkit.runtime.bench import harness, results_jsonl  # noqa: E402
from dstoolkit.runtime.bench.report import write_report  # noqa: E402

# The jobs live beside this script; gpus and peak_bf16 stay importable from `published_runs` for other scripts.
from published_runs_estimate import estimate, evaluate, peak_bf16  # noqa: E402,F401
from published_runs_loso import run_loso  # noqa: E402
from published_runs_report import plot, print_console, render_md  # noqa: E402
from published_runs_specs import (SPECS_DIR, TABLE, gpus, is_held_out_table, load_table, repo_relative,  # noqa: E402,F401
                                  spec_for, specs_dir_for, write_spec)
from published_runs_summary import summarize_rows  # noqa: E402

BENCH = "published_runs"
RESULTS_DIR = REPO / "benchmarks" / "results"


def summary_of(rows: list[dict], doc: dict) -> dict:
    """summarize_rows over the result rows; for a held-out table without the thirds split, and with the rows that
    repeat a fitted row's layout from another container (`repeats`) set apart: the others are new layouts."""
    if not is_held_out_table(doc):
        return summarize_rows(rows)
    summary = summarize_rows(rows, split=False)
    repeats = {r["id"] for r in doc["runs"] if r.get("repeats")}
    new = summarize_rows([r for r in rows if r["id"] not in repeats], split=False)
    summary["repeats"] = sorted(repeats & {r["id"] for r in rows})
    summary["new_layouts"] = {k: new[k] for k in ("runs", "mape", "spearman_efficiency")}
    return summary


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=pathlib.Path, default=TABLE)
    ap.add_argument("--specs-dir", type=pathlib.Path, default=None,
                    help="where the per-run specs are written (default benchmarks/specs/published/, "
                         "benchmarks/specs/held_out/ for a held-out table)")
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR, help="results folder")
    ap.add_argument("--tag", default=_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m"),
                    help="suffix of the result files (default: this UTC year and month)")
    ap.add_argument("--only", default=None, help="only runs whose id contains this text")
    ap.add_argument("--jobs", type=int, default=2, help="estimator processes at a time")
    ap.add_argument("--loso", action=argparse.BooleanOptionalAction, default=True,
                    help="leave one source out: refit the fitted constants without each source (default on, ~4 min)")
    ap.add_argument("--render-from", metavar="JSONL", type=pathlib.Path,
                    help="print the markdown of an existing result (its latest run) and exit; nothing is run or written")
    args = ap.parse_args(argv)

    doc = load_table(args.table)
    held = is_held_out_table(doc)
    specs_dir = args.specs_dir or specs_dir_for(doc)
    page = dict(table=repo_relative(args.table), specs_dir=repo_relative(specs_dir), held_out=held)
    if args.render_from:
        recs = results_jsonl.read_records(args.render_from)
        runs = [r for r in recs if r.get("bench") == BENCH and r.get("event") is None and "key" in r]
        if not runs:
            raise SystemExit(f"{args.render_from}: no {BENCH} records")
        last = runs[-1]["run_id"]
        rows = [r["result"] for r in runs if r["run_id"] == last]
        png = args.render_from.with_suffix(".png")
        sys.stdout.write(render_md(rows, summary_of(rows, doc), runs[-1]["env"], doc["sources"],
                                   png.name if png.exists() else None, **page))
        return 0

    runs = [dict(r, _index=i) for i, r in enumerate(doc["runs"]) if args.only is None or args.only in r["id"]]
    if not runs:
        raise SystemExit(f"no run id contains {args.only!r}")
    specs = {r["id"]: write_spec(r, doc["sources"][r["source"]], specs_dir, args.table) for r in runs}
    spec_docs = {r["id"]: spec_for(r) for r in runs}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = dict(zip([r["id"] for r in runs], pool.map(lambda r: estimate(specs[r["id"]]), runs)))
    rows = [evaluate(r, spec_docs[r["id"]], results[r["id"]]) for r in runs]
    summary = summary_of(rows, doc)
    if args.loso and held:
        print(f"{page['table']} is held out (nothing is fitted on it): no leave-one-source-out")
    elif args.loso:
        summary["loso"] = run_loso(runs, specs)

    env = harness.capture_env(world_size=1, config={"table": doc["runs"] if args.only is None else runs},
                              packages=("pyyaml", "pydantic", "transformers"))
    run_id = results_jsonl.open_run(None, BENCH, env["config_hash"]).run_id
    stem = f"{BENCH}_{args.tag}" if args.only is None else f"{BENCH}_{args.tag}_{args.only}"
    jsonl = args.out / f"{stem}.jsonl"
    records = []
    for row in rows:
        rec = results_jsonl.base_record(BENCH, run_id, row["id"], env)
        rec["result"] = row
        records.append(rec)
    results_jsonl.append_records(jsonl, records)
    results_jsonl.close_run(jsonl, BENCH, env["config_hash"], run_id, summary=summary)
    png = plot(rows, args.out / f"{stem}.png")
    md = render_md(rows, summary, env, doc["sources"], png.name if png is not None else None, **page)
    write_report(args.out / f"{stem}.md", md)
    print_console(rows, summary)
    print(f"\nwrote {jsonl}, {args.out / (stem + '.md')}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
