"""Render benchmark JSON Lines results into markdown tables and matplotlib PNG plots.

Everything here is derived from the result files; nothing is measured. For each (bench, config hash, row key)
only the newest record is shown, so re-running a bench updates the report while the JSONL keeps the history.
`dstoolkit report`'s entry point, which reads and checks the records and the output paths, is `report_render`.
"""
from __future__ import annotations

import io
import json
import pathlib
from typing import Any, Iterable, Optional, Sequence

from dstoolkit.common.atomic import atomic_write_bytes, atomic_write_text
from dstoolkit.runtime.bench import stats
from dstoolkit.runtime.bench.report_env import by_env, env_groups, env_head, env_line


# --------------------------------------------------------------------------------------------------
# The one markdown reporter (dstoolkit report and every benchmarks/*.py script)
# --------------------------------------------------------------------------------------------------

_ALIGN = {"": "---", "l": "---", "left": "---", "r": "---:", "right": "---:", "c": ":---:", "center": ":---:"}


def render_markdown_table(rows: Iterable[Sequence[Any]], columns: Sequence[str | tuple[str, str]]) -> list[str]:
    """A GitHub markdown table as lines: header, separator, one line per row.

    Args:
        rows: cell values per row, in column order; None renders empty, anything else with str(). A row
            shorter than the header is padded with empty cells (a FAILED row with one message cell).
        columns: header texts, or (header, align) with align "l" / "r" / "c" (default left).
    """
    heads, seps = [], []
    for col in columns:
        head, align = (col, "") if isinstance(col, str) else col
        if align not in _ALIGN:
            raise ValueError(f"column {head!r}: align {align!r}, use one of l, r, c")
        heads.append(head)
        seps.append(_ALIGN[align])
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join(seps) + "|"]
    for row in rows:
        cells = ["" if c is None else str(c) for c in row]
        if len(cells) > len(heads):
            raise ValueError(f"row has {len(cells)} cells for {len(heads)} columns: {cells[:3]}...")
        cells += [""] * (len(heads) - len(cells))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_report(path: pathlib.Path | str, text: str | Sequence[str]) -> pathlib.Path:
    """Write a markdown report atomically (dstoolkit.common.atomic); lines are joined with newlines and
    the file ends with exactly one. Returns the path."""
    if not isinstance(text, str):
        text = "\n".join(text)
    return atomic_write_text(path, text.rstrip("\n") + "\n")


def write_json(path: pathlib.Path | str, doc: Any, indent: int = 1) -> pathlib.Path:
    """Write a JSON result atomically (``default=str`` for paths, dates and numpy scalars)."""
    return atomic_write_text(path, json.dumps(doc, indent=indent, default=str))


def env_brief(env: dict[str, Any]) -> str:
    """'DeepSpeed X, torch Y, commit Z, <UTC time>' from `harness.capture_env` (or the older per-script
    environments in committed results, which named the time ``date``)."""
    when = env.get("timestamp_utc") or env.get("date")
    return f"DeepSpeed {env.get('deepspeed')}, torch {env.get('torch')}, commit {env.get('git_commit')}, {when}"


