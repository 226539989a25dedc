"""The sweep's ranking and its explanation: the rank key (memory headroom first, then step time, ties to the
simpler layout), why the winner wins over the runners-up and the best lower ZeRO stage, the headroom and host
memory notes. No torch import.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import CandidateEstimate, GiB
from dstoolkit.generate.sweep_result import Ranked
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.spec import Spec
from dstoolkit.spec.cluster_fields import host_memory_source, memory_headroom_fraction, memory_headroom_source


STEP_TIME_TIE_TOLERANCE = 0.005
"""Relative width of a tie: sorted by the figure, a tie group's leader (its smallest figure) ties every figure up to
leader x (1 + this) (`tie_groups`), and the simpler layout ranks first. The one tie rule of `sweep`'s ranking, of its
"same estimated step time" text and of `tune`'s estimate ranking (estimates are not finer than that)."""


def headroom_note(spec: Spec, first: Ranked, fit: Sequence[Ranked]) -> str:
    """What the memory headroom decided: a faster layout passed over, or a pick that cannot leave it."""

    e0 = first.estimate
    pct = memory_headroom_fraction(spec.cluster) * 100
    src = memory_headroom_source(spec.cluster)
    if not e0.within_headroom:
        return (f" No fitting layout leaves the {pct:.0f}% memory headroom ({_gib(e0.headroom_bytes)}; {src}): "
                f"this one peaks at {_gib(e0.memory_per_rank_bytes)} of {_gib(e0.device_memory_bytes)}.")
    faster = [r for r in fit if not r.estimate.within_headroom and r.estimate.step_time_s < e0.step_time_s]
    if faster:
        f = min(faster, key=lambda r: r.estimate.step_time_s)
        return (f" Passed over for the {pct:.0f}% memory headroom ({src}): {f.candidate.label}, "
                f"{f.estimate.step_time_s:.4g} s, peaks at {_gib(f.estimate.memory_per_rank_bytes)} of "
                f"{_gib(f.estimate.device_memory_bytes)}.")
    return ""


def host_memory_text(spec: Spec, est: CandidateEstimate) -> str:
    """Why a layout does not fit the node's host RAM (offloaded states of every rank on the node)."""
    return (f"host memory {_gib(est.host_memory_per_node_bytes)} per node ({_gib(est.host_memory_per_rank_bytes)} "
            f"per rank x {spec.cluster.gpus_per_node} ranks) > {_gib(est.host_memory_node_capacity_bytes)} of host RAM "
            f"({host_memory_source(spec.cluster)})")


def same_step_time(a: float, b: float) -> bool:
    """Two estimated figures (> 0) tie: the larger is at most the smaller x (1 + STEP_TIME_TIE_TOLERANCE). The pairwise
    test of `tie_groups`."""
    lo, hi = min(a, b), max(a, b)
    return hi <= lo * (1.0 + STEP_TIME_TIE_TOLERANCE)


def tie_groups(values: Sequence[float]) -> list[int]:
    """The tie group of each figure (same order as `values`): sorted ascending, a new group starts at the first figure
    that does not tie its group's leader (`same_step_time`), so ties are judged against a leader, never against a fixed
    bucket edge. Group indices order as the figures do."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    groups = [0] * len(values)
    g, leader = -1, None
    for i in order:
        if leader is None or not same_step_time(leader, values[i]):
            g, leader = g + 1, values[i]
        groups[i] = g
    return groups


def tie_ranked(items: Sequence, side, figure, rest) -> list:
    """`items` ranked by (side, tie group of figure within the side, rest): side(x) first (e.g. outside the memory
    headroom), then the tie group (`tie_groups`, lower figure first), then rest(x) (the simpler layout first)."""
    by_side: dict = {}
    for x in items:
        by_side.setdefault(side(x), []).append(x)
    out = []
    for s in sorted(by_side):
        xs = by_side[s]
        groups = tie_groups([figure(x) for x in xs])
        out += [x for _, x in sorted(zip(groups, xs), key=lambda gx: (gx[0], rest(gx[1])))]
    return out


TIE_TEXT = f"within the {STEP_TIME_TIE_TOLERANCE * 100:g}% tie rule"


def simplicity_key(c: Candidate) -> tuple:
    """Which of two tied layouts is simpler (smaller first): no offload, then the larger micro-batch (fewer
    micro-steps: "the largest that fits"), the lower ZeRO stage, no ZeRO++, less model parallelism. The one tie rule
    of `sweep` and of `tune`'s estimate ranking."""
    return (int(c.offload_optimizer) + int(c.offload_param), -c.micro_batch, c.zero_stage, int(c.zeropp), c.tp * c.pp)


def _tail_key(r: Ranked) -> tuple:
    c = r.candidate
    return (*simplicity_key(c), r.estimate.memory_per_rank_bytes, c.label)


def rank(rows: Sequence[Ranked]) -> list[Ranked]:
    """Layouts that leave the memory headroom (cluster.memory_headroom_fraction) first; then fastest first. Within a tie
    group (`tie_groups`) the simpler layout wins (`simplicity_key`), then less memory, and the label for a stable
    order."""
    return tie_ranked(rows, lambda r: int(not r.estimate.within_headroom), lambda r: r.estimate.step_time_s, _tail_key)


