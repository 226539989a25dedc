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
import json
import math
import pathlib
import random
import sys
from typing import Any, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402

import estimator_fit as fit  # noqa: E402
import published_runs as pr  # noqa: E402
from dstoolkit.estimate.core import upper_bound_exceeds  # noqa: E402
from dstoolkit.generate.undecided import GPU_OUT_OF_SOURCE_ERROR, within_error  # noqa: E402
from dstoolkit.runtime.bench import harness, results_jsonl, stats  # noqa: E402
from dstoolkit.runtime.bench.report import render_markdown_table, write_report  # noqa: E402

BENCH = "layout_sweeps"
TABLE = REPO / "benchmarks" / "data" / "layout_sweeps.yaml"
SPECS_DIR = REPO / "benchmarks" / "specs" / "layout_sweeps"
RESULTS_DIR = REPO / "benchmarks" / "results"
GOALS = {"mape": 0.08, "mean_spearman": 0.85, "top1_regret": 0.03, "refused": 0}
"""Issue 24 'Done when' for the layout sweeps."""
RELATED = {"bigscience_prequel": {"bloom"}}
"""Sweep source -> published_runs sources of the same cluster and framework, left out of its LOSO fit too."""


# --------------------------------------------------------------------------------------------------
# Table -> runs (the published_runs row shape, so published_runs.spec_for builds the spec)
# --------------------------------------------------------------------------------------------------


