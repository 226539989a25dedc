"""Exact parameter counts from a `ModelShape` (no torch).

Counts follow the Hugging Face module layouts of each family, weight by weight:
- Llama / Mistral / Qwen2 / Qwen3: embed_tokens, per layer input_layernorm, q/k/v/o_proj (GQA; Qwen2 adds
  q/k/v biases; Qwen3 adds per-head q_norm/k_norm), post_attention_layernorm, gate/up/down_proj (SwiGLU),
  final norm, lm_head (absent when tied).
- Mixtral: block_sparse_moe.gate (router, no bias) + experts w1/w2/w3.
- Qwen2-MoE: mlp.gate (router), experts, shared_expert (gate/up/down) and shared_expert_gate (hidden -> 1).
- DeepSeek-V2/V3 MLA: q_proj, or q_a_proj + q_a_layernorm + q_b_proj when q_lora_rank is set;
  kv_a_proj_with_mqa (-> kv_lora_rank + qk_rope_head_dim), kv_a_layernorm, kv_b_proj, o_proj.
  MoE: gate.weight, routed experts, shared_experts (one MLP of width n_shared_experts * moe_intermediate_size).
  V3's gate.e_score_correction_bias is a buffer, not a parameter (`ParamCount.buffers`). The MTP module
  (num_nextn_predict_layers) is excluded.
- GPT-2: wte, wpe (learned positions), ln_1/ln_2/ln_f with bias, c_attn/c_proj and c_fc/c_proj with biases.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from dstoolkit.models.measured import MeasuredParams
from dstoolkit.models.shape import ModelShape


class ParamCount(BaseModel):
    """Exact parameter counts by component. All counts are whole-model (all layers), in parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    total: int
    """Every parameter (embedding + lm_head + attention + dense_mlp + routed_experts + shared_experts + router + norms
    + other + tower)."""
    active: int
    """Parameters a token touches: total - routed_experts + num_experts_per_tok experts per MoE layer."""
    embedding: int
    """Input token embedding plus learned position table (GPT-2)."""
    lm_head: int
    """Output projection; 0 when tied to the input embedding."""
    attention: int
    """All attention projections and their biases, plus norms inside attention (MLA q_a/kv_a layernorms,
    Qwen3 q_norm/k_norm), all layers."""
    dense_mlp: int
    """All dense-FFN layers (every layer of a dense model; DeepSeek first_k_dense_replace / Qwen mlp_only_layers)."""
    routed_experts: int
    """All routed expert weights, all MoE layers."""
    shared_experts: int
    """Shared experts, including Qwen-MoE's shared_expert_gate."""
    router: int
    """Router/gate weights (trainable parameters only: DeepSeek-V3's e_score_correction_bias is in `buffers`)."""
    norms: int
    """Per-layer input/post-attention norms and the final norm."""
    expert_params_each: int
    """Parameters of one routed expert (0 for a dense model)."""
    num_moe_layers: int = 0
    """MoE layers counted."""
    other: int = 0
    """Parameters outside every role above (learned scalars, per-layer extras); transformers-measured shapes only."""
    tower: int = 0
    """A multimodal model's vision/audio towers and projectors (`MeasuredParams.vision_params`): in total, not in
    active; transformers-measured shapes only."""
    buffers: int = 0
    """Elements of registered buffers that hold model state, in no field above and not in total or active:
    DeepSeek-V3's router `e_score_correction_bias`, one fp32 element per routed expert per MoE layer (transformers
    5 DeepseekV3TopkRouter registers it with nn.Buffer and keeps it in fp32, `_keep_in_fp32_modules_strict`). No
    gradient (it only picks the top-k indices), no optimizer state, no FLOPs: the balancing rule updates it outside
    the optimizer. The state dict holds it (estimate.checkpoint_bytes counts it, fp32, 59 KB on DeepSeek-V3). A
    transformers-measured shape: `MeasuredParams.buffers_not_counted`."""
    source: str = "analytic"
    """analytic (this module's formulas) or transformers (meta-device build, `ModelShape.measured`)."""

    @property
    def non_expert(self) -> int:
        """Everything except routed experts (replicated across expert-parallel ranks)."""
        return self.total - self.routed_experts

    @property
    def non_embedding(self) -> int:
        """total minus the input embedding (and learned positions) and the untied lm_head: Kaplan et al.'s N,
        and the "non-embedding" figure Qwen model cards publish (a multimodal model's towers left out)."""
        return self.total - self.embedding - self.lm_head - self.tower

    @property
    def active_non_embedding(self) -> int:
        """active minus the embedding tables and the untied lm_head."""
        return self.active - self.embedding - self.lm_head


def _linear(n_in: int, n_out: int, bias: bool) -> int:
    return n_in * n_out + (n_out if bias else 0)


def _norm(width: int, shape: ModelShape) -> int:
    return width * (2 if shape.norm_type == "layernorm" else 1)


def _mlp(shape: ModelShape, ffn: int, bias: bool) -> int:
    """One FFN: gated (gate, up, down) or plain (up, down); biases on every projection when `bias`."""
    h = shape.hidden_size
    n = _linear(h, ffn, bias) + _linear(ffn, h, bias)
    if shape.mlp_gated:
        n += _linear(h, ffn, bias)
    return n


