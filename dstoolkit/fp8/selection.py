"""The FP8 layer selection of `dstoolkit fp8 plan`, as the estimator reads it (`Fp8Selection`, a `runplan.RunPlan` field): per block
the share of its linear weights that run in FP8, and whether the LM head does. No torch import.

The rule is the plan's own: the rank's linear layers (`fp8.linears.rank_linears`) each decided by
`fp8.report.decide_linear` (skip_first / skip_last_layers, include / exclude patterns, minimum and aligned dims), after
the plan's input checks (`fp8.plan.check_plan_inputs`: layout, skips that leave no block in FP8;
`fp8.plan.token_problem`: tokens per micro-batch Transformer Engine refuses), which raise the plan's own messages.
"""
from __future__ import annotations

from typing import Mapping, Optional

from pydantic import BaseModel, ConfigDict

from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.fp8.linears import rank_linears
from dstoolkit.fp8.plan import check_plan_inputs, token_problem
from dstoolkit.fp8.report import decide_linear
from dstoolkit.models.shape import ModelShape


class Fp8Selection(BaseModel):
    """Which linear layers an fp8 run swaps, from the FP8 plan's own selection (`dstoolkit.fp8.report.decide_linear`
    on the rank's linear layers, `fp8.selection.fp8_selection`): a skipped layer stays bf16, with no FP8 GEMM
    speed-up and no FP8 weight cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocks: tuple[float, ...]
    """Per transformer block, the share of its linear weights (K x N summed) the selection swaps to FP8."""
    lm_head: bool = False
    """Whether the LM head runs in FP8 (the default selection excludes it: Fp8LayerSelection.exclude '*lm_head*')."""


def fp8_selection(shape: ModelShape, cfg: Fp8Config, *, micro_batch: int, seq_len: int, tp: int = 1, pp: int = 1,
                  ep: int = 1, names: Optional[Mapping[str, str]] = None) -> Fp8Selection:
    """The selection `fp8 plan` makes for this model and layout (see the module docstring).

    Raises:
        ValueError: what `fp8 plan` refuses for the same settings, with its message.
    """
    check_plan_inputs(shape, cfg, tp, pp, ep, names)
    problem = token_problem(cfg, micro_batch, seq_len, names)
    if problem:
        raise ValueError(problem)
    n_blocks = shape.num_hidden_layers
    swapped = [0] * n_blocks
    total = [0] * n_blocks
    head = False
    for lin in rank_linears(shape, micro_batch * seq_len, tp, ep):
        fp8 = decide_linear(cfg, lin.name, lin.k, lin.n, n_blocks) is None
        layer = lin.input_key[0]
        if isinstance(layer, int) and 0 <= layer < n_blocks:
            total[layer] += lin.k * lin.n
            swapped[layer] += lin.k * lin.n if fp8 else 0
        elif "lm_head" in lin.name or "output_layer" in lin.name:
            head = head or fp8
    return Fp8Selection(blocks=tuple(s / t if t else 0.0 for s, t in zip(swapped, total)), lm_head=head)
