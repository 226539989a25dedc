"""Per-layer attention facts of a transformers build (split from models.module_tree): each softmax-attention
layer's width and the keys one query may attend to. torch is not imported here; nothing imports transformers."""
from __future__ import annotations

import sys
from typing import Optional

from dstoolkit.models.module_tree import as_int, config_value

WINDOW_KEYS = {
    # transformers' layer_types -> the config field bounding the keys one query attends to.
    "sliding_attention": ("sliding_window",),  # Mistral/Gemma/GPT-OSS/MiMo local layers (window of w keys)
    "chunked_attention": ("attention_chunk_size",),  # Llama 4 iRoPE local layers (keys of the query's chunk)
    "indexed_attention": ("index_topk",),  # DeepSeek-V3.2 DSA: the lightning indexer selects top-k keys
}
"""Attention layer types whose quadratic term is bounded (DeepSeek-V3.2 report §2.1: core attention O(L·k))."""


def attention_facts(model, parts: dict, text_cfg) -> None:
    """Per softmax-attention layer: its width (query heads x q.k head width, from the built module) and the
    keys one query may attend to (`layer_types` of the config: sliding window, chunk, DSA top-k; without them
    the window the config applies to every layer, `uniform_window`)."""
    prefix, layers = parts["prefix"], parts["layers"]
    if prefix is None:
        return
    heads = config_value(text_cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    types = config_value(text_cfg, "layer_types")
    modules = dict(model.named_modules())
    uniform = uniform_window(model, text_cfg)
    for rec in layers:
        if rec["mixer"] != "attention":
            continue
        i = rec["index"]
        kind = types[i] if isinstance(types, (list, tuple)) and i < len(types) and isinstance(types[i], str) \
            else "full_attention" if uniform is None else "sliding_attention"
        rec["attention_kind"] = kind
        keys = WINDOW_KEYS.get(kind)
        rec["attention_window"] = uniform if uniform is not None else \
            as_int(config_value(text_cfg, *keys)) if keys else None
        here = f"{prefix}.{i}."
        mod = next((m for path, m in modules.items() if path.startswith(here) and "Attention" in type(m).__name__
                    and isinstance(getattr(m, "qk_head_dim", getattr(m, "head_dim", None)), int)), None)
        layer_heads = heads[i] if isinstance(heads, list) and i < len(heads) else heads
        if mod is not None and isinstance(layer_heads, int):
            hd = getattr(mod, "qk_head_dim", None) or getattr(mod, "head_dim")
            rec["attention_width"] = layer_heads * hd


UNIFORM_WINDOW_MASK = "create_sliding_window_causal_mask"
"""The masking function (transformers.masking_utils) a family's modelling code imports when it bounds attention by
the config's sliding_window."""


def uniform_window(model, text_cfg) -> Optional[int]:
    """The window the config applies to every attention layer, or None.

    transformers families without `layer_types` that bound attention by `sliding_window` (Mistral, Mixtral,
    StarCoder2, Phi-3, PhiMoE, Qwen3-MoE, MiniMax, Doge, ...) pass `config.sliding_window` to every layer's
    attention and build `create_sliding_window_causal_mask` whenever it is not None (e.g. modeling_mistral.py:
    `mask_function = create_causal_mask if self.config.sliding_window is None else
    create_sliding_window_causal_mask`). So: the built config's `sliding_window` after its own __init__
    normalisation (Qwen3MoeConfig sets None without use_sliding_window; Qwen2-MoE's 0 is no window) is a positive
    int, the config has no layer_types (those families window per layer, models.attention_facts.WINDOW_KEYS), and
    a module the model is built from imports that mask. A family whose modelling code never imports it keeps its
    sliding_window unread (full attention), as transformers does."""
    if isinstance(config_value(text_cfg, "layer_types"), (list, tuple)):
        return None
    window = as_int(config_value(text_cfg, "sliding_window"))
    if window is None or window <= 0:
        return None
    modules = (sys.modules.get(type(m).__module__) for m in model.modules())
    return window if any(hasattr(mod, UNIFORM_WINDOW_MASK) for mod in modules if mod is not None) else None


def window_fields(text_cfg, m) -> dict:
    """ModelShape.sliding_window of a build whose config applies one window to every attention layer without
    layer_types (the layers' attention_window, `uniform_window`); {} otherwise (layer_types windows stay per layer
    in `measured`)."""
    windows = {layer.attention_window for layer in m.layers if layer.mixer == "attention"}
    if isinstance(config_value(text_cfg, "layer_types"), (list, tuple)) or len(windows) != 1 or None in windows:
        return {}
    return {"sliding_window": windows.pop()}
