"""Bundled model shapes, written from public facts (model cards, papers, published config.json values).

Nothing is downloaded. Each preset cites where its numbers come from; `tests/unit/test_params_presets.py`
pins the resulting counts to the published totals in docs/anchors.md.
"""
from __future__ import annotations

import difflib

from dstoolkit.models.shape import ModelShape

LLAMA3_VOCAB = 128256
"""Llama 3 / 3.1 tokenizer size (tiktoken-based, 128K tokens + 256 special), Llama 3 model card."""

PRESETS: dict[str, ModelShape] = {
    # Llama 3 8B: Meta Llama 3 model card / config.json: hidden 4096, 32 layers, 32 heads, 8 KV heads (GQA),
    # SwiGLU FFN 14336, vocab 128256, untied embeddings, 8K context. Published: 8.03B.
    "llama-3-8b": ModelShape(
        name="llama-3-8b", model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    # Llama 3 70B: model card / config.json: hidden 8192, 80 layers, 64 heads, 8 KV heads, FFN 28672.
    # Published: 70.6B.
    "llama-3-70b": ModelShape(
        name="llama-3-70b", model_type="llama", hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=28672, vocab_size=LLAMA3_VOCAB, tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    # Llama 3.1 405B: "The Llama 3 Herd of Models" (arXiv 2407.21783) Table 3: 126 layers, model dim 16384,
    # FFN 53248, 128 heads, 8 KV heads, vocab 128K; 128K context. Published: 405.9B (model card).
    "llama-3.1-405b": ModelShape(
        name="llama-3.1-405b", model_type="llama", hidden_size=16384, num_hidden_layers=126,
        num_attention_heads=128, num_key_value_heads=8, intermediate_size=53248, vocab_size=LLAMA3_VOCAB,
        tie_word_embeddings=False, max_position_embeddings=131072,
    ),
    # Mixtral 8x7B: "Mixtral of Experts" (arXiv 2401.04088) Table 1: dim 4096, 32 layers, head_dim 128,
    # 32 heads, 8 KV heads, hidden_dim 14336, vocab 32000, 8 experts, top-2, context 32768.
    # Published: 46.7B total, 12.9B active (docs/anchors.md; embeddings counted).
    "mixtral-8x7b": ModelShape(
        name="mixtral-8x7b", model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, tie_word_embeddings=False,
        max_position_embeddings=32768, num_experts=8, num_experts_per_tok=2,
    ),
    # DeepSeek-V3: arXiv 2412.19437 §4.2 and the public config.json: 61 layers, hidden 7168, first 3 layers
    # dense (FFN 18432); MoE layers 1 shared + 256 routed experts of FFN 2048, top-8; MLA with 128 heads,
    # qk_nope 128 + qk_rope 64, q_lora_rank 1536, kv_lora_rank 512, v_head_dim 128; vocab 129280; untied;
    # router with e_score_correction_bias (auxiliary-loss-free balancing, §2.1.2). One MTP module
    # (num_nextn_predict_layers=1) is excluded from counts. Published: 671B total, 37B active.
    "deepseek-v3": ModelShape(
        name="deepseek-v3", model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432, vocab_size=129280,
        tie_word_embeddings=False, max_position_embeddings=163840,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=2048, num_shared_experts=1,
        first_k_dense_replace=3, moe_layer_freq=1, router_score_correction_bias=True, num_nextn_predict_layers=1,
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    ),
    # Tiny llama-style dense model for CPU demos and real 2-rank runs: big enough that weights dominate
    # DeepSpeed's buffers, small enough that a 2-rank CPU step is well under a second (3.95M parameters).
    "tiny": ModelShape(
        name="tiny", model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, intermediate_size=688, vocab_size=2048, tie_word_embeddings=False,
        max_position_embeddings=2048,
    ),
    # Tiny Mixtral-style MoE: "tiny" with 4 experts (FFN 688 each), top-2 routing.
    "tiny-moe": ModelShape(
        name="tiny-moe", model_type="mixtral", hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, intermediate_size=688, vocab_size=2048, tie_word_embeddings=False,
        max_position_embeddings=2048, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=688,
    ),
}


def get_preset(name: str) -> ModelShape:
    """Return a bundled model shape by name (case-insensitive).

    Args:
        name: A preset name such as "llama-3-8b" or "tiny-moe".

    Raises:
        ValueError: Unknown name; the message lists the presets and a did-you-mean.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key in PRESETS:
        return PRESETS[key]
    close = difflib.get_close_matches(str(key), list(PRESETS), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown model preset {name!r} ({hint}known presets: {', '.join(PRESETS)})")
