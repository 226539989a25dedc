"""The tables of measured figures in docs/*.md besides the README's fidelity table
(`dstoolkit.runtime.bench.fidelity_table`), and the name each page's markers use for every table. Each figure is
read from a file under ``benchmarks/results/`` (`dstoolkit.runtime.bench.result_files`) and every row names it; where
each table goes on a page, and the ``--write`` / ``--check`` entry point: `dstoolkit.runtime.bench.pages`. The cells
are drawn with the one markdown reporter (`dstoolkit.runtime.bench.report`). No torch is imported here.
"""
from __future__ import annotations

from typing import Callable, Sequence

from dstoolkit.runtime.bench.fidelity_table import fidelity_table
from dstoolkit.runtime.bench.report import _fmt, _human_size, _latest, render_markdown_table  # the one reporter's cell formats
from dstoolkit.runtime.bench.result_files import RESULTS, PageError, Results, files_cell, pct


def _range(xs: Sequence[float], fmt: str) -> str:
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


TUNE_FILES = (("tiny (`ds_configs/tiny_cpu.yaml`)", "tune_vs_grid_cpu2_202611.json"),
              ("tiny, grid measured again", "tune_vs_grid_cpu2_202611_run2.json"),
              ("tiny MoE, ep 1/2", "tune_vs_grid_tiny_moe_cpu_cpu2_202611.json"),
              ("held out (6 layers, fp32, recompute as a dimension)", "tune_vs_grid_heldout_cpu_cpu2_202611.json"))
TUNE_BUDGETS = (3, 5, 7)
TUNE_RANDOM_AT = 5


def tune_table(res: Results, prefix: str) -> list[str]:
    rows, met, goals = [], [], set()
    for label, f in TUNE_FILES:
        d = res.json(f)
        goals.add(d["goal"])
        first = next((s for s in d["summary"] if s["meets_goal"]), None)
        met.append(f"{label.split(' (')[0]}: " + (f"budget {first['budget']} ({pct(first['share_of_grid'], 0, False)} "
                                                   "of its grid)" if first else "not met"))
        by_budget = {s["budget"]: s for s in d["summary"]}
        pruned = d.get("grid_points_pruned") or 0
        points = f"{d['grid_points']}" + (f" (+{pruned} pruned)" if pruned else "")
        rows.append([label, points, *(f"{by_budget[b]['min_fraction']:.3f}" for b in TUNE_BUDGETS),
                     f"{by_budget[TUNE_RANDOM_AT]['random_search_expected_fraction']:.3f}",
                     files_cell([f], prefix)])
    return render_markdown_table(rows, ["space", "grid points", *(f"budget {b}" for b in TUNE_BUDGETS),
                                        f"random search at {TUNE_RANDOM_AT} (expected)", "file"]) + [
        "", f"Goal ({'; '.join(sorted(goals))}) first met at: {'; '.join(met)}."]


COMM_FILE = "comm_gloo2_cpu_202611.jsonl"
COMM_ROWS = (("all_reduce", 2**20), ("all_reduce", 2**24), ("all_reduce", 2**26), ("all_reduce", 2**28),
             ("all_gather", 2**26))
"""(op, message bytes) rows shown in docs/benchmarks.md; the report holds every row."""


def comm_table(res: Results, prefix: str) -> list[str]:
    recs = [r for r in _latest(res.jsonl(COMM_FILE)) if r.get("bench") == "comm"]
    rows = []
    for op, size in COMM_ROWS:
        hit = [r for r in recs if r.get("op") == op and r.get("size") == size]
        if not hit:
            raise PageError(f"{res.root / COMM_FILE}: no {op} record of {size} bytes")
        r = hit[-1]
        rows.append([op, _human_size(size), r["count"], _fmt(r["time_us"], 1), _fmt(r["algbw"]), _fmt(r["busbw"]),
                     r["#wrong"]])
    return render_markdown_table(rows, ["op", ("size", "r"), ("count", "r"), ("time_us", "r"),
                                        ("algbw GB/s", "r"), ("busbw GB/s", "r"), ("#wrong", "r")]) + [
        "", f"From [`{RESULTS}/{COMM_FILE}`]({prefix}{RESULTS}/{COMM_FILE}) (newest record per row)."]


