"""Published runs, the report: the Markdown page, the predicted-vs-published plot and the console summary, each
rendered from the result rows and their summary alone (so `--render-from` re-renders a committed JSON Lines file)."""
from __future__ import annotations

import math
import pathlib
from typing import Any, Optional

import estimator_fit as fit
from dstoolkit.runtime.bench.report import render_markdown_table, save_figure
from published_runs_summary import FAR_OFF, GOAL_MAPE, GOAL_SPEARMAN_EFF


def _f(x: Optional[float], fmt: str = "{:.1f}") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def _layout(r: dict[str, Any]) -> str:
    lay = r["layout"]
    parts = [f"tp{lay['tp']}", f"pp{lay['pp']}"]
    if lay.get("vpp"):
        parts.append(f"vpp{lay['vpp']}")
    if (lay.get("cp") or 1) > 1:
        parts.append(f"cp{lay['cp']}")
    if (lay.get("ep") or 1) > 1:
        parts.append(f"ep{lay['ep']}")
    if lay.get("sp"):
        parts.append("sp")
    parts.append(f"z{lay['zero_stage']}")
    return " ".join(parts)


def _mem(r: dict[str, Any]) -> str:
    if r.get("memory_per_rank_gib") is None:
        return "–"
    return f"{r['memory_per_rank_gib']:.0f}/{r['gpu_memory_gib']:.0f}" + ("" if r.get("fits") else " **no fit**")


