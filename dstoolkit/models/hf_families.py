"""The hand-written Hugging Face config readers (split from models.hf): one config mapping of a known `model_type`
into ModelShape keyword arguments, exact and fast (no torch, no transformers: the sweep calls the estimator
thousands of times). models.hf picks between these readers and transformers; models.hf_keys holds the strict
check of an inline spec's keys.

The analytic `model_type`s and the fields each needs are listed in `FAMILIES`. Optional fields take the
defaults of the corresponding `transformers` config class (e.g. `num_key_value_heads` defaults to
`num_attention_heads`, Llama's `tie_word_embeddings` to False, GPT-2's to True). Module layouts the
config does not spell out are fixed per family, as in the `transformers` modelling code:
Qwen2 and Qwen2-MoE always have q/k/v biases, GPT-2 always has biases and LayerNorm, and so on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from dstoolkit.models.router_scoring import SCORING_KEY, sigmoid_with_expert_bias
from dstoolkit.models.shape import DROPOUT_FIX, ROPE_TYPES, dropout_probability, rope_scaling_of


class HFConfigError(ValueError):
    """A Hugging Face config problem tied to one field (`field` is the config key, or None)."""

    def __init__(self, field: Optional[str], problem: str, fix: str):
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field + ': ' if field else ''}{problem} ({fix})")


@dataclass(frozen=True)
class Family:
    """How one `model_type` maps to a ModelShape."""

    required: tuple[str, ...]
    """Keys that must be present (the ones without a safe transformers default)."""
    build: Callable[[dict, "Family"], dict]
    """Turns the config dict into ModelShape keyword arguments."""
    optional: tuple[str, ...] = ()
    """Keys read when present (defaults from transformers)."""
    aliases: tuple[tuple[str, str], ...] = ()
    """(key, other spelling) pairs: the config class's `attribute_map` (transformers 5.x), under which transformers
    reads either name as the same field and saves the mapped one (Qwen3MoeConfig saves num_experts as
    num_local_experts, GPT2Config's hidden_size is n_embd). `build` reads `key`."""

    def read(self, d: dict) -> dict:
        """ModelShape keyword arguments of config `d`, each alias read as its key.

        Raises:
            HFConfigError: a key and its alias both given with different values, or `build`'s errors."""
        d = dict(d)
        for key, other in self.aliases:
            if other not in d:
                continue
            if key in d and d[key] != d[other]:
                raise HFConfigError(other, f"{other}={d[other]!r} and {key}={d[key]!r} name the same field "
                                    "(transformers' attribute_map) with different values",
                                    f"keep one of {key!r} and {other!r}")
            d.setdefault(key, d[other])
        return self.build(d, self)


MISSING = "required field is missing"
"""The problem text of a missing required key (models.hf adds the transformers-build workaround to its fix)."""


def _get(d: dict, key: str) -> Any:
    if key not in d:
        raise HFConfigError(key, MISSING, f"add {key!r}")
    return d[key]


def _int(d: dict, key: str, default: Any = ..., *, allow_none: bool = False) -> Optional[int]:
    value = d.get(key, default) if default is not ... else _get(d, key)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HFConfigError(key, f"expected a non-negative integer, got {value!r}", f"fix {key!r}")
    return value


def _bool(d: dict, key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise HFConfigError(key, f"expected true/false, got {value!r}", f"fix {key!r}")
    return value


def kv_heads_value(value: Any, key: str = "num_key_value_heads") -> None:
    """Refuse 0 key/value heads (transformers divides num_attention_heads by it: ZeroDivisionError at build)."""
    if value == 0 and not isinstance(value, bool):
        raise HFConfigError(key, "0 key/value heads: attention needs at least one (transformers divides "
                            "num_attention_heads by it)", f"give {key} a divisor of num_attention_heads, or null "
                            "(= num_attention_heads: multi-head attention)")


def rope_scaling(d: dict) -> Any:
    """The config's rope_scaling (or transformers 5's rope_parameters) as a RopeScaling, checked
    (shape.rope_scaling_of); HFConfigError naming the key."""
    for key in ("rope_scaling", "rope_parameters"):
        if d.get(key) is not None:
            try:
                return rope_scaling_of(d[key], key)
            except ValueError as exc:
                raise HFConfigError(key, str(exc), f"use one of {', '.join(ROPE_TYPES)} (or remove {key} for "
                                    "plain RoPE)") from None
    return None


def _partial_rotary_factor(d: dict) -> float:
    """The share of a head RoPE turns: partial_rotary_factor at the top or in rope_parameters / rope_scaling
    (transformers 5 moves it there); 1.0 when absent or not a number."""
    for where in (d, d.get("rope_parameters"), d.get("rope_scaling")):
        v = where.get("partial_rotary_factor") if isinstance(where, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return float(v)
    return 1.0


def check_rotary_dim(d: dict, kw: dict) -> None:
    """Refuse an odd rotary dimension, as transformers 5 does when it makes the config (modeling_rope_utils
    validate_rope: 'RoPE requires an even rotary dimension' for head_dim > 4, odd, fully rotated; DeepSeek's
    config sets head_dim = qk_rope_head_dim). A head_dim derived from hidden_size / num_attention_heads is
    held to the same rule: RoPE's cos/sin tables are 2 x ceil(d / 2) wide and do not broadcast over an odd
    head. Learned-position families (GPT-2) have no rotary embedding."""
    if kw.get("learned_positions"):
        return
    if kw.get("qk_rope_head_dim"):
        dim, field, given = kw["qk_rope_head_dim"], "qk_rope_head_dim", True
    elif kw.get("head_dim"):
        dim, field, given = kw["head_dim"], "head_dim", True
    else:
        h, heads = kw.get("hidden_size"), kw.get("num_attention_heads")
        if not h or not heads:
            return
        dim, field, given = h // heads, "head_dim", False
    factor = _partial_rotary_factor(d)
    if dim <= 4 or dim % 2 == 0 or int(dim * factor) != dim:
        return
    what = (f"{dim}" if given else
            f"hidden_size / num_attention_heads = {kw['hidden_size']} / {kw['num_attention_heads']} = {dim}")
    raise HFConfigError(field, f"{what} is odd and fully rotated: RoPE needs an even rotary dimension (transformers "
                        "refuses the config: 'RoPE requires an even rotary dimension')",
                        f"give {field} an even value" + ("" if given else " (set head_dim, or change hidden_size)"))


def _dense_common(d: dict) -> dict:
    heads = _int(d, "num_attention_heads")
    kv_heads_value(d.get("num_key_value_heads"))
    return dict(
        rope_scaling=rope_scaling(d),
        hidden_size=_int(d, "hidden_size"),
        num_hidden_layers=_int(d, "num_hidden_layers"),
        num_attention_heads=heads,
        # transformers: num_key_value_heads=None means multi-head attention (= num_attention_heads).
        num_key_value_heads=_int(d, "num_key_value_heads", None, allow_none=True) or heads,
        head_dim=_int(d, "head_dim", None, allow_none=True),
        intermediate_size=_int(d, "intermediate_size"),
        vocab_size=_int(d, "vocab_size"),
        max_position_embeddings=_int(d, "max_position_embeddings", None, allow_none=True),
        hidden_act=str(d.get("hidden_act", "silu")),
        attention_dropout=dropout(d, "attention_dropout", 0.0),
    )


def dropout(d: dict, key: str, default: float) -> float:
    """A dropout probability of the config (transformers' default when absent), checked to lie in [0, 1)
    (module_tree.dropout_probability)."""
    v = d.get(key, default)
    try:
        return dropout_probability(default if v is None else v)
    except ValueError as exc:
        raise HFConfigError(key, str(exc), DROPOUT_FIX) from None


def _llama(d: dict, fam: Family) -> dict:
    # LlamaConfig: attention_bias puts a bias on q, k, v AND o_proj; mlp_bias on gate/up/down.
    kw = _dense_common(d)
    bias = _bool(d, "attention_bias", False)
    kw.update(tie_word_embeddings=_bool(d, "tie_word_embeddings", False), attention_bias=bias, o_proj_bias=bias,
              mlp_bias=_bool(d, "mlp_bias", False))
    return kw


def _window(d: dict, default: Optional[int]) -> Optional[int]:
    # the config's sliding_window (transformers' default when absent), a positive int or null
    w = _int(d, "sliding_window", default, allow_none=True)
    if w == 0:
        raise HFConfigError("sliding_window", "a window of 0 keys lets a query attend to nothing",
                            "give the window in tokens, or null for full attention")
    return w


def _windowed(kw: dict, window: Optional[int], windowed: Callable[[int], bool]) -> dict:
    # sliding_window / full_attention_layers of the layers `windowed(i)` says the window applies to
    n = kw["num_hidden_layers"]
    full = tuple(i for i in range(n) if not windowed(i))
    if window is None or len(full) == n:
        return kw
    return {**kw, "sliding_window": window, "full_attention_layers": full}


def _mistral(d: dict, fam: Family) -> dict:
    kw = _dense_common(d)
    kw.update(tie_word_embeddings=_bool(d, "tie_word_embeddings", False))
    # MistralConfig.sliding_window defaults to 4096 (MixtralConfig's to None); modeling_mistral/mixtral pass it to
    # every layer's attention and build create_sliding_window_causal_mask whenever it is not None (transformers 5.x)
    return _windowed(kw, _window(d, 4096 if fam is FAMILIES.get("mistral") else None), lambda i: True)


def _qwen_window(d: dict, kw: dict, rule: str) -> dict:
    # Qwen2Config / Qwen3Config: sliding_window (default 4096) only with use_sliding_window (default False), on the
    # layers i >= max_window_layers (default 28); Qwen2MoeConfig: on the even layers i < max_window_layers;
    # Qwen3MoeConfig: on every layer (configuration_qwen2.py, _qwen2_moe, _qwen3, _qwen3_moe, transformers 5.x)
    if not _bool(d, "use_sliding_window", False):
        return kw
    first = _int(d, "max_window_layers", 28)
    windowed = {"from": lambda i: i >= first, "even_below": lambda i: (i + 1) % 2 == 1 and i < first,
                "all": lambda i: True}[rule]
    return _windowed(kw, _window(d, 4096), windowed)


def _mixtral(d: dict, fam: Family) -> dict:
    kw = _mistral(d, fam)
    kw.update(num_experts=_int(d, "num_local_experts"), num_experts_per_tok=_int(d, "num_experts_per_tok"),
              moe_intermediate_size=None)
    return kw


def _qwen2(d: dict, fam: Family) -> dict:
    # Qwen2Attention: q/k/v_proj bias=True, o_proj bias=False (hard-coded in transformers).
    kw = _dense_common(d)
    kw.update(tie_word_embeddings=_bool(d, "tie_word_embeddings", False), attention_bias=True, o_proj_bias=False)
    return kw if fam is not FAMILIES.get("qwen2") else _qwen_window(d, kw, "from")


def _qwen_sparse_layers(d: dict, n_layers: int) -> tuple[int, ...]:
    # Qwen2MoeDecoderLayer: layer i is sparse iff i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    step = _int(d, "decoder_sparse_step", 1)
    if step < 1:
        raise HFConfigError("decoder_sparse_step", f"must be >= 1, got {step}", "use 1 for MoE in every layer")
    only = d.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise HFConfigError("mlp_only_layers", f"expected a list of layer indices, got {only!r}", "fix mlp_only_layers")
    dense = set(only) | {i for i in range(n_layers) if (i + 1) % step != 0}
    return tuple(sorted(i for i in dense if 0 <= i < n_layers))


def _qwen2_moe(d: dict, fam: Family) -> dict:
    kw = _qwen2(d, fam)
    shared = _int(d, "shared_expert_intermediate_size")
    kw.update(num_experts=_int(d, "num_experts"), num_experts_per_tok=_int(d, "num_experts_per_tok"),
              moe_intermediate_size=_int(d, "moe_intermediate_size"),
              shared_expert_intermediate_size=shared or None,
              # Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x)) * shared_expert(x), always built
              shared_expert_gate=bool(shared),
              # Qwen2MoeConfig.norm_topk_prob defaults to False (transformers 5.x configuration_qwen2_moe.py)
              norm_topk_prob=_bool(d, "norm_topk_prob", False),
              mlp_only_layers=_qwen_sparse_layers(d, kw["num_hidden_layers"]))
    return _qwen_window(d, kw, "even_below")


def _qwen3(d: dict, fam: Family) -> dict:
    # Qwen3Attention: q/k/v/o bias = attention_bias (default False); q_norm/k_norm RMSNorm(head_dim).
    kw = _dense_common(d)
    kw["head_dim"] = _int(d, "head_dim")
    bias = _bool(d, "attention_bias", False)
    kw.update(tie_word_embeddings=_bool(d, "tie_word_embeddings", False), attention_bias=bias, o_proj_bias=bias,
              qk_norm=True)
    return kw if fam is not FAMILIES.get("qwen3") else _qwen_window(d, kw, "from")


def _qwen3_moe(d: dict, fam: Family) -> dict:
    kw = _qwen3(d, fam)
    kw.update(num_experts=_int(d, "num_experts"), num_experts_per_tok=_int(d, "num_experts_per_tok"),
              moe_intermediate_size=_int(d, "moe_intermediate_size"),
              mlp_only_layers=_qwen_sparse_layers(d, kw["num_hidden_layers"]),
              # Qwen3MoeConfig.norm_topk_prob defaults to False (transformers 5.x configuration_qwen3_moe.py)
              norm_topk_prob=_bool(d, "norm_topk_prob", False))
    return _qwen_window(d, kw, "all")


def _deepseek(d: dict, fam: Family) -> dict:
    kw = _dense_common(d)
    kw["head_dim"] = None  # MLA: per-head widths come from qk_nope/qk_rope/v_head_dim
    kw["num_key_value_heads"] = None
    bias = _bool(d, "attention_bias", False)
    routed = _int(d, "n_routed_experts", allow_none=True)
    v3 = fam is FAMILIES.get("deepseek_v3")
    kw.update(
        tie_word_embeddings=_bool(d, "tie_word_embeddings", False),
        attention_bias=bias, o_proj_bias=bias,
        q_lora_rank=_int(d, "q_lora_rank", allow_none=True),
        kv_lora_rank=_int(d, "kv_lora_rank"),
        qk_rope_head_dim=_int(d, "qk_rope_head_dim"),
        qk_nope_head_dim=_int(d, "qk_nope_head_dim"),
        v_head_dim=_int(d, "v_head_dim"),
        num_nextn_predict_layers=_int(d, "num_nextn_predict_layers", 0),
    )
    if routed:
        # DeepseekV2/V3 MoE gate: e_score_correction_bias exists only for topk_method == "noaux_tc"
        # (the V3 default; V2 uses greedy / group_limited_greedy).
        topk_method = d.get("topk_method", "noaux_tc" if v3 else "greedy")
        kw.update(
            num_experts=routed,
            num_experts_per_tok=_int(d, "num_experts_per_tok"),
            moe_intermediate_size=_int(d, "moe_intermediate_size"),
            num_shared_experts=_int(d, "n_shared_experts", allow_none=True) or 0,
            first_k_dense_replace=_int(d, "first_k_dense_replace"),
            # transformers 5.x has no moe_layer_freq (DeepseekV2/V3DecoderLayer: MoE on every layer from
            # first_k_dense_replace on) and leaves it out of the configs it writes; DeepSeek's own modelling code
            # reads it as "every moe_layer_freq-th layer" (its released configs say 1: the same layers)
            moe_layer_freq=_int(d, "moe_layer_freq", 1),
            # sigmoid + expert bias: that bias scored with sigmoid (scoring_func, else the model_type's default,
            # router_scoring: DeepSeek's own V2 config says softmax, V3's sigmoid)
            router_score_correction_bias=sigmoid_with_expert_bias(
                "deepseek_v3" if v3 else "deepseek_v2", d.get(SCORING_KEY), topk_method == "noaux_tc")[0],
            # DeepseekV2Config.norm_topk_prob defaults to False, DeepseekV3Config's to True (transformers 5.x)
            norm_topk_prob=_bool(d, "norm_topk_prob", v3),
        )
    return kw


def _gpt2(d: dict, fam: Family) -> dict:
    # GPT2Config names (n_embd, n_layer, n_head, n_positions, n_inner; the Llama-style names are its attribute_map
    # aliases, Family.read); GPT2Model always has biases on c_attn/c_proj/c_fc, LayerNorm with bias, learned
    # positions, and ties lm_head to wte by default.
    h = _int(d, "n_embd")
    inner = d.get("n_inner")
    return dict(
        hidden_size=h,
        num_hidden_layers=_int(d, "n_layer"),
        num_attention_heads=_int(d, "n_head"),
        intermediate_size=_int(d, "n_inner") if inner is not None else 4 * h,
        vocab_size=_int(d, "vocab_size"),
        max_position_embeddings=_int(d, "n_positions"),
        learned_positions=True,
        tie_word_embeddings=_bool(d, "tie_word_embeddings", True),
        attention_bias=True, o_proj_bias=True, mlp_bias=True, mlp_gated=False, norm_type="layernorm", qkv_fused=True,
        hidden_act=str(d.get("activation_function", "gelu_new")),
        attention_dropout=dropout(d, "attn_pdrop", 0.1),  # transformers GPT2Config default
    )


_DENSE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
_MLA = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
_DEEPSEEK_MOE = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size")

FAMILIES: dict[str, Family] = {
    "llama": Family(_DENSE, _llama, ("num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias")),
    "mistral": Family(_DENSE, _mistral, ("num_key_value_heads", "head_dim", "tie_word_embeddings")),
    "mixtral": Family(_DENSE + ("num_local_experts", "num_experts_per_tok"), _mixtral,
                      ("num_key_value_heads", "head_dim", "tie_word_embeddings"),
                      (("num_local_experts", "num_experts"),)),
    "qwen2": Family(_DENSE, _qwen2, ("num_key_value_heads", "tie_word_embeddings")),
    "qwen2_moe": Family(_DENSE + ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                  "shared_expert_intermediate_size"), _qwen2_moe,
                        ("num_key_value_heads", "tie_word_embeddings", "decoder_sparse_step", "mlp_only_layers")),
    "qwen3": Family(_DENSE + ("head_dim",), _qwen3, ("num_key_value_heads", "tie_word_embeddings", "attention_bias")),
    "qwen3_moe": Family(_DENSE + ("head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size"),
                        _qwen3_moe, ("num_key_value_heads", "tie_word_embeddings", "attention_bias",
                                     "decoder_sparse_step", "mlp_only_layers"),
                        (("num_experts", "num_local_experts"),)),
    "deepseek_v2": Family(_DENSE + _MLA + _DEEPSEEK_MOE + ("first_k_dense_replace",), _deepseek,
                          ("tie_word_embeddings", "attention_bias", "topk_method", "moe_layer_freq"),
                          (("n_routed_experts", "num_experts"),)),
    "deepseek_v3": Family(_DENSE + _MLA + _DEEPSEEK_MOE + ("first_k_dense_replace",), _deepseek,
                          ("tie_word_embeddings", "attention_bias", "topk_method", "num_nextn_predict_layers",
                           "moe_layer_freq"),
                          (("n_routed_experts", "num_local_experts"), ("num_nextn_predict_layers", "num_mtp_layers"))),
    "gpt2": Family(("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"), _gpt2,
                   ("n_inner", "tie_word_embeddings", "activation_function"),
                   (("n_embd", "hidden_size"), ("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"),
                    ("n_positions", "max_position_embeddings"))),
}
"""Supported HF model types. DeepSeek's MoE keys may be null (n_routed_experts: null makes a dense model)."""
