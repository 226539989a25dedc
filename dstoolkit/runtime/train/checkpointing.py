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
    """Recompute the blocks of `model` (its `.blocks` nn.ModuleList) that `policy` marks, in backward.

    A model whose class reads the flags itself (`dstoolkit.runtime.model.TinyTransformer`: a method other than
    `__init__` reads `self.checkpointed`, and calls `self.checkpoint_fn`) gets them set; any other module with
    `.blocks` gets each marked block's forward wrapped in the checkpoint call, so the recompute happens whatever its
    own forward does (a later call re-applies: blocks it no longer marks get their own forward back).

    Args:
        model: module with `blocks` (nn.ModuleList); for `selective`, each block's `self_attn.recompute_core` is
            switched on (a model whose blocks have none is refused).
        policy: the shared policy object.
        backend: "torch" uses `torch.utils.checkpoint` (non-reentrant); "deepspeed" uses
            `deepspeed.checkpointing.checkpoint` (needs `deepspeed.checkpointing.configure` for its
            partition/offload options; defaults work without it).

    Returns:
        The per-block recompute flags that were applied.

    Raises:
        TypeError: `model` has no `.blocks` (a transformers model: the message points at
            `gradient_checkpointing_enable()`), or `selective` on blocks without a `recompute_core` switch.
        ValueError: an unknown `backend`.
    """
    if backend not in ("torch", "deepspeed"):
        raise ValueError(f"backend={backend!r}: use 'torch' or 'deepspeed'")
    name = type(model).__name__
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        if _is_transformers(model):
            raise TypeError(
                f"model {name} has no `blocks` nn.ModuleList to apply {policy.kind!r} to: for a transformers model "
                "use model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False}) "
                "(HF Trainer: TrainingArguments(gradient_checkpointing=True)), which recomputes every decoder layer")
        raise TypeError(f"model {name} has no `blocks` nn.ModuleList to apply {policy.kind!r} to: put the layers to "
                        "recompute in `model.blocks` (an nn.ModuleList, each called as a module), or call "
                        "torch.utils.checkpoint.checkpoint around them in your forward")
    attns = [getattr(b, "self_attn", None) for b in blocks]
    switches = [a for a in attns if a is not None and hasattr(a, "recompute_core")]
    if policy.recomputes_attention_core and len(switches) < len(blocks):
        raise TypeError(f"model {name}: {policy.kind!r} recomputes the attention core through each block's "
                        "`self_attn.recompute_core` switch (dstoolkit.runtime.model's blocks), which "
                        f"{len(blocks) - len(switches)} of its {len(blocks)} blocks lack: use 'full', 'every-k' or "
                        "'ratio' (whole blocks recomputed)")
    flags = policy.checkpointed_layers(len(blocks))
    fn = None
    if backend == "deepspeed":
        import deepspeed

        fn = deepspeed.checkpointing.checkpoint
    for attn in switches:
        attn.recompute_core = policy.recomputes_attention_core
    if _reads_flags(model):
        model.checkpointed = list(flags)
        model.checkpoint_fn = fn
        return flags
    for block, flag in zip(blocks, flags):
        own = block.__dict__.pop("forward", None)
        if isinstance(own, _Recompute):  # applied before: back to what the block had
            own = own.original
        if own is not None:
            block.forward = own  # a forward the user set on the instance: kept (and wrapped when marked)
        if flag:
            block.forward = _Recompute(block.forward, fn, own)
    model.checkpointed = list(flags)
    return flags


def recompute_call(checkpoint_fn, f, *args, **kwargs):
    """`f(*args, **kwargs)` with its activations recomputed in backward while autograd records (as is under no_grad):
    through `checkpoint_fn` (`deepspeed.checkpointing.checkpoint(function, *args)`, positional arguments only) or,
    when None, `torch.utils.checkpoint.checkpoint` non-reentrant. The one recompute call of the bundled model's blocks
    and of `apply_checkpoint_policy`'s wrapped blocks."""
    if not torch.is_grad_enabled():
        return f(*args, **kwargs)
    if checkpoint_fn is not None:
        import functools

        return checkpoint_fn(functools.partial(f, **kwargs) if kwargs else f, *args)
    from torch.utils.checkpoint import checkpoint

    return checkpoint(f, *args, use_reentrant=False, **kwargs)


class _Recompute:
    """A block's forward, run under the checkpoint call while autograd records (its activations recomputed in
    backward); as is under no_grad."""

    def __init__(self, forward: Callable, fn: Optional[Callable], original: Optional[Callable]) -> None:
        self.forward, self.fn = forward, fn
        self.original = original
        """The forward the block instance itself held before (None: its class's)."""

    def __call__(self, *args, **kwargs):
        return recompute_call(self.fn, self.forward, *args, **kwargs)


def _reads_flags(model: nn.Module) -> bool:
    """Whether `model`'s class reads `self.checkpointed` itself (a method other than __init__ names it)."""
    for cls in type(model).__mro__:
        if cls is nn.Module:
            break
        for attr, fn in vars(cls).items():
            code = getattr(fn, "__code__", None)
            if attr != "__init__" and code is not None and "checkpointed" in code.co_names:
                return True
    return False


def _is_transformers(model: nn.Module) -> bool:
    inner = getattr(model, "model", None)
    return (callable(getattr(model, "gradient_checkpointing_enable", None))
            or isinstance(getattr(inner, "layers", None), nn.ModuleList))


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
