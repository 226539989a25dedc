"""The batch ramp for a DeepSpeed engine. The schedule lives in the core (`dstoolkit.estimate.batch_ramp`) so that
`dstoolkit estimate --tokens` counts the same steps the trainer runs; `BatchRamp.apply` here also re-aligns
DeepSpeed's micro-step count after a change (`accum.align_window`): DeepSpeed closes a window when (micro_steps + 1)
% gradient_accumulation_steps == 0 and `set_train_batch_size` leaves micro_steps alone, so without it the first
windows after a change close early (2 of 3, 2 of 4 micro-batches) while each loss is still divided by the new
count. Call `apply` between optimizer steps (before the step's first micro-batch), as the trainer does."""
from __future__ import annotations

from typing import Any

from dstoolkit.estimate.batch_ramp import BatchRamp as _Schedule, RampPoint

__all__ = ["BatchRamp", "RampPoint"]


class BatchRamp(_Schedule):
    """`dstoolkit.estimate.batch_ramp.BatchRamp` whose `apply` starts the new accumulation window with the next
    micro-batch."""

    def apply(self, engine: Any, consumed_samples: int) -> int:
        """Set the engine's global batch for the next step (only when it changes) and align DeepSpeed's window to
        it; returns that batch."""
        from dstoolkit.runtime.train.accum import align_window

        changed = engine.train_batch_size() != self.batch_at(consumed_samples)
        gb = super().apply(engine, consumed_samples)
        if changed:
            align_window(engine)
        return gb
