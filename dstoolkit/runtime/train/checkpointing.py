"""Apply a `CheckpointPolicy` to a model's block list, and measure what it saves.

The policy object is the same one `dstoolkit.estimate` reads (`dstoolkit.spec.checkpoint`), so the
runtime and the estimate cannot disagree on which blocks recompute.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Optional

import torch
from torch import nn

from dstoolkit.spec.checkpoint import CheckpointPolicy

Backend = Literal["torch", "deepspeed"]


def apply_checkpoint_policy(model: nn.Module, policy: CheckpointPolicy, *, backend: Backend = "torch") -> list[bool]:
    """Mark the blocks of `model` (a `TinyTransformer`-like module with `.blocks`) for recompute.

    Args:
        model: module with `blocks` (nn.ModuleList) and a `checkpointed` list consulted in forward;
            for `selective`, each block's `self_attn.recompute_core` is switched on.
        policy: the shared policy object.
        backend: "torch" uses `torch.utils.checkpoint` (non-reentrant); "deepspeed" uses
            `deepspeed.checkpointing.checkpoint` (needs `deepspeed.checkpointing.configure` for its
            partition/offload options; defaults work without it).

    Returns:
        The per-block recompute flags that were applied.
    """
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(f"model {type(model).__name__} has no `blocks` nn.ModuleList to apply {policy.kind!r} to")
    flags = policy.checkpointed_layers(len(blocks))
    model.checkpointed = list(flags)
    for block in blocks:
        attn = getattr(block, "self_attn", None)
        if attn is not None and hasattr(attn, "recompute_core"):
            attn.recompute_core = policy.recomputes_attention_core
    if backend == "deepspeed":
        import deepspeed

        model.checkpoint_fn = deepspeed.checkpointing.checkpoint
    elif backend == "torch":
        model.checkpoint_fn = None
    else:
        raise ValueError(f"backend={backend!r}: use 'torch' or 'deepspeed'")
    return flags


@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd keeps for backward during one forward pass."""

    saved_bytes: int
    """Sum over tensors saved for backward (distinct storages counted once), excluding parameters."""
    num_tensors: int
    """Number of distinct saved storages counted."""


def measure_saved_activation_bytes(
    forward: Callable[[], torch.Tensor], *, exclude: Optional[list[torch.Tensor]] = None
) -> SavedActivations:
    """Run `forward()` under `torch.autograd.graph.saved_tensors_hooks` and sum what autograd keeps.

    Storages are de-duplicated by data pointer (a view saved twice counts once); parameters (and any
    tensor in `exclude`) are not activations and are skipped. Tensors saved inside a checkpointed region
    are only the region inputs, which is exactly the saving a policy buys.

    Args:
        forward: closure that runs the forward pass and returns the loss (backward is then run and discarded).
        exclude: tensors whose storage must not count (model parameters).

    Returns:
        SavedActivations with the byte total.
    """
    skip = {t.untyped_storage().data_ptr() for t in (exclude or [])}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in skip and ptr not in seen:
                seen[ptr] = st.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse / meta tensors carry no storage
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    loss.backward()
    return SavedActivations(saved_bytes=sum(seen.values()), num_tensors=len(seen))
