"""The model shape every estimator, generator and real run works from (no torch import).

Field names follow Hugging Face `config.json` names so that a shape reads like the config it came from.
Readers (`dstoolkit.models.hf`) and presets (`dstoolkit.models.presets`) produce a `ModelShape`;
`dstoolkit.models.params.count_params(shape)` counts its parameters exactly.
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field


class ModelShape(BaseModel):
    """Architecture facts of a decoder-only transformer (dense, MoE, MLA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "model"
    """Display name (preset name or the config file's stem)."""
    model_type: str
    """HF `model_type`: llama, mistral, mixtral, qwen2, qwen2_moe, deepseek_v2, deepseek_v3, gpt2, ... ."""
    hidden_size: int = Field(gt=0)
    """h: width of the residual stream."""
    num_hidden_layers: int = Field(gt=0)
    """L: number of transformer blocks."""
    num_attention_heads: int = Field(gt=0)
    """a: query heads."""
    num_key_value_heads: Optional[int] = Field(default=None, gt=0)
    """KV heads for GQA/MQA; None means equal to num_attention_heads."""
    head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head width; None means hidden_size // num_attention_heads."""
    intermediate_size: int = Field(gt=0)
    """Dense FFN width (also the dense layers of DeepSeek-style models)."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size V."""
    tie_word_embeddings: bool = False
    """Whether the LM head shares the input embedding matrix."""
    attention_bias: bool = False
    """q/k/v projection biases (Qwen2 has them; o_proj has none)."""
    mlp_gated: bool = True
    """SwiGLU-style gate+up+down (3 matrices) when True; plain up+down (2 matrices) when False."""
    max_position_embeddings: Optional[int] = None
    """Learned absolute position table size (GPT-2 style), counted only when learned_positions is True."""
    learned_positions: bool = False
    """True for models with a learned position-embedding table (GPT-2); RoPE models have none."""

    # --- Mixture of experts (0 experts = dense) ---
    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer (Mixtral num_local_experts, Qwen-MoE num_experts, DeepSeek n_routed_experts)."""
    num_experts_per_tok: int = Field(default=0, ge=0)
    """Top-k routed experts each token activates."""
    moe_intermediate_size: Optional[int] = Field(default=None, gt=0)
    """FFN width of one routed expert; None means intermediate_size (Mixtral)."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Always-active shared experts (DeepSeek n_shared_experts); each has moe_intermediate_size width."""
    shared_expert_intermediate_size: Optional[int] = Field(default=None, gt=0)
    """Qwen-MoE: width of the single shared expert (which also has a 1-output sigmoid gate)."""
    first_k_dense_replace: int = Field(default=0, ge=0)
    """DeepSeek: the first k layers use a dense FFN instead of MoE."""
    moe_layer_freq: int = Field(default=1, ge=1)
    """DeepSeek: every moe_layer_freq-th layer (after first_k_dense_replace) is MoE."""

    # --- Multi-head latent attention (DeepSeek-V2/V3); all None for standard attention ---
    q_lora_rank: Optional[int] = Field(default=None, gt=0)
    """Rank of the query down-projection; None means a full q_proj (DeepSeek-V2-Lite)."""
    kv_lora_rank: Optional[int] = Field(default=None, gt=0)
    """Rank of the joint KV compression (its presence turns MLA on)."""
    qk_rope_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head rotary part of q/k."""
    qk_nope_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head non-rotary part of q/k."""
    v_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head value width."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, layer_index: int) -> bool:
        """DeepSeek/Qwen-MoE convention: layer i is MoE when i >= first_k_dense_replace and i % freq == 0."""
        if not self.is_moe:
            return False
        return layer_index >= self.first_k_dense_replace and layer_index % self.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))