def multinode_table(res: Results, prefix: str) -> list[str]:
    t200, t1g = "multinode_throttle_cpu_202611.json", "multinode_throttle_cpu_202611_run1.json"
    faults = "multinode_faults_cpu_202611.json"
    rows = []
    for f in (t200, t1g):
        d = res.json(f)
        thr = [c for c in d["comm"]["throttled"] if c["wrong"] == 0]
        by_op: dict[str, list[dict]] = {}
        for c in thr:
            by_op.setdefault(c["op"], []).append(c)
        ar = by_op.get("all_reduce", [])
        others = "; ".join(f"{op.replace('_', '-')} {_range([c['busbw_over_rate'] for c in cs], '.2f')}"
                           for op, cs in by_op.items() if op != "all_reduce")
        rows.append([f"cross-host all-reduce busbw, link throttled to {d['rate']} ({d['rate_bytes_per_s'] / 1e6:g} MB/s)"
                     + ("" if f == t200 else ", earlier run"),
                     f"{_range([c['busbw_GBps'] for c in ar], '.4f')} GB/s = "
                     f"{_range([c['busbw_over_rate'] for c in ar], '.2f')} of the throttle, "
                     f"{_range([c['size'] / 2**20 for c in ar], '.0f')} MiB messages"
                     + (f" (other ops, as a fraction of the throttle: {others})" if others else ""),
                     files_cell([f], prefix)])
        un = [c for c in d["comm"].get("unthrottled") or [] if c["op"] == "all_reduce"]
        if un and f == t200:
            big = max(un, key=lambda c: c["size"])
            rows.append([f"same, unthrottled ({big['size'] / 2**20:.0f} MiB all-reduce)",
                         f"{big['busbw_GBps']:.2f} GB/s ({big['busbw_over_rate']:.0f}x the throttle)",
                         files_cell([f], prefix)])
    d = res.json(t200)
    runs = d["runs"]
    rows.append([f"step time under {d['rate']}, " + " / ".join(r["strategy"] for r in runs),
                 "measured " + " / ".join(f"{r['measured_step_time_s']:.2f}" for r in runs) + " s; estimated "
                 + " / ".join(f"{r['estimator_as_is_s']:.2f}" for r in runs) + " s ("
                 + " / ".join(pct(r["error_estimator_as_is"], 0) for r in runs) + "); the single-busbw estimator "
                 "before " + " / ".join(f"{r['old_estimator_single_busbw_s']:.2f}" for r in runs) + " s",
                 files_cell([t200], prefix)])
    fd = res.json(faults)
    for fl in fd["faults"]:
        what = {"cut": f"cut link, process-group timeout {fl['pg_timeout_s']} s",
                "lost": "lost host (SIGKILL of all its processes)"}.get(fl["fault"], fl["fault"])
        rows.append([what, f"first failure after {fl['seconds_fault_to_first_failure']:.2f} s, every launcher exited "
                     f"after {fl['seconds_fault_to_all_exited']:.2f} s (exit codes {fl['fault_returncodes']}); resumed "
                     f"from step {fl['resumed_from_step']}: {fl['steps_compared']}/{fl['steps_expected']} steps "
                     f"compared, max abs loss difference {fl['max_abs_loss_diff']}"
                     + (", bitwise equal" if fl["bitwise_equal"] else ""), files_cell([faults], prefix)])
    return render_markdown_table(rows, ["what", "figure", "file"])


TABLES: dict[str, Callable[[Results, str], list[str]]] = {
    "fidelity": fidelity_table, "tune-vs-grid": tune_table, "comm": comm_table, "multinode": multinode_table}
"""Table name (as written in the page's markers) -> renderer."""
