"""Shrink a Hugging Face config so that its own transformers architecture trains on 2 CPU ranks in seconds.

`shrink_config(config, sizes)` returns a copy of the language-model config (the `text_config` of a
multimodal config) with small sizes and the architecture kept:

kept      model_type and the class transformers builds for it, attention kind (GQA/MQA/MHA ratio class,
          MLA with its LoRA ranks, sliding / chunked / linear / Mamba mixers, DSA indexer), the per-layer
          pattern (`layer_types`, `hybrid_override_pattern`, per-layer lists, attention/MoE intervals), MoE
          routing top-k, shared experts, grouped routing, dense-first layers, norms, activations, biases,
          tied embeddings, RoPE settings.
shrunk    depth (the shortest prefix holding every layer kind of every per-layer pattern, at least
          `min_layers`), hidden size, query / KV / linear-attention / Mamba heads (in proportion), every head
          width (in proportion to head_dim), FFN / expert / shared-expert / latent widths (in proportion to
          hidden), routed experts (top-k kept; at least 2 x top-k so routing still chooses), vocabulary,
          attention windows and DSA top-k (so a short sequence still exercises them), SSM state.

The shrink is a pure function of the config dict (no torch import): the trainer, `dstoolkit bench train` and
`dstoolkit tune --mode real` build the result with transformers (`dstoolkit.runtime.hf_model.build_hf_model`).
Anything it cannot shrink is a `ShrinkError` naming the field, the value and the fix. The sizes asked for and
`--shrink` parsing: `dstoolkit.runtime.shrink_sizes`; a shrunk run of a spec: `dstoolkit.runtime.shrink_run`.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from dstoolkit.models.config_keys import EXPERT_KEYS, TOPK_KEYS
from dstoolkit.runtime.shrink_sizes import ShrinkError, ShrinkSizes

MAX_SHRUNK_PARAMS = 20_000_000
"""A shrunk copy above this many parameters is refused: some width field was not recognised (the error names
the largest tensor), and a 2-rank CPU run of it would take minutes, not seconds."""

MAX_AUTO_DEPTH = 12
"""A pattern whose layer kinds need a deeper prefix than this is refused (e.g. per-layer block_configs that
all differ): a shrunk run is meant to take seconds."""

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
QUERY_HEAD_KEYS = ("num_attention_heads", "n_head")
# Head counts scaled like the query heads (ratio to num_attention_heads kept, divisibility checked).
PROPORTIONAL_HEAD_KEYS = ("num_key_value_heads", "num_global_key_value_heads", "swa_num_attention_heads",
                          "swa_num_key_value_heads", "index_n_heads", "linear_num_key_heads",
                          "linear_num_value_heads", "mamba_num_heads", "n_groups", "o_groups")
# Per-head widths, scaled by one factor (target head_dim / the config's head_dim), kept even for RoPE.
HEAD_WIDTH_KEYS = ("head_dim", "global_head_dim", "swa_head_dim", "v_head_dim", "swa_v_head_dim",
                   "qk_rope_head_dim", "qk_nope_head_dim", "index_head_dim", "linear_key_head_dim",
                   "linear_value_head_dim", "mamba_head_dim", "attention_head_dim", "rotary_dim")
# Widths scaled with the hidden size (ratio to hidden kept), rounded to a multiple of 8.
HIDDEN_WIDTH_KEYS = ("intermediate_size", "intermediate_size_mlp", "dense_intermediate_size", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "share_expert_dim",
                     "shared_intermediate_size", "routed_expert_hidden_size", "moe_latent_size", "q_lora_rank",
                     "kv_lora_rank", "o_lora_rank", "time_step_rank", "hidden_size_per_layer_input",
                     "ffn_hidden_size", "n_inner")
VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")
WINDOW_KEYS = ("sliding_window", "sliding_window_size", "attention_chunk_size", "index_topk")
STATE_KEYS = ("ssm_state_size", "state_size", "d_state")
# Interval fields: one layer in every N has the other kind; depth must reach N to hold both.
PERIOD_KEYS = ("full_attention_interval", "sliding_window_pattern", "interleave_moe_layer_step",
               "decoder_sparse_step", "moe_layer_freq", "attn_layer_period", "expert_layer_period")
PERIOD_OFFSETS = {"attn_layer_period": "attn_layer_offset", "expert_layer_period": "expert_layer_offset"}
# Dense-first layers: kept at 1 (one dense layer, then MoE) when the config has more.
DENSE_FIRST_KEYS = ("first_k_dense_replace", "num_hash_layers")
# Layer counts that must not exceed the shrunk depth.
LAYER_COUNT_KEYS = ("max_window_layers",)
# Per-layer index lists (kept where the index is below the new depth).
LAYER_INDEX_KEYS = ("mlp_only_layers", "no_rope_layer_indices", "moe_layers")
DROPPED_KEYS = ("quantization_config",)


@dataclass(frozen=True)
class Shrunk:
    """A shrunk language-model config and what was done to it."""

    config: dict
    """The shrunk config (the language model's: a multimodal config's text_config, with its model_type)."""
    model_type: str
    changed: dict[str, tuple[Any, Any]]
    """Every field the shrink changed: {name: (full value, shrunk value)} (lists/strings by length)."""
    kept: dict[str, Any]
    """Architecture facts carried over unchanged (top-k, shared experts, layer kinds, tie, norms, ...)."""
    seq_len_cap: int
    notes: tuple[str, ...] = field(default=())

    def sizes(self) -> dict[str, Any]:
        """The headline shrunk sizes (for the metrics line and reports)."""
        c = self.config
        pick = (lambda keys: next((c[k] for k in keys if isinstance(c.get(k), int)), None))
        return {"layers": pick(LAYER_KEYS), "hidden": pick(HIDDEN_KEYS), "heads": pick(QUERY_HEAD_KEYS),
                "kv_heads": c.get("num_key_value_heads"), "head_dim": c.get("head_dim"),
                "intermediate": c.get("intermediate_size"), "moe_intermediate": c.get("moe_intermediate_size"),
                "experts": pick(EXPERT_KEYS), "top_k": pick(TOPK_KEYS), "vocab": c.get("vocab_size")}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _first_key(d: dict, keys) -> Optional[str]:
    return next((k for k in keys if _is_int(d.get(k))), None)


def _per_layer(key: str, value: Any, n_layers: int) -> bool:
    """A per-layer setting: a list with one entry per layer, or a layer-pattern string of the layer count."""
    if key in ("architectures",) + LAYER_INDEX_KEYS:
        return False
    if isinstance(value, list):
        return len(value) == n_layers and n_layers > 1
    return isinstance(value, str) and "pattern" in key and len(value) == n_layers


def _kind_key(x: Any) -> str:
    return repr(x)  # lists of dicts (block_configs) are unhashable


def _prefix_holding_all(values) -> int:
    """Length of the shortest prefix of `values` that holds every distinct value."""
    wanted = {_kind_key(v) for v in values}
    seen: set[str] = set()
    for i, v in enumerate(values):
        seen.add(_kind_key(v))
        if seen == wanted:
            return i + 1
    return len(values)


def _even(x: float, lo: int = 2) -> int:
    return max(lo, 2 * int(round(x / 2)))


def _mult8(x: float) -> int:
    return max(8, 8 * int(round(x / 8)))


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap (at least 1)."""
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


