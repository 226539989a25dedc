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

from dstoolkit.bench import harness  # noqa: E402
from dstoolkit.tune.objective import TrialOutcome, run_real_trial  # noqa: E402
from dstoolkit.tune.space import TuneSpace  # noqa: E402

SPEC = ROOT / "ds_configs" / "tiny_cpu.yaml"
RESULTS = ROOT / "benchmarks" / "results"
STAMP = _dt.date.today().strftime("%Y%m")
GRID_JSONL = RESULTS / f"tune_grid_cpu2_{STAMP}.jsonl"
OUT_STEM = RESULTS / f"tune_vs_grid_cpu2_{STAMP}"
BUCKET_SCALES = (1.0,)  # the comparison space: 8 ZeRO/offload modes x 3 micro-batches = 24 points
GRID_STEPS, GRID_SKIP = 8, 3  # per point: 8 optimizer steps, the first 3 not timed (median of 5)
BUDGETS = (3, 5, 7, 10)  # 7 of 24 = 29% of the grid's trials
SEEDS = (0, 1, 2)
GOAL_FRACTION, GOAL_TRIAL_SHARE = 0.95, 0.30


# A 2-rank job on 2 cores is itself a 1-min load of ~2; above this, other processes competed.
QUIET_LOAD_MAX = 3.0


def load_space():
    from dstoolkit.models import resolve_spec_model
    from dstoolkit.schemas.spec import load_spec

    spec = load_spec(SPEC)
    return TuneSpace.from_spec(spec, resolve_spec_model(spec), bucket_scales=BUCKET_SCALES, data_parallel_only=True)


def run_grid(args) -> int:
    space = load_space()
    points = list(space.points())
    done = {r["key"] for r in harness.read_records(args.grid)} if args.grid.exists() else set()
    todo = [p for p in points if p.key not in done]
    # Shuffled (fixed seed): load on the shared cores drifts over the run; run order must not follow the config.
    random.Random(0).shuffle(todo)
    print(f"# grid: {len(points)} points, {len(done)} already measured in {args.grid}, {len(todo)} to run", flush=True)
    spec_hash = hashlib.sha256(SPEC.read_bytes()).hexdigest()[:16]
    env = harness.capture_env(2, "gloo", {"spec": str(SPEC), "steps": GRID_STEPS, "skip": GRID_SKIP})
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
            harness.append_records(args.grid, [rec])
            v = f"{out.value:,.0f} tok/s" if out.value else out.reason[:80]
            print(f"[{i + 1}/{len(todo)}] {p.label:<44} {out.status:<7} {v}  ({out.wall_s:.0f} s, load "
                  f"{load_before[0]:.1f})", flush=True)
    print(f"# grid done in {time.perf_counter() - t_all:.0f} s", flush=True)
    return 0


def run_tune(args) -> int:
    from dstoolkit.tune.study import TuneOptions, run_study

    space = load_space()
    rows = {r["key"]: r for r in harness.read_records(args.grid)}
    points = list(space.points())
    missing = [p.label for p in points if p.key not in rows]
    if missing:
        print(f"error: {len(missing)} grid points not measured yet (run --phase grid): {missing[:3]}", file=sys.stderr)
        return 2
    ok = {k: r for k, r in rows.items() if r["status"] == "ok"}
    grid_best_key = max(ok, key=lambda k: ok[k]["tokens_per_s"])
    grid_best = ok[grid_best_key]["tokens_per_s"]
    n_grid = len(points)

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
                opts = TuneOptions(spec_path=SPEC, out_dir=out, budget=budget, objective="throughput", mode="real",
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
           "spec": str(SPEC.relative_to(ROOT)), "grid_points": n_grid, "grid_best": grid_sorted[0]["label"],
           "grid_best_tokens_per_s": grid_best, "goal": f">= {GOAL_FRACTION} of grid best with <= "
                                                         f"{GOAL_TRIAL_SHARE:.0%} of the grid's trials",
           "loadavg_1min_during_grid": {"min": min(loads), "max": max(loads)},
           "loadavg_now": list(os.getloadavg()), "tune_phase_s": round(time.perf_counter() - t0, 1),
           "grid_wall_s_total": round(sum(r["wall_s"] for r in rows.values()), 1),
           "summary": summary, "runs": runs,
           "grid": [{"label": r["label"], "status": r["status"], "tokens_per_s": r["tokens_per_s"],
                     "estimated_tokens_per_s": (r.get("estimate") or {}).get("tokens_per_s"),
                     "wall_s": r["wall_s"], "loadavg_before": r["loadavg_before"][0]} for r in grid_sorted]}
    OUT = args.out_stem
    OUT.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    OUT.with_suffix(".md").write_text(render_md(doc))
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


