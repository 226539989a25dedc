"""Layout sweeps, estimating and scoring: each row estimated in process (the plan `dstoolkit estimate SPEC` builds);
per group MAPE, Spearman of the order, top-1 regret, the undecided set `sweep` would mark, refusals and OOM
disagreements; `sweep`'s own pick; the summary over groups; the estimated memory beside what a source reports; the
execution A/B checks."""
from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import estimator_fit as fit
import published_runs_specs as prs
from dstoolkit.estimate.core import upper_bound_exceeds
from dstoolkit.generate.undecided import GPU_OUT_OF_SOURCE_ERROR, within_error
from dstoolkit.runtime.bench import stats
from layout_sweeps_table import _run, write_spec


def estimate_row(run: dict[str, Any], spec_path: pathlib.Path) -> dict[str, Any]:
    from dstoolkit.estimate import estimate_run
    from dstoolkit.hardware.table import GpuSpec, get_gpu

    plan, err = fit.plan_for_spec(spec_path)
    row = {k: run.get(k) for k in ("id", "source", "micro_batch", "global_batch", "seq_len", "precision", "recompute",
                                   "oom", "measured_step_s", "measured_mem_gb", "text")}
    row["layout"] = {"tp": run["layout"].get("tp", 1), "pp": run["layout"].get("pp", 1),
                     "dp": prs.gpus(run) // (run["layout"].get("tp", 1) * run["layout"].get("pp", 1)
                                           * int(run["layout"].get("cp") or 1)),
                     "zero_stage": run["layout"].get("zero_stage", 0)}
    row["gpus"] = prs.gpus(run)
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


def sweep_pick_summary(sweeps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`sweep`'s own pick over the groups: in how many it applies, how many of its picks were measured, their regret."""
    applied = [v for v in sweeps.values() if v.get("applicable")]
    measured = [v["regret"] for v in applied if v.get("regret") is not None]
    return {"groups": len(sweeps), "applicable": len(applied), "measured": len(measured),
            "mean_regret": sum(measured) / len(measured) if measured else None,
            "max_regret": max(measured) if measured else None}


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


def single_node(doc: dict[str, Any], specs_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Each `single_node` row: a run of the source on one node (no network), estimated as the groups' rows are.
    Throughput error = measured step time / predicted - 1 (predicted tokens/s over measured - 1, as the groups);
    reported beside the source's multi-node rows to say whether its error lives inside the node. Not scored."""
    out = []
    for e in doc.get("single_node") or []:
        common = dict((doc.get("common") or {}).get(e["source"]) or {})
        for i, r in enumerate(e["rows"]):
            if r["tp"] * r["pp"] * r["dp"] != common["gpus_per_node"]:
                raise SystemExit(f"single_node {e['id']} row {i}: tp*pp*dp must fill the one node "
                                 f"({common['gpus_per_node']} GPUs)")
            run = _run(f"{e['id']}_{i}_tp{r['tp']}_pp{r['pp']}_mb{r['micro_batch']}", e, common, r, 1)
            pred = estimate_row(run, write_spec(run, specs_dir))["predicted_step_s"]
            out.append({"id": e["id"], "source": e["source"], "row": i, "text": r["text"],
                        "micro_batch": r["micro_batch"], "global_batch": r["global_batch"],
                        "measured_step_s": float(r["sec_per_iter"]), "predicted_step_s": pred,
                        "error": float(r["sec_per_iter"]) / pred - 1 if pred else None})
    return out
