"""Activation-checkpoint policy: one object shared by the memory estimator and the runtime wrapper.

No torch import. `dstoolkit.estimate` reads `checkpointed_layers` to size activations, and
`dstoolkit.runtime.train.checkpointing` applies the same object to a model's block list, so the two cannot disagree.
"""
from __future__ import annotations

import math
from fractions import Fraction

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PolicyKind = Literal["none", "full", "every-k", "ratio", "selective"]


class CheckpointPolicy(BaseModel):
    """Which transformer blocks recompute their activations in backward."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: PolicyKind = "none"
    """none: keep everything; full: every block; every-k: one block in k; ratio: the first ceil(ratio*L)
    blocks; selective: only the attention core (scores/softmax/dropout) is recomputed (Korthikanti §4.2)."""
    every_k: int = Field(default=1, ge=1)
    """every-k: checkpoint blocks whose index is a multiple of every_k (block 0, k, 2k, ...)."""
    ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """ratio: fraction of blocks checkpointed, counted from the first block (Megatron's uniform ratio)."""

    @model_validator(mode="after")
    def _check_params_match_kind(self) -> "CheckpointPolicy":
        if self.kind != "every-k" and self.every_k != 1:
            raise ValueError(f"every_k={self.every_k} is only used with kind='every-k' (kind={self.kind!r})")
        if self.kind != "ratio" and self.ratio != 1.0:
            raise ValueError(f"ratio={self.ratio} is only used with kind='ratio' (kind={self.kind!r})")
        return self

    def checkpointed_layers(self, num_layers: int) -> list[bool]:
        """Per block: True where the whole block is recomputed (block input kept only).

        `selective` returns all False: blocks keep their activations except the attention core,
        which the estimator and the runtime handle separately.
        """
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        if self.kind == "full":
            return [True] * num_layers
        if self.kind == "every-k":
            return [i % self.every_k == 0 for i in range(num_layers)]
        if self.kind == "ratio":
            # ceil(ratio * L) of the ratio as written: 0.28 * 25 is 7.000000000000001 in binary floating point,
            # which a plain ceil makes 8 blocks; the decimal the user wrote (repr) gives exactly 7
            n = math.ceil(Fraction(repr(self.ratio)) * num_layers)
            return [i < n for i in range(num_layers)]
        return [False] * num_layers

    @property
    def recomputes_attention_core(self) -> bool:
        return self.kind == "selective"