def render_md(doc) -> str:
    L = [f"# Tuner vs grid: {doc['spec']}, 2 CPU ranks (gloo)", "", doc["method"], "",
         f"Grid: {doc['grid_points']} points, best {doc['grid_best']} at {doc['grid_best_tokens_per_s']:,.0f} tok/s. "
         f"Goal: {doc['goal']}. 1-min load average during the grid: {doc['loadavg_1min_during_grid']['min']:.1f}-"
         f"{doc['loadavg_1min_during_grid']['max']:.1f} on 2 cores shared with other jobs (timings are noisy).", "",
         "| budget (evaluated trials) | share of grid | fraction of grid best, seeds 0/1/2 | mean | min | goal met "
         "| random search: expected fraction | random search: P(within 5%) |",
         "|---|---|---|---|---|---|---|---|"]
    for s in doc["summary"]:
        L.append(f"| {s['budget']} | {s['share_of_grid']:.0%} | {' / '.join(f'{f:.3f}' for f in s['fractions'])} | "
                 f"{s['mean_fraction']:.3f} | {s['min_fraction']:.3f} | {'yes' if s['meets_goal'] else 'no'} | "
                 f"{s['random_search_expected_fraction']:.3f} | {s['random_search_p_within_goal']:.2f} |")
    meas = [g["tokens_per_s"] for g in doc["grid"] if g["tokens_per_s"]]
    est = [g["estimated_tokens_per_s"] for g in doc["grid"] if g.get("estimated_tokens_per_s")]
    within = sum(1 for v in meas if v >= GOAL_FRACTION * max(meas))
    L += ["", f"Reading: only {within} of {len(meas)} measured points lie within {1 - GOAL_FRACTION:.0%} of the grid's best, "
          f"so meeting the goal means finding the top point. The estimator puts all points within "
          f"{(max(est) / min(est) - 1) * 100:.1f}% of each other ({min(est):,.0f}-{max(est):,.0f} tok/s) on this CPU, while "
          f"the measured spread is {max(meas) / min(meas):.1f}x ({min(meas):,.0f}-{max(meas):,.0f} tok/s) under a 1-min load of "
          f"{doc['loadavg_1min_during_grid']['min']:.0f}-{doc['loadavg_1min_during_grid']['max']:.0f} on 2 cores"
          + (": most of the measured differences are load noise, which no search strategy can learn. "
             "Rerun `--phase grid` on a quiet machine for a meaningful grid."
             if doc["loadavg_1min_during_grid"]["max"] > QUIET_LOAD_MAX else
             " (the grid's own 2 ranks are that load: the machine was otherwise idle), so the measured spread is real "
             "and the estimator's CPU ranking, which seeds the search, does not separate the points that matter.")
          + " Random search (exact expectation over the same grid) is the baseline to beat."]
    L += ["", "## Grid (measured once, sorted)", "", "| config | tok/s | estimate tok/s | load before |", "|---|---|---|---|"]
    for g in doc["grid"]:
        v = f"{g['tokens_per_s']:,.0f}" if g["tokens_per_s"] else g["status"]
        e = f"{g['estimated_tokens_per_s']:,.0f}" if g.get("estimated_tokens_per_s") else "-"
        L.append(f"| {g['label']} | {v} | {e} | {g['loadavg_before']:.1f} |")
    L += ["", "## Tuner runs", ""]
    for r in doc["runs"]:
        L.append(f"- budget {r['budget']}, seed {r['seed']}: best {r['best_label']} ({r['fraction_of_grid_best']:.3f}); "
                 f"sequence: {' -> '.join(r['sequence'])}")
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
    ax.set_title("dstoolkit tune vs exhaustive grid (tiny spec, 2 CPU ranks)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("grid", "tune", "all"), default="all")
    ap.add_argument("--grid", type=pathlib.Path, default=GRID_JSONL, help="grid JSONL (appended, reused)")
    ap.add_argument("--out-stem", type=pathlib.Path, default=OUT_STEM)
    ap.add_argument("--budgets", type=lambda s: [int(x) for x in s.split(",")], default=list(BUDGETS))
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per grid point")
    args = ap.parse_args(argv)
    args.grid.parent.mkdir(parents=True, exist_ok=True)
    rc = 0
    if args.phase in ("grid", "all"):
        rc = run_grid(args)
    if rc == 0 and args.phase in ("tune", "all"):
        rc = run_tune(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
