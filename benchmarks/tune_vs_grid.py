"""Tuner vs exhaustive grid on this machine: 2 CPU ranks, the tiny spec, a 24-point space.

Two phases:

1. ``--phase grid``: every point of the space is run once for real (the same short 2-rank trainer run the
   tuner's real mode uses: `dstoolkit.tune.objective.run_real_trial`), and each point's measured tokens/s is
   appended to a JSONL file (``benchmarks/results/tune_grid_cpu2_<yyyymm>.jsonl``). Points already in the file
   are skipped, so an interrupted grid resumes.
2. ``--phase tune``: the tuner (`dstoolkit.tune.run_study`: estimator-seeded TPE, same space) at several budgets
   x 3 seeds. To keep CPU time sane, a tuner trial does NOT launch a new run: it looks up the measured grid value
   of the point it picked. The tuner's choice sequence is real (what it proposes, in which order, given the
   values it has seen); the measurements come from the one real grid run.

Reported: the tuner's best (true measured value of the point it ended with) as a fraction of the grid's best,
against the number of evaluated trials. Goal: >= 0.95 with <= 30% of the grid's trials.

    .venv/bin/python benchmarks/tune_vs_grid.py --phase grid     # ~25-60 s per point here (launch-bound)
    .venv/bin/python benchmarks/tune_vs_grid.py --phase tune     # seconds; writes the .json/.md/.png results

Other spaces and repeated grids: ``--spec ds_configs/tiny_moe_cpu.yaml`` (files named after the spec), and
``--grid FILE --out-stem STEM`` to measure a second grid and compare the tuner against it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import math
import json
import os
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dstoolkit.common.atomic import atomic_write_text  # noqa: E402
from dstoolkit.runtime.bench import harness, results_jsonl, stats  # noqa: E402
from dstoolkit.runtime.bench.report import render_markdown_table, save_figure, write_report  # noqa: E402
from dstoolkit.tune.objective import TrialOutcome, run_real_trial  # noqa: E402
from dstoolkit.tune.space import TuneSpace  # noqa: E402

SPEC = ROOT / "ds_configs" / "tiny_cpu.yaml"
RESULTS = ROOT / "benchmarks" / "results"
STAMP = _dt.date.today().strftime("%Y%m")


def default_paths(spec: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(grid JSONL, output stem) for a spec: the tiny spec keeps the original names, others add the spec name."""
    tag = "" if spec.resolve() == SPEC.resolve() else f"_{spec.stem}"
    return RESULTS / f"tune_grid{tag}_cpu2_{STAMP}.jsonl", RESULTS / f"tune_vs_grid{tag}_cpu2_{STAMP}"

BUCKET_SCALES = (1.0,)  # the comparison space: 8 ZeRO/offload modes x 3 micro-batches = 24 points
GRID_STEPS, GRID_SKIP = 8, 3  # per point: 8 optimizer steps, the first 3 not timed (median of 5)
BUDGETS = (3, 5, 7, 10)  # 7 of 24 = 29% of the grid's trials
SEEDS = (0, 1, 2)
GOAL_FRACTION, GOAL_TRIAL_SHARE = 0.95, 0.30


# A 2-rank job on 2 cores is itself a 1-min load of ~2; above this, other processes competed.
QUIET_LOAD_MAX = 3.0


def load_space(spec_path: pathlib.Path = SPEC):
    from dstoolkit.models import resolve_spec_model
    from dstoolkit.spec import load_spec

    spec = load_spec(spec_path)
    return TuneSpace.from_spec(spec, resolve_spec_model(spec), bucket_scales=BUCKET_SCALES, data_parallel_only=True)


