"""Text helpers shared by every layer. Pure Python."""
from __future__ import annotations

import difflib
from typing import Iterable, Optional


def did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.75) -> Optional[str]:
    """The choice closest to ``word``, or None when nothing is close.

    Tried in order: the same letters ignoring case; the same ``_``-separated words in another order
    (comm_overlap -> overlap_comm); the closest spelling whose difflib ratio (on lower-cased text) is at least
    ``cutoff``. The choice is returned as given, in its own case.

    Callers pick the cutoff: 0.75 for DeepSpeed rule parameters, 0.72 for DeepSpeed keys, 0.6 for spec keys,
    0.5 for GPU names (already normalised by the caller).
    """
    lowered = {str(c).lower(): c for c in choices}  # on a case clash the later choice wins
    w = str(word).lower().strip()
    if w in lowered:
        return lowered[w]
    tokens = sorted(w.replace("-", "_").split("_"))
    for low, orig in lowered.items():
        if sorted(low.split("_")) == tokens:
            return orig
    hit = difflib.get_close_matches(w, list(lowered), n=1, cutoff=cutoff)
    return lowered[hit[0]] if hit else None
