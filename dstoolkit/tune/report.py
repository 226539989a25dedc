"""Outputs of a tuning study: the best config (validated), a report of every trial (markdown + JSON), a plot.

Files are written atomically (dstoolkit.common.atomic: temporary file, fsync, rename) into the study's output folder; they are derived
from the study database and rewritten when a study is resumed. Each is listed in the folder's manifest
(`dstoolkit.tune.manifest`) as it is written, so --force and a resume replace it only while it is as tune wrote it.
"""
from __future__ import annotations

import io
import json
import pathlib
from typing import Any, Optional

import yaml

from dstoolkit.common.atomic import atomic_write_bytes, atomic_write_text
from dstoolkit.tune.manifest import Manifest
from dstoolkit.tune.space import TunePoint, TuneSpace, trial_spec_dict

GiB = 2**30


def _fmt_value(objective: str, v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} tok/s" if objective == "throughput" else f"{v / GiB:.3f} GiB"


def render_markdown(result, space: TuneSpace, opts, findings: list[str]) -> str:
    """The markdown report: settings, best, then one row per trial."""
    obj = opts.objective
    lines = [f"# dstoolkit tune: {space.spec.name} ({opts.mode} mode, objective {obj})", ""]
    lines += [f"- spec: `{opts.spec_path}`; seed {opts.seed}; budget {opts.budget} evaluated trials"
              f" ({result.evaluated} evaluated, {len(result.trials)} trials in all incl. pruned/duplicates)",
              f"- stopped: {result.stop_reason}; resumed: {'yes' if result.resumed else 'no'}",
              f"- space: {result.space_size} points; dimensions: "
              + ", ".join(f"{k} {list(map(str, v))}" for k, v in space.dimensions().items())]
    for k, why in space.fixed_reasons.items():
        lines.append(f"- {k} fixed: {why}")
    shrunk = getattr(space, "shrunk", None)
    if shrunk is not None:
        sizes = ", ".join(f"{k} {v}" for k, v in shrunk.shrunk.sizes().items() if v is not None)
        lines.append(f"- model: the spec's own {shrunk.shrunk.model_type} architecture (transformers), shrunk "
                     f"(--shrink {opts.shrink}): {sizes}; seq_len {shrunk.seq_len}; estimates are the shrunk model's")
    if opts.mode == "real":
        lines.append(f"- real trials: {opts.steps} optimizer steps ({opts.skip_steps} warm-up steps not timed), "
                     f"{opts.launcher} launcher, median step time; objective "
                     + ("global tokens/s" if obj == "throughput" else "rank-0 peak memory (RSS on CPU)"))
    else:
        lines.append("- estimate mode: the objective is the estimate (`dstoolkit.estimate`), nothing was run")
    lines.append("")
    b = result.best
    if b:
        lines += [f"## Best: trial #{b['number']}: {b['label']}", "",
                  f"- objective: {_fmt_value(obj, b['value'])}"]
        e = b.get("estimate") or {}
        if e:
            lines.append(f"- estimate: {e.get('tokens_per_s', 0):,.0f} tok/s, {e.get('step_time_s', 0):.4g} s/step, "
                         f"{e.get('memory_per_rank_bytes', 0) / GiB:.3f} GiB per rank")
        lines += [f"- {n}" for n in getattr(result, "notes", [])]
        lines.append("- config: `best_ds_config.json` (validate_config and the memory estimate: "
                     + ("no findings" if not findings else f"{len(findings)} non-error finding(s): "
                        + "; ".join(findings[:5])) + "), spec copy `best_spec.yaml`")
    else:
        lines += ["## No trial succeeded", "", "Every trial was pruned or failed; see the reasons below."]
    lines += ["", "## Trials", "",
              "| # | status | config | objective | estimate | best so far | note |",
              "|---|---|---|---|---|---|---|"]
    best_so_far: Optional[float] = None
    maximize = obj == "throughput"
    for r in result.trials:
        v = r["value"] if r["state"] == "COMPLETE" else None
        if v is not None:
            best_so_far = v if best_so_far is None else (max(best_so_far, v) if maximize else min(best_so_far, v))
        e = r.get("estimate") or {}
        est = "-"
        if e:
            est = (f"{e.get('tokens_per_s', 0):,.0f} tok/s" if maximize else
                   f"{e.get('memory_per_rank_bytes', 0) / GiB:.3f} GiB")
        note = r.get("reason") or ""
        if r.get("seeded_by"):
            note = f"seeded ({r['seeded_by']})" + (f"; {note}" if note else "")
        note = note.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r['number']} | {r.get('status') or r['state'].lower()} | {r.get('label') or '-'} | "
                     f"{_fmt_value(obj, v)} | {est} | {_fmt_value(obj, best_so_far)} | {note} |")
    return "\n".join(lines) + "\n"


