"""Statistics of repeated measurements, the one summary every bench quotes: the median with p10/p90 and IQR (never
one run), and the Spearman rank correlation the fidelity benchmarks score an order with (split from
runtime.bench.harness). Pure functions, no torch."""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as the samples)."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    p10: float
    p90: float
    iqr: float
    """Inter-quartile range p75 - p25: the spread we quote next to the median."""
    rel_spread: float
    """(p90 - p10) / median: how noisy the median is, as a fraction."""

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method) of already sorted values.

    Args:
        sorted_values: ascending values, at least one.
        q: percentile in [0, 100].
    """
    if not sorted_values:
        raise ValueError("percentile of an empty sample")
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of two equally long sequences (tied values share their average rank);
    nan when either is constant."""
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2 + 1
            i = j + 1
        return r

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb) if va and vb else float("nan")


def summarize(samples: Iterable[float]) -> Stats:
    """Median, mean, extremes, p10/p90 and IQR of raw samples.

    Args:
        samples: raw measurements; at least one.

    Returns:
        A `Stats` with the same unit as the samples.
    """
    values = sorted(float(v) for v in samples)
    if not values:
        raise ValueError("summarize() needs at least one sample")
    med = percentile(values, 50)
    p10, p90 = percentile(values, 10), percentile(values, 90)
    return Stats(
        n=len(values),
        median=med,
        mean=sum(values) / len(values),
        min=values[0],
        max=values[-1],
        p10=p10,
        p90=p90,
        iqr=percentile(values, 75) - percentile(values, 25),
        rel_spread=(p90 - p10) / med if med else 0.0,
    )
