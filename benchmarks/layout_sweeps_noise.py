"""Layout sweeps, the noise ceiling: the log-normal noise of one measurement from a source's repeated timings, the
Spearman a model that knew every measured time would score against one such measurement per layout, and the MAPE
that the noise alone leaves."""
from __future__ import annotations

import math
import random
from typing import Any, Optional

from dstoolkit.runtime.bench import stats
from layout_sweeps_score import per_token


CEILING_DRAWS = 4000
CEILING_SEED = 0


def repeat_sigma(pairs: list[dict[str, Any]]) -> Optional[float]:
    """Log-normal noise sigma of one measurement from pairs of repeated timings (a_s, b_s) of one layout:
    var(ln a - ln b) = 2 sigma^2, pooled over the pairs."""
    if not pairs:
        return None
    return math.sqrt(sum(math.log(p["a_s"] / p["b_s"]) ** 2 for p in pairs) / (2 * len(pairs)))


def noise_ceiling(times: list[float], sigma: float, draws: int = CEILING_DRAWS, seed: int = CEILING_SEED) -> Optional[float]:
    """Mean Spearman between `times` and one re-measurement of each, times x exp(sigma z), z ~ N(0, 1), over
    `draws` seeded draws: what a model that knew `times` exactly would score against a single noisy measurement
    per layout. `times` are themselves measured (noisier than the truth, so more spread out), which makes this an
    upper estimate of the ceiling."""
    if len(times) < 3 or sigma is None:
        return None
    rng = random.Random(seed)
    total = 0.0
    for _ in range(draws):
        total += stats.spearman(times, [t * math.exp(sigma * rng.gauss(0.0, 1.0)) for t in times])
    return total / draws


def mape_floor(sigma: Optional[float], draws: int = CEILING_DRAWS, seed: int = CEILING_SEED) -> Optional[float]:
    """Mean |error| of a model that knew every true step time, scored against one measurement each, true x
    exp(sigma z), z ~ N(0, 1) (error = predicted tokens/s / measured - 1 = exp(-sigma z) - 1), over `draws` seeded
    draws: the MAPE that measurement noise alone leaves (~0.8 sigma for small sigma)."""
    if sigma is None:
        return None
    rng = random.Random(seed)
    return sum(abs(math.exp(-sigma * rng.gauss(0.0, 1.0)) - 1.0) for _ in range(draws)) / draws


def ceilings(groups, rows_by_group, scores, doc, loso=None) -> dict[str, Any]:
    """Per group of a source with repeated timings (doc['repeatability']): the noise ceiling of its Spearman; and
    over those groups of >= 3 layouts the mean ceiling beside the model's mean Spearman (in sample, LOSO)."""
    sig = {src: repeat_sigma(pairs) for src, pairs in (doc.get("repeatability") or {}).items()}
    per, model, model_lo = {}, [], []
    for g in groups:
        sc = scores[g["id"]]
        if g["source"] not in sig or sc["ran"] < 3 or sc["spearman"] is None:
            continue
        ran = [r for r in rows_by_group[g["id"]] if not r["oom"] and r.get("predicted_step_s") is not None]
        per[g["id"]] = noise_ceiling([per_token(r["measured_step_s"], r) for r in ran], sig[g["source"]])
        model.append(sc["spearman"])
        lg = (loso or {}).get(g["id"], {}).get("score")
        if lg and lg.get("spearman") is not None:
            model_lo.append(lg["spearman"])
    vals = [v for v in per.values() if v is not None]
    # the MAPE floor over the layouts that ran (score_group's `ran`, its `mape` per group), by source
    floor = {src: mape_floor(v) for src, v in sig.items()}
    noisy = [(g["source"], scores[g["id"]]) for g in groups if g["source"] in sig and scores[g["id"]]["ran"]]
    n_noisy = sum(sc["ran"] for _, sc in noisy)
    return {"sigma_by_source": sig, "mape_floor_by_source": floor, "rows_with_sigma": n_noisy,
            "rows": sum(sc["ran"] for sc in scores.values()),
            "mape_floor_rows_with_sigma": sum(floor[src] * sc["ran"] for src, sc in noisy) / n_noisy if n_noisy else None,
            "model_mape_rows_with_sigma": sum(sc["mape"] * sc["ran"] for _, sc in noisy) / n_noisy if n_noisy else None,
            "pairs_by_source": {k: len(v) for k, v in (doc.get("repeatability") or {}).items()},
            "draws": CEILING_DRAWS, "seed": CEILING_SEED, "per_group": per, "groups": len(vals),
            "mean_ceiling": sum(vals) / len(vals) if vals else None,
            "mean_model_spearman": sum(model) / len(model) if model else None,
            "mean_model_spearman_loso": sum(model_lo) / len(model_lo) if model_lo and len(model_lo) == len(model) else None}