def render_plot(result, opts, path: pathlib.Path) -> None:
    """Objective against trial number: evaluated points, failures and pruned trials, and the best so far."""
    # optional extra (plots): loaded only when a plot is drawn
    import matplotlib

    matplotlib.use("Agg")
    # optional extra (plots): loaded only when a plot is drawn
    import matplotlib.pyplot as plt

    maximize = opts.objective == "throughput"
    scale = 1.0 if maximize else 1.0 / GiB
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs, ys, bx, by = [], [], [], []
    best = None
    for r in result.trials:
        if r["state"] == "COMPLETE" and r["value"] is not None:
            v = r["value"] * scale
            if r["duplicate_of"] is None:
                xs.append(r["number"])
                ys.append(v)
            best = v if best is None else (max(best, v) if maximize else min(best, v))
        if best is not None:
            bx.append(r["number"])
            by.append(best)
    ax.plot(xs, ys, "o", color="tab:blue", label="evaluated")
    if bx:
        ax.step(bx, by, where="post", color="tab:green", label="best so far")
    fails = [r["number"] for r in result.trials if r["state"] == "FAIL" and r.get("status") != "interrupted"]
    stopped = [r["number"] for r in result.trials if r.get("status") == "interrupted"]
    pruned = [r["number"] for r in result.trials if r["state"] == "PRUNED"]
    lo = min(ys) if ys else 0.0
    if fails:
        ax.plot(fails, [lo] * len(fails), "x", color="tab:red", label="failed (OOM/error/timeout)")
    if stopped:
        ax.plot(stopped, [lo] * len(stopped), "s", mfc="none", color="tab:orange", label="interrupted (retried)")
    if pruned:
        ax.plot(pruned, [lo] * len(pruned), "|", color="tab:gray", label="pruned before running")
    ax.set_xlabel("trial")
    ax.set_ylabel("tokens/s (higher is better)" if maximize else "GiB per rank (lower is better)")
    ax.set_title(f"dstoolkit tune: {opts.objective}, {opts.mode} mode, seed {opts.seed}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_outputs(result, space: TuneSpace, opts) -> list[str]:
    """Write best_ds_config.json (validated), best_spec.yaml, report.md, report.json and the plot, each listed in the
    folder's manifest once written.

    Returns:
        The names of the files written.
    """
    out = pathlib.Path(opts.out_dir)
    manifest = Manifest(out)
    written: list[str] = []

    def wrote(name: str) -> None:
        written.append(name)
        manifest.record([name])

    findings: list[str] = []
    best_cfg: Optional[dict] = None
    if result.best is not None:
        point = TunePoint.model_validate(result.best["point"])
        chk = space.check(point)
        if chk.pruned or chk.ds_config is None:  # cannot happen for a point that ran; keep the invariant loud
            raise RuntimeError(f"internal: the best point {point.label} fails its checks: {chk.pruned_reason}")
        best_cfg = chk.ds_config
        findings = list(chk.warnings)
        atomic_write_text(out / "best_ds_config.json", json.dumps(best_cfg, indent=2) + "\n")
        wrote("best_ds_config.json")
        data = trial_spec_dict(space.spec, point)
        head = f"# {space.spec.name}: the spec with the best tuned layout fixed ({point.label}); written by dstoolkit tune\n"
        user_seq = getattr(space, "user_seq_len", None)
        if getattr(space, "shrunk", None) is not None and user_seq is not None:
            data["training"]["seq_len"] = user_seq  # the spec's own, not the shrunk run's
            head += (f"# the layout was measured on the model shrunk (--shrink {opts.shrink}) at seq_len "
                     f"{space.spec.training.seq_len}; this spec keeps the full model and your seq_len {user_seq}\n")
        spec_text = head + yaml.safe_dump(data, sort_keys=False)
        atomic_write_text(out / "best_spec.yaml", spec_text)
        wrote("best_spec.yaml")
    md = render_markdown(result, space, opts, findings)
    atomic_write_text(out / "report.md", md)
    wrote("report.md")
    doc: dict[str, Any] = {
        "spec": str(opts.spec_path), "objective": opts.objective, "mode": opts.mode, "seed": opts.seed,
        "budget": opts.budget, "evaluated": result.evaluated, "stop_reason": result.stop_reason,
        "resumed": result.resumed, "space_size": result.space_size,
        "space": {k: [v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for v in vs]
                  for k, vs in space.dimensions().items()},
        "best": result.best, "best_ds_config": best_cfg, "best_config_findings": findings,
        "trials": result.trials}
    atomic_write_text(out / "report.json", json.dumps(doc, indent=1, default=str) + "\n")
    wrote("report.json")
    render_plot(result, opts, out / "objective_vs_trial.png")
    wrote("objective_vs_trial.png")
    return written