def _depth(d: dict, n: int, sizes: ShrinkSizes) -> tuple[int, dict[str, int]]:
    """(depth, why) where why maps each field that needs depth to the depth it needs."""
    need: dict[str, int] = {}
    for key, value in d.items():
        if _per_layer(key, value, n):
            need[key] = _prefix_holding_all(list(value))
    for key in PERIOD_KEYS:
        v = d.get(key)
        if _is_int(v) and v > 1:
            off = d.get(PERIOD_OFFSETS.get(key, ""), 0)
            need[key] = v + (off if _is_int(off) else 0)
    for key in DENSE_FIRST_KEYS:
        if _is_int(d.get(key)) and d[key] > 0:
            need[key] = 2  # one dense-first layer, then the other kind
    return max([sizes.min_layers, *need.values()]), need


def shrink_config(config: dict, sizes: Optional[ShrinkSizes] = None) -> Shrunk:
    """A small copy of `config` with its architecture kept (module docstring).

    Args:
        config: A parsed config.json (any model type transformers builds; a multimodal config's text_config
            is used, with its model_type).
        sizes: Target sizes (default `ShrinkSizes()`).

    Returns:
        The `Shrunk` config with the record of what changed and what was kept.

    Raises:
        ShrinkError: a field the shrink needs is missing or inconsistent, or an explicit size would drop a
            layer kind or go below the routing top-k (the message names the field, the value and the fix).
    """
    sizes = sizes or ShrinkSizes()
    if not isinstance(config, dict):
        raise ShrinkError("config", f"expected a mapping of HF config fields, got {type(config).__name__}",
                          "pass the parsed config.json")
    notes: list[str] = []
    if isinstance(config.get("text_config"), dict):
        d = copy.deepcopy(config["text_config"])
        d.setdefault("model_type", config.get("model_type"))
        notes.append(f"shrunk the language model (text_config, model_type {d.get('model_type')!r}) of the "
                     f"multimodal {config.get('model_type')!r} config; the vision tower is not built")
    else:
        d = copy.deepcopy(config)
    changed: dict[str, tuple[Any, Any]] = {}

    def put(key: str, new: Any) -> None:
        old = d.get(key)
        if old != new:
            changed[key] = (len(old) if isinstance(old, (list, str)) else old,
                            len(new) if isinstance(new, (list, str)) else new)
            d[key] = new

    for key in DROPPED_KEYS:
        if key in d:
            d.pop(key)
            changed[key] = ("set", None)
            notes.append(f"{key} dropped: the shrunk copy trains in the run's own precision")
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ShrinkError("model_type", f"missing or not a string ({model_type!r})",
                          "the config needs the model_type transformers builds it by")

    # ---- depth
    lk = _first_key(d, LAYER_KEYS)
    if lk is None:
        raise ShrinkError("num_hidden_layers", "the config names no layer count (num_hidden_layers / n_layer / "
                          "num_layers)", "add num_hidden_layers")
    n = d[lk]
    auto_depth, need = _depth(d, n, sizes)
    auto_depth = min(auto_depth, n)
    if auto_depth > MAX_AUTO_DEPTH:
        why = max(need, key=need.get)
        raise ShrinkError(why, f"every layer kind of {why} first appears only within the first {auto_depth} layers "
                          f"(more than {MAX_AUTO_DEPTH})", "this per-layer pattern is too irregular to shrink by "
                          "depth; train it with the stand-in model (no --shrink) or a hand-cut config")
    depth = auto_depth if sizes.layers is None else sizes.layers
    if depth > n:
        raise ShrinkError("--shrink layers", f"layers={depth} exceeds the config's {lk}={n}",
                          f"give layers <= {n} (or leave it out)")
    if sizes.layers is not None and depth < auto_depth:
        why = max(need, key=need.get) if need else lk
        raise ShrinkError("--shrink layers", f"layers={depth} would drop a layer kind of {why} (the first "
                          f"{need.get(why, auto_depth)} layers hold every kind)",
                          f"give layers >= {auto_depth}, or leave layers out")
    for key, value in list(d.items()):
        if _per_layer(key, value, n):
            put(key, value[:depth])
    for key in LAYER_KEYS:
        if _is_int(d.get(key)):
            put(key, depth)
    for key in LAYER_INDEX_KEYS:
        if isinstance(d.get(key), list):
            put(key, [i for i in d[key] if _is_int(i) and i < depth])
    for key in LAYER_COUNT_KEYS:
        if _is_int(d.get(key)):
            put(key, min(d[key], depth))
    for key in DENSE_FIRST_KEYS:
        if _is_int(d.get(key)) and d[key] > 1:
            put(key, 1)
    if _is_int(d.get("num_kv_shared_layers")) and d["num_kv_shared_layers"] > 0:
        put("num_kv_shared_layers", min(d["num_kv_shared_layers"], depth // 2))

    # ---- hidden size and heads
    hk = _first_key(d, HIDDEN_KEYS)
    if hk is None:
        raise ShrinkError("hidden_size", "the config names no hidden size (hidden_size / d_model / n_embd)",
                          "add hidden_size")
    h_full, h = d[hk], sizes.hidden
    if h_full <= 0:
        raise ShrinkError(hk, f"{hk}={h_full} is not positive", "fix the config")
    qk = _first_key(d, QUERY_HEAD_KEYS)
    heads_full = d[qk] if qk else None
    heads = sizes.heads
    if heads_full is not None:
        if heads_full <= 0:
            raise ShrinkError(qk, f"{qk}={heads_full} is not positive", "fix the config")
        heads = min(heads, heads_full)
        put(qk, heads)
    ref_hd = d.get("head_dim") if _is_int(d.get("head_dim")) else None
    if ref_hd is None and _is_int(d.get("qk_nope_head_dim")) and _is_int(d.get("qk_rope_head_dim")):
        ref_hd = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]  # MLA: the q/k head width
    if ref_hd is None and heads_full:
        ref_hd = h_full // heads_full
    hd_scale = sizes.head_dim / ref_hd if ref_hd else 1.0
    for key in HIDDEN_KEYS:
        if _is_int(d.get(key)):
            put(key, h)
    if heads_full:
        for key in PROPORTIONAL_HEAD_KEYS:
            v = d.get(key)
            if not _is_int(v) or v <= 0:
                continue
            new = max(1, round(v * heads / heads_full))
            put(key, new)
        for key in ("num_key_value_heads", "num_global_key_value_heads", "swa_num_key_value_heads"):
            v = d.get(key)
            q = d.get("swa_num_attention_heads") if key.startswith("swa_") else heads
            if _is_int(v) and _is_int(q) and q % v:
                put(key, _divisor_at_most(q, v))  # GQA: a whole number of query heads per KV head
        lq, lv = d.get("linear_num_key_heads"), d.get("linear_num_value_heads")
        if _is_int(lq) and _is_int(lv) and lv % lq:
            put("linear_num_key_heads", _divisor_at_most(lv, lq))
        mh, ng = d.get("mamba_num_heads"), d.get("n_groups")
        if _is_int(mh) and _is_int(ng) and mh % ng:
            put("n_groups", _divisor_at_most(mh, ng))
    for key in HEAD_WIDTH_KEYS:
        v = d.get(key)
        if _is_int(v) and v > 0:
            put(key, _even(v * hd_scale))
    if _is_int(d.get("qk_head_dim")) and _is_int(d.get("qk_nope_head_dim")) and _is_int(d.get("qk_rope_head_dim")):
        put("qk_head_dim", d["qk_nope_head_dim"] + d["qk_rope_head_dim"])
    h_scale = h / h_full
    for key in HIDDEN_WIDTH_KEYS:
        v = d.get(key)
        if _is_int(v) and v > 0:
            put(key, _mult8(v * h_scale))
        elif isinstance(v, list) and v and all(_is_int(x) for x in v):
            put(key, [_mult8(x * h_scale) if x > 0 else x for x in v])

    # ---- experts
    ek, kk = _first_key(d, EXPERT_KEYS), _first_key(d, TOPK_KEYS)
    if ek is not None and d[ek] > 1:
        if kk is None:
            raise ShrinkError(ek, f"{ek}={d[ek]} but the config names no routing top-k ({' / '.join(TOPK_KEYS)})",
                              "add the top-k field, or shrink the experts by hand")
        e_full, k = d[ek], d[kk]
        if not 1 <= k <= e_full:
            raise ShrinkError(kk, f"{kk}={k} is not within 1..{ek}={e_full}", "fix the config")
        groups, topk_groups = d.get("n_group"), d.get("topk_group")
        if sizes.experts is not None:
            e = sizes.experts
            if e < k:
                raise ShrinkError("--shrink experts", f"experts={e} is below the routing top-k {kk}={k} of the "
                                  "config", f"give experts >= {k} (top-k is kept)")
            if e > e_full:
                raise ShrinkError("--shrink experts", f"experts={e} exceeds the config's {ek}={e_full}",
                                  f"give experts <= {e_full}")
        else:
            e = min(e_full, max(8, 2 * k))
        if _is_int(groups) and groups > 1:
            # Grouped routing (DeepSeek-V3): scores per group from its top-2 experts, then top-k within the
            # best topk_group groups; keep the groups with at least 2 experts each and room for top-k.
            per = max(2, math.ceil(k / max(1, topk_groups if _is_int(topk_groups) else 1)), math.ceil(e / groups))
            e = min(e_full, groups * per)
            if e % groups:
                raise ShrinkError("n_group", f"n_group={groups} does not divide the shrunk expert count {e}",
                                  f"give --shrink experts as a multiple of {groups}")
        for key in EXPERT_KEYS:
            if _is_int(d.get(key)) and d[key] == e_full:
                put(key, e)
        if e == k:
            notes.append(f"experts = top-k = {k}: every token visits every expert (routing weights still learned)")
    elif kk is not None and ek is None and d.get(kk, 0) > 1:
        raise ShrinkError(kk, f"{kk}={d[kk]} but the config names no expert count ({' / '.join(EXPERT_KEYS)})",
                          "add the expert-count field")

    # ---- vocabulary, windows, state
    for key in VOCAB_KEYS:
        v = d.get(key)
        if _is_int(v) and v > sizes.vocab:
            put(key, sizes.vocab)
    vocab = d.get("vocab_size") if _is_int(d.get("vocab_size")) else sizes.vocab
    remap: dict[int, int] = {}

    def small_id(i: Any) -> Any:
        if not _is_int(i) or i < vocab:
            return i
        remap.setdefault(i, vocab - 1 - len(remap))  # distinct ids at the top of the shrunk vocabulary
        return remap[i]

    for key in TOKEN_ID_KEYS:
        v = d.get(key)
        if isinstance(v, list):
            put(key, [small_id(x) for x in v])
        elif _is_int(v):
            put(key, small_id(v))
    for key in WINDOW_KEYS:
        v = d.get(key)
        if _is_int(v) and v > sizes.window:
            put(key, sizes.window)
    for key in STATE_KEYS:
        v = d.get(key)
        if _is_int(v) and v > sizes.state:
            put(key, sizes.state)

    kinds = {k: sorted({_kind_key(x) for x in v}) for k, v in d.items() if isinstance(v, (list, str))
             and k in changed and _per_layer(k, v, depth)}
    kept = {"model_type": model_type}
    if kk is not None:
        kept[kk] = d[kk]
    for key in ("n_shared_experts", "num_shared_experts", "n_group", "topk_group", "tie_word_embeddings",
                "hidden_act", "hidden_activation", "norm_topk_prob", "scoring_func", "topk_method",
                "attention_bias", "mlp_bias", "rms_norm_eps", "layer_norm_eps", "partial_rotary_factor",
                "first_k_dense_replace", "full_attention_interval", "interleave_moe_layer_step"):
        if key in d and not isinstance(d[key], (dict, list)):
            kept[key] = d[key]
    if kinds:
        kept["layer_kinds"] = kinds
    return Shrunk(config=d, model_type=model_type, changed=changed, kept=kept, seq_len_cap=sizes.seq_len,
                  notes=tuple(notes))


__all__ = ["MAX_SHRUNK_PARAMS", "Shrunk", "shrink_config"]
