"""The arithmetic of `dstoolkit bench overlap` (pure; unit-tested): interval unions of a profiler trace, the
exposed communication, η = 1 − exposed / comm, the slowest of the concurrent compute-only engines, and the
record of one measured configuration (`Variant`) from its raw samples (definitions: the docstring of
`dstoolkit.runtime.bench.overlap`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import stats


@dataclasses.dataclass
class Variant:
    """One measured configuration."""

    key: str
    config_name: str
    ds_config: dict
    zero_stage: int
    overlap_comm: Optional[bool]
    """Effective overlap_comm (None at stage 0, which has no such switch)."""
    reduce_bucket_size: Optional[int]
    ep_size: int
    spec_path: Optional[str]
    opt_partitioned: bool
    """Whether each rank's optimizer step touches 1/N of the model (ZeRO >= 1, or DeepSpeed's bf16 optimizer)."""


def union_intervals(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping [start, end) intervals."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted((s, e) for s, e in intervals if e > s):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def covered_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length of the union of intervals."""
    return sum(e - s for s, e in union_intervals(intervals))


def exposed_length(comm: Sequence[tuple[float, float]], compute: Sequence[tuple[float, float]]) -> float:
    """Length of the communication union that no compute interval covers."""
    comm_u, comp_u = union_intervals(comm), union_intervals(compute)
    overlap = 0.0
    j = 0
    for s, e in comm_u:
        while j < len(comp_u) and comp_u[j][1] <= s:
            j += 1
        k = j
        while k < len(comp_u) and comp_u[k][0] < e:
            overlap += min(e, comp_u[k][1]) - max(s, comp_u[k][0])
            k += 1
    return covered_length(comm_u) - overlap


def eta_from(exposed_s: float, comm_s: float) -> tuple[float, float]:
    """(clamped, raw) η = 1 − exposed/comm; comm_s <= 0 gives η = 1 (nothing to hide)."""
    if comm_s <= 0:
        return 1.0, 1.0
    raw = 1.0 - exposed_s / comm_s
    return min(1.0, max(0.0, raw)), raw


def merge_compute_only(per_engine: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per variant, the slowest of the N concurrent single-rank engines at each step (pure; unit-tested)."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for recs in per_engine:
        for r in recs:
            by_key.setdefault(r["key"], []).append(r)
    out = {}
    for key, recs in by_key.items():
        if len(recs) != len(per_engine):
            continue  # an engine is missing this variant: no result
        fb = [list(r["compute_fb_samples_s"]) for r in recs]
        op = [list(r["compute_opt_samples_s"]) for r in recs]
        n = min(len(x) for x in fb)
        slowest = [max(range(len(recs)), key=lambda j: fb[j][i] + op[j][i]) for i in range(n)]
        out[key] = {"key": key, "compute_fb_samples_s": [fb[j][i] for i, j in enumerate(slowest)],
                    "compute_opt_samples_s": [op[j][i] for i, j in enumerate(slowest)],
                    "engines": len(recs), "loss": recs[0].get("loss")}
    return out


def combine(v: Variant, world: int, multi: dict[str, Any], single: dict[str, Any]) -> dict[str, Any]:
    """Turn raw samples of one variant into the overlap record (see module docstring for the definitions)."""
    scale = 1.0 / world if v.opt_partitioned else 1.0
    compute = [fb + op * scale for fb, op in zip(single["compute_fb_samples_s"], single["compute_opt_samples_s"])]
    c_stats = stats.summarize(compute)
    o_stats = stats.summarize(multi["overlapped_samples_s"])
    m_stats = stats.summarize(multi["comm_samples_s"])
    exposed = max(0.0, o_stats.median - c_stats.median)
    eta, eta_raw = eta_from(exposed, m_stats.median)
    rec: dict[str, Any] = {
        "config_name": v.config_name, "zero_stage": v.zero_stage, "overlap_comm": v.overlap_comm,
        "reduce_bucket_size": v.reduce_bucket_size, "ep_size": v.ep_size, "world_size": world,
        "micro_batch": v.ds_config["train_micro_batch_size_per_gpu"],
        "compute_s": c_stats.to_dict(), "comm_s": m_stats.to_dict(), "overlapped_s": o_stats.to_dict(),
        "exposed_comm_s": exposed, "eta": eta, "eta_raw": eta_raw,
        "compute_fb_s": stats.summarize(single["compute_fb_samples_s"]).median,
        "compute_opt_full_s": stats.summarize(single["compute_opt_samples_s"]).median,
        "opt_scale": scale,
        "comm_calls": multi.get("comm_calls", []),
        "comm_bytes_per_step": sum(c["bytes"] * c["count"] for c in multi.get("comm_calls", [])),
        "samples": {"overlapped_s": multi["overlapped_samples_s"], "comm_s": multi["comm_samples_s"], "compute_s": compute},
        "loss_last": multi.get("loss"),
        "compute_slowdown": None, "eta_profiler": None,
        "ds_config": v.ds_config,
    }
    prof = multi.get("profile")
    if prof:
        exp_p = sorted(p["exposed_s"] for p in prof)[len(prof) // 2]
        union_p = sorted(p["comm_union_s"] for p in prof)[len(prof) // 2]
        rec["profiler"] = {"steps": prof, "exposed_s": exp_p, "comm_union_s": union_p}
        rec["eta_profiler"] = eta_from(exp_p, union_p)[0] if union_p > 0 else None
        # The profiler slows the traced steps, so carry over the exposed *fraction* of the traced step, not its
        # seconds: compute inside the overlapped step = overlapped x (1 - exposed/step) from the trace.
        frac = sorted(p["exposed_s"] / p["step_s"] for p in prof if p["step_s"] > 0)
        f = frac[len(frac) // 2] if frac else 0.0
        rec["profiler"]["exposed_fraction"] = f
        rec["compute_slowdown"] = o_stats.median * (1.0 - f) / c_stats.median - 1.0 if c_stats.median > 0 else None
    return rec
