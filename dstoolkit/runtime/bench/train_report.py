"""Measured figures of a training run and the bench train table: the trainer's or the hook's per-step lines
summarised (warm-up steps dropped, median and p90 step time, tokens/s, peak memory, the comm share), HF
Trainer's final log line as the fallback, the estimate's error, and the measured | estimate | error table.
Pure functions (no run is started here).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import stats

def summarize_metrics(rows: Sequence[dict[str, Any]], skip_steps: int, seq_len: int) -> dict[str, Any]:
    """Measured figures from the trainer's per-step JSON lines (pure; unit-tested).

    Raises:
        RuntimeError: fewer timed steps than 1.
    """
    steps = sorted((r for r in rows if r.get("event") is None and "step_time_s" in r), key=lambda r: r["step"])
    timed = steps[skip_steps:]
    if not timed:
        raise RuntimeError(f"the trainer reported {len(steps)} steps; need more than --skip-steps={skip_steps}")
    st = stats.summarize(r["step_time_s"] for r in timed)
    tokens_per_step = timed[-1]["global_batch"] * seq_len
    return {
        "steps": len(steps),
        "timed_steps": len(timed),
        "step_time_s_median": st.median,
        "step_time_s_p90": st.p90,
        "step_time_s_stats": st.to_dict(),
        "step_time_samples_s": [r["step_time_s"] for r in timed],
        "tokens_per_step": tokens_per_step,
        "tokens_per_s": tokens_per_step / st.median,
        "peak_memory_bytes": max(int(r.get("peak_rss_bytes") or 0) for r in steps) or None,
        "peak_memory_kind": "rank-0 peak RSS",
        "loss_first": steps[0].get("loss"),
        "loss_last": steps[-1].get("loss"),
        "global_batch": timed[-1].get("global_batch"),
        "micro_batch": timed[-1].get("micro_batch"),
        "grad_accum": timed[-1].get("grad_accum"),
        "comm_share": measured_comm_share(timed),
    }


def measured_comm_share(timed: Sequence[dict[str, Any]]) -> Optional[float]:
    """Rank 0's time blocked in collectives / step time over the timed steps (`comm_wait_s`, the trainer's and the
    hook's timed collectives: dstoolkit.runtime.train.commtime); None when a step lacks it."""
    waits = [r.get("comm_wait_s") for r in timed]
    total = sum(r["step_time_s"] for r in timed)
    if not timed or any(w is None for w in waits) or total <= 0:
        return None
    return sum(waits) / total


def rel_error(estimate: Optional[float], measured: Optional[float]) -> Optional[float]:
    """estimate / measured − 1 (None when either is missing or measured is 0)."""
    if estimate is None or measured is None or measured == 0:
        return None
    return float(estimate) / float(measured) - 1.0


