"""Layout sweeps, the report: the Markdown page (summary in sample beside leave one source out, by source, noise
ceiling, the source's own model, execution A/B, per group, rows, device memory, sources) rendered from the scored
groups."""
from __future__ import annotations

from typing import Any, Optional

import estimator_fit as fit
from dstoolkit.runtime.bench.report import render_markdown_table
from layout_sweeps_score import per_token, summarize


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
    lines += single_node_lines(s.get("single_node") or [], groups, rows_by_group)
    lines += by_tp_lines(groups, rows_by_group)
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


def by_tp_lines(groups, rows_by_group) -> list[str]:
    """Error of the layouts that ran by source and tensor-parallel size (a source with several sizes): where the
    misses sit when one size is predicted well and another is not."""
    cells: dict[tuple[str, int], list[float]] = {}
    for g in groups:
        for r in rows_by_group[g["id"]]:
            if not r["oom"] and r.get("predicted_step_s"):
                cells.setdefault((g["source"], r["layout"]["tp"]), []).append(
                    r["measured_step_s"] / r["predicted_step_s"] - 1)
    multi = {src for src, _ in cells if len({tp for s2, tp in cells if s2 == src}) > 1}
    body = [[src, str(tp), str(len(v)), _pct(sum(v) / len(v)), _pct(sum(abs(x) for x in v) / len(v)),
             f"{sum(abs(x) <= 0.03 for x in v)}", f"{_pct(min(v))} to {_pct(max(v))}"]
            for (src, tp), v in sorted(cells.items()) if src in multi]
    if not body:
        return []
    return ["", "## Error by tensor-parallel size", "",
            "Layouts that ran, by source and TP size (error = predicted tokens/s ÷ measured − 1, in sample).", ""] + \
        render_markdown_table(body, ["source", ("tp", "r"), ("layouts", "r"), ("signed mean", "r"), ("MAPE", "r"),
                                     ("within ±3%", "r"), ("range", "r")])


def single_node_lines(one: list[dict[str, Any]], groups, rows_by_group) -> list[str]:
    """The `single_node` rows beside the mean signed error of their source's multi-node rows."""
    if not one:
        return []
    lines = ["", "**One node, no network.** Rows the source ran on a single node (`single_node` in the table), "
             "estimated as the rows above: error = predicted tokens/s ÷ measured − 1. Beside them, the mean signed "
             "error of the same source's multi-node rows: where both agree, the error lives inside the node "
             "(compute, NVLink, the host), not between nodes. Not scored above.", ""]
    body = []
    for a in one:
        multi = [r["measured_step_s"] / r["predicted_step_s"] - 1 for g in groups if g["source"] == a["source"]
                 for r in rows_by_group[g["id"]] if r.get("measured_step_s") and r.get("predicted_step_s")]
        body.append([a["id"], str(a["micro_batch"]), str(a["global_batch"]), f"{a['measured_step_s']:.2f}",
                     f"{a['predicted_step_s']:.2f}" if a["predicted_step_s"] else "–", _pct(a["error"]),
                     _pct(sum(multi) / len(multi)) if multi else "–", a["text"].replace("|", "\\|")])
    return lines + render_markdown_table(body, ["check", ("mb", "r"), ("gbs", "r"), ("measured s", "r"),
                                                ("predicted s", "r"), ("error", "r"),
                                                ("source's multi-node mean signed error", "r"), "source row"])