def attention_params_per_layer(shape: ModelShape) -> int:
    """Parameters of one attention block (projections, biases and attention-internal norms)."""
    h, a = shape.hidden_size, shape.num_attention_heads
    if shape.is_mla:
        # DeepSeek-V2 §2.1 (MLA); HF DeepseekV2Attention / DeepseekV3Attention module layout.
        qk = shape.q_head_dim
        kv_rank, rope = shape.kv_lora_rank or 0, shape.qk_rope_head_dim or 0
        if shape.q_lora_rank is None:
            n = _linear(h, a * qk, False)  # q_proj
        else:
            n = _linear(h, shape.q_lora_rank, shape.attention_bias)  # q_a_proj
            n += _norm(shape.q_lora_rank, shape)  # q_a_layernorm
            n += _linear(shape.q_lora_rank, a * qk, False)  # q_b_proj
        n += _linear(h, kv_rank + rope, shape.attention_bias)  # kv_a_proj_with_mqa
        n += _norm(kv_rank, shape)  # kv_a_layernorm
        n += _linear(kv_rank, a * ((shape.qk_nope_head_dim or 0) + (shape.v_head_dim or 0)), False)  # kv_b_proj
        n += _linear(a * (shape.v_head_dim or 0), h, shape.o_proj_bias)  # o_proj
        return n
    d, kv = shape.head_size, shape.kv_heads
    n = _linear(h, a * d, shape.attention_bias)  # q_proj
    n += 2 * _linear(h, kv * d, shape.attention_bias)  # k_proj, v_proj
    n += _linear(a * d, h, shape.o_proj_bias)  # o_proj
    if shape.qk_norm:
        n += 2 * _norm(d, shape)  # q_norm, k_norm over head_dim
    return n


def count_measured(m: MeasuredParams) -> ParamCount:
    """A `ParamCount` from a transformers meta-device measurement (exact; buffers not counted)."""
    roles = m.by_role()
    return ParamCount(
        total=m.total, active=m.active, embedding=roles["embedding"], lm_head=roles["lm_head"],
        attention=roles["attention"], dense_mlp=roles["dense_mlp"], routed_experts=roles["routed_experts"],
        shared_experts=roles["shared_experts"], router=roles["router"], norms=roles["norms"],
        expert_params_each=max((l.expert_params_each for l in m.layers), default=0),
        num_moe_layers=m.num_moe_layers, other=roles["other"], tower=m.vision_params, buffers=m.buffers_not_counted,
        source="transformers",
    )


def count_params(shape: ModelShape) -> ParamCount:
    """Count the parameters of `shape` exactly.

    Args:
        shape: The model shape.

    Returns:
        A `ParamCount` with the total, the active count (top-k routed experts per MoE layer) and a breakdown.
        For a shape that transformers built (`shape.measured` set) the measured counts, exact for any
        architecture; otherwise this module's per-family formulas.
    """
    if shape.measured is not None:
        return count_measured(shape.measured)
    h, L, V = shape.hidden_size, shape.num_hidden_layers, shape.vocab_size

    embedding = V * h
    if shape.learned_positions:
        if shape.max_position_embeddings is None:
            raise ValueError("learned_positions=True needs max_position_embeddings (the position-table size)")
        embedding += shape.max_position_embeddings * h
    lm_head = 0 if shape.tie_word_embeddings else V * h

    attention = L * attention_params_per_layer(shape)
    norms = L * 2 * _norm(h, shape) + _norm(h, shape)  # input + post-attention norm per layer, final norm

    n_moe = shape.num_moe_layers
    n_dense = L - n_moe
    dense_mlp = n_dense * _mlp(shape, shape.intermediate_size, shape.mlp_bias)

    expert_each = _mlp(shape, shape.expert_ffn_size, False) if shape.is_moe else 0
    routed = n_moe * shape.num_experts * expert_each

    router = n_moe * shape.num_experts * h if shape.is_moe else 0
    # DeepSeek-V3 gate.e_score_correction_bias: a buffer (ParamCount.buffers), not a parameter
    buffers = n_moe * shape.num_experts if shape.is_moe and shape.router_score_correction_bias else 0

    shared_per_layer = 0
    if shape.num_shared_experts:
        # DeepSeek: n_shared experts of width moe_intermediate_size, fused into one MLP (same count).
        shared_per_layer += _mlp(shape, shape.num_shared_experts * shape.expert_ffn_size, False)
    if shape.shared_expert_intermediate_size:
        # Qwen2-MoE: one shared expert plus its sigmoid gate Linear(hidden, 1, bias=False).
        shared_per_layer += _mlp(shape, shape.shared_expert_intermediate_size, False) + h
    shared = n_moe * shared_per_layer

    total = embedding + lm_head + attention + dense_mlp + routed + shared + router + norms
    active = total - routed + n_moe * shape.num_experts_per_tok * expert_each
    return ParamCount(
        total=total,
        active=active,
        embedding=embedding,
        lm_head=lm_head,
        attention=attention,
        dense_mlp=dense_mlp,
        routed_experts=routed,
        shared_experts=shared,
        router=router,
        norms=norms,
        expert_params_each=expert_each,
        num_moe_layers=n_moe,
        buffers=buffers,
    )