def render_md(rows: list[dict[str, Any]], summary: dict[str, Any], env: dict[str, Any], sources: dict[str, Any],
              png_name: Optional[str] = None, table: str = "benchmarks/data/published_runs.yaml",
              specs_dir: str = "benchmarks/specs/published", held_out: bool = False) -> str:
    s = summary
    lines = [
        "# Held-out published runs vs the estimator" if held_out else "# Published training runs vs the estimator",
        "",
        f"`benchmarks/published_runs.py` over `{table}`: {s['runs']} measured runs from "
        f"{s['sources']} sources, each a spec (`{specs_dir}/`) estimated with `dstoolkit estimate --format json`. "
        "Predicted tokens/s/GPU = tokens per step ÷ step time ÷ GPUs; error = predicted ÷ published − 1. Efficiency = "
        "tokens/s/GPU × the estimator's model FLOPs per token ÷ the GPU's bf16 peak, for both sides. Layouts are the "
        "closest the spec can express; rows flagged *inexpressible* say what was lost."
        + (" **Held out:** no constant was ever fitted on these rows (benchmarks/estimator_fit.py reads "
           "benchmarks/data/published_runs.yaml alone), so every figure here is out of sample." if held_out else ""),
        "",
        f"_Estimator at commit {str(env.get('git_commit'))[:12]}, {env.get('timestamp_utc')}; python {env.get('python')}._",
        "",
        "## Summary",
        "",
    ]
    if png_name:
        lines += [f"![predicted vs published]({png_name})", ""]
    lines += render_markdown_table([
        ["throughput MAPE (all estimated runs)", _pct(s["mape"]).lstrip("+"), f"goal ≤ {100 * GOAL_MAPE:.0f}%"],
        ["median absolute error", _pct(s["median_abs_error"]).lstrip("+"), ""],
        ["MAPE, runs predicted to fit", _pct(s["mape_fitting_only"]).lstrip("+"), ""],
        [f"MAPE, fully expressible runs ({s['fully_expressible']})", _pct(s["mape_fully_expressible"]).lstrip("+"), ""],
        ["runs within ±15%", f"{s['within_15pct']} / {s['estimated']}", ""],
        ["Spearman, tokens/s/GPU", _f(s["spearman_tokens_per_s"], "{:.3f}"), ""],
        ["Spearman, efficiency (bf16-peak MFU)", _f(s["spearman_efficiency"], "{:.3f}"), f"goal ≥ {GOAL_SPEARMAN_EFF}"],
        ["layouts predicted not to fit (false OOMs)", f"{len(s['not_fitting'])} / {s['estimated']}", "goal 0"],
        ["estimator failed", str(len(s["failed"])), ""],
    ] + [[f"{label}: MAPE / median abs error / Spearman tok/s / Spearman eff / false OOMs",
          f"{_pct(part['mape']).lstrip('+')} / {_pct(part['median_abs_error']).lstrip('+')} / "
          f"{_f(part['spearman_tokens_per_s'], '{:.3f}')} / {_f(part['spearman_efficiency'], '{:.3f}')} / "
          f"{part['false_ooms']}", f"{part['runs']} runs"]
         for label, part in (("training rows (i % 3 != 2)", (s.get("split") or {}).get("train")),
                             ("held-out rows (i % 3 == 2)", (s.get("split") or {}).get("held_out"))) if part]
      + ([[f"MAPE / Spearman eff, the {s['new_layouts']['runs']} rows whose layout no fitted row has",
           f"{_pct(s['new_layouts']['mape']).lstrip('+')} / {_f(s['new_layouts']['spearman_efficiency'], '{:.3f}')}",
           f"the other {len(s['repeats'])} repeat a published_runs.yaml row's model, GPUs and layout from another "
           "container (`repeats`)"]] if s.get("new_layouts") else []),
        ["figure", ("value", "r"), "note"])
    if s.get("loso"):
        lines += [""] + fit.render_loso_md(s["loso"], "Leave one source out (every fitted constant refitted without it)")
        lines += fit.render_ablation_md(s["loso"].get("ablation") or {})
        lines += ["", "Shipped constants: " + fit.fmt_point(s["loso"]["shipped"]) + "."]
    lines += ["", "## Runs", ""]
    lines += render_markdown_table(
        ([r["id"], r["model"], f"{r['gpus']}× {r['gpu']}", _layout(r), f"{r['micro_batch']}/{r['global_batch']}",
          r["seq_len"], r["precision"], r["recompute"], _f(r["published_tokens_per_s_per_gpu"]),
          _f(r.get("predicted_tokens_per_s_per_gpu")), _pct(r.get("error")),
          _f(r.get("published_efficiency"), "{:.3f}"), _f(r.get("predicted_efficiency"), "{:.3f}"), _mem(r),
          "yes" if r["inexpressible"] else ""] for r in rows),
        ["run", "model", "GPUs", "layout", "mb/gbs", ("seq", "r"), "prec", "recompute",
         ("published tok/s/GPU", "r"), ("predicted", "r"), ("error", "r"), ("eff pub", "r"), ("eff pred", "r"),
         ("mem GiB/cap", "r"), "inexpressible"])
    lines += ["", "## Predicted not to fit", ""]
    nf = [r for r in rows if r.get("fits") is False]
    if nf:
        lines += [f"- `{r['id']}`: {r['memory_per_rank_gib']:.1f} GiB per rank predicted, {r['gpu_memory_gib']:.0f} GiB GPU "
                  f"(the source ran it)" for r in nf]
    else:
        lines.append("None.")
    if s["failed"]:
        lines += ["", "## Estimator refused", ""] + [f"- `{f['id']}`: {f['error']}" for f in s["failed"]]
    if s["layout_changed"]:
        lines += ["", "## Estimator changed the given layout", ""]
        lines += [f"- `{r['id']}`: {', '.join(r['layout_changed'])}" for r in rows if r.get("layout_changed")]
    lines += ["", "## Ten worst runs", ""]
    by_id = {r["id"]: r for r in rows}
    lines += render_markdown_table(
        ([i, _pct(by_id[i]["error"]), _breakdown(by_id[i]), "; ".join(by_id[i]["inexpressible"]) or "–"]
         for i in s["worst"]),
        ["run", ("error", "r"), "estimated step (compute / exposed comm / bubble-free total s)", "inexpressible"])
    far = [r for r in rows if r.get("error") is not None and abs(r["error"]) > FAR_OFF]
    lines += ["", f"## Runs more than {100 * FAR_OFF:.0f}% off ({len(far)})", ""]
    lines += [f"- `{r['id']}`" + ("" if held_out else f" ({'held out' if r.get('held_out') else 'training'})")
              + f": {_pct(r['error'])}; "
              + ("; ".join(r["inexpressible"]) if r["inexpressible"] else "layout fully expressible")
              for r in sorted(far, key=lambda r: -abs(r["error"]))] or ["None."]
    lines += ["", "## Flags per run", ""]
    for r in rows:
        if r["assumed"] or r["inexpressible"]:
            lines.append(f"- `{r['id']}`: " + "; ".join([f"assumed: {a}" for a in r["assumed"]] +
                                                         [f"inexpressible: {x}" for x in r["inexpressible"]]))
    lines += ["", "## Sources", ""]
    for key, src in sources.items():
        n = sum(1 for r in rows if r["source"] == key)
        lines.append(f"- **{key}** ({n} runs, {src['publisher']}): {src['title']}, <{src['url']}>, {src['where']}. "
                     f"Conversion: {src['flop_formula']} Provenance: {src['verification']}")
    return "\n".join(lines) + "\n"


