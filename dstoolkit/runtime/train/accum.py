"""DeepSpeed's gradient-accumulation window around a rollback and a batch-ramp change (no torch import).

DeepSpeed 0.19.8 decides the accumulation boundary by counting: `engine.step()` after each micro-batch adds one to
`engine.micro_steps`, and the optimizer steps when (micro_steps + 1) % gradient_accumulation_steps == 0
(deepspeed/runtime/engine.py `is_gradient_accumulation_boundary`). Two things leave that count out of phase with
the caller's optimizer steps:

* `engine.load_checkpoint` restores the weights, the optimizer, the scheduler and `global_steps`, but neither
  `micro_steps` nor the gradients accumulated since the last optimizer step (engine.py `load_checkpoint` /
  `_load_checkpoint`). A rollback k micro-batches into a window of G would add the abandoned micro-batches'
  gradients to the first step after it, and every later step would end k micro-batches early (measured:
  tests/dist/test_s29_train_rollback_accum.py).
* `engine.set_train_batch_size` (the batch ramp) changes G and leaves `micro_steps` alone: after 3 steps at G=1, a
  window of G=2 closes after its first micro-batch, and from then on each step's last micro-batch trains in the
  next step.

`close_window` (before a rollback's load) and `align_window` (between optimizer steps) put the count back.
"""
from __future__ import annotations

from typing import Any, Optional


def _counter(engine: Any) -> Optional[tuple[int, int]]:
    """(micro-batches into the open window, window size) of a DeepSpeed engine; None for an engine without
    DeepSpeed's micro-step count (a stand-in in tests)."""
    micro = getattr(engine, "micro_steps", None)
    gas = getattr(engine, "gradient_accumulation_steps", None)
    if isinstance(micro, bool) or not isinstance(micro, int) or not callable(gas):
        return None
    g = int(gas())
    return micro % g, g


def open_micro_batches(engine: Any) -> int:
    """Micro-batches back-propagated since the engine's last optimizer step (0 at a window start)."""
    c = _counter(engine)
    return c[0] if c else 0


def close_window(engine: Any, loss: Any) -> int:
    """Finish the engine's open accumulation window before a checkpoint load; returns how many micro-batches it
    held (0: nothing open, nothing done).

    The next micro-step is made the window's last and `loss` (a loss whose graph has not been back-propagated:
    the micro-batch that triggered the rollback) is back-propagated with weight 0, then `engine.step()`. The
    optimizer applies the abandoned gradients, a throwaway update the load that follows overwrites (weights,
    optimizer state, scheduler, global_steps; NaN included), and DeepSpeed's own post-step clean-up empties every
    gradient buffer it keeps, whatever the ZeRO stage or precision; the count then sits at a window start.

    Raises:
        RuntimeError: a window is open and there is no `loss` to close it with.
    """
    c = _counter(engine)
    if c is None or c[0] == 0:
        return 0
    held, gas = c
    if loss is None:
        raise RuntimeError(f"a rollback {held} micro-batches into an accumulation window of {gas} needs the rejected "
                           "micro-batch's loss to close the window (DeepSpeed's load_checkpoint keeps the "
                           "accumulated gradients)")
    engine.micro_steps += gas - 1 - held  # the next engine.step() is the boundary
    engine.backward(loss * 0.0)
    engine.step()
    return held


def align_window(engine: Any) -> int:
    """Start the engine's next accumulation window at the next micro-batch (call between optimizer steps, when no
    gradients are pending: after `set_train_batch_size` changed the window, or a load); returns the micro-steps
    the count was off by (0: already aligned)."""
    c = _counter(engine)
    if c is None or c[0] == 0:
        return 0
    engine.micro_steps -= c[0]
    return c[0]
