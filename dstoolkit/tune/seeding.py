"""The estimator's ranking that seeds a study: how many top points are enqueued before TPE (`default_seed_trials`,
raised when the estimator ties several points within its measured error) and which (`estimator_ranking`).
"""
from __future__ import annotations

from typing import Optional

from dstoolkit.generate import run_sweep
from dstoolkit.generate.sweep_explain import simplicity_key, tie_ranked
from dstoolkit.tune.objective import direction
from dstoolkit.tune.space import PointCheck, TunePoint, TuneSpace, estimated_tokens_per_s


SEED_BAND_FRACTION = 0.05
"""Points estimated within this fraction of the best estimate are ties for the estimator: the calibrated
step-time model's measured error is about this size (MAPE 4.4-6.2%, benchmarks/results/step_time_fidelity_cpu_202611.md),
so only real trials can order them."""


MAX_SEED_TRIALS = 5


def default_seed_trials(budget: int, band_size: int = 1) -> int:
    """Trials taken from the estimator's ranking before TPE: about a third of the budget (1 to 5), raised to
    the number of points the estimator cannot tell apart from its best (`band_size`, see SEED_BAND_FRACTION),
    at most half the budget (rounded up) and at most 5."""
    base = max(1, min(MAX_SEED_TRIALS, round(budget / 3)))
    return max(base, min(band_size, -(-budget // 2), MAX_SEED_TRIALS))


def estimate_band_size(values: list[float], objective: str) -> int:
    """How many of the estimated objective values (any order) lie within SEED_BAND_FRACTION of the best one
    (higher is better for throughput, lower for memory)."""
    if not values:
        return 0
    if direction(objective) == "maximize":
        best = max(values)
        return sum(1 for v in values if v >= best * (1 - SEED_BAND_FRACTION))
    best = min(values)
    return sum(1 for v in values if v <= best * (1 + SEED_BAND_FRACTION))


def seed_band_size(head: list[PointCheck], objective: str, spec) -> int:
    """`estimate_band_size` over the estimator-ranked checks `head` (one per layout, best first) on #1's side of the
    memory headroom: the ranking puts the other side last, so a point there (however good its estimate) neither sets
    the band's best nor counts in it."""
    if not head:
        return 0
    side = [c for c in head if c.estimate.within_headroom == head[0].estimate.within_headroom]
    return estimate_band_size([abs(_rank_key(objective, c, spec)) for c in side], objective)


def _rank_key(objective: str, check: PointCheck, spec) -> float:
    est = check.estimate
    return -estimated_tokens_per_s(spec, est) if objective == "throughput" else float(est.memory_per_rank_bytes)


def _tie_figure(objective: str, check: PointCheck) -> float:
    """The figure ties are judged on: the estimated step time (throughput: as `sweep` ranks), or memory per rank."""
    est = check.estimate
    return est.step_time_s if objective == "throughput" else float(est.memory_per_rank_bytes)


def one_per_layout(pool: list[TunePoint], n: int) -> list[TunePoint]:
    """The first `n` distinct layouts (sweep labels) of an estimator-ranked pool, one point each, at the layout's
    default DeepSpeed settings (the generated bucket sizes, overlap_comm as generated: on for a GPU space) when that
    point is in the pool, else the layout's best-ranked point: the seeds measure the layouts `sweep` lists, not
    overlap / bucket variants of its first one."""
    by_label: dict[str, list[TunePoint]] = {}
    for p in pool:
        by_label.setdefault(p.candidate.label, []).append(p)
    out = []
    for variants in list(by_label.values())[:n]:
        default = [p for p in variants if p.bucket_scale == 1.0 and p.overlap_comm in (None, True)]
        out.append(default[0] if default else variants[0])
    return out


def estimator_ranking(space: TuneSpace, objective: str, checks: Optional[dict[str, PointCheck]], top: int,
                      world_size: Optional[int] = None,
                      cache: Optional[dict[str, PointCheck]] = None) -> list[TunePoint]:
    """Up to `top` runnable points, best estimate first (for the objective).

    With a full scan (`checks`), every runnable point is ranked; otherwise the sweep's ranking
    (`run_sweep`, default knobs) is used, each point re-checked with this space's checks (stored in `cache`
    when given, so the caller does not check them again).
    """
    if top <= 0:
        return []
    if checks is not None:
        ok = [c for c in checks.values() if not c.pruned]
        # as in `sweep`: the points that leave the memory headroom first (the sweep's within_headroom rule), then the
        # estimate; ties (sweep_explain.tie_groups: within the tolerance of the group's leader) go to the simpler
        # layout (sweep_explain.simplicity_key)
        ok = tie_ranked(ok, lambda c: int(not c.estimate.within_headroom), lambda c: _tie_figure(objective, c),
                        lambda c: (simplicity_key(c.point.candidate), c.point.label))
        return [c.point for c in ok[:top]]

    res = run_sweep(space.spec, space.shape, top=max(top * 2, 8), validate=False, advise=False)
    dims = space.dimensions()
    ranked = list(res.ranked)
    if objective == "memory":
        ranked.sort(key=lambda r: r.estimate.memory_per_rank_bytes)
    cands: list[TunePoint] = []
    for r in ranked:
        c = r.candidate
        if c.tp not in dims["tp"] or c.pp not in dims["pp"] or c.micro_batch not in dims["micro_batch"]:
            continue
        if c.zero_stage == 0:
            cands.append(TunePoint(candidate=c))
            continue
        overlap = None if dims["overlap_comm"] == [None] else True
        scales = sorted(dims["bucket_scale"], key=lambda x: (x != 1.0, x))
        for scale in scales:  # the generated default bucket first, then the other scales
            cands.append(TunePoint(candidate=c, overlap_comm=overlap, bucket_scale=scale))
        if overlap is not None:
            cands.append(TunePoint(candidate=c, overlap_comm=False, bucket_scale=1.0 if 1.0 in dims["bucket_scale"]
                                   else dims["bucket_scale"][0]))
    out: list[TunePoint] = []
    seen: set[str] = set()
    for p in cands:
        if p.key in seen:
            continue
        seen.add(p.key)
        chk = space.check(p, world_size=world_size)
        if cache is not None:
            cache[p.key] = chk
        if not chk.pruned:
            out.append(p)
        if len(out) >= top:
            break
    return out
