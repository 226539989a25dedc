"""The example trainer's learning rate: the token-counted schedule (linear warm-up, cosine decay to a floor) when the
DeepSpeed JSON has no scheduler, else DeepSpeed's value; times the spike guard's / fault injector's multiplier.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from dstoolkit.runtime.train.run_state import RunState


LR_DECAY_FLOOR = 0.1
"""Cosine decay ends at this fraction of the peak LR (Chinchilla / Llama practice)."""


def _lr_at(tokens: int, base_lr: float, warmup_tokens: int, total_tokens: Optional[int]) -> float:
    """Token-counted LR: linear warm-up, then cosine to LR_DECAY_FLOOR x peak (kept in tokens so a batch
    ramp does not distort it)."""
    if warmup_tokens > 0 and tokens < warmup_tokens:
        return base_lr * (tokens + 1) / warmup_tokens
    if total_tokens and total_tokens > warmup_tokens:
        frac = min(1.0, (tokens - warmup_tokens) / (total_tokens - warmup_tokens))
        return base_lr * (LR_DECAY_FLOOR + (1 - LR_DECAY_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))
    return base_lr


class LrControl:
    """Sets the LR of every param group for the next step: the token-counted schedule (`_lr_at`) when the
    JSON has no scheduler, else DeepSpeed's value; times a multiplier (spike-guard cool-down, injected blow-up)."""

    def __init__(self, optimizer: Any, own_schedule: bool, spec: Any, global_batch: int, state: "RunState") -> None:
        seq_len = spec.training.seq_len
        self.optimizer, self.own_schedule, self.state = optimizer, own_schedule, state
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.warmup_tokens = spec.training.warmup_steps * global_batch * seq_len
        self.total_tokens = spec.training.train_steps * global_batch * seq_len if spec.training.train_steps else None

    def set(self, mult: float) -> float:
        lrs = []
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            if self.own_schedule:
                g["lr"] = _lr_at(self.state.tokens, base, self.warmup_tokens, self.total_tokens) * mult
            else:  # DeepSpeed's scheduler set g["lr"] at the last engine.step(); scale on top of it
                g["lr"] = g["lr"] * mult
            lrs.append(g["lr"])
        return lrs[0]