def _p(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """Measured | estimate | error per config."""
    lines = ["# dstoolkit bench train: measured (estimate) error=estimate/measured-1; step times in s; memory: "
             "measured = rank-0 peak RSS, estimate = device bytes per rank",
             f"# {'config':<16} {'tok/s':>9} {'(est)':>9} {'err':>6} {'step med':>9} {'(est)':>9} {'err':>6} "
             f"{'p90':>7} {'mem GiB':>8} {'(est)':>7} {'MFU':>8} {'(est)':>8} {'loss':>13}"]
    for r in records:
        if r.get("status") != "ok":
            why = r.get("reason") or next(iter((r.get("error_tail") or "").strip().splitlines()[-1:]), "")
            lines.append(f"  {r.get('config_name'):<16} FAILED (exit {r.get('returncode')}): {why}")
            continue
        m, e, err = r["measured"], r.get("estimate") or {}, r.get("error") or {}

        def g(d, k, fmt):
            v = d.get(k)
            return fmt % v if isinstance(v, (int, float)) else "-"

        mem = (lambda v: f"{v / 2**30:.2f}" if v else "-")
        lines.append(
            f"  {r['config_name']:<16} {g(m, 'tokens_per_s', '%.0f'):>9} {g(e, 'tokens_per_s', '%.0f'):>9} "
            f"{_p(err.get('tokens_per_s')):>6} {g(m, 'step_time_s_median', '%.4f'):>9} {g(e, 'step_time_s', '%.4f'):>9} "
            f"{_p(err.get('step_time_s')):>6} {g(m, 'step_time_s_p90', '%.4f'):>7} {mem(m.get('peak_memory_bytes')):>8} "
            f"{mem(e.get('memory_per_rank_bytes')):>7} {g(m, 'mfu', '%.2e'):>8} {g(e, 'mfu', '%.2e'):>8} "
            f"{g(m, 'loss_first', '%.2f')}->{g(m, 'loss_last', '%.2f')}")
        if e.get("error"):
            lines.append(f"    estimate unavailable: {e['error']}")
        if r.get("estimate_assumed"):  # the user's "auto" values, made concrete for the estimate only
            lines.append("    the run got the config as given; the estimate assumed: "
                         + "; ".join(r["estimate_assumed"]))
        if m.get("comm_share") is not None:
            est_comm = f" (estimate {e['comm_share']:.0%})" if e.get("comm_share") is not None else ""
            lines.append(f"    comm: {m['comm_share']:.0%} of the step blocked in collectives, measured{est_comm}")
        ran, sh = r.get("model_ran") or {}, r.get("shrink")
        if sh:
            sizes = " ".join(f"{k}={v}" for k, v in (sh.get("shrunk_sizes") or {}).items() if v is not None)
            changes = "; ".join(f"{k} {a}->{b}" for k, (a, b) in (sh.get("config_changes") or {}).items())
            lines.append(f"    ran {ran.get('model_class') or sh.get('model_type')} ({(ran.get('params') or 0) / 1e6:.2f}M "
                         f"params) shrunk: {sizes} seq_len={sh.get('seq_len')}" + (f"; config: {changes}" if changes else ""))
    return "\n".join(lines)


def summarize_hook_rows(rows: Sequence[dict[str, Any]], skip_steps: int) -> dict[str, Any]:
    """Measured figures from the hook's per-step lines (pure).

    Raises:
        RuntimeError: no timed step.
    """
    steps = sorted((r for r in rows if r.get("event") is None and "step_time_s" in r), key=lambda r: r["step"])
    timed = steps[skip_steps:]
    if not timed:
        raise RuntimeError(f"the command completed {len(steps)} optimizer steps; need more than --skip-steps="
                           f"{skip_steps}")
    st = stats.summarize(r["step_time_s"] for r in timed)
    tokens = [r.get("tokens") or 0 for r in timed]
    tok_step = sorted(tokens)[len(tokens) // 2]
    samples = sorted(r.get("samples") or 0 for r in timed)[len(timed) // 2]
    peaks = [int(r["peak_memory_bytes"]) for r in steps if r.get("peak_memory_bytes")]
    return {
        "source": "deepspeed engine hook", "steps": len(steps), "timed_steps": len(timed),
        "step_time_s_median": st.median, "step_time_s_p90": st.p90, "step_time_s_stats": st.to_dict(),
        "step_time_samples_s": [r["step_time_s"] for r in timed],
        "tokens_per_step": tok_step or None, "tokens_per_s": (tok_step / st.median) if tok_step else None,
        "samples_per_s": (samples / st.median) if samples else None,
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_kind": "rank-0 peak RSS" if peaks and not _on_cuda() else "rank-0 torch.cuda.max_memory_allocated",
        "loss_first": steps[0].get("loss"), "loss_last": steps[-1].get("loss"),
        "global_batch": timed[-1].get("global_batch"), "micro_batch": timed[-1].get("micro_batch"),
        "grad_accum": timed[-1].get("grad_accum"), "comm_share": measured_comm_share(timed),
    }


def _on_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def hf_log_metrics(text: str, seq_len: Optional[int]) -> Optional[dict[str, Any]]:
    """Fallback: HF Trainer's final `{'train_runtime': ..., 'train_samples_per_second': ...}` line."""
    import re

    m = re.findall(r"'train_samples_per_second':\s*'?([0-9.eE+-]+)", text)
    if not m:
        return None
    sps = float(m[-1])
    loss = re.findall(r"'train_loss':\s*'?([0-9.eE+-]+)", text)
    return {"source": "HF Trainer log (no DeepSpeed engine step seen)", "samples_per_s": sps,
            "tokens_per_s": sps * seq_len if seq_len else None, "loss_last": float(loss[-1]) if loss else None,
            "peak_memory_bytes": None}
