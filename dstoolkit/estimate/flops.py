"""Training FLOPs per token and per step, and MFU (docs/anchors.md, "FLOPs and MFU"). No torch import."""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate.layout import param_totals
from dstoolkit.runplan import RunPlan
from dstoolkit.models.shape import ModelShape

TRAIN_FLOPS_PER_PARAM = 6
"""Kaplan et al. 2020: forward 2N + backward 4N FLOPs per token per matmul parameter."""
FORWARD_FLOPS_PER_PARAM = 2
"""One multiply-accumulate per parameter per token in the forward pass."""
ATTENTION_TRAIN_COEFF = 12
"""PaLM App. B: attention adds 12·L·H·Q·T training FLOPs per token (fwd 4·L·H·Q·T: QK^T and AV, 2 each)."""
ATTENTION_FORWARD_COEFF = 4
"""Forward-only share of the attention term (1/3 of 12)."""


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token (model FLOPs, the MFU numerator) and what the hardware executes."""

    dense: float
    """6 · N_matmul (N = active parameters that take part in a matmul; MoE: top-k experts only)."""
    attention: float
    """12 · L · H · Q · T (PaLM App. B)."""
    recompute: float
    """Extra forward FLOPs from activation recompute (counted by HFU, not by MFU)."""

    @property
    def model(self) -> float:
        """Model FLOPs per token: 6N + 12LHQT."""
        return self.dense + self.attention

    @property
    def hardware(self) -> float:
        """Executed FLOPs per token including recompute."""
        return self.model + self.recompute


def attention_head_dims(shape: ModelShape) -> tuple[int, int]:
    """(H, Q) for the attention term: heads and the per-head q·k width (MLA: nope + rope dims)."""
    if shape.is_mla:
        return shape.num_attention_heads, (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
    return shape.num_attention_heads, shape.head_size


def flops_per_token(shape: ModelShape, seq_len: int, *, checkpointed_layers: list[bool] | None = None,
                    selective: bool = False) -> FlopsPerToken:
    """Training FLOPs per token: 6N + 12·L·H·Q·T, plus recompute.

    Args:
        shape: model.
        seq_len: T.
        checkpointed_layers: per block, True where the block re-runs its forward in backward.
        selective: selective recompute (re-runs only the attention core forward in every block).
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be > 0")
    totals = param_totals(shape)
    n = totals.matmul_active
    L = shape.num_hidden_layers
    H, Q = attention_head_dims(shape)
    dense = TRAIN_FLOPS_PER_PARAM * n  # Kaplan et al. 2020
    attention = ATTENTION_TRAIN_COEFF * L * H * Q * seq_len  # PaLM App. B
    recompute = 0.0
    if checkpointed_layers:
        frac = sum(checkpointed_layers) / L
        per_layer_fwd = (FORWARD_FLOPS_PER_PARAM * (n - _non_layer_matmul(shape)) / L
                         + ATTENTION_FORWARD_COEFF * H * Q * seq_len)
        recompute += frac * L * per_layer_fwd  # one more forward of each recomputed block
    if selective:
        recompute += ATTENTION_FORWARD_COEFF * L * H * Q * seq_len
    return FlopsPerToken(dense=float(dense), attention=float(attention), recompute=float(recompute))


def _non_layer_matmul(shape: ModelShape) -> int:
    """Matmul parameters outside the blocks (the LM head)."""
    return shape.vocab_size * shape.hidden_size


def plan_flops_per_token(plan: RunPlan) -> FlopsPerToken:
    return flops_per_token(plan.shape, plan.seq_len,
                           checkpointed_layers=plan.checkpoint.checkpointed_layers(plan.shape.num_hidden_layers),
                           selective=plan.checkpoint.recomputes_attention_core)


def tokens_per_step(plan: RunPlan) -> int:
    """Global tokens per optimizer step: micro_batch · grad_accum · dp · seq_len."""
    ds = plan.ds
    return ds.micro_batch * ds.grad_accum * plan.dp * plan.seq_len


def mfu(tokens_per_s: float, model_flops_per_token: float, peak_flops_per_gpu: float, num_gpus: int) -> float:
    """MFU = achieved tokens/s × FLOPs per token ÷ (peak × GPUs) (docs/anchors.md; PaLM App. B)."""
    if tokens_per_s < 0 or peak_flops_per_gpu <= 0 or num_gpus <= 0:
        raise ValueError("tokens_per_s must be >= 0, peak and GPU count > 0")
    return tokens_per_s * model_flops_per_token / (peak_flops_per_gpu * num_gpus)