def _latest(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest record per (bench, row key, backend, world size, dtype), in first-seen order.

    A rerun of the same measurement (even with other repetition counts) supersedes the older row in the
    report; the JSONL files keep every run.
    """
    latest: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r.get("event") is not None or "bench" not in r or "key" not in r:
            continue
        env = r.get("env") or {}
        ident = (r["bench"], r["key"], r.get("backend") or env.get("backend"),
                 r.get("world_size") or env.get("world_size"), r.get("type"))
        latest.pop(ident, None)  # re-insert: newest position
        latest[ident] = r
    return list(latest.values())


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if x != x:  # NaN
            return "–"
        if abs(x) >= 1e5 or (abs(x) < 1e-3 and x != 0):
            return f"{x:.3g}"
        return f"{x:.{digits}f}"
    return str(x)


def _oc(v: Optional[bool]) -> str:
    return "n/a" if v is None else ("on" if v else "off")


def _median(xs: Sequence[float]) -> Optional[float]:
    return stats.summarize(xs).median if xs else None


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:+.1f}%"


def _gib(x: Optional[float]) -> str:
    return "–" if x is None else f"{x / 2**30:.2f}"


def _human_size(n: int) -> str:
    for unit, div in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


def _comm_section(recs: list[dict[str, Any]], out_dir: pathlib.Path, plots: list[pathlib.Path], prefix: str) -> list[str]:
    lines = ["## Collectives (`dstoolkit bench comm`)", "",
             "nccl-tests convention: algbw = size / time, busbw = algbw × factor (all-reduce 2(n−1)/n; all-gather, "
             "reduce-scatter, all-to-all (n−1)/n; broadcast 1). GB/s = 10⁹ B/s. time = median over repetitions of "
             "the slowest rank; spread = busbw p10–p90.", ""]
    groups = _comm_groups(recs)
    for (backend, world, typ), rows in groups:
        lines.append(f"### {backend}, {world} ranks, {typ}{_comm_env_suffix(groups, (backend, world, typ), rows)}")
        lines.append(env_line(rows))
        lines.append("")
        lines += render_markdown_table(
            ([r["op"], _human_size(r["size"]), r["count"], _fmt(r["time_us"], 1), _fmt(r["algbw"]), _fmt(r["busbw"]),
              f"{_fmt((r.get('busbw_stats') or {}).get('p10'))}–{_fmt((r.get('busbw_stats') or {}).get('p90'))}",
              r["#wrong"]] for r in sorted(rows, key=lambda r: (r["op"], r["size"]))),
            ["op"] + [(c, "r") for c in ("size", "count", "time_us", "algbw GB/s", "busbw GB/s", "busbw p10–p90",
                                         "#wrong")])
        lines.append("")
    plot = _plot_comm(groups, out_dir, prefix)
    if plot:
        plots.append(plot)
        lines += [f"![busbw vs size]({plot.name})", ""]
    return lines


def _comm_groups(recs: list[dict[str, Any]]) -> list[tuple[tuple, list[dict[str, Any]]]]:
    """((backend, world size, dtype), rows) per table: rows of one such triple measured in several environments
    (`report_env.env_groups`) get one table each, so an env line never covers another run's rows."""
    by_triple: dict[tuple, list[dict[str, Any]]] = {}
    for r in recs:
        by_triple.setdefault((r.get("backend"), r.get("world_size"), r.get("type")), []).append(r)
    return [(triple, rows) for triple, all_rows in by_triple.items() for rows in env_groups(all_rows)]


def _comm_env_suffix(groups: list[tuple[tuple, list[dict[str, Any]]]], triple: tuple,
                     rows: list[dict[str, Any]]) -> str:
    """', commit X, measured D' where the (backend, world size, dtype) has tables from several environments."""
    return f", {env_head(rows)}" if sum(t == triple for t, _ in groups) > 1 else ""


def _comm_overhead_section(recs: list[dict[str, Any]]) -> list[str]:
    if not recs:
        return []
    lines = ["## Harness overhead (`benchmarks/comm_overhead.py`)", "",
             "busbw from the `bench comm` harness against a bare `torch.distributed` timing loop on the same sizes, "
             "interleaved in the same ranks.", ""]
    return lines + by_env(recs, _comm_overhead_table)


def _comm_overhead_table(recs: list[dict[str, Any]]) -> list[str]:
    return render_markdown_table(
        ([r.get("op"), _human_size(r["size"]), _fmt(r.get("harness_busbw")), _fmt(r.get("bare_busbw")),
          _pct(r.get("rel_diff"))] for r in sorted(recs, key=lambda r: (r.get("op", ""), r.get("size", 0)))),
        ["op"] + [(c, "r") for c in ("size", "harness busbw", "bare busbw", "harness / bare − 1")]) + [""]


def _plotted_section(head: list[str], recs: list[dict[str, Any]], table, plot_fn, alt: str, out_dir: pathlib.Path,
                     plots: list[pathlib.Path], prefix: str) -> list[str]:
    """A section: its heading lines, one table per environment (`by_env`), then its plot when one was drawn."""
    lines = head + by_env(recs, table)
    plot = plot_fn(recs, out_dir, prefix)
    if plot:
        plots.append(plot)
        lines += [f"![{alt}]({plot.name})", ""]
    return lines


def _overlap_section(recs: list[dict[str, Any]], out_dir: pathlib.Path, plots: list[pathlib.Path], prefix: str) -> list[str]:
    head = ["## Compute/communication overlap (`dstoolkit bench overlap`)", "",
            "η = 1 − exposed / total communication. **η (timing)**: exposed = overlapped step − compute-only step "
            "(N concurrent single-rank engines), total = the step's collectives replayed alone; clamped to [0, 1]. "
            "**η (trace)**: from a torch-profiler trace of the real step, the part of the communication spans that no "
            "compute span covers, over the communication spans (one measurement, so immune to load drift between "
            "phases). Compute slowdown = overlapped × (1 − exposed fraction of the traced step) ÷ compute-only − 1. Times are medians (s).",
            ""]
    return _plotted_section(head, recs, _overlap_table, _plot_overlap, "eta per config", out_dir, plots, prefix)


def _overlap_table(recs: list[dict[str, Any]]) -> list[str]:
    """One environment's overlap rows and their median η per overlap_comm setting."""
    lines = render_markdown_table(
        ([r.get("config_name"), r.get("zero_stage"), _oc(r.get("overlap_comm")), _fmt(r.get("reduce_bucket_size")),
          _fmt(r["compute_s"]["median"], 4), _fmt(r["comm_s"]["median"], 4), _fmt(r["overlapped_s"]["median"], 4),
          _fmt(r.get("exposed_comm_s"), 4), _fmt(r.get("eta")), _fmt(r.get("eta_profiler")),
          _pct(r.get("compute_slowdown"))] for r in recs),
        ["config", ("ZeRO", "r"), "overlap_comm"] + [(c, "r") for c in (
            "reduce bucket", "compute-only", "comm-only", "overlapped", "exposed", "η (timing)", "η (trace)",
            "slowdown")])
    for label, flag in (("on", True), ("off", False)):
        sel = [r for r in recs if r.get("overlap_comm") is flag]
        if sel:
            t = [r["eta"] for r in sel if r.get("eta") is not None]
            p = [r["eta_profiler"] for r in sel if r.get("eta_profiler") is not None]
            lines.append("")
            lines.append(f"overlap_comm {label}: median η (timing) {_fmt(_median(t))}, median η (trace) {_fmt(_median(p))} "
                         f"over {len(sel)} variants.")
    return lines + [""]


def _train_section(recs: list[dict[str, Any]], out_dir: pathlib.Path, plots: list[pathlib.Path], prefix: str) -> list[str]:
    head = ["## Training throughput (`dstoolkit bench train`)", "",
            "Measured over the timed steps (warm-up steps excluded) through the `deepspeed` launcher; the estimate "
            "from `dstoolkit.estimate` beside it; error = estimate ÷ measured − 1.", ""]
    return _plotted_section(head, recs, _train_table, _plot_train, "predicted vs measured step time", out_dir, plots,
                            prefix)


def _train_table(recs: list[dict[str, Any]]) -> list[str]:
    """One environment's training rows and their step-time error summary (one estimator version per summary)."""
    rows = []
    for r in recs:
        m, e, err = r.get("measured", {}), r.get("estimate") or {}, r.get("error") or {}
        rows.append([
            r.get("config_name"), m.get("timed_steps"), f"{_fmt(m.get('tokens_per_s'), 1)} ({_fmt(e.get('tokens_per_s'), 1)})",
            _pct(err.get("tokens_per_s")), f"{_fmt(m.get('step_time_s_median'), 4)} ({_fmt(e.get('step_time_s'), 4)})",
            _pct(err.get("step_time_s")), _fmt(m.get("step_time_s_p90"), 4),
            f"{_gib(m.get('peak_memory_bytes'))} ({_gib(e.get('memory_per_rank_bytes'))})", _pct(err.get("memory_bytes")),
            f"{_fmt(m.get('mfu'), 4)} ({_fmt(e.get('mfu'), 4)})", f"{_fmt(m.get('loss_first'))}→{_fmt(m.get('loss_last'))}"])
    lines = render_markdown_table(rows, ["config"] + [(c, "r") for c in (
        "steps", "tokens/s (est)", "err", "step median s (est)", "err", "step p90 s", "peak mem GiB (est)", "err",
        "MFU (est)")] + ["loss first→last"])
    errs = [abs(r["error"]["step_time_s"]) for r in recs if (r.get("error") or {}).get("step_time_s") is not None]
    if errs:
        worst = max(recs, key=lambda r: abs((r.get("error") or {}).get("step_time_s") or 0))
        lines += ["", f"Worst step-time error: {_pct(worst['error']['step_time_s'])} ({worst.get('config_name')}); "
                      f"mean absolute error {100 * sum(errs) / len(errs):.1f}% over {len(errs)} configs."]
    return lines + [""]


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # headless: files only
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: pathlib.Path | str, *, dpi: int = 110, **savefig_kw: Any) -> pathlib.Path:
    """Render a matplotlib figure to PNG and write it atomically (dstoolkit.common.atomic): a reader never
    sees half a plot. The one figure writer for `dstoolkit report` and benchmarks/*.py."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, **savefig_kw)
    return atomic_write_bytes(path, buf.getvalue())


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    return save_figure(fig, path, dpi=110, bbox_inches="tight")


def _plot_comm(groups: list[tuple[tuple, list[dict[str, Any]]]], out_dir: pathlib.Path, prefix: str) -> Optional[pathlib.Path]:
    if not groups:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (backend, world, typ), rows in groups:
        env = _comm_env_suffix(groups, (backend, world, typ), rows)
        for op in sorted({r["op"] for r in rows}):
            pts = sorted((r["size"], r["busbw"], (r.get("busbw_stats") or {})) for r in rows if r["op"] == op)
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            line, = ax.plot(xs, ys, marker="o", ms=3, label=f"{op} ({backend}, n={world}{env})")
            lo = [p[2].get("p10", p[1]) for p in pts]
            hi = [p[2].get("p90", p[1]) for p in pts]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s, nccl-tests convention)")
    ax.set_title("Collective bus bandwidth vs size (median, p10–p90 band)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    path = _save(fig, out_dir / f"{prefix}_comm_busbw.png")
    plt.close(fig)
    return path


def _plot_overlap(recs: list[dict[str, Any]], out_dir: pathlib.Path, prefix: str) -> Optional[pathlib.Path]:
    if not recs:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(recs) + 2), 4))
    labels = [f"{r.get('config_name')}\noc={_oc(r.get('overlap_comm'))} b={_fmt(r.get('reduce_bucket_size'))}"
              for r in recs]
    etas = [r.get("eta") or 0.0 for r in recs]
    etas_p = [r.get("eta_profiler") if r.get("eta_profiler") is not None else float("nan") for r in recs]
    colors = ["tab:blue" if r.get("overlap_comm") else "tab:gray" for r in recs]
    xs = list(range(len(recs)))
    ax.bar([x - 0.2 for x in xs], etas, width=0.4, color=colors, label="η (timing)")
    ax.bar([x + 0.2 for x in xs], etas_p, width=0.4, color=colors, alpha=0.45, hatch="//", label="η (trace)")
    ax.legend(fontsize=7)
    ax.set_xticks(range(len(recs)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=6)
    ax.set_ylim(0, 1)
    ax.set_ylabel("η = 1 − exposed/total comm")
    ax.set_title("Overlap efficiency per config (blue: overlap_comm on)")
    ax.grid(True, axis="y", alpha=0.3)
    path = _save(fig, out_dir / f"{prefix}_overlap_eta.png")
    plt.close(fig)
    return path


def _plot_train(recs: list[dict[str, Any]], out_dir: pathlib.Path, prefix: str) -> Optional[pathlib.Path]:
    pts = [(r["estimate"]["step_time_s"], r["measured"]["step_time_s_median"], r.get("config_name"))
           for r in recs if (r.get("estimate") or {}).get("step_time_s") and (r.get("measured") or {}).get("step_time_s_median")]
    if not pts:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    ax.scatter(xs, ys)
    for x, y, name in pts:
        ax.annotate(str(name), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.2
    ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="predicted = measured")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured step time, median (s)")
    ax.set_title("Step time: estimate vs measurement")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)
    path = _save(fig, out_dir / f"{prefix}_train_step_time.png")
    plt.close(fig)
    return path