def _breakdown(r: dict[str, Any]) -> str:
    b = r.get("step_time_breakdown_s") or {}
    if not b:
        return "–"
    return (f"{_f(b.get('compute_s'), '{:.2f}')} / {_f(b.get('comm_exposed_s'), '{:.2f}')} / "
            f"{_f(b.get('total_s'), '{:.2f}')}")


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> Optional[pathlib.Path]:
    ok = [r for r in rows if r.get("predicted_tokens_per_s_per_gpu")]
    if not ok:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 7))
    sources = sorted({r["source"] for r in ok})
    cmap = plt.get_cmap("tab10")
    for i, src in enumerate(sources):
        for fits, marker in ((True, "o"), (False, "x")):
            sel = [r for r in ok if r["source"] == src and bool(r.get("fits")) is fits]
            if sel:
                ax.scatter([r["published_tokens_per_s_per_gpu"] for r in sel],
                           [r["predicted_tokens_per_s_per_gpu"] for r in sel], marker=marker, s=36,
                           color=cmap(i % 10), label=src + ("" if fits else " (predicted no fit)"))
    lo = min(min(r["published_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"]) for r in ok) / 1.5
    hi = max(max(r["published_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"]) for r in ok) * 1.5
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="predicted = published")
    ax.fill_between(xs, [x * (1 - FAR_OFF) for x in xs], [x * (1 + FAR_OFF) for x in xs], color="grey", alpha=0.2,
                    label="±15%")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published tokens/s per GPU")
    ax.set_ylabel("predicted tokens/s per GPU (dstoolkit estimate)")
    ax.set_title("Published training runs: predicted vs measured throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    out = save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def print_console(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    w = max(len(r["id"]) for r in rows)
    print(f"{'run':{w}s} {'published':>10s} {'predicted':>10s} {'error':>8s}  fits")
    for r in rows:
        print(f"{r['id']:{w}s} {_f(r['published_tokens_per_s_per_gpu']):>10s} {_f(r.get('predicted_tokens_per_s_per_gpu')):>10s} "
              f"{_pct(r.get('error')):>8s}  {'' if r.get('fits') is None else ('yes' if r['fits'] else 'NO')}"
              + (f"  [{r['estimate_error']}]" if r.get("estimate_error") else ""))
    print()
    print(f"runs {s['runs']} from {s['sources']} sources; estimated {s['estimated']}")
    print(f"MAPE {_pct(s['mape'])} (median |error| {_pct(s['median_abs_error'])}; fitting only {_pct(s['mape_fitting_only'])}; "
          f"fully expressible {_pct(s['mape_fully_expressible'])} over {s['fully_expressible']})")
    print(f"Spearman tokens/s {_f(s['spearman_tokens_per_s'], '{:.3f}')}, efficiency {_f(s['spearman_efficiency'], '{:.3f}')}")
    print(f"predicted not to fit ({len(s['not_fitting'])}): {', '.join(s['not_fitting']) or 'none'}")
    if s["failed"]:
        print(f"estimator refused ({len(s['failed'])}): " + "; ".join(f"{f['id']}: {f['error']}" for f in s["failed"]))
    for name, part in (s.get("split") or {}).items():
        print(f"{name}: {part['runs']} runs, MAPE {_pct(part['mape'])}, median {_pct(part['median_abs_error'])}, "
              f"Spearman tok/s {_f(part['spearman_tokens_per_s'], '{:.3f}')}, eff {_f(part['spearman_efficiency'], '{:.3f}')}, "
              f"false OOMs {part['false_ooms']}")
    print("worst 10: " + ", ".join(s["worst"]))
    lo = (s.get("loso") or {}).get("overall")
    if lo:
        print(f"leave one source out: MAPE in sample {_pct(lo['mape_in_sample'])} -> out of source "
              f"{_pct(lo['mape_out_of_source'])}; efficiency Spearman {_f(lo['spearman_eff_in_sample'], '{:.3f}')} -> "
              f"{_f(lo['spearman_eff_out_of_source'], '{:.3f}')}")
        for name, v in (s["loso"].get("ablation") or {}).items():
            print(f"  {name}: out-of-source MAPE free {_pct(v['mape_out_of_source_free'])}, pinned at "
                  f"{v['pinned_at']:g} {_pct(v['mape_out_of_source_pinned'])} -> "
                  f"{'helps' if v['helps_out_of_source'] else 'only in sample'}")
