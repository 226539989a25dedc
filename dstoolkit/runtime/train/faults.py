"""Fault injection for the example trainer (tests and demos; off by default): a poisoned batch, an LR blow-up, a
killed rank. Every fault fires once, even when a rollback replays its step. A flag that could never fire (a step
beyond --steps, a rank or micro-batch the run does not have) is refused before any rank starts (`fault_flags`).
"""
from __future__ import annotations

import argparse
import os
import signal
from typing import TYPE_CHECKING, Any

from dstoolkit.runtime.train.fault_flags import DEFAULT_KILL_RANK

if TYPE_CHECKING:
    from dstoolkit.runtime.train.run_state import MetricsWriter


class FaultInjector:
    """--inject-poison, --inject-lr-blowup and --kill-at-step."""

    def __init__(self, args: argparse.Namespace, blowups: dict[int, float], writer: "MetricsWriter") -> None:
        self.poisons = dict(args.inject_poison)
        """Step -> the micro-batch of that step (0-based) that gets random labels."""
        self.blowups = blowups
        self.kill_at_step = args.kill_at_step
        self.kill_rank = DEFAULT_KILL_RANK if args.kill_rank is None else args.kill_rank
        self.writer = writer
        self.fired: set[tuple[str, int]] = set()

    def lr_factor(self, step: int) -> float:
        """The blow-up factor for this step's LR (1.0 when none is due)."""
        if step in self.blowups and ("lr", step) not in self.fired:
            self.fired.add(("lr", step))
            self.writer.write({"event": "inject", "kind": "lr_blowup", "step": step, "factor": self.blowups[step]})
            return self.blowups[step]
        return 1.0

    def poison_due(self, step: int, micro: int) -> bool:
        """Whether micro-batch `micro` (0-based, batches trained on so far in the step) of `step` is poisoned."""
        return self.poisons.get(step) == micro and ("poison", step) not in self.fired

    @staticmethod
    def poisoned_labels(labels: Any, pos: int, vocab_size: int) -> Any:
        """Random labels seeded by the data position: every rank's batch is bad (a globally bad batch)."""
        import torch

        gen = torch.Generator().manual_seed(pos)
        return torch.randint(0, vocab_size, labels.shape, generator=gen)

    def poisoned(self, step: int, pos: int) -> None:
        self.fired.add(("poison", step))
        self.writer.write({"event": "inject", "kind": "poison", "step": step, "data_pos": pos})

    def maybe_kill(self, step: int, rank: int) -> None:
        if self.kill_at_step is not None and step == self.kill_at_step and rank == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # die like an OOM-killed / preempted rank
