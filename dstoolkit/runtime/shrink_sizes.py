"""What a shrunk run is asked for: the `--shrink` value (`parse_shrink`: 'auto' or key=value sizes) as
`ShrinkSizes`, and `ShrinkError`, the one error of the shrink (naming the field, the value and the fix). The
shrink itself: `dstoolkit.runtime.shrink`; a shrunk run of a spec: `dstoolkit.runtime.shrink_run`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

class ShrinkError(ValueError):
    """A config (or a shrink request) that cannot be shrunk; the message names the field, value and fix."""

    def __init__(self, field_name: str, problem: str, fix: str) -> None:
        self.field = field_name
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field_name}: {problem}; {fix}")


@dataclass(frozen=True)
class ShrinkSizes:
    """Target sizes of a shrunk copy (None: chosen from the config, see the field notes)."""

    layers: Optional[int] = None
    """Decoder layers; None: the shortest prefix holding every layer kind (at least `min_layers`)."""
    min_layers: int = 2
    """Lower bound of the automatic depth."""
    hidden: int = 64
    """Hidden size."""
    heads: int = 4
    """Query heads (KV, linear-attention and Mamba heads keep their ratio to it)."""
    head_dim: int = 16
    """Width of one attention head (other per-head widths keep their ratio to head_dim)."""
    experts: Optional[int] = None
    """Routed experts per MoE layer; None: max(8, 2 x top-k), at most the config's count. Never below top-k."""
    vocab: int = 512
    """Vocabulary size (token ids the config names are moved inside it)."""
    window: int = 16
    """Cap on sliding windows, attention chunks and the DSA indexer top-k (so a short sequence exercises them)."""
    state: int = 16
    """Cap on the SSM state size (Mamba layers)."""
    seq_len: int = 64
    """Cap on the run's sequence length (the spec's training.seq_len when smaller)."""
    micro_batch: int = 2
    """`dstoolkit bench train --shrink`: cap on a config's micro batch (a generated strategy's batch is sized for
    its cluster; the shrunk run keeps its ZeRO / offload / precision / bucket settings at a small batch)."""
    grad_accum: int = 2
    """`dstoolkit bench train --shrink`: cap on a config's gradient-accumulation steps."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_arg(self) -> str:
        """The `--shrink` value that parses back to these sizes (what bench and tune pass to the trainer)."""
        return ",".join(f"{k}={v}" for k, v in self.as_dict().items() if v is not None)


SHRINK_KEYS = tuple(f.name for f in fields(ShrinkSizes))


def parse_shrink(text: Optional[str]) -> Optional[ShrinkSizes]:
    """`--shrink` values: None/"" (no shrink), "auto" (the defaults), or "key=value,..." over `SHRINK_KEYS`
    (e.g. "layers=4,hidden=128,experts=8").

    Raises:
        ShrinkError: an unknown key (with a did-you-mean) or a value that is not a positive integer.
    """
    if text is None or str(text).strip() == "":
        return None
    text = str(text).strip()
    if text.lower() in ("auto", "default", "yes", "on", "true"):
        return ShrinkSizes()
    values: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ShrinkError("--shrink", f"{part!r} is not key=value",
                              f"write e.g. --shrink layers=4,hidden=64 (keys: {', '.join(SHRINK_KEYS)}) or --shrink auto")
        if key not in SHRINK_KEYS:
            guess = difflib.get_close_matches(key, SHRINK_KEYS, n=1)
            hint = f"did you mean {guess[0]!r}? " if guess else ""
            raise ShrinkError(f"--shrink {key}", f"unknown key {key!r}", f"{hint}keys: {', '.join(SHRINK_KEYS)}")
        try:
            value = int(raw.strip())
        except ValueError:
            value = -1
        if value < 1:
            raise ShrinkError(f"--shrink {key}", f"{raw.strip()!r} is not a positive integer",
                              f"give {key}=N with N >= 1")
        values[key] = value
    sizes = replace(ShrinkSizes(), **values)
    if sizes.hidden % sizes.heads:
        raise ShrinkError("--shrink hidden", f"hidden={sizes.hidden} is not a multiple of heads={sizes.heads}",
                          "pick hidden as a multiple of heads, e.g. hidden=64,heads=4")
    if sizes.head_dim % 2:
        raise ShrinkError("--shrink head_dim", f"head_dim={sizes.head_dim} is odd (RoPE rotates pairs)",
                          "give an even head_dim, e.g. 16")
    return sizes
