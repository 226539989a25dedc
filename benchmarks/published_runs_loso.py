"""Published runs, leave one source out (issue 24): every fitted constant (benchmarks/estimator_fit.py) refitted on
a grid without the held-out source, per source and overall, and whether each constant helps out of source at all
(pinned at its absent value, the others refitted). benchmarks/layout_sweeps_loso.py fits on the same rows."""
from __future__ import annotations

import datetime as _dt
import pathlib
from typing import Any, Callable, Optional

import estimator_fit as fit
from published_runs_estimate import peak_bf16
from published_runs_specs import gpus


def fit_rows(runs: list[dict[str, Any]],
             spec_path: Callable[[dict[str, Any]], pathlib.Path]) -> tuple[list[fit.Row], list[Any]]:
    """The fit rows and plans of the runs whose spec (`spec_path(run)`, taken run by run) the CLI's loader plans: the
    measured step time from the published tokens/s/GPU, the estimator's tokens per step and FLOPs per token."""
    rows, plans = [], []
    for r in runs:
        plan, err = fit.plan_for_spec(spec_path(r))
        if plan is None:
            continue
        from dstoolkit.estimate import estimate_run

        est = estimate_run(plan)
        tokens = float(est.tokens_per_step)
        rows.append(fit.Row(r["id"], r["source"], tokens / (float(r["tokens_per_s_per_gpu"]) * gpus(r)), tokens, gpus(r),
                            float(est.flops_per_token), peak_bf16(r["gpu"])))
        plans.append(plan)
    return rows, plans


def run_loso(runs: list[dict[str, Any]], specs: dict[str, pathlib.Path]) -> Optional[dict[str, Any]]:
    """LOSO and the per-constant ablation over the table (benchmarks/estimator_fit.py), in process."""
    rows, plans = fit_rows(runs, lambda r: specs[r["id"]])
    if len({r.source for r in rows}) < 2:
        return None
    shipped = [fit.step_time_s(pl) for pl in plans]
    points = fit.grid_points()
    t0 = _dt.datetime.now()
    table = fit.evaluate_grid(plans, points, lambda n, tot: print(
        f"  loso grid {n}/{tot} ({(_dt.datetime.now() - t0).total_seconds():.0f} s)", flush=True)
        if n % 100 == 0 or n == tot else None)
    res = fit.loso(rows, table, points, shipped)
    res["ablation"] = fit.ablation(rows, table, points, shipped)
    res["shipped"] = fit.current_values()
    return res