def load(path: pathlib.Path = TABLE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    for key in ("sources", "groups"):
        if key not in (doc or {}):
            raise SystemExit(f"{path}: missing '{key}'")
    return doc


def _run(rid: str, g: dict[str, Any], common: dict[str, Any], r: dict[str, Any], nodes: int,
         **execution: Any) -> dict[str, Any]:
    """One table row of group (or A/B entry) `g` as a published_runs-shaped run: the source's `common` facts, the
    group's model, precision and overrides, the row's layout and batch; `execution` on top of both."""
    return {"id": rid, "source": g["source"], "model_name": g["id"], "model": g["model"], "gpu": common["gpu"],
            "nodes": nodes, "gpus_per_node": common["gpus_per_node"],
            "layout": {"tp": r["tp"], "pp": r["pp"], "zero_stage": g.get("zero_stage", common["zero_stage"])},
            "execution": {**(common.get("execution") or {}), **(g.get("execution") or {}), **execution},
            "micro_batch": r["micro_batch"], "global_batch": r["global_batch"], "seq_len": common["seq_len"],
            "precision": g["precision"], "recompute": r.get("recompute", common["recompute"]), "text": r["text"]}


def group_runs(doc: dict[str, Any], published: dict[str, Any]) -> list[dict[str, Any]]:
    """Every group as {id, source, where, runs: [published_runs-shaped run + measured_step_s / oom]}."""
    out = []
    for g in doc["groups"]:
        common = dict((doc.get("common") or {}).get(g["source"]) or {})
        runs = []
        for i, r in enumerate(g["rows"]):
            nodes = int(g.get("nodes", common["nodes"]))  # a group may run on its own node count (vTrain: 8-64)
            gpus = nodes * int(common["gpus_per_node"])
            if r["tp"] * r["pp"] * r["dp"] != gpus:
                raise SystemExit(f"{g['id']} row {i}: tp*pp*dp = {r['tp'] * r['pp'] * r['dp']} != {gpus} GPUs")
            rid = f"{g['id']}_tp{r['tp']}_pp{r['pp']}_dp{r['dp']}_mb{r['micro_batch']}"
            runs.append({**_run(rid, g, common, r, nodes),
                         "oom": bool(r.get("oom")), "measured_step_s": r.get("sec_per_iter"),
                         "measured_mem_gb": r.get("mem_gb")})
        out.append({"id": g["id"], "source": g["source"], "where": g["where"], "runs": runs})
    by_id = {r["id"]: r for r in published["runs"]}
    for g in doc.get("from_published_runs") or []:
        runs = []
        for rid in g["runs"]:
            r = dict(by_id[rid])
            tokens = r["global_batch"] * r["seq_len"]
            r.update(oom=False, measured_step_s=tokens / (float(r["tokens_per_s_per_gpu"]) * pr.gpus(r)),
                     text=r["published"]["text"])
            runs.append(r)
        srcs = {r["source"] for r in runs}
        out.append({"id": g["id"], "source": srcs.pop() if len(srcs) == 1 else "mixed",
                    "where": "published_runs.yaml rows " + ", ".join(g["runs"]), "runs": runs})
    return out


def write_spec(run: dict[str, Any], out_dir: pathlib.Path) -> pathlib.Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = (f"# {run['model_name']}: {run['text']}\n"
            "# Generated by benchmarks/layout_sweeps.py from benchmarks/data/layout_sweeps.yaml; edit the table, not this file.\n"
            + yaml.safe_dump(pr.spec_for(run), sort_keys=False, width=120))
    path = out_dir / f"{run['id']}.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path


def execution_ab(doc: dict[str, Any], specs_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Each `execution_ab` entry: one layout the source timed with an execution setting on and off, everything else
    equal. The estimator's cost of the setting (predicted step time on / off - 1) beside the measured one
    (throughput off / on - 1); no figure of these rows is fitted or scored above."""
    out = []
    for e in doc.get("execution_ab") or []:
        common = dict((doc.get("common") or {}).get(e["source"]) or {})
        for i, r in enumerate(e["rows"]):
            pred = {}
            for flag in (False, True):
                run = _run(f"{e['id']}_{i}_{e['field']}_{str(flag).lower()}", e, common, r, r["nodes"],
                           **{e["field"]: flag})
                pred[flag] = estimate_row(run, write_spec(run, specs_dir))["predicted_step_s"]
            out.append({"id": e["id"], "field": e["field"], "row": i, "text": r["text"], "gpus": r["nodes"] * common["gpus_per_node"],
                        "global_batch": r["global_batch"],
                        "predicted_cost": pred[True] / pred[False] - 1 if pred[True] and pred[False] else None,
                        "measured_cost": float(r["tflops_off"]) / float(r["tflops_on"]) - 1})
    return out


# --------------------------------------------------------------------------------------------------
# Estimating and scoring
# --------------------------------------------------------------------------------------------------


def estimate_row(run: dict[str, Any], spec_path: pathlib.Path) -> dict[str, Any]:
    from dstoolkit.estimate import estimate_run
    from dstoolkit.hardware.table import GpuSpec, get_gpu

    plan, err = fit.plan_for_spec(spec_path)
    row = {k: run.get(k) for k in ("id", "source", "micro_batch", "global_batch", "seq_len", "precision", "recompute",
                                   "oom", "measured_step_s", "measured_mem_gb", "text")}
    row["layout"] = {"tp": run["layout"].get("tp", 1), "pp": run["layout"].get("pp", 1),
                     "dp": pr.gpus(run) // (run["layout"].get("tp", 1) * run["layout"].get("pp", 1)
                                           * int(run["layout"].get("cp") or 1)),
                     "zero_stage": run["layout"].get("zero_stage", 0)}
    row["gpus"] = pr.gpus(run)
    row["tokens_per_step"] = run["global_batch"] * run["seq_len"]
    if plan is None:
        row.update(refused=err, predicted_step_s=None, fits=None)
        return row
    est = estimate_run(plan)
    gpu = run["gpu"]
    row.update(refused=None, predicted_step_s=float(est.step_time_s), fits=bool(est.fits),
               memory_gib=est.memory.total / 2**30, sum_of_parts_gib=est.memory.sum_of_parts_bytes / 2**30,
               allowance_gib=est.memory.allowance_bytes / 2**30, device_gib=plan.gpu.memory_bytes / 2**30,
               flops_per_token=float(est.flops_per_token),
               peak_flops=get_gpu(GpuSpec.model_validate(gpu) if isinstance(gpu, dict) else gpu).peak_bf16_flops,
               layout_kept=(plan.tp, plan.pp, plan.dp, plan.ds.micro_batch) == (
                   row["layout"]["tp"], row["layout"]["pp"], row["layout"]["dp"], run["micro_batch"]),
               breakdown={k: float(getattr(est.step_time, k)) for k in ("compute_s", "comm_exposed_s", "memory_s")
                          if hasattr(est.step_time, k)})
    return row


def per_token(step_s: float, row: dict[str, Any]) -> float:
    return step_s / row["tokens_per_step"]


def candidates(ran: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The layouts a planner would choose among: those estimated to fit, or all that ran when none is."""
    return [r for r in ran if r.get("fits")] or ran


def marked_undecided(ran: list[dict[str, Any]], key: str = "predicted_step_s",
                     error: float = GPU_OUT_OF_SOURCE_ERROR) -> dict[str, Any]:
    """What `sweep` / `generate` would mark over these measured layouts: the ones estimated to fit whose estimated
    time per token lies within `error` of the fastest estimate (generate.undecided.within_error), whether the
    measured best is among them, and the regret left once they are all measured."""
    fitting = candidates(ran)
    if not fitting:
        return {"marked": [], "best_marked": None, "regret_after_measuring": None}
    marked = [fitting[i] for i in within_error([per_token(r[key], r) for r in fitting], error)]
    best = min(per_token(r["measured_step_s"], r) for r in ran)
    got = min(per_token(r["measured_step_s"], r) for r in marked)
    return {"marked": [r["id"] for r in marked], "best_marked": got <= best,
            "regret_after_measuring": got / best - 1.0}


def score_group(rows: list[dict[str, Any]], key: str = "predicted_step_s") -> dict[str, Any]:
    """MAPE, Spearman of the order, top-1 regret over the rows that ran; the undecided set `sweep` would mark and
    what measuring it leaves; refusals and OOM disagreements."""
    ran = [r for r in rows if not r["oom"] and r.get(key) is not None]
    errs = [r["measured_step_s"] / r[key] - 1.0 for r in ran]
    sp = None
    if len(ran) >= 2:
        v = stats.spearman([per_token(r["measured_step_s"], r) for r in ran], [per_token(r[key], r) for r in ran])
        sp = None if isinstance(v, float) and math.isnan(v) else v
    fitting = candidates(ran)
    best = min(per_token(r["measured_step_s"], r) for r in ran) if ran else None
    pick = min(fitting, key=lambda r: per_token(r[key], r)) if fitting else None
    return {
        "rows": len(rows), "ran": len(ran), "oom_rows": sum(1 for r in rows if r["oom"]),
        "mape": sum(abs(e) for e in errs) / len(errs) if errs else None,
        # the step time's own error, |predicted / measured - 1|: what simulators publish (vTrain, SimAI, Lumos)
        "time_mape": sum(abs(r[key] / r["measured_step_s"] - 1.0) for r in ran) / len(ran) if ran else None,
        "spearman": sp,
        "top1_pick": pick["id"] if pick else None,
        "top1_regret": (per_token(pick["measured_step_s"], pick) / best - 1.0) if pick else None,
        **marked_undecided(ran, key),
        "refused": [r["id"] for r in rows if r.get("refused") and not r["oom"]],
        "false_oom": [r["id"] for r in ran if r.get("fits") is False],
        "missed_oom": [r["id"] for r in rows if r["oom"] and r.get("fits")],
        # of those, the ones `sweep` / `estimate` still mark: the peak fits, the sum of parts + allowance does not
        "missed_oom_cautioned": [r["id"] for r in rows if r["oom"] and r.get("fits") and cautioned(r)],
    }


def cautioned(row: dict[str, Any]) -> bool:
    """Whether the estimate carries the sum-of-parts caution for this row (estimate.core.upper_bound_exceeds, the
    '*' of `sweep`)."""
    return upper_bound_exceeds(round(row["sum_of_parts_gib"] * 2**30), round(row["allowance_gib"] * 2**30),
                               round(row["device_gib"] * 2**30))


SWEEP_SPACE = ("tp a power of two up to the node, pp dividing the world (candidate_grid.pp_choices), micro batch in "
               "candidate_grid.MICRO_BATCH_CHOICES, one global batch and GPU count")


def sweep_pick(group: dict[str, Any], rows: list[dict[str, Any]], spec_path: pathlib.Path) -> dict[str, Any]:
    """`sweep`'s own top pick over the group's open dimensions, when every measured layout lies in its space."""
    from dstoolkit.generate.candidate_grid import MICRO_BATCH_CHOICES, pow2_upto, pp_choices

    runs = group["runs"]
    gpn = runs[0]["gpus_per_node"]
    # the execution facts as canonical JSON: their values may be lists (recompute_modules), which a set cannot hold
    fixed = {(r["layout"].get("zero_stage", 0), r["recompute"], json.dumps(r.get("execution") or {}, sort_keys=True),
              r["layout"].get("vpp"), r["layout"].get("ep", 1), r["layout"].get("cp") or 1) for r in runs}
    if len(fixed) > 1:
        return {"applicable": False,
                "why": "the layouts differ in more than tp/pp/micro batch (ZeRO stage, schedule, framework or EP)"}
    outside = [r["id"] for r in runs if r["layout"].get("tp", 1) not in pow2_upto(gpn)
               or r["micro_batch"] not in MICRO_BATCH_CHOICES or r.get("global_batch") != runs[0].get("global_batch")
               or (r.get("nodes"), r["gpus_per_node"]) != (runs[0].get("nodes"), gpn)]
    if not outside:  # the pp test needs the spec's world size and layer count
        from dstoolkit.models import resolve_model
        from dstoolkit.spec import load_spec

        spec = load_spec(str(spec_path))
        shape = resolve_model(spec.model, spec_path.parent)
        pps = pp_choices(spec.cluster.world_size, shape.num_hidden_layers)
        outside = [r["id"] for r in runs if r["layout"].get("pp", 1) not in pps]
    if outside:
        return {"applicable": False, "why": f"{len(outside)} of {len(runs)} layouts outside the sweep space ({SWEEP_SPACE})"}
    from dstoolkit.generate.sweep import run_sweep

    for f in ("tp", "pp", "micro_batch"):
        setattr(spec.training, f, "auto")
    res = run_sweep(spec, shape, top=1, validate=False, advise=False)
    if res.winner is None:
        return {"applicable": True, "pick": None, "why": "the sweep found no fitting layout"}
    c = res.winner.candidate
    match = [r for r in rows if (r["layout"]["tp"], r["layout"]["pp"], r["micro_batch"]) == (c.tp, c.pp, c.micro_batch)
             and not r["oom"]]
    pick = f"tp{c.tp} pp{c.pp} mb{c.micro_batch}"
    if not match:
        return {"applicable": True, "pick": pick, "regret": None, "why": "the sweep's pick was not measured"}
    ran = [r for r in rows if not r["oom"]]
    best = min(per_token(r["measured_step_s"], r) for r in ran)
    return {"applicable": True, "pick": pick, "regret": per_token(match[0]["measured_step_s"], match[0]) / best - 1.0}


def summarize(scores: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ran_rows = sum(s["ran"] for s in scores.values())
    mapes = [(s["mape"], s["ran"]) for s in scores.values() if s["mape"] is not None]
    time_mapes = [(s["time_mape"], s["ran"]) for s in scores.values() if s.get("time_mape") is not None]
    sps = [s["spearman"] for s in scores.values() if s["spearman"] is not None and s["ran"] >= 3]
    regrets = [s["top1_regret"] for s in scores.values() if s["top1_regret"] is not None]
    # the undecided set only says something where there is an order to decide: groups of >= 2 layouts that ran
    multi = [s for s in scores.values() if s["ran"] >= 2 and s.get("best_marked") is not None]
    after = [s["regret_after_measuring"] for s in multi]
    return {
        "groups": len(scores), "ran_rows": ran_rows,
        "mape_rows": sum(m * n for m, n in mapes) / sum(n for _, n in mapes) if mapes else None,
        "time_mape_rows": (sum(m * n for m, n in time_mapes) / sum(n for _, n in time_mapes)) if time_mapes else None,
        "mean_spearman_groups_ge3": sum(sps) / len(sps) if sps else None,
        "spearman_groups": len(sps),
        "mean_top1_regret": sum(regrets) / len(regrets) if regrets else None,
        "max_top1_regret": max(regrets) if regrets else None,
        "undecided_error": GPU_OUT_OF_SOURCE_ERROR,
        "undecided_groups": len(multi),
        "undecided_best_marked": sum(1 for s in multi if s["best_marked"]),
        "undecided_share_marked": (sum(len(s["marked"]) / s["ran"] for s in multi) / len(multi)) if multi else None,
        "mean_regret_after_measuring": sum(after) / len(after) if after else None,
        "max_regret_after_measuring": max(after) if after else None,
        "refused": sum(len(s["refused"]) for s in scores.values()),
        "false_oom": sum(len(s["false_oom"]) for s in scores.values()),
        "missed_oom": sum(len(s["missed_oom"]) for s in scores.values()),
        "missed_oom_cautioned": sum(len(s["missed_oom_cautioned"]) for s in scores.values()),
    }


def published_model_line(src: dict[str, Any], rows: list[dict[str, Any]], scope: str,
                         mape_loso: Optional[float] = None) -> Optional[str]:
    """The source's own model's published error on its measurements (`published_model_error` in the table, `scope`
    multi_node or single_node) beside the estimator's on the same rows that ran: its iteration-time MAPE (the metric
    such simulators publish, |predicted / measured - 1|) and this page's throughput MAPE (measured / predicted - 1).
    None where the source publishes none or no row ran."""
    pub = (src.get("published_model_error") or {})
    ran = [r for r in rows if not r.get("oom") and r.get("predicted_step_s") and r.get("measured_step_s")]
    if pub.get(scope) is None or not ran:
        return None
    time_mape = sum(abs(r["predicted_step_s"] / r["measured_step_s"] - 1) for r in ran) / len(ran)
    tput_mape = sum(abs(r["measured_step_s"] / r["predicted_step_s"] - 1) for r in ran) / len(ran)
    out = (f"**The source's own model.** {pub['model']} reports a {pub['metric']} of {_pct(pub[scope])} on these "
           f"{scope.replace('_', '-')} measurements ({pub['cite']}). On the same {len(ran)} rows, from the spec alone: "
           f"iteration-time MAPE {_pct(time_mape)}, throughput MAPE {_pct(tput_mape)} in sample")
    return out + (f", {_pct(mape_loso)} out of source." if mape_loso is not None else ".")


def memory_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The estimate against the device memory a source reports per run (`mem_gb`: nvidia-smi's figure, the CUDA
    context and what the caching allocator holds; read as GiB, nvidia-smi's MiB / 1024). Two estimates beside it:
    the peak of the phase timeline + the allowance (what `fits` tests), and every category at its own maximum + the
    allowance (sum of parts: what a caching allocator that reuses no block across phases would hold). Reported,
    not fitted. OOM rows: how many each estimate puts over the device."""
    have = [r for r in rows if r.get("measured_mem_gb") and r.get("memory_gib") is not None and not r["oom"]]
    out: dict[str, Any] = {"rows": len(have)}
    for key, col in (("peak", "memory_gib"), ("sum_of_parts", "sum_of_parts_gib")):
        ratios = sorted(r["measured_mem_gb"] / (r[col] + r["allowance_gib"]) for r in have)
        errs = [abs((r[col] + r["allowance_gib"]) / r["measured_mem_gb"] - 1.0) for r in have]
        out[key] = {"median_measured_over_estimate": ratios[len(ratios) // 2] if ratios else None,
                    "min_ratio": ratios[0] if ratios else None, "max_ratio": ratios[-1] if ratios else None,
                    "mape": sum(errs) / len(errs) if errs else None}
    oom = [r for r in rows if r["oom"] and r.get("memory_gib") is not None]
    out["oom_rows"] = len(oom)
    out["oom_over_device_peak"] = sum(1 for r in oom if r["memory_gib"] + r["allowance_gib"] > r["device_gib"])
    out["oom_over_device_sum_of_parts"] = sum(1 for r in oom if r["sum_of_parts_gib"] + r["allowance_gib"] > r["device_gib"])
    ran = [r for r in rows if not r["oom"] and r.get("memory_gib") is not None]
    out["ran_over_device_sum_of_parts"] = sum(1 for r in ran if r["sum_of_parts_gib"] + r["allowance_gib"] > r["device_gib"])
    return out


CEILING_DRAWS = 4000
CEILING_SEED = 0


def repeat_sigma(pairs: list[dict[str, Any]]) -> Optional[float]:
    """Log-normal noise sigma of one measurement from pairs of repeated timings (a_s, b_s) of one layout:
    var(ln a - ln b) = 2 sigma^2, pooled over the pairs."""
    if not pairs:
        return None
    return math.sqrt(sum(math.log(p["a_s"] / p["b_s"]) ** 2 for p in pairs) / (2 * len(pairs)))


def noise_ceiling(times: list[float], sigma: float, draws: int = CEILING_DRAWS, seed: int = CEILING_SEED) -> Optional[float]:
    """Mean Spearman between `times` and one re-measurement of each, times x exp(sigma z), z ~ N(0, 1), over
    `draws` seeded draws: what a model that knew `times` exactly would score against a single noisy measurement
    per layout. `times` are themselves measured (noisier than the truth, so more spread out), which makes this an
    upper estimate of the ceiling."""
    if len(times) < 3 or sigma is None:
        return None
    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        total += stats.spearman(times, [t * math.exp(sigma * rng.gauss(0.0, 1.0)) for t in times])
    return total / draws


def mape_floor(sigma: Optional[float], draws: int = CEILING_DRAWS, seed: int = CEILING_SEED) -> Optional[float]:
    """Mean |error| of a model that knew every true step time, scored against one measurement each, true x
    exp(sigma z), z ~ N(0, 1) (error = predicted tokens/s / measured - 1 = exp(-sigma z) - 1), over `draws` seeded
    draws: the MAPE that measurement noise alone leaves (~0.8 sigma for small sigma)."""
    if sigma is None:
        return None
    rng = random.Random(seed)
    return sum(abs(math.exp(-sigma * rng.gauss(0.0, 1.0)) - 1.0) for _ in range(draws)) / draws


def ceilings(groups, rows_by_group, scores, doc, loso=None) -> dict[str, Any]:
    """Per group of a source with repeated timings (doc['repeatability']): the noise ceiling of its Spearman; and
    over those groups of >= 3 layouts the mean ceiling beside the model's mean Spearman (in sample, LOSO)."""
    sig = {src: repeat_sigma(pairs) for src, pairs in (doc.get("repeatability") or {}).items()}
    per, model, model_lo = {}, [], []
    for g in groups:
        sc = scores[g["id"]]
        if g["source"] not in sig or sc["ran"] < 3 or sc["spearman"] is None:
            continue
        ran = [r for r in rows_by_group[g["id"]] if not r["oom"] and r.get("predicted_step_s") is not None]
        per[g["id"]] = noise_ceiling([per_token(r["measured_step_s"], r) for r in ran], sig[g["source"]])
        model.append(sc["spearman"])
        lg = (loso or {}).get(g["id"], {}).get("score")
        if lg and lg.get("spearman") is not None:
            model_lo.append(lg["spearman"])
    vals = [v for v in per.values() if v is not None]
    # the MAPE floor over the layouts that ran (score_group's `ran`, its `mape` per group), by source
    floor = {src: mape_floor(v) for src, v in sig.items()}
    noisy = [(g["source"], scores[g["id"]]) for g in groups if g["source"] in sig and scores[g["id"]]["ran"]]
    n_noisy = sum(sc["ran"] for _, sc in noisy)
    return {"sigma_by_source": sig, "mape_floor_by_source": floor, "rows_with_sigma": n_noisy,
            "rows": sum(sc["ran"] for sc in scores.values()),
            "mape_floor_rows_with_sigma": sum(floor[src] * sc["ran"] for src, sc in noisy) / n_noisy if n_noisy else None,
            "model_mape_rows_with_sigma": sum(sc["mape"] * sc["ran"] for _, sc in noisy) / n_noisy if n_noisy else None,
            "pairs_by_source": {k: len(v) for k, v in (doc.get("repeatability") or {}).items()},
            "draws": CEILING_DRAWS, "seed": CEILING_SEED, "per_group": per, "groups": len(vals),
            "mean_ceiling": sum(vals) / len(vals) if vals else None,
            "mean_model_spearman": sum(model) / len(model) if model else None,
            "mean_model_spearman_loso": sum(model_lo) / len(model_lo) if model_lo and len(model_lo) == len(model) else None}


# --------------------------------------------------------------------------------------------------
# LOSO
# --------------------------------------------------------------------------------------------------


def loso_sweeps(groups, rows_by_group, published_doc, specs_pub_dir: pathlib.Path,
                specs_dir: pathlib.Path = SPECS_DIR) -> dict[str, Any]:
    """Refit the fitted constants on published_runs rows of the other sources, re-predict each group."""
    pub_runs = [dict(r, _index=i) for i, r in enumerate(published_doc["runs"])]
    pub_plans, pub_rows = [], []
    for r in pub_runs:
        path = pr.write_spec(r, published_doc["sources"][r["source"]], specs_pub_dir)
        plan, err = fit.plan_for_spec(path)
        if plan is None:
            continue
        from dstoolkit.estimate import estimate_run

        est = estimate_run(plan)
        tokens = float(est.tokens_per_step)
        pub_plans.append(plan)
        pub_rows.append(fit.Row(r["id"], r["source"], tokens / (float(r["tokens_per_s_per_gpu"]) * pr.gpus(r)),
                                tokens, pr.gpus(r), float(est.flops_per_token), pr.peak_bf16(r["gpu"])))
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


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _sp(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.3f}"


def _marked(sc: Optional[dict[str, Any]]) -> str:
    """`k/n, best in` (or `best out, regret after x%`) for one group's undecided set; – where nothing is marked."""
    if not sc or sc.get("best_marked") is None or sc["ran"] < 2:
        return "–"
    head = f"{len(sc['marked'])}/{sc['ran']}"
    return f"{head}, best in" if sc["best_marked"] else f"{head}, best out, {_pct(sc['regret_after_measuring'])}"


def _frac(k: Optional[int], n: Optional[int]) -> str:
    return "–" if not n else f"{k} of {n}"


def sweep_pick_summary(sweeps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`sweep`'s own pick over the groups: in how many it applies, how many of its picks were measured, their regret."""
    applied = [v for v in sweeps.values() if v.get("applicable")]
    measured = [v["regret"] for v in applied if v.get("regret") is not None]
    return {"groups": len(sweeps), "applicable": len(applied), "measured": len(measured),
            "mean_regret": sum(measured) / len(measured) if measured else None,
            "max_regret": max(measured) if measured else None}


def _sweep_pick_figure(sp: dict[str, Any]) -> list[str]:
    value = f"{sp['applicable']} of {sp['groups']} / {sp['measured']}"
    if sp["measured"]:
        value += f" / {_pct(sp['mean_regret'])} / {_pct(sp['max_regret'])}"
    return ["`sweep`'s own pick: groups inside its space / picks that were measured / their mean / worst regret", value]


def by_source_rows(groups, scores, loso) -> list[list[str]]:
    """The summary's figures per source (summarize over that source's groups; the leave-one-source-out MAPE from
    loso where it ran): one markdown row each, in the table's order of sources."""
    out = []
    for src in dict.fromkeys(g["source"] for g in groups):
        ids = [g["id"] for g in groups if g["source"] == src]
        sm = summarize({i: scores[i] for i in ids})
        lo = summarize({i: loso[i]["score"] for i in ids if i in loso}) if loso else None
        out.append([src, str(len(ids)), str(sm["ran_rows"]), _pct(sm["mape_rows"]),
                    _pct(lo["mape_rows"]) if lo and lo["groups"] else "–",
                    f"{_sp(sm['mean_spearman_groups_ge3'])} ({sm['spearman_groups']})",
                    f"{_pct(sm['mean_top1_regret'])} / {_pct(sm['max_top1_regret'])}"])
    return out


def render_md(groups, rows_by_group, scores, sweeps, summary, loso, env, doc) -> str:
    s = summary
    lines = ["# Measured layout sweeps vs the estimator", "",
             f"`benchmarks/layout_sweeps.py` over `benchmarks/data/layout_sweeps.yaml`: {s['groups']} groups (one model on "
             f"one cluster at several layouts), {s['ran_rows']} layouts that ran. Error = predicted tokens/s ÷ measured − 1; "
             "order = Spearman of predicted vs measured time per token; top-1 regret = measured time per token of the "
             "layout ranked fastest (among those predicted to fit) ÷ the measured best − 1.", "",
             f"_Estimator at commit {str(env.get('git_commit'))[:12]}, {env.get('timestamp_utc')}._", "", "## Summary", ""]
    pub = loso.pop("_published_runs", None) if loso else None
    lo = summarize({k: v["score"] for k, v in loso.items()}) if loso else None
    lines += render_markdown_table([
        ["throughput MAPE (rows that ran)", _pct(s["mape_rows"]), _pct(lo["mape_rows"]) if lo else "–", "≤ 8%"],
        ["step-time MAPE, abs(predicted ÷ measured − 1) (the metric vTrain, SimAI and Lumos publish)",
         _pct(s["time_mape_rows"]), _pct(lo["time_mape_rows"]) if lo and lo.get("time_mape_rows") is not None else "–",
         ""],
        [f"mean within-group Spearman ({s['spearman_groups']} groups of ≥ 3)", _sp(s["mean_spearman_groups_ge3"]),
         _sp(lo["mean_spearman_groups_ge3"]) if lo else "–", "≥ 0.85"],
        ["mean / worst top-1 regret", f"{_pct(s['mean_top1_regret'])} / {_pct(s['max_top1_regret'])}",
         f"{_pct(lo['mean_top1_regret'])} / {_pct(lo['max_top1_regret'])}" if lo else "–", "≤ 3%"],
        [f"measured best among the layouts marked undecided (within {_pct(s['undecided_error'])} of the fastest "
         f"estimate; {s['undecided_groups']} groups of ≥ 2)",
         _frac(s["undecided_best_marked"], s["undecided_groups"]),
         _frac(lo["undecided_best_marked"], lo["undecided_groups"]) if lo else "–", ""],
        ["mean share of a group's layouts marked", _pct(s["undecided_share_marked"]),
         _pct(lo["undecided_share_marked"]) if lo else "–", ""],
        ["mean / worst regret after `tune --mode real` measures the marked ones",
         f"{_pct(s['mean_regret_after_measuring'])} / {_pct(s['max_regret_after_measuring'])}",
         f"{_pct(lo['mean_regret_after_measuring'])} / {_pct(lo['max_regret_after_measuring'])}" if lo else "–", ""],
        ["layouts that ran but refused", str(s["refused"]), "", "0"],
        ["layouts that ran, predicted not to fit", str(s["false_oom"]), "", "0"],
        ["layouts reported OOM, predicted to fit (of them, marked with the sum-of-parts caution)",
         f"{s['missed_oom']} ({s['missed_oom_cautioned']})", "", ""],
        [*_sweep_pick_figure(s["sweep_pick"]), "", ""],
    ], ["figure", ("in sample", "r"), ("leave one source out", "r"), "goal"])
    lines += ["", "By source (each figure over that source's groups alone):", ""]
    lines += render_markdown_table(by_source_rows(groups, scores, loso),
                                   ["source", ("groups", "r"), ("layouts", "r"), ("MAPE", "r"), ("MAPE loso", "r"),
                                    ("mean Spearman (groups of ≥ 3)", "r"), ("mean / worst regret", "r")])
    ce = s.get("noise_ceiling")
    if ce and ce["groups"]:
        sig = ", ".join(f"{k} {_pct(v)} from {ce['pairs_by_source'][k]} repeated timings" for k, v in ce["sigma_by_source"].items())
        lines += ["", f"**Noise ceiling.** One measured iteration moves on its own (noise σ per measurement: {sig}; "
                  "`repeatability` in the table). A model that knew every measured time exactly would score a mean "
                  f"Spearman of {_sp(ce['mean_ceiling'])} against one such measurement per layout on the {ce['groups']} "
                  f"groups of those sources ({ce['draws']} seeded draws, an upper estimate); the estimator scores "
                  f"{_sp(ce['mean_model_spearman'])} in sample and {_sp(ce['mean_model_spearman_loso'])} out of source "
                  "on the same groups."]
        if ce.get("mape_floor_rows_with_sigma") is not None:
            lines[-1] += (f" The same noise leaves a MAPE of {_pct(ce['mape_floor_rows_with_sigma'])} to such a model on "
                          f"the {ce['rows_with_sigma']} layouts of those sources (the estimator: "
                          f"{_pct(ce['model_mape_rows_with_sigma'])} in sample), "
                          f"{_pct(ce['mape_floor_rows_with_sigma'] * ce['rows_with_sigma'] / ce['rows'])} of the "
                          f"overall MAPE over all {ce['rows']}; σ from so few pairs is itself uncertain.")
    for key, src in doc["sources"].items():
        ran = [r for g in groups if g["source"] == key for r in rows_by_group[g["id"]]]
        lo_src = [(loso[g["id"]]["score"]["mape"], scores[g["id"]]["ran"]) for g in groups
                  if g["source"] == key and loso and loso.get(g["id"]) and loso[g["id"]]["score"]["mape"] is not None]
        line = published_model_line(src, ran, "multi_node",
                                    sum(m * n for m, n in lo_src) / sum(n for _, n in lo_src) if lo_src else None)
        if line:
            lines += ["", line]
    ab = s.get("execution_ab") or []
    if ab:
        lines += ["", "**Execution A/B.** A setting the source timed on and off on one layout (`execution_ab` in the "
                  "table), everything else equal: the estimator's cost of it (predicted step time on ÷ off − 1) beside "
                  "the measured cost (throughput off ÷ on − 1). Not scored above.", ""]
        lines += render_markdown_table(
            [[a["id"], a["field"], str(a["gpus"]), str(a["global_batch"]), _pct(a["predicted_cost"]),
              _pct(a["measured_cost"]), a["text"].replace("|", "\\|")] for a in ab],
            ["check", "setting", ("GPUs", "r"), ("gbs", "r"), ("predicted cost", "r"), ("measured cost", "r"), "source row"])
    per_ceiling = (ce or {}).get("per_group") or {}
    lines += ["", "## Per group", ""]
    body = []
    for g in groups:
        sc = scores[g["id"]]
        lg = loso.get(g["id"], {}).get("score") if loso else None
        sw = sweeps.get(g["id"]) or {}
        swt = ("n/a: " + sw.get("why", "")) if not sw.get("applicable") else (
            f"{sw.get('pick')}: " + (_pct(sw.get("regret")) if sw.get("regret") is not None else sw.get("why", "")))
        body.append([g["id"], g["source"], f"{sc['ran']} (+{sc['oom_rows']} OOM)", _pct(sc["mape"]),
                     _pct(lg["mape"]) if lg else "–", _sp(sc["spearman"]), _sp(lg["spearman"]) if lg else "–",
                     _sp(per_ceiling.get(g["id"])) if g["id"] in per_ceiling else "–", _pct(sc["top1_regret"]), _pct(lg["top1_regret"]) if lg else "–", _marked(sc), _marked(lg),
                     str(len(sc["refused"])), str(len(sc["false_oom"])), str(len(sc["missed_oom"])), swt])
    lines += render_markdown_table(body, ["group", "source", ("layouts", "r"), ("MAPE", "r"), ("MAPE loso", "r"),
                                          ("Spearman", "r"), ("Spearman loso", "r"), ("noise ceiling", "r"),
                                          ("regret", "r"),
                                          ("regret loso", "r"), ("marked: best in? / regret after", "r"),
                                          ("marked loso", "r"), ("refused", "r"), ("false OOM", "r"),
                                          ("missed OOM", "r"), "sweep's own pick"])
    lines += ["", "## Rows", ""]
    body = []
    for g in groups:
        for r in rows_by_group[g["id"]]:
            lay = r["layout"]
            meas = "OOM" if r["oom"] else f"{per_token(r['measured_step_s'], r) * 1e6:.2f}"
            pred = "refused: " + r["refused"] if r.get("refused") else (
                f"{per_token(r['predicted_step_s'], r) * 1e6:.2f}" if r.get("predicted_step_s") else "–")
            err = "" if r["oom"] or not r.get("predicted_step_s") else _pct(r["measured_step_s"] / r["predicted_step_s"] - 1)
            fits = "" if r.get("fits") is None else ("fits" if r["fits"] else "no fit")
            body.append([g["id"], f"tp{lay['tp']} pp{lay['pp']} dp{lay['dp']} z{lay['zero_stage']}", r["micro_batch"],
                         r["global_batch"], meas, pred, err, fits])
    lines += render_markdown_table(body, ["group", "layout", ("mb", "r"), ("gbs", "r"), ("measured µs/token", "r"),
                                          ("predicted µs/token", "r"), ("error", "r"), "memory"])
    mv = s.get("memory_vs_reported")
    if mv and mv["rows"]:
        pk, sp = mv["peak"], mv["sum_of_parts"]
        lines += ["", "## Device memory vs what the source reports", "",
                  f"{mv['rows']} layouts that ran report their device memory (`mem_gb`, nvidia-smi: the CUDA context and "
                  "what PyTorch's caching allocator holds, not the allocated peak). Measured ÷ (estimated peak + "
                  f"allowance, what `fits` tests): median {pk['median_measured_over_estimate']:.2f}, range "
                  f"{pk['min_ratio']:.2f}-{pk['max_ratio']:.2f} (MAPE {_pct(pk['mape'])}); measured ÷ (sum of parts + "
                  f"allowance, each category at its own maximum): median {sp['median_measured_over_estimate']:.2f}, "
                  f"range {sp['min_ratio']:.2f}-{sp['max_ratio']:.2f} (MAPE {_pct(sp['mape'])}). Of the "
                  f"{mv['oom_rows']} layouts reported out of memory, the peak puts {mv['oom_over_device_peak']} over the "
                  f"device and the sum of parts {mv['oom_over_device_sum_of_parts']}; the sum of parts puts "
                  f"{mv['ran_over_device_sum_of_parts']} of the layouts that ran over it. Reported, not fitted: "
                  "`fits` stays the peak's.", ""]
        body = []
        for g in groups:
            for r in rows_by_group[g["id"]]:
                if r.get("memory_gib") is None or not (r.get("measured_mem_gb") or r["oom"]):
                    continue
                lay = r["layout"]
                body.append([g["id"], f"tp{lay['tp']} pp{lay['pp']} dp{lay['dp']} z{lay['zero_stage']}", r["micro_batch"],
                             "OOM" if r["oom"] else f"{r['measured_mem_gb']:g}",
                             f"{r['memory_gib'] + r['allowance_gib']:.1f}", f"{r['sum_of_parts_gib'] + r['allowance_gib']:.1f}",
                             f"{r['device_gib']:.0f}"])
        lines += render_markdown_table(body, ["group", "layout", ("mb", "r"), ("reported GiB", "r"),
                                              ("peak + allowance GiB", "r"), ("sum of parts + allowance GiB", "r"),
                                              ("device GiB", "r")])
    if pub:
        lines += [""] + fit.render_loso_md(pub["loso"], "Leave one source out on published_runs.yaml (same grid)")
        lines += fit.render_ablation_md(pub["ablation"])
    if loso:
        lines += ["", "## Leave one source out: refitted constants per group", ""]
        lines += [f"- `{gid}`: {fit.fmt_point(v['refit'])}" for gid, v in loso.items()]
    lines += ["", "## Sources", ""]
    for key, src in doc["sources"].items():
        n = sum(len(rows_by_group[g["id"]]) for g in groups if g["source"] == key or
                (key == "published_runs" and g["where"].startswith("published_runs")))
        lines.append(f"- **{key}** ({n} rows): {src['title']}, <{src['url']}>, {src['where']}. {src.get('cluster', '')} "
                     f"{('Memory: ' + src['memory'] + '. ') if src.get('memory') else ''}Provenance: {src['verification']}")
    for key, com in (doc.get("common") or {}).items():
        lines += [f"- {key} assumed: " + "; ".join(com.get("assumed") or []),
                  f"- {key} inexpressible: " + "; ".join(com.get("inexpressible") or [])]
    return "\n".join(lines) + "\n"


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
    published = pr.load_table()
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
