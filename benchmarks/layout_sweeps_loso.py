"""Layout sweeps, leave one source out: every fitted constant (benchmarks/estimator_fit.py) refitted on the
published_runs.yaml rows of the other sources (a sweep source is never in that table; `RELATED` names the published
source that shares its cluster and is left out with it), and each group predicted again."""
from __future__ import annotations

import datetime as _dt
import pathlib
from typing import Any

import estimator_fit as fit
import published_runs_specs as prs
from layout_sweeps_score import score_group
from layout_sweeps_table import SPECS_DIR
from published_runs_loso import fit_rows


RELATED = {"bigscience_prequel": {"bloom"}}
"""Sweep source -> published_runs sources of the same cluster and framework, left out of its LOSO fit too."""


def loso_sweeps(groups, rows_by_group, published_doc, specs_pub_dir: pathlib.Path,
                specs_dir: pathlib.Path = SPECS_DIR) -> dict[str, Any]:
    """Refit the fitted constants on published_runs rows of the other sources, re-predict each group."""
    pub_runs = [dict(r, _index=i) for i, r in enumerate(published_doc["runs"])]
    pub_rows, pub_plans = fit_rows(
        pub_runs, lambda r: prs.write_spec(r, published_doc["sources"][r["source"]], specs_pub_dir))
    sweep_items = []  # (group id, row index, plan)
    for g in groups:
        for j, row in enumerate(rows_by_group[g["id"]]):
            if row.get("predicted_step_s") is None:
                continue
            plan, _ = fit.plan_for_spec(specs_dir / f"{row['id']}.yaml")
            sweep_items.append((g["id"], j, plan))
    points = fit.grid_points()
    plans = pub_plans + [p for _, _, p in sweep_items]
    t0 = _dt.datetime.now()

    def progress(n, total):
        if n % 100 == 0 or n == total:
            print(f"  grid {n}/{total} ({(_dt.datetime.now() - t0).total_seconds():.0f} s)", flush=True)

    table = fit.evaluate_grid(plans, points, progress)
    npub = len(pub_plans)
    pub_table = [t[:npub] for t in table]
    shipped = [fit.step_time_s(pl) for pl in pub_plans]
    out = {"_published_runs": {"loso": fit.loso(pub_rows, pub_table, points, shipped),
                               "ablation": fit.ablation(pub_rows, pub_table, points, shipped)}}
    for g in groups:
        excluded = {g["source"]} | RELATED.get(g["source"], set())
        idx = [i for i, r in enumerate(pub_rows) if r.source not in excluded]
        p = fit.best_point(pub_rows, pub_table, idx, points)
        refit = [dict(r) for r in rows_by_group[g["id"]]]
        for k, (gid, j, _) in enumerate(sweep_items):
            if gid == g["id"]:
                refit[j]["predicted_step_s"] = table[p][npub + k]
        out[g["id"]] = {"refit": points[p], "score": score_group(refit)}
    return out
