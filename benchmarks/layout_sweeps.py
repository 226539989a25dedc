"""Measured layout sweeps against the estimator: does it put the layouts of one model on one cluster in the order
they measured, and is its fastest pick really fast? (issue 24, deliverable 1)

Reads benchmarks/data/layout_sweeps.yaml: groups of measured runs (one model, one cluster, one framework, one
sequence length, several tp x pp x dp x micro batch layouts), each row cited; plus groups of
benchmarks/data/published_runs.yaml rows that share model, cluster, sequence length and batch. Writes one spec per
row (benchmarks/specs/layout_sweeps/<id>.yaml), builds the plan the CLI builds for it (`dstoolkit estimate SPEC`'s
own loader) and estimates it in process. Per group:

* MAPE of throughput (predicted tokens/s ÷ measured − 1, over the rows that ran);
* Spearman of predicted vs measured time per token (the order of the layouts; per token because a few rows ran
  2016 instead of 2048 sequences);
* top-1 regret: measured time per token of the layout the estimator ranks fastest (among those it says fit) over
  the measured best, − 1;
* the layouts `sweep` / `generate` mark as undecided (`generate.undecided`: estimated time per token within the GPU
  model's out-of-source error of the fastest estimate, among those estimated to fit), whether the measured best is
  among them, and the regret left after `tune --mode real` measures just those (the best measured of the marked
  ones over the measured best, − 1);
* `sweep`'s own top pick, when every layout of the group lies in the sweep's space (tp, pp and micro batch as
  `generate.candidate_grid.enumerate_candidates` tries them, one global batch); else why not;
* refusals (the toolkit rejects a layout that really ran: must be 0), false OOMs (a layout that ran predicted not
  to fit), and layouts the source reports out of memory that the estimator says fit.

Leave-one-source-out (`--loso`, default on): every fitted constant (benchmarks/estimator_fit.py) is refitted on the
published-runs rows of the other sources (a sweep source is never in that table; `RELATED` names the published
source that shares its cluster and is left out with it), and the group is predicted again.

    python benchmarks/layout_sweeps.py            # ~6 min on 2 cores with --loso
    python benchmarks/layout_sweeps.py --no-loso  # ~40 s

Outputs benchmarks/results/layout_sweeps_<yyyymm>.{jsonl,md}. Nothing here changes the estimator.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import pathlib
import sys
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from dstoolkit.runtime.bench import harness, results_jsonl  # noqa: E402
from dstoolkit.runtime.bench.report import write_report  # noqa: E402
from published_runs_specs import load_table  # noqa: E402

# The jobs live beside this script; the names other scripts and the tests read from `layout_sweeps` stay here.
from layout_sweeps_loso import RELATED, loso_sweeps  # noqa: E402,F401
from layout_sweeps_noise import ceilings, mape_floor, noise_ceiling, repeat_sigma  # noqa: E402,F401
from layout_sweeps_report import _pct, _sp, by_source_rows, published_model_line, render_md, single_node_lines  # noqa: E402,F401
from layout_sweeps_score import (SWEEP_SPACE, estimate_row, execution_ab, marked_undecided,  # noqa: E402,F401
                                 memory_check, per_token, score_group, single_node, summarize, sweep_pick,
                                 sweep_pick_summary)
from layout_sweeps_table import SPECS_DIR, TABLE, _run, group_runs, load, write_spec  # noqa: E402,F401

BENCH = "layout_sweeps"
RESULTS_DIR = REPO / "benchmarks" / "results"
GOALS = {"mape": 0.08, "mean_spearman": 0.85, "top1_regret": 0.03, "refused": 0}
"""Issue 24 'Done when' for the layout sweeps."""


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=pathlib.Path, default=TABLE)
    ap.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR)
    ap.add_argument("--specs-dir", type=pathlib.Path, default=SPECS_DIR)
    ap.add_argument("--tag", default=_dt.datetime.now(_dt.timezone.utc).strftime("%Y%m"))
    ap.add_argument("--loso", action=argparse.BooleanOptionalAction, default=True,
                    help="refit the fitted constants without each group's source (default on; ~5 min)")
    args = ap.parse_args(argv)
    doc = load(args.table)
    published = load_table()
    groups = group_runs(doc, published)
    rows_by_group, scores, sweeps = {}, {}, {}
    for g in groups:
        paths = {r["id"]: write_spec(r, args.specs_dir) for r in g["runs"]}
        rows = [estimate_row(r, paths[r["id"]]) for r in g["runs"]]
        rows_by_group[g["id"]] = rows
        scores[g["id"]] = score_group(rows)
        try:
            sweeps[g["id"]] = sweep_pick(g, rows, paths[g["runs"][0]["id"]])
        except Exception as exc:  # reported in the table, never hidden
            sweeps[g["id"]] = {"applicable": False, "why": f"sweep failed: {exc}"}
        sc = scores[g["id"]]
        print(f"{g['id']:42s} ran {sc['ran']:2d}  MAPE {_pct(sc['mape']):>6s}  Spearman {_sp(sc['spearman']):>6s}  "
              f"regret {_pct(sc['top1_regret']):>6s}  refused {len(sc['refused'])}  false OOM {len(sc['false_oom'])}  "
              f"missed OOM {len(sc['missed_oom'])}", flush=True)
    summary = summarize(scores)
    summary["sweep_pick"] = sweep_pick_summary(sweeps)
    print(f"\nall: {summary}")
    loso = loso_sweeps(groups, rows_by_group, published, args.specs_dir.parent / "published", args.specs_dir) if args.loso else {}
    pub = loso.get("_published_runs") if loso else None
    if loso:
        lsum = summarize({k: v["score"] for k, v in loso.items() if k != "_published_runs"})
        print(f"loso: {lsum}")
        summary["loso"] = lsum
        po = pub["loso"]["overall"]
        summary["published_runs_loso"] = po
        summary["published_runs_ablation"] = pub["ablation"]
        print(f"published_runs LOSO: MAPE in {_pct(po['mape_in_sample'])} out {_pct(po['mape_out_of_source'])}; "
              f"eff Spearman in {_sp(po['spearman_eff_in_sample'])} out {_sp(po['spearman_eff_out_of_source'])}")
        for k, v in pub["ablation"].items():
            print(f"  {k}: OOS free {_pct(v['mape_out_of_source_free'])} pinned {_pct(v['mape_out_of_source_pinned'])}")
    summary["memory_vs_reported"] = memory_check([r for g in groups for r in rows_by_group[g["id"]]])
    mv = summary["memory_vs_reported"]
    print(f"memory vs reported ({mv['rows']} rows): measured / (peak + allowance) median "
          f"{mv['peak']['median_measured_over_estimate']}, / (sum of parts + allowance) "
          f"{mv['sum_of_parts']['median_measured_over_estimate']}")
    summary["noise_ceiling"] = ceilings(groups, rows_by_group, scores, doc,
                                        {k: v for k, v in loso.items() if k != "_published_runs"} if loso else None)
    nc = summary["noise_ceiling"]
    print(f"noise ceiling: sigma {nc['sigma_by_source']}; mean Spearman ceiling {_sp(nc['mean_ceiling'])} over "
          f"{nc['groups']} groups; model {_sp(nc['mean_model_spearman'])} (loso {_sp(nc['mean_model_spearman_loso'])})")
    summary["execution_ab"] = execution_ab(doc, args.specs_dir)
    for a in summary["execution_ab"]:
        print(f"A/B {a['id']} row {a['row']} ({a['field']}): predicted {_pct(a['predicted_cost'])}, "
              f"measured {_pct(a['measured_cost'])}")
    summary["single_node"] = single_node(doc, args.specs_dir)
    for a in summary["single_node"]:
        print(f"one node {a['id']} row {a['row']}: measured {a['measured_step_s']} s, predicted "
              f"{a['predicted_step_s']:.2f} s, error {_pct(a['error'])}")
    env = harness.capture_env(world_size=1, config={"table": doc}, packages=("pyyaml", "pydantic"))
    run_id = results_jsonl.open_run(None, BENCH, env["config_hash"]).run_id
    jsonl = args.out / f"{BENCH}_{args.tag}.jsonl"
    records = []
    for g in groups:
        rec = results_jsonl.base_record(BENCH, run_id, g["id"], env)
        rec["result"] = {"group": g["id"], "source": g["source"], "where": g["where"], "rows": rows_by_group[g["id"]],
                         "score": scores[g["id"]], "sweep_pick": sweeps[g["id"]],
                         "loso": loso.get(g["id"]) if loso else None}
        records.append(rec)
    results_jsonl.append_records(jsonl, records)
    results_jsonl.close_run(jsonl, BENCH, env["config_hash"], run_id, summary=summary)
    write_report(args.out / f"{BENCH}_{args.tag}.md",
                 render_md(groups, rows_by_group, scores, sweeps, summary, loso, env, doc))
    print(f"wrote {jsonl}, {args.out / (BENCH + '_' + args.tag + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