def run_grid(args) -> int:
    space = load_space(args.spec)
    points = list(space.points())
    done = {r["key"] for r in results_jsonl.read_records(args.grid)} if args.grid.exists() else set()
    todo = [p for p in points if p.key not in done]
    # Shuffled (fixed seed): load on the shared cores drifts over the run; run order must not follow the config.
    random.Random(0).shuffle(todo)
    print(f"# grid: {len(points)} points, {len(done)} already measured in {args.grid}, {len(todo)} to run", flush=True)
    spec_hash = hashlib.sha256(args.spec.read_bytes()).hexdigest()[:16]
    env = harness.capture_env(2, "gloo", {"spec": str(args.spec), "steps": GRID_STEPS, "skip": GRID_SKIP})
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-grid-") as tmp:
        for i, p in enumerate(todo):
            chk = space.check(p, world_size=2)
            load_before = os.getloadavg()
            if chk.pruned:
                out = TrialOutcome(status="pruned", reason=chk.pruned_reason or "", code=chk.pruned_code or "")
            else:
                out = run_real_trial(space, chk, pathlib.Path(tmp) / f"p{i:03d}", steps=GRID_STEPS,
                                     skip_steps=GRID_SKIP, timeout_s=args.timeout)
            rec = {"key": p.key, "label": p.label, "point": p.model_dump(mode="json"), "status": out.status,
                   "reason": out.reason, "tokens_per_s": out.value, "wall_s": round(out.wall_s, 2),
                   "step_time_s_median": out.measured.get("step_time_s_median"),
                   "step_time_samples_s": out.measured.get("step_time_samples_s"),
                   "peak_memory_bytes": out.measured.get("peak_memory_bytes"),
                   "loss_first": out.measured.get("loss_first"), "loss_last": out.measured.get("loss_last"),
                   "estimate": out.estimate, "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
                   "spec_sha256": spec_hash, "time_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                   "git_commit": env.get("git_commit"), "torch": env.get("torch"), "deepspeed": env.get("deepspeed")}
            results_jsonl.append_records(args.grid, [rec])
            v = f"{out.value:,.0f} tok/s" if out.value else out.reason[:80]
            print(f"[{i + 1}/{len(todo)}] {p.label:<44} {out.status:<7} {v}  ({out.wall_s:.0f} s, load "
                  f"{load_before[0]:.1f})", flush=True)
    print(f"# grid done in {time.perf_counter() - t_all:.0f} s", flush=True)
    return 0


def run_tune(args) -> int:
    from dstoolkit.tune.options import TuneOptions
    from dstoolkit.tune.study import run_study

    space = load_space(args.spec)
    rows = {r["key"]: r for r in results_jsonl.read_records(args.grid)}
    points = list(space.points())
    missing = [p.label for p in points if p.key not in rows]
    if missing:
        print(f"error: {len(missing)} grid points not measured yet (run --phase grid): {missing[:3]}", file=sys.stderr)
        return 2
    ok = {k: r for k, r in rows.items() if r["status"] == "ok"}
    grid_best_key = max(ok, key=lambda k: ok[k]["tokens_per_s"])
    grid_best = ok[grid_best_key]["tokens_per_s"]
    # The grid a search has to beat: points the pre-run checks let through (pruned ones cost no run either way).
    n_grid = sum(1 for p in points if rows[p.key]["status"] != "pruned")
    # The estimate the tuner sees now (the grid file keeps the one current when the grid ran).
    estimate_now = {}
    for p in points:
        chk = space.check(p, world_size=2)
        if chk.estimate is not None:
            estimate_now[p.key] = space.spec.training.global_batch * space.spec.training.seq_len / chk.estimate.step_time_s

    def lookup(point, chk):
        r = rows[point.key]
        if r["status"] != "ok":
            return TrialOutcome(status=r["status"], reason=f"(grid) {r['reason']}", code=r["status"])
        return TrialOutcome(status="ok", value=r["tokens_per_s"], measured={"tokens_per_s": r["tokens_per_s"],
                                                                            "source": "grid lookup"})

    runs = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-vs-grid-") as tmp:
        for budget in args.budgets:
            for seed in SEEDS:
                out = pathlib.Path(tmp) / f"b{budget}_s{seed}"
                opts = TuneOptions(spec_path=args.spec, out_dir=out, budget=budget, objective="throughput", mode="real",
                                   seed=seed, bucket_scales=BUCKET_SCALES, progress=False)
                res = run_study(opts, lookup=lookup, ranks=2, write_outputs=False)
                evaluated = [r for r in res.trials if r["counted"]]
                best = res.best
                frac = (best["value"] / grid_best) if best else 0.0
                curve, b = [], 0.0
                for r in evaluated:
                    if r["state"] == "COMPLETE":
                        b = max(b, r["value"])
                    curve.append(b / grid_best)
                runs.append({"budget": budget, "seed": seed, "evaluated": len(evaluated), "trials": len(res.trials),
                             "best_label": best["label"] if best else None, "best_tokens_per_s": best and best["value"],
                             "fraction_of_grid_best": frac, "fraction_curve": curve,
                             "sequence": [r["label"] for r in evaluated],
                             "seeded": [r["label"] for r in evaluated if r.get("seeded_by")]})
                print(f"budget {budget:>2} seed {seed}: best {best['label'] if best else '-'} = {frac:.3f} of grid best "
                      f"({len(evaluated)} evaluated, {len(res.trials)} trials)", flush=True)
    values = sorted(r["tokens_per_s"] for r in ok.values())
    summary = []
    for budget in args.budgets:
        fr = [r["fraction_of_grid_best"] for r in runs if r["budget"] == budget]
        summary.append({"budget": budget, "share_of_grid": budget / n_grid, "fractions": fr,
                        "mean_fraction": sum(fr) / len(fr), "min_fraction": min(fr),
                        "random_search_expected_fraction": random_expected_fraction(values, budget),
                        "random_search_p_within_goal": random_p_within(values, budget, GOAL_FRACTION),
                        "meets_goal": min(fr) >= GOAL_FRACTION and budget / n_grid <= GOAL_TRIAL_SHARE})
    grid_sorted = sorted(rows.values(), key=lambda r: -(r["tokens_per_s"] or 0))
    loads = [r["loadavg_before"][0] for r in rows.values()] + [r["loadavg_after"][0] for r in rows.values()]
    doc = {"what": "dstoolkit tune (optuna TPE, estimator-seeded) vs exhaustive grid; tiny spec, 2 CPU gloo ranks",
           "method": "grid: each point run once for real (trainer, torchrun, 2 ranks, "
                     f"{GRID_STEPS} steps, first {GRID_SKIP} untimed, median step time). tuner: real choice sequence, "
                     "each pick answered with the measured grid value of that point (no new runs).",
           "spec": str(args.spec.resolve().relative_to(ROOT)), "grid_file": str(args.grid.resolve().relative_to(ROOT)),
           "grid_points": n_grid, "grid_points_pruned": len(points) - n_grid, "grid_best": grid_sorted[0]["label"],
           "grid_best_tokens_per_s": grid_best, "goal": f">= {GOAL_FRACTION} of grid best with <= "
                                                         f"{GOAL_TRIAL_SHARE:.0%} of the grid's trials",
           "loadavg_1min_during_grid": {"min": min(loads), "max": max(loads)},
           "loadavg_now": list(os.getloadavg()), "tune_phase_s": round(time.perf_counter() - t0, 1),
           "grid_wall_s_total": round(sum(r["wall_s"] for r in rows.values()), 1),
           "summary": summary, "runs": runs,
           "grid": [{"label": r["label"], "status": r["status"], "tokens_per_s": r["tokens_per_s"],
                     "estimated_tokens_per_s": estimate_now.get(r["key"]),
                     "wall_s": r["wall_s"], "loadavg_before": r["loadavg_before"][0]} for r in grid_sorted]}
    OUT = args.out_stem
    atomic_write_text(OUT.with_suffix(".json"), json.dumps(doc, indent=1) + "\n")
    write_report(OUT.with_suffix(".md"), render_md(doc))
    render_png(doc, OUT.with_suffix(".png"))
    print(f"wrote {OUT}.json/.md/.png")
    return 0


def random_expected_fraction(values: list[float], k: int) -> float:
    """Baseline: E[best of k points drawn without replacement] / best, exactly (sorted ascending v_1..v_n: the
    best of k is v_i with probability C(i-1, k-1) / C(n, k))."""
    n = len(values)
    k = min(k, n)
    return sum(v * math.comb(i, k - 1) for i, v in enumerate(values)) / math.comb(n, k) / values[-1]


def random_p_within(values: list[float], k: int, frac: float) -> float:
    """Baseline: probability that k random distinct points include one within `frac` of the best."""
    n, m = len(values), sum(1 for v in values if v >= frac * values[-1])
    k = min(k, n)
    return 1.0 - math.comb(n - m, k) / math.comb(n, k)


def estimator_reading(doc) -> dict:
    """How well the estimate the tuner is seeded with orders the measured grid."""
    pairs = [(g["tokens_per_s"], g["estimated_tokens_per_s"]) for g in doc["grid"]
             if g["tokens_per_s"] and g.get("estimated_tokens_per_s")]
    meas = [m for m, _ in pairs]
    est = [e for _, e in pairs]
    best = max(meas)
    by_est = sorted(pairs, key=lambda p: -p[1])
    return {"points": len(pairs), "within_goal": sum(1 for v in meas if v >= GOAL_FRACTION * best),
            "spearman": stats.spearman(meas, est), "est_min": min(est), "est_max": max(est),
            "meas_min": min(meas), "meas_max": best,
            "estimated_top3_measured_fraction": [m / best for m, _ in by_est[:3]],
            "median_abs_error": sorted(abs(e / m - 1) for m, e in pairs)[len(pairs) // 2]}


def render_md(doc) -> str:
    load = doc["loadavg_1min_during_grid"]
    quiet = load["max"] <= QUIET_LOAD_MAX
    pruned = doc.get("grid_points_pruned", 0)
    L = [f"# Tuner vs grid: {doc['spec']}, 2 CPU ranks (gloo)", "", doc["method"], "",
         f"Grid ({doc.get('grid_file', '')}): {doc['grid_points']} runnable points"
         + (f" ({pruned} more pruned by the pre-run checks, free for grid and tuner alike)" if pruned else "")
         + f", best {doc['grid_best']} at {doc['grid_best_tokens_per_s']:,.0f} tok/s. Goal: {doc['goal']}. "
         f"1-min load average during the grid: {load['min']:.1f}-{load['max']:.1f} on 2 cores"
         + (" (the grid's own 2 ranks are a load of ~2: the machine was otherwise idle)." if quiet else
            ": other jobs competed for the cores, so the timings are noisy."), ""]
    L += render_markdown_table(
        ([s["budget"], f"{s['share_of_grid']:.0%}", " / ".join(f"{f:.3f}" for f in s["fractions"]),
          f"{s['mean_fraction']:.3f}", f"{s['min_fraction']:.3f}",
          "yes" if s["meets_goal"] else "no" if s["share_of_grid"] <= GOAL_TRIAL_SHARE else "over 30%",
          f"{s['random_search_expected_fraction']:.3f}", f"{s['random_search_p_within_goal']:.2f}"]
         for s in doc["summary"]),
        ("budget (evaluated trials)", "share of grid (goal <= 30%)", "fraction of grid best, seeds 0/1/2", "mean",
         "min (goal >= 0.95)", "goal met", "random search: expected fraction", "random search: P(within 5%)"))
    met = [s for s in doc["summary"] if s["meets_goal"]]
    L += ["", (f"Goal met at budget {met[0]['budget']} ({met[0]['share_of_grid']:.0%} of the grid's trials): every seed "
               f"within {1 - GOAL_FRACTION:.0%} of the grid's best." if met else
               "Goal not met at any budget within 30% of the grid's trials.")]
    r = estimator_reading(doc)
    top3 = " / ".join(f"{f:.3f}" for f in r["estimated_top3_measured_fraction"])
    L += ["", f"Reading: {r['within_goal']} of {r['points']} measured points lie within {1 - GOAL_FRACTION:.0%} of the "
          f"grid's best; the measured spread is {r['meas_max'] / r['meas_min']:.1f}x ({r['meas_min']:,.0f}-"
          f"{r['meas_max']:,.0f} tok/s). The estimate the search is seeded with (calibrated step-time model, the "
          f"tuner's current one) spans {r['est_min']:,.0f}-{r['est_max']:,.0f} tok/s, ranks the measured grid with "
          f"Spearman {r['spearman']:.2f} (median |error| {r['median_abs_error']:.0%}), and its top three estimated "
          f"points measure {top3} of the grid's best. Random search (exact expectation over the same grid) is the "
          "baseline to beat."]
    L += ["", "## Grid (measured once, sorted)", ""]
    L += render_markdown_table(
        ([g["label"], f"{g['tokens_per_s']:,.0f}" if g["tokens_per_s"] else g["status"],
          f"{g['estimated_tokens_per_s']:,.0f}" if g.get("estimated_tokens_per_s") else "-",
          f"{g['loadavg_before']:.1f}"] for g in doc["grid"]),
        ("config", "tok/s", "estimate tok/s (now)", "load before"))
    L += ["", "## Tuner runs", "", "Seeded trials (the estimator's ranking) are marked with *.", ""]
    for r in doc["runs"]:
        seeded = set(r.get("seeded", []))
        seq = " -> ".join(lbl + ("*" if lbl in seeded else "") for lbl in r["sequence"])
        L.append(f"- budget {r['budget']}, seed {r['seed']}: best {r['best_label']} ({r['fraction_of_grid_best']:.3f}); "
                 f"sequence: {seq}")
    return "\n".join(L) + "\n"


def render_png(doc, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = ["tab:blue", "tab:orange", "tab:green"]
    longest = max(doc["runs"], key=lambda r: r["budget"])["budget"]
    for seed, c in zip(SEEDS, colors):
        runs = [r for r in doc["runs"] if r["seed"] == seed and r["budget"] == longest]
        for r in runs:
            ax.step(range(1, len(r["fraction_curve"]) + 1), r["fraction_curve"], where="post", color=c, alpha=0.6,
                    label=f"tuner seed {seed} (best so far)")
    xs = [s["budget"] for s in doc["summary"]]
    ax.plot(xs, [s["mean_fraction"] for s in doc["summary"]], "ko-", label="mean final best at each budget")
    ax.plot(xs, [s["min_fraction"] for s in doc["summary"]], "kv--", alpha=0.6, label="worst seed")
    ax.plot(xs, [s["random_search_expected_fraction"] for s in doc["summary"]], "s:", color="tab:purple",
            label="random search, expected (exact, same grid)")
    ax.axhline(GOAL_FRACTION, color="red", ls=":", label=f"goal {GOAL_FRACTION:.0%} of grid best")
    ax.axvline(GOAL_TRIAL_SHARE * doc["grid_points"], color="gray", ls=":",
               label=f"{GOAL_TRIAL_SHARE:.0%} of {doc['grid_points']} grid trials")
    ax.set_xlabel("evaluated trials")
    ax.set_ylabel("tuner best / grid best (tokens/s)")
    ax.set_title(f"dstoolkit tune vs exhaustive grid ({pathlib.Path(doc['spec']).stem}, 2 CPU ranks)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("grid", "tune", "all"), default="all")
    ap.add_argument("--spec", type=pathlib.Path, default=SPEC, help="the spec whose space is compared")
    ap.add_argument("--grid", type=pathlib.Path, default=None, help="grid JSONL (appended, reused)")
    ap.add_argument("--out-stem", type=pathlib.Path, default=None)
    ap.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=list(BUDGETS))
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per grid point")
    args = ap.parse_args(argv)
    grid, stem = default_paths(args.spec)
    args.grid = args.grid or grid
    args.out_stem = args.out_stem or stem
    args.grid.parent.mkdir(parents=True, exist_ok=True)
    rc = 0
    if args.phase in ("grid", "all"):
        rc = run_grid(args)
    if rc == 0 and args.phase in ("tune", "all"):
        rc = run_tune(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
