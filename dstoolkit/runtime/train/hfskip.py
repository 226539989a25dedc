"""Skipping one micro-batch inside an HF Trainer step (`DstoolkitCallback`): the Trainer back-propagates every
micro-batch it has run forward, so a batch the spike guard rejects is back-propagated anyway and must add no
gradient, NaN/Inf included.

`ZeroBatch.arm(model, loss)` returns the loss to hand back to the Trainer, a finite zero that keeps the batch's graph
(`loss.nan_to_num(0, 0, 0) * 0`), and puts a hook on every trainable parameter that replaces the gradient this
backward computes for it by zeros. The hooks are tensor hooks (`Tensor.register_hook`): they run when the
parameter's gradient is computed, before it is accumulated into `.grad` and before the hooks DeepSpeed (ZeRO
reduction, on accumulation) and DDP register, so every rank runs the same backward and the same collectives as for
any micro-batch, with zeros in them. `disarm()` removes the hooks once that backward is done (the callback calls it
at the next forward and after every micro-step).

Why not just `loss * 0`: 0 x NaN is NaN. The backward runs through the batch's forward; where the forward went
NaN/Inf, the upstream gradient 0 meets NaN activations and every gradient is NaN. Measured with real 2-rank HF
Trainer + DeepSpeed runs, a NaN in the LM head's output on one rank (tests/dist/test_s29b_train_hf_nan.py): ZeRO-0
fp32 wrote NaN into all 106,816 weights and every later loss was NaN; ZeRO-2 bf16 with
`bf16.check_grad_overflow: false`, 86% of them at once; with DeepSpeed's overflow check (ZeRO-1/2/3 fp32, bf16 by
default) the grad norm was inf and the whole step was dropped, the other micro-batches' gradients with it (fp16,
not measured here, the CPU has no fp16: DeepSpeed's overflow path drops the step and also halves the loss scale). Nor a loss with no graph behind it (a fresh zero leaf): DeepSpeed 0.19.8's
ZeRO-2 then sees a micro-batch that fires none of its gradient hooks; in the same runs it failed in
`reduce_ipg_grads` (IndexError) when that micro-batch opened the step, and ended the step with an infinite grad
norm when it closed it.
"""
from __future__ import annotations

from typing import Any


class ZeroBatch:
    """Zero the gradients of the one backward that follows `arm` (see the module docstring)."""

    def __init__(self) -> None:
        self._handles: list = []

    @property
    def armed(self) -> bool:
        """Whether hooks are in place (a skipped batch's backward is still to come)."""
        return bool(self._handles)

    def arm(self, model: Any, loss: Any) -> Any:
        """Hook every trainable parameter of `model` and return the zero loss to back-propagate in place of `loss`.

        Args:
            model: the module whose forward produced `loss` (the Trainer's model, inside the DeepSpeed engine).
            loss: the batch's loss tensor (any value, NaN/Inf included).

        Returns:
            A tensor of `loss`'s shape, 0.0 everywhere, whose backward reaches the parameters with zero gradients.
        """
        import torch

        self.disarm()
        self._handles = [p.register_hook(torch.zeros_like) for p in model.parameters() if p.requires_grad]
        return loss.nan_to_num(0.0, posinf=0.0, neginf=0.0) * 0.0

    def disarm(self) -> None:
        """Remove the hooks (after the skipped batch's backward; a no-op when none are in place)."""
        for h in self._handles:
            h.remove()
        self._handles = []
