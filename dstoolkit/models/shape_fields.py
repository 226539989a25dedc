"""ModelShape keyword arguments from a transformers (text) config and its measured counts (split from
models.from_transformers): the widths the estimator's formulas read, derived from the measured counts where the
config names them differently per family (or not at all). No torch import.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from dstoolkit.models.attention_facts import window_fields
from dstoolkit.models.block_facts import arch_fields
from dstoolkit.models.measured import ArchFacts, MeasuredParams
from dstoolkit.models.module_tree import BuildError, as_int, config_value
from dstoolkit.models.router_scoring import SCORING_KEY, sigmoid_with_expert_bias
from dstoolkit.models.shape import ATTENTION_DROPOUT_KEYS, dropout_probability


def shape_fields(text_cfg: Any, m: MeasuredParams) -> dict:
    """ModelShape keyword arguments for the estimator's formulas, from the (text) config and the measurement.

    Widths that the config names differently per family (or not at all) are derived from the measured
    counts: the dense FFN width from the dense-MLP parameters of a dense layer, the expert width from one
    routed expert, the shared-expert width from a layer's shared experts. They are effective widths (what a
    gated FFN of that many parameters would have); the exact counts stay in `measured`.
    """
    h = as_int(config_value(text_cfg, "hidden_size", "n_embd", "d_model", "dim"))
    if h is None:
        raise BuildError("the config has no hidden_size (nor n_embd / d_model)")
    heads = as_int(config_value(text_cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")) or 1
    if config_value(text_cfg, "multi_query") is True:
        kv = 1
    else:
        kv_raw = config_value(text_cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
                      "n_kv_heads")
        if isinstance(kv_raw, list) and kv_raw and all(isinstance(x, int) and x > 0 for x in kv_raw):
            kv_raw = math.gcd(*kv_raw)  # per-layer KV heads: what every layer can be split by
        if kv_raw == 0 and not isinstance(kv_raw, bool):
            raise BuildError("num_key_value_heads=0: attention needs at least one key/value head (give a divisor of "
                             "num_attention_heads, or null for multi-head attention)")
        kv = as_int(kv_raw)
    head_dim = as_int(config_value(text_cfg, "head_dim", "attention_head_dim", "kv_channels"))
    if head_dim is None:
        head_dim = max(1, h // heads)
    if kv is None or heads % kv:
        kv = heads
    vocab = as_int(config_value(text_cfg, "vocab_size", "padded_vocab_size")) or max(1, m.embedding // h)

    arch = m.arch or ArchFacts()

    def width_of(measured_each: int, named: Optional[int], gated_default: bool,
                 built: Optional[int] = None) -> tuple[int, bool]:
        # The FFN width the config names (or the built down projection reads) when the measured parameters agree
        # with it (biases aside), else the width a gated (3 matrices) or plain (2 matrices) FFN of that many
        # parameters would have; gated_default: what the built FFN is (block_facts), True when unknown.
        for width in (named, built):
            if width:
                for gated_try in (True, False):
                    w = 3 if gated_try else 2
                    if abs(measured_each - w * h * width) <= 0.01 * measured_each:
                        return width, gated_try
        w = 3 if gated_default else 2
        return max(1, measured_each // (w * h)), gated_default

    dense = [l.dense_mlp for l in m.layers if l.dense_mlp]
    inter_cfg = as_int(config_value(text_cfg, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"))
    built_gated = True if arch.mlp_gated is None else arch.mlp_gated
    if dense:
        inter, gated = width_of(max(dense), inter_cfg, built_gated, arch.mlp_width)
    else:
        inter, gated = inter_cfg or 4 * h, True
    # the key transformers' family reads for ACT2FN, else the activation module the built FFN holds (block_facts)
    act = config_value(text_cfg, *ACTIVATION_KEYS) or arch.activation
    kw: dict = dict(
        hidden_size=h, num_hidden_layers=len(m.layers), num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, intermediate_size=max(1, inter), vocab_size=vocab, tie_word_embeddings=m.lm_head == 0,
        mlp_gated=gated, max_position_embeddings=as_int(config_value(text_cfg, "max_position_embeddings", "n_positions")),
        hidden_act=str(act or "silu"),
    )
    kw.update(arch_fields(text_cfg, arch, head_dim))
    kw.update(window_fields(text_cfg, m))
    if config_value(text_cfg, "attention_bias") is True:
        kw["attention_bias"] = True
    # the attention dropout the config trains with (transformers' per-family defaults: GPT-2 attn_pdrop 0.1,
    # Bloom / Llama-style attention_dropout 0.0); models.hf refuses a value that is not a probability, naming its
    # key, before the build
    drop = config_value(text_cfg, *ATTENTION_DROPOUT_KEYS)
    if drop is not None:
        kw["attention_dropout"] = dropout_probability(drop)
    qkv_width = (heads + 2 * kv) * head_dim
    if any(g.role == "attention" and g.layers and g.in_features == h and g.out_features == qkv_width
           for g in m.linear_layers()):
        kw["qkv_fused"] = True  # one projection makes q, k and v (GPT-NeoX query_key_value, Falcon, Phi-3 qkv_proj)
    moe = [l for l in m.layers if l.is_moe]
    if moe:
        each = max(l.expert_params_each for l in moe)
        named = as_int(config_value(text_cfg, "moe_intermediate_size", "expert_intermediate_size"))
        if named is None and not dense:
            named = inter_cfg  # Mixtral / GPT-OSS name the expert width intermediate_size
        ie, gated_e = width_of(each, named, gated)
        kw.update(num_experts=max(l.num_experts for l in moe), num_experts_per_tok=max(l.experts_per_tok for l in moe),
                  moe_intermediate_size=ie, mlp_gated=gated_e,
                  mlp_only_layers=tuple(l.index for l in m.layers if not l.is_moe))
        # a router that holds e_score_correction_bias: sigmoid + expert bias when the config's scoring_func (its
        # class default on the built config) or the model_type's default (router_scoring) is sigmoid
        flag, note = sigmoid_with_expert_bias(config_value(text_cfg, "model_type"),
                                              config_value(text_cfg, SCORING_KEY), arch.router_score_bias)
        if flag:
            kw["router_score_correction_bias"] = True
        if note:
            kw["notes"] = (note,)
        norm_topk = config_value(text_cfg, "norm_topk_prob")
        if isinstance(norm_topk, bool):  # the family's config default when the file leaves it out
            kw["norm_topk_prob"] = norm_topk
        shared = max(l.shared_experts for l in moe)
        if shared:
            kw["shared_expert_intermediate_size"] = max(1, shared // ((3 if gated_e else 2) * h))
            kw["shared_expert_gate"] = arch.shared_expert_gate
    mla = {k: as_int(config_value(text_cfg, k)) for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    if all(mla.values()):
        kw.update(mla, q_lora_rank=as_int(config_value(text_cfg, "q_lora_rank")), head_dim=None, num_key_value_heads=None)
        kw.pop("rotary_fraction", None)  # MLA turns its own qk_rope_head_dim channels, not a share of a head
    return kw


ACTIVATION_KEYS = ("hidden_act", "activation_function", "activation", "hidden_activation")
"""The keys transformers' families name the FFN activation by (Llama-style, GPT-2, Falcon, Gemma)."""
