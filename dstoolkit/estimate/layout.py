"""Ordered parameter layout of a `ModelShape`, in Hugging Face / `dstoolkit.runtime.model` module order.

DeepSpeed ZeRO-1/2 flattens each parameter group in registration order and cuts the flat buffer into
equal partitions, so *which* parameters land on a rank (and how many elements a rank's gradient buffer
holds) depends on this order. Building the ordered list from the shape lets the estimator reproduce
DeepSpeed's partition boundaries exactly instead of assuming Ψ/N.

No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dstoolkit.models.measured import TOKEN_EMBEDDING_NAME, ParamEntry, measured_layout
from dstoolkit.models.shape import ModelShape


def _attention_entries(shape: ModelShape, i: int) -> list[ParamEntry]:
    h = shape.hidden_size
    a = shape.num_attention_heads
    pre = f"blocks.{i}.self_attn."
    out: list[ParamEntry] = []

    def add(n: str, numel: int, tp: bool = True) -> None:
        out.append(ParamEntry(pre + n, numel, "attention", i, tp))

    if shape.is_mla:
        # DeepSeek-V2/V3 multi-head latent attention (HF modeling_deepseek.py module layout).
        qk_head = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
        v_head = shape.v_head_dim or shape.head_size
        if shape.q_lora_rank:
            add("q_a_proj.weight", h * shape.q_lora_rank, False)
            add("q_a_layernorm.weight", shape.q_lora_rank, False)
            add("q_b_proj.weight", shape.q_lora_rank * a * qk_head)
        else:
            add("q_proj.weight", h * a * qk_head)
        kv_lora = shape.kv_lora_rank or 0
        add("kv_a_proj_with_mqa.weight", h * (kv_lora + (shape.qk_rope_head_dim or 0)), False)
        add("kv_a_layernorm.weight", kv_lora, False)
        add("kv_b_proj.weight", kv_lora * a * ((shape.qk_nope_head_dim or 0) + v_head))
        add("o_proj.weight", a * v_head * h)
        if shape.o_proj_bias:
            add("o_proj.bias", h, False)
        return out
    d = shape.head_size
    kv = shape.kv_heads
    add("q_proj.weight", h * a * d)
    if shape.attention_bias:
        add("q_proj.bias", a * d)
    add("k_proj.weight", h * kv * d)
    if shape.attention_bias:
        add("k_proj.bias", kv * d)
    add("v_proj.weight", h * kv * d)
    if shape.attention_bias:
        add("v_proj.bias", kv * d)
    add("o_proj.weight", a * d * h)
    if shape.o_proj_bias:
        add("o_proj.bias", h, False)
    if shape.qk_norm:  # Qwen3: RMSNorm over head_dim on q and k
        add("q_norm.weight", _norm_numel(d, shape), False)
        add("k_norm.weight", _norm_numel(d, shape), False)
    return out


def _norm_numel(width: int, shape: ModelShape) -> int:
    """RMSNorm has a weight; LayerNorm (GPT-2) a weight and a bias, counted together as one entry."""
    return width * (2 if shape.norm_type == "layernorm" else 1)


def _mlp_entries(prefix: str, h: int, inter: int, gated: bool, kind: str, layer: int,
                 bias: bool = False) -> list[ParamEntry]:
    out = []
    if gated:
        out.append(ParamEntry(prefix + "gate_proj.weight", h * inter, kind, layer, True))
        if bias:
            out.append(ParamEntry(prefix + "gate_proj.bias", inter, kind, layer, True))
    out.append(ParamEntry(prefix + "up_proj.weight", h * inter, kind, layer, True))
    if bias:
        out.append(ParamEntry(prefix + "up_proj.bias", inter, kind, layer, True))
    out.append(ParamEntry(prefix + "down_proj.weight", inter * h, kind, layer, True))
    if bias:
        out.append(ParamEntry(prefix + "down_proj.bias", h, kind, layer, False))
    return out


@lru_cache(maxsize=64)
def param_layout(shape: ModelShape) -> tuple[ParamEntry, ...]:
    """All parameter tensors of `shape` in module registration order (embedding, blocks, norm, lm_head).

    MoE blocks follow DeepSpeed's native MoE layout (router `gate.wg` first, then experts), which is also
    the HF order (Mixtral: gate then experts; DeepSeek: gate, experts, shared experts). A shape built by
    transformers on the meta device (`shape.measured`) is laid out from its exact per-layer, per-role counts
    (hybrid mixers, per-layer widths), never from the analytic formulas.
    """
    if shape.measured is not None:
        return measured_layout(shape.measured)
    h = shape.hidden_size
    out: list[ParamEntry] = [ParamEntry(TOKEN_EMBEDDING_NAME, shape.vocab_size * h, "embedding", -1, True)]
    if shape.learned_positions and shape.max_position_embeddings:
        out.append(ParamEntry("embed_positions.weight", shape.max_position_embeddings * h, "embedding", -1, False))
    for i in range(shape.num_hidden_layers):
        out.append(ParamEntry(f"blocks.{i}.input_layernorm.weight", _norm_numel(h, shape), "norm", i, False))
        out.extend(_attention_entries(shape, i))
        out.append(ParamEntry(f"blocks.{i}.post_attention_layernorm.weight", _norm_numel(h, shape), "norm", i, False))
        pre = f"blocks.{i}.mlp."
        if shape.is_moe_layer(i):
            out.append(ParamEntry(pre + "gate.wg.weight", h * shape.num_experts, "router", i, False))
            for e in range(shape.num_experts):
                out.extend(_mlp_entries(f"{pre}experts.{e}.", h, shape.expert_ffn_size, shape.mlp_gated, "expert", i))
            if shape.num_shared_experts > 0:
                out.extend(_mlp_entries(pre + "shared_expert.", h, shape.num_shared_experts * shape.expert_ffn_size,
                                        shape.mlp_gated, "shared_expert", i))
            elif shape.shared_expert_intermediate_size:
                out.extend(_mlp_entries(pre + "shared_expert.", h, shape.shared_expert_intermediate_size,
                                        shape.mlp_gated, "shared_expert", i))
                out.append(ParamEntry(pre + "shared_expert_gate.weight", h, "router", i, False))
        else:
            out.extend(_mlp_entries(pre, h, shape.intermediate_size, shape.mlp_gated, "dense_mlp", i, shape.mlp_bias))
    out.append(ParamEntry("norm.weight", _norm_numel(h, shape), "norm", -1, False))
    if not shape.tie_word_embeddings:
        out.append(ParamEntry("lm_head.weight", shape.vocab_size * h, "lm_head", -1, True))
    return tuple(out)


@dataclass(frozen=True)
class ParamTotals:
    """Parameter totals derived from the layout."""

    total: int
    active: int
    """Parameters one token touches: total less the routed experts it is not sent to and a multimodal model's
    vision/audio towers (kind "tower": they run on image / audio inputs, not on text tokens)."""
    embedding: int
    lm_head: int
    expert: int
    """All routed-expert parameters (every expert of every MoE layer)."""
    matmul_active: int
    """Parameters that take part in a matmul for one token (excludes the input embedding lookup and norms;
    includes the LM head and only the top-k routed experts). This is the N of 6N FLOPs."""


@lru_cache(maxsize=64)
def param_totals(shape: ModelShape) -> ParamTotals:
    """Totals for `shape` (routed experts counted at top-k for `active`)."""
    layout = param_layout(shape)
    total = sum(p.numel for p in layout)
    expert = sum(p.numel for p in layout if p.kind == "expert")
    k_frac = (shape.num_experts_per_tok / shape.num_experts) if shape.is_moe else 0.0
    inactive = int(round(expert * (1.0 - k_frac)))
    tower = sum(p.numel for p in layout if p.kind == "tower")
    active = total - inactive - tower
    emb = sum(p.numel for p in layout if p.kind == "embedding")
    head = sum(p.numel for p in layout if p.kind == "lm_head")
    norms = sum(p.numel for p in layout if p.kind == "norm")
    matmul = active - emb - norms + (emb if shape.tie_word_embeddings else 0)
    if shape.tie_word_embeddings:  # the tied matrix is used once as the LM head matmul
        matmul = active - norms - sum(p.numel for p in layout if p.name == "embed_positions.weight")
    return ParamTotals(total=total, active=active, embedding=emb, lm_head=head, expert=expert,
                       matmul_active=matmul)