def _gap_text(e0: CandidateEstimate, e: CandidateEstimate) -> str:
    gap = (e.step_time_s / e0.step_time_s - 1) * 100 if e0.step_time_s > 0 else 0.0
    if same_step_time(e0.step_time_s, e.step_time_s) and e.within_headroom == e0.within_headroom:
        return (f"same estimated step time as #1 ({e.step_time_s:.4g} s, {TIE_TEXT}; ties go to the simpler "
                "layout)")
    return f"{gap:+.1f}% step time vs #1 ({e.step_time_s:.4g} s)"


def _out_of_order_text(earlier: Sequence[Ranked], r: Ranked) -> str:
    """Why `r` ranks below a slower layout ranked before it (1-based position in the text): a tie, or the memory
    headroom; '' when every layout before it is at least as fast."""
    e = r.estimate
    for j, q in enumerate(earlier, start=1):
        if q.estimate.step_time_s <= e.step_time_s:
            continue
        if q.estimate.within_headroom and not e.within_headroom:
            return f"; ranked below #{j}, which leaves the memory headroom and this one does not"
        if same_step_time(q.estimate.step_time_s, e.step_time_s):
            return (f"; ties with #{j} ({q.estimate.step_time_s:.4g} s, same estimated step time {TIE_TEXT}: the "
                    "simpler layout ranks first)")
    return ""


def _difference_notes(a: Candidate, b: Candidate) -> list[str]:
    """What `b` does differently from `a`, phrased as the cost it brings (estimator-independent)."""
    notes = []
    if b.zero_stage != a.zero_stage or b.zeropp != a.zeropp:
        if b.zero_stage > a.zero_stage:
            cost = {1: "a parameter all-gather after each step", 2: "a gradient reduce-scatter every micro-step",
                    3: "parameter all-gathers every micro-step"}[b.zero_stage]
            notes.append(f"ZeRO-{b.zero_stage} instead of ZeRO-{a.zero_stage} (more communication: {cost})")
        elif b.zero_stage < a.zero_stage:
            notes.append(f"ZeRO-{b.zero_stage} instead of ZeRO-{a.zero_stage} (more memory per rank)")
        if b.zeropp != a.zeropp:
            notes.append("ZeRO++ quantized collectives" if b.zeropp else "no ZeRO++")
    if (b.offload_optimizer, b.offload_param) != (a.offload_optimizer, a.offload_param):
        notes.append(f"offload {b.offload_label} instead of {a.offload_label}"
                     + (" (CPU optimizer step and PCIe copies)" if b.offload_optimizer else ""))
    if b.tp != a.tp:
        notes.append(f"tp {b.tp} instead of {a.tp}" + (" (TP all-reduces in every layer)" if b.tp > a.tp else ""))
    if b.pp != a.pp:
        notes.append(f"pp {b.pp} instead of {a.pp}" + (" (pipeline bubble)" if b.pp > a.pp else ""))
    if b.ep != a.ep:
        notes.append(f"ep {b.ep} instead of {a.ep}" + (" (more all-to-all)" if b.ep > a.ep else ""))
    if b.micro_batch != a.micro_batch:
        notes.append(f"micro-batch {b.micro_batch} instead of {a.micro_batch}"
                     + (" (more, smaller micro-steps)" if b.micro_batch < a.micro_batch else ""))
    if b.checkpoint != a.checkpoint:
        notes.append(f"recompute {b.checkpoint_label} instead of {a.checkpoint_label}")
    return notes


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def explain(ranked: list[Ranked], gpu: GpuSpec, all_fit: Sequence[Ranked] = (),
            compare_stages: bool = True) -> tuple[list[Ranked], Optional[str]]:
    """Attach a reason to each ranked candidate and build the "why the first wins" text.

    `all_fit` (every candidate that fits, any order) lets the text say whether a lower ZeRO stage fits at all.
    """
    if not ranked:
        return ranked, None
    first = ranked[0]
    e0 = first.estimate
    out = [Ranked(first.candidate, e0, reason=(
        f"fastest estimated step {e0.step_time_s:.4g} s (MFU {e0.mfu * 100:.1f}%), "
        f"{_gib(e0.memory_per_rank_bytes)} of {_gib(e0.device_memory_bytes)} per rank"), findings=first.findings)]
    for r in ranked[1:]:
        e = r.estimate
        diff = _difference_notes(first.candidate, r.candidate)
        reason = (f"{_gap_text(e0, e)}, {_gib(e.memory_per_rank_bytes)} per rank"
                  + (f"; differs by: {', '.join(diff)}" if diff else "") + _out_of_order_text(ranked[:len(out)], r))
        out.append(Ranked(r.candidate, e, reason=reason, findings=r.findings))
    why = f"{first.candidate.label} wins: {out[0].reason}."
    if len(out) > 1:
        second = out[1]
        diff = _difference_notes(first.candidate, second.candidate)
        why += (f" The runner-up ({second.candidate.label}): {_gap_text(e0, second.estimate)}"
                + (f"; it uses {', '.join(diff)}" if diff else "") + ".")
    pool = list(all_fit) or out
    if compare_stages and first.candidate.zero_stage > 0:
        lower = [r for r in pool if r.candidate.zero_stage < first.candidate.zero_stage]
        if not lower:
            why += f" No lower ZeRO stage fits in {_gib(e0.device_memory_bytes)}."
        else:
            best_lower = rank(lower)[0]
            why += (f" The best lower-stage layout ({best_lower.candidate.label}) fits too: "
                    f"{_gap_text(e0, best_lower.estimate)}.")
    return out, why
