"""The estimator's fitted constants, in process: predict a set of specs under other values of them, refit them
without one source group, and report leave-one-source-out (LOSO) figures beside the in-sample ones (issue 24).

Which constants are fitted to benchmarks/data/published_runs.yaml (grep "Fitted" in dstoolkit/estimate and
dstoolkit/hardware): `estimate.gemm.GEMM_HALF_DIM`, `estimate.cluster_model.FRAMEWORK_EFFICIENCY` and
`estimate.cluster_model.MEGATRON_MOE_HOST_SYNC_S` (`FITTED`). A fourth, `estimate.comm.INTER_NODE_HOP_LATENCY_S`,
was removed in issue 24: its ablation here showed it helps only in sample. Every other number of the GPU step time
is a datasheet or source figure.

The refit is a grid search (`GRID`): every row is estimated once per grid point (`evaluate_grid`, a few ms an
estimate), and a fold picks the point with the lowest MAPE over the rows of the other sources (`best_point`). So a
held-out source is predicted by constants that never saw it. `loso` returns, per source and overall, MAPE and
the efficiency Spearman, in sample (the shipped constants) and out of source.

The GPU path only (CPU step times come from a machine's calibration, not from these constants). No torch import.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import pathlib
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dstoolkit.runtime.bench import stats  # noqa: E402

FITTED = {
    "GEMM_HALF_DIM": "dstoolkit.estimate.gemm",
    "FRAMEWORK_EFFICIENCY": "dstoolkit.estimate.cluster_model",
    "MEGATRON_MOE_HOST_SYNC_S": "dstoolkit.estimate.cluster_model",
}
"""Name -> module of every constant fitted to the published-runs table."""

GRID = {
    "GEMM_HALF_DIM": (256, 384, 512),
    "FRAMEWORK_EFFICIENCY": (0.80, 0.84, 0.88, 0.92, 0.96),
    "MEGATRON_MOE_HOST_SYNC_S": (0.0, 4.5e-3),
}
"""The values each fold chooses among (the shipped values are on the grid unless the estimator moved)."""
OFF = {"GEMM_HALF_DIM": 0, "FRAMEWORK_EFFICIENCY": 1.0, "MEGATRON_MOE_HOST_SYNC_S": 0.0}
"""Each constant's 'absent' value (no shape fall-off, no framework loss, no hop latency, no host sync): the ablation
pins one constant there and refits the others, so a constant whose out-of-source error is no better than without
it only helps in sample (issue 24: such a constant is removed)."""


def _module(name: str):
    import importlib

    return importlib.import_module(FITTED[name])


def current_values() -> dict[str, float]:
    """The shipped values of the fitted constants."""
    return {k: getattr(_module(k), k) for k in FITTED}


@contextlib.contextmanager
def patched(values: dict[str, float]) -> Iterator[None]:
    """Set the fitted constants to `values` for the duration (module globals, read at call time)."""
    old = current_values()
    try:
        for k, v in values.items():
            setattr(_module(k), k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(_module(k), k, v)


def grid_points(grid: dict[str, Sequence[float]] = GRID, off: Optional[dict[str, float]] = None) -> list[dict[str, float]]:
    """The grid, plus for each constant whose absent value (OFF) is not on it the slice with it pinned there (so
    `ablation` can refit the others without it). `loso` and `best_point` search the grid part only."""
    keys = list(grid)
    pts = [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]
    for name, value in (OFF if off is None else off).items():
        if value in grid[name]:
            continue
        sub = dict(grid, **{name: (value,)})
        pts += [dict(zip(keys, combo), ablation=name) for combo in itertools.product(*(sub[k] for k in keys))]
    return pts


def plan_for_spec(path: pathlib.Path):
    """The RunPlan `dstoolkit estimate SPEC` builds (the CLI's own loader), or the error text."""
    from dstoolkit.cli.estimate import _plan_from_spec

    try:
        return _plan_from_spec(str(path))[0], None
    except (ValueError, SystemExit) as exc:  # a spec the toolkit refuses: reported, never hidden
        return None, str(exc).splitlines()[-1] if str(exc) else type(exc).__name__


def step_time_s(plan) -> float:
    from dstoolkit.estimate import estimate_run

    return float(estimate_run(plan).step_time_s)


def evaluate_grid(plans: Sequence[Any], points: Sequence[dict[str, float]],
                  progress: Optional[Callable[[int, int], None]] = None) -> list[list[float]]:
    """times[p][i]: step time of plan i under grid point p."""
    out = []
    for n, pt in enumerate(points):
        with patched({k: v for k, v in pt.items() if k in FITTED}):
            out.append([step_time_s(pl) for pl in plans])
        if progress:
            progress(n + 1, len(points))
    return out


@dataclass(frozen=True)
class Row:
    """One measured case for the fit: its source group, the measured step time and FLOPs per token per GPU-second
    conversion (so efficiency = tokens/s/GPU x flops_per_token / peak)."""

    id: str
    source: str
    measured_step_s: float
    tokens_per_step: float
    gpus: int
    flops_per_token: float
    peak_flops: float


def _err(pred_s: float, meas_s: float) -> float:
    """Throughput error (predicted tokens/s / measured - 1) from step times."""
    return meas_s / pred_s - 1.0


def mape_of(rows: Sequence[Row], times: Sequence[float], idx: Sequence[int]) -> float:
    return sum(abs(_err(times[i], rows[i].measured_step_s)) for i in idx) / len(idx) if idx else math.nan


def best_point(rows: Sequence[Row], table: Sequence[Sequence[float]], idx: Sequence[int],
               points: Optional[Sequence[dict[str, Any]]] = None) -> int:
    """The grid point with the lowest throughput MAPE over rows idx (ablation slices excluded when points given)."""
    cand = [p for p in range(len(table)) if points is None or "ablation" not in points[p]]
    return min(cand, key=lambda p: mape_of(rows, table[p], idx))


def _eff_spearman(rows: Sequence[Row], pred_s: dict[int, float]) -> Optional[float]:
    idx = sorted(pred_s)
    if len(idx) < 3:
        return None
    meas = [rows[i].tokens_per_step / rows[i].measured_step_s / rows[i].gpus * rows[i].flops_per_token / rows[i].peak_flops
            for i in idx]
    pred = [rows[i].tokens_per_step / pred_s[i] / rows[i].gpus * rows[i].flops_per_token / rows[i].peak_flops for i in idx]
    v = stats.spearman(meas, pred)
    return None if isinstance(v, float) and math.isnan(v) else v


def loso(rows: Sequence[Row], table: Sequence[Sequence[float]], points: Sequence[dict[str, float]],
         shipped: Sequence[float], fit_mask: Optional[Sequence[bool]] = None) -> dict[str, Any]:
    """Leave-one-source-out over `rows`.

    Args:
        rows: the measured cases.
        table: evaluate_grid's step times (grid point x row).
        points: the grid points of `table`.
        shipped: the step times with the shipped constants (in-sample figures).
        fit_mask: which rows may be fitted on (default all); a held-out source is never fitted on either way.

    Returns: {"per_source": {src: {...}}, "overall": {...}, "folds": {src: chosen point}}.
    """
    mask = list(fit_mask) if fit_mask is not None else [True] * len(rows)
    sources = sorted({r.source for r in rows})
    oos: dict[int, float] = {}
    folds = {}
    per = {}
    for src in sources:
        held = [i for i, r in enumerate(rows) if r.source == src]
        fit = [i for i, r in enumerate(rows) if r.source != src and mask[i]]
        p = best_point(rows, table, fit, points)
        folds[src] = points[p]
        for i in held:
            oos[i] = table[p][i]
        per[src] = {
            "rows": len(held),
            "mape_in_sample": mape_of(rows, shipped, held),
            "mape_out_of_source": mape_of(rows, table[p], held),
            "spearman_eff_in_sample": _eff_spearman(rows, {i: shipped[i] for i in held}),
            "spearman_eff_out_of_source": _eff_spearman(rows, {i: table[p][i] for i in held}),
            "refit": points[p],
        }
    allidx = list(range(len(rows)))
    overall = {
        "rows": len(rows),
        "sources": len(sources),
        "mape_in_sample": mape_of(rows, shipped, allidx),
        "mape_out_of_source": sum(abs(_err(oos[i], rows[i].measured_step_s)) for i in allidx) / len(allidx),
        "spearman_eff_in_sample": _eff_spearman(rows, {i: shipped[i] for i in allidx}),
        "spearman_eff_out_of_source": _eff_spearman(rows, oos),
        "in_sample_best_point": points[best_point(rows, table, [i for i in allidx if mask[i]], points)],
    }
    return {"per_source": per, "overall": overall, "out_of_source_step_s": {rows[i].id: oos[i] for i in allidx}}


def fmt_point(pt: dict[str, float]) -> str:
    hop = f"hop {pt['INTER_NODE_HOP_LATENCY_S'] * 1e6:g} us, " if "INTER_NODE_HOP_LATENCY_S" in pt else ""
    return (f"half-dim {pt['GEMM_HALF_DIM']:g}, eff {pt['FRAMEWORK_EFFICIENCY']:.2f}, {hop}"
            f"moe sync {pt['MEGATRON_MOE_HOST_SYNC_S'] * 1e3:g} ms")


def render_loso_md(res: dict[str, Any], title: str) -> list[str]:
    """Markdown lines: per-source and overall, in-sample beside out-of-source."""
    from dstoolkit.runtime.bench.report import render_markdown_table

    def pct(x):
        return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"

    def sp(x):
        return "–" if x is None else f"{x:.3f}"

    o = res["overall"]
    lines = [f"## {title}", "",
             "Every fitted constant (benchmarks/estimator_fit.py FITTED) refitted on a grid without the held-out source; "
             "the held-out source is predicted with the refitted values. In sample = the shipped constants.", ""]
    body = [[s, str(v["rows"]), pct(v["mape_in_sample"]), pct(v["mape_out_of_source"]),
             sp(v["spearman_eff_in_sample"]), sp(v["spearman_eff_out_of_source"]), fmt_point(v["refit"])]
            for s, v in res["per_source"].items()]
    body.append(["**overall**", str(o["rows"]), pct(o["mape_in_sample"]), pct(o["mape_out_of_source"]),
                 sp(o["spearman_eff_in_sample"]), sp(o["spearman_eff_out_of_source"]),
                 "in-sample best: " + fmt_point(o["in_sample_best_point"])])
    lines += render_markdown_table(body, ["source", ("rows", "r"), ("MAPE in sample", "r"), ("MAPE out of source", "r"),
                                          ("eff Spearman in", "r"), ("eff Spearman out", "r"), "refit without it"])
    return lines


def ablation(rows: Sequence[Row], table: Sequence[Sequence[float]], points: Sequence[dict[str, float]],
             shipped: Sequence[float], fit_mask: Optional[Sequence[bool]] = None) -> dict[str, dict[str, Any]]:
    """Per fitted constant: LOSO overall MAPE with it free (all fitted) and with it pinned at OFF (the others
    refitted), in sample and out of source."""
    out = {}
    free = loso(rows, table, points, shipped, fit_mask)["overall"]
    allidx = list(range(len(rows)))
    for name, off in OFF.items():
        keep = [p for p, pt in enumerate(points) if pt[name] == off and pt.get("ablation") in (None, name)]
        if not keep:
            continue
        sub_pts = [{k: v for k, v in points[p].items() if k != "ablation"} for p in keep]
        res = loso(rows, [table[p] for p in keep], sub_pts, shipped, fit_mask)["overall"]
        best = min(keep, key=lambda p: mape_of(rows, table[p], allidx))
        out[name] = {"pinned_at": off, "mape_out_of_source_free": free["mape_out_of_source"],
                     "mape_out_of_source_pinned": res["mape_out_of_source"],
                     "mape_in_sample_best_free": mape_of(rows, table[best_point(rows, table, allidx, points)], allidx),
                     "mape_in_sample_best_pinned": mape_of(rows, table[best], allidx),
                     "helps_out_of_source": res["mape_out_of_source"] > free["mape_out_of_source"] + 1e-9}
    return out


def render_ablation_md(abl: dict[str, dict[str, Any]]) -> list[str]:
    from dstoolkit.runtime.bench.report import render_markdown_table

    lines = ["", "### Does each fitted constant help out of source?", "",
             "LOSO with the constant free vs pinned at its absent value (the others refitted). A constant that does "
             "not lower the out-of-source MAPE only helps in sample.", ""]
    lines += render_markdown_table(
        [[k, f"{v['pinned_at']:g}", f"{100 * v['mape_in_sample_best_free']:.1f}% / {100 * v['mape_in_sample_best_pinned']:.1f}%",
          f"{100 * v['mape_out_of_source_free']:.1f}% / {100 * v['mape_out_of_source_pinned']:.1f}%",
          "yes" if v["helps_out_of_source"] else "**no**"] for k, v in abl.items()],
        ["constant", ("absent value", "r"), ("in-sample MAPE free / pinned", "r"),
         ("out-of-source MAPE free / pinned", "r"), "helps out of source"])
    return lines
