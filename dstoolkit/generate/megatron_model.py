"""The model as both Megatron targets see it (`dstoolkit.generate.megatron_lm`,
`dstoolkit.generate.megatron_deepspeed`): its own training constants Megatron would otherwise default
(`model_constants`: RoPE base, norm epsilon, init std, dropouts, MoE router numbers, read from the config by one
reader) and what Megatron's GPT model cannot build (`model_gaps`: the shape's architecture, and the config's scaling
keys / per-layer RoPE bases / embedding dropout, each declared once). `UnsupportedTarget`: what a target cannot
express. No torch import.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


class UnsupportedTarget(ValueError):
    """The target cannot express this model or layout; the message says what is missing."""


@dataclass(frozen=True)
class ModelConstants:
    """The model's own training constants that Megatron would otherwise default (and so change the model)."""

    rope_theta: float
    norm_eps: float
    init_std: float
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    moe_aux_loss_coeff: float = 0.01
    moe_topk_scaling_factor: Optional[float] = None
    """DeepSeek routed_scaling_factor: routed expert outputs are scaled by it."""
    moe_router_num_groups: Optional[int] = None
    """DeepSeek n_group: experts are routed in groups (node-limited routing)."""
    moe_router_group_topk: Optional[int] = None
    """DeepSeek topk_group: groups each token may use."""
    source: str = ""


# Published config.json values of the bundled presets (Hugging Face hub configs / papers).
_PRESET_CONSTANTS: dict[str, ModelConstants] = {
    # Meta Llama 3 / 3.1 config.json: rope_theta 500000, rms_norm_eps 1e-5, initializer_range 0.02.
    "llama-3-8b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3 config.json"),
    "llama-3-70b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3 config.json"),
    "llama-3.1-405b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3.1 config.json"),
    # Mixtral-8x7B config.json: rope_theta 1e6, rms_norm_eps 1e-5, router_aux_loss_coef 0.02.
    "mixtral-8x7b": ModelConstants(1e6, 1e-5, 0.02, moe_aux_loss_coeff=0.02, source="Mixtral-8x7B config.json"),
    # DeepSeek-V3 config.json: rope_theta 10000, rms_norm_eps 1e-6, initializer_range 0.006; the paper's
    # sequence-wise balance loss alpha = 1e-4 (arXiv 2412.19437 §4.2).
    "deepseek-v3": ModelConstants(10000.0, 1e-6, 0.006, moe_aux_loss_coeff=1e-4, moe_topk_scaling_factor=2.5,
                                  moe_router_num_groups=8, moe_router_group_topk=4, source="DeepSeek-V3 config.json"),
    # dstoolkit's tiny models (dstoolkit/runtime/model.py: ROPE_THETA, RMS_NORM_EPS, INIT_STD, MOE_AUX_LOSS_COEF).
    "tiny": ModelConstants(10000.0, 1e-5, 0.02, source="dstoolkit tiny model"),
    "tiny-moe": ModelConstants(10000.0, 1e-5, 0.02, moe_aux_loss_coeff=0.01, source="dstoolkit tiny model"),
}


# transformers config-class defaults per model_type (used when neither a preset nor the config gives a value).
_FAMILY_DEFAULTS: dict[str, ModelConstants] = {
    "llama": ModelConstants(10000.0, 1e-6, 0.02, source="transformers LlamaConfig defaults"),
    "mistral": ModelConstants(10000.0, 1e-6, 0.02, source="transformers MistralConfig defaults"),
    "mixtral": ModelConstants(1e6, 1e-5, 0.02, moe_aux_loss_coeff=0.001, source="transformers MixtralConfig defaults"),
    "qwen2": ModelConstants(10000.0, 1e-6, 0.02, source="transformers Qwen2Config defaults"),
    "qwen2_moe": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers Qwen2MoeConfig defaults"),
    "qwen3": ModelConstants(10000.0, 1e-6, 0.02, source="transformers Qwen3Config defaults"),
    "qwen3_moe": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers Qwen3MoeConfig defaults"),
    "deepseek_v2": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers DeepseekV2Config defaults"),
    "deepseek_v3": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=1e-4, source="transformers DeepseekV3Config defaults"),
    "gpt2": ModelConstants(10000.0, 1e-5, 0.02, attention_dropout=0.1, hidden_dropout=0.1,
                           source="transformers GPT2Config defaults (attn_pdrop, resid_pdrop 0.1: the model the "
                                  "estimate and the Hugging Face targets train)"),
}


_CONFIG_KEYS = {"norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"),
                "init_std": ("initializer_range",),
                "hidden_dropout": ("hidden_dropout", "resid_pdrop", "residual_dropout"),
                "moe_aux_loss_coeff": ("router_aux_loss_coef", "aux_loss_alpha"),
                "moe_topk_scaling_factor": ("routed_scaling_factor",), "moe_router_num_groups": ("n_group",),
                "moe_router_group_topk": ("topk_group",)}
"""The config key spellings of each constant, first present wins (norm_epsilon, residual_dropout: StarCoder2). The
RoPE base has its own reader, `rope_thetas`, since transformers 5 nests it in rope_parameters."""

_INT_FIELDS = ("moe_router_num_groups", "moe_router_group_topk")

_TOP_ROPE_THETA_KEYS = ("rope_theta", "rotary_emb_base")
"""Top-level RoPE base spellings (transformers 4 configs; GPT-NeoX's older rotary_emb_base)."""

_EMBEDDING_DROPOUT_KEYS = ("embedding_dropout", "embd_pdrop")
"""Dropout on the token embeddings (StarCoder2, GPT-2). Both Megatron targets drop the embeddings with
--hidden-dropout (Megatron-LM LanguageModelEmbedding, Megatron-DeepSpeed language_model.Embedding)."""


def hf_config_dict(spec: Spec) -> dict[str, Any]:
    """The model's Hugging Face fields as the spec gives them (hf_config file or inline; a multimodal config's
    text_config fields over its own, as the shape readers read them), or {} for a preset."""
    m = spec.model
    d: dict[str, Any] = {}
    if m.form == "inline":
        d = dict(m.inline)
    elif m.form == "hf_config" and m.hf_config:
        p = Path(m.hf_config).expanduser()
        if not p.is_absolute():
            p = spec.base_dir / p
        if p.is_dir():
            p = p / "config.json"
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
    text = d.get("text_config") if isinstance(d, dict) else None
    return {**d, **text} if isinstance(text, dict) else d if isinstance(d, dict) else {}


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def rope_thetas(d: dict[str, Any]) -> dict[str, float]:
    """{where in the config: RoPE base} as transformers 5 resolves it (PreTrainedConfig.convert_rope_params_to_dict:
    rope_scaling, else rope_parameters, flat or nested per layer type (the keys of layer_types); a rope_theta in it
    wins over the top-level rope_theta, which fills each entry that lacks one). {} when the config gives none."""
    top = next((float(d[k]) for k in _TOP_ROPE_THETA_KEYS if _number(d.get(k))), None)
    top_key = next((k for k in _TOP_ROPE_THETA_KEYS if _number(d.get(k))), None)
    key = "rope_scaling" if isinstance(d.get("rope_scaling"), dict) and d["rope_scaling"] else "rope_parameters"
    rp = d.get(key) if isinstance(d.get(key), dict) else {}
    labels = set(d.get("layer_types") or ()) if isinstance(d.get("layer_types"), list) else set()
    nested = {t: v for t, v in rp.items() if isinstance(v, dict) and (t in labels or not labels)}
    out: dict[str, float] = {}
    for where, params in (nested.items() if nested else [(None, rp)]):
        name = f"{key}.{where}.rope_theta" if where else f"{key}.rope_theta"
        if _number(params.get("rope_theta")):
            out[name] = float(params["rope_theta"])
        elif top is not None:
            out[top_key if where is None else f"{top_key} (for {where})"] = top
    return out


def rope_theta_problem(d: dict[str, Any]) -> Optional[str]:
    """Why one --rotary-base cannot stand for the config's RoPE bases (several, per layer type: Gemma-3's local 1e4
    and global 1e6), or None."""
    thetas = rope_thetas(d)
    if len(set(thetas.values())) <= 1:
        return None
    return (f"a RoPE base per layer type ({', '.join(f'{k} {v:g}' for k, v in thetas.items())}; Megatron's GPT has "
            "one --rotary-base / --rotary-position-embeddings-theta for every layer)")


def model_constants(spec: Spec, shape: ModelShape) -> ModelConstants:
    """RoPE base, norm epsilon, init std, dropout and aux-loss coefficient of the spec's model.

    The config's own values win (hf_config / inline fields; the RoPE base also from transformers 5's
    rope_parameters: `rope_thetas`), then the bundled preset's published values, then the transformers defaults of
    the model_type (dropout: 0, but GPT-2's 0.1; the attention dropout is the one ModelShape.attention_dropout
    reads, which the estimate charges).

    Raises:
        UnsupportedTarget: the config gives several RoPE bases (`rope_theta_problem`).
    """
    d = hf_config_dict(spec)
    problem = rope_theta_problem(d)
    if problem:
        raise UnsupportedTarget(f"cannot express {problem}")
    return _constants(spec, shape, d)


def _constants(spec: Spec, shape: ModelShape, d: dict[str, Any]) -> ModelConstants:
    """`model_constants` once the RoPE bases are known to agree."""
    base = _PRESET_CONSTANTS.get(spec.model.preset or "", None) if spec.model.form == "preset" else None
    if base is None:
        base = _FAMILY_DEFAULTS.get(shape.model_type, ModelConstants(10000.0, 1e-5, 0.02, source="generic defaults"))
    vals = {k: getattr(base, k) for k in ("rope_theta", "norm_eps", "init_std", "attention_dropout",
                                          "hidden_dropout", "moe_aux_loss_coeff", "moe_topk_scaling_factor",
                                          "moe_router_num_groups", "moe_router_group_topk")}
    used = []
    for where, theta in rope_thetas(d).items():
        vals["rope_theta"] = theta
        used.append(where)
    for field, keys in _CONFIG_KEYS.items():
        for k in keys:
            if _number(d.get(k)):
                vals[field] = int(d[k]) if field in _INT_FIELDS else float(d[k])
                used.append(k)
                break
    # the attention dropout has one owner: the model shape (models.hf_families: the config's attention_dropout /
    # attn_pdrop, else its family's transformers default), which the estimate charges too
    if shape.attention_dropout != vals["attention_dropout"]:
        vals["attention_dropout"] = float(shape.attention_dropout)
        used.append("attention dropout of the model shape")
    src = base.source + (f"; from the config: {', '.join(used)}" if used else "")
    return ModelConstants(source=src, **vals)


@dataclass(frozen=True)
class ScaleKey:
    """A config key that scales the model's math where Megatron's GPT has no flag (neither Megatron-LM's
    megatron/training/arguments.py at d98e8a64 nor Megatron-DeepSpeed's megatron/arguments.py at 4efb479d
    spells it), with the value at which the model is plain Llama / GPT math."""

    key: str
    neutral: Callable[[ModelShape], Any]
    """The value that changes nothing (a config's None means off / the standard value in every family below)."""
    what: str
    """What transformers does with it (its modeling file)."""
    family_defaults: tuple[tuple[str, Any], ...] = ()
    """(model_type, the config class's default) where the default is not neutral and a config may leave it out."""


_GRANITE = ("granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa", "granitemoe_swa")

SCALE_KEYS: tuple[ScaleKey, ...] = (
    ScaleKey("embedding_multiplier", lambda s: 1.0,
             "token embeddings multiplied by it (Granite µP: GraniteModel.forward)"),
    ScaleKey("residual_multiplier", lambda s: 1.0,
             "each attention / MLP output multiplied by it before the residual add (GraniteDecoderLayer)"),
    ScaleKey("attention_multiplier", lambda s: s.head_size ** -0.5,
             "the attention score scale (GraniteAttention.scaling; Megatron scales by 1/sqrt(kv_channels))",
             tuple((t, 1.0) for t in _GRANITE)),
    ScaleKey("logits_scaling", lambda s: 1.0, "output logits divided by it (GraniteForCausalLM)"),
    ScaleKey("logit_scale", lambda s: 1.0, "output logits multiplied by it (CohereForCausalLM)",
             (("cohere", 0.0625), ("cohere2", 0.0625), ("cohere2_moe", 0.0625))),
    ScaleKey("final_logit_softcapping", lambda s: None,
             "output logits soft-capped, cap * tanh(logits / cap) (Gemma2ForCausalLM)",
             (("gemma2", 30.0), ("vaultgemma", 30.0), ("gemma3n_text", 30.0))),
    ScaleKey("attn_logit_softcapping", lambda s: None,
             "attention scores soft-capped (Gemma-2 eager_attention_forward)",
             (("gemma2", 50.0), ("vaultgemma", 50.0))),
    ScaleKey("query_pre_attn_scalar", lambda s: s.head_size,
             "attention scores scaled by query_pre_attn_scalar**-0.5, not head_dim**-0.5 (Gemma2Attention)",
             (("gemma2", 256), ("gemma3_text", 256), ("vaultgemma", 256))),
    ScaleKey("clip_qkv", lambda s: None, "queries / keys / values clamped to +-clip_qkv (OlmoAttention)"),
    ScaleKey("scale_emb", lambda s: 1.0, "token embeddings multiplied by it (MiniCPM3)", (("minicpm3", 12),)),
    ScaleKey("scale_depth", lambda s: math.sqrt(s.num_hidden_layers),
             "each residual branch multiplied by scale_depth / sqrt(num_hidden_layers) (MiniCPM3DecoderLayer)",
             (("minicpm3", 1.4),)),
    ScaleKey("mup_enabled", lambda s: False, "embeddings multiplied by sqrt(hidden_size) (AfmoeModel)"),
)
"""The scaling keys of transformers 5's causal-LM configs that Megatron's GPT would drop: each refused, naming it."""

EMBEDDING_SCALED_FAMILIES = ("gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4",
                             "gemma4_text", "vaultgemma")
"""model_types whose code scales the token embeddings by sqrt(hidden_size) without a config key (GemmaModel's
normalizer, Gemma3TextScaledWordEmbedding)."""


def _differs(value: Any, neutral: Any) -> bool:
    if value is None or value == neutral:
        return False
    if _number(value) and _number(neutral):
        return not math.isclose(float(value), float(neutral), rel_tol=1e-6)
    return True


def config_gaps(spec: Spec, shape: ModelShape) -> list[str]:
    """What the spec's config says that Megatron's GPT would drop: a scaling key off its neutral value
    (`SCALE_KEYS`, a family's default where the key is left out), Gemma's sqrt(hidden_size) embedding scale, RoPE
    bases per layer type, an embedding dropout other than the hidden dropout."""
    d = hf_config_dict(spec)
    gaps = []
    mt = d.get("model_type", shape.model_type)
    scaled = []
    for sk in SCALE_KEYS:
        value = d[sk.key] if sk.key in d else dict(sk.family_defaults).get(mt)
        neutral = sk.neutral(shape)
        if _differs(value, neutral):
            given = "" if sk.key in d else f", {mt}'s default"
            scaled.append(f"{sk.key}={value!r} ({sk.what}{given}; neutral: {'off' if neutral is None else neutral})")
    if scaled:
        gaps.append(f"{'; '.join(scaled)}: no Megatron flag sets {'these' if len(scaled) > 1 else 'this'}, so it would "
                    "train plain GPT math (the hf / accelerate targets train the transformers model itself)")
    if mt in EMBEDDING_SCALED_FAMILIES or shape.model_type in EMBEDDING_SCALED_FAMILIES:
        gaps.append(f"token embeddings scaled by sqrt(hidden_size) ({mt}: GemmaModel's normalizer; no Megatron flag)")
    problem = rope_theta_problem(d)
    if problem:
        gaps.append(problem)
    emb = next(((k, float(d[k])) for k in _EMBEDDING_DROPOUT_KEYS if _number(d.get(k))), None)
    if emb is not None:
        hidden = _constants(spec, shape, d).hidden_dropout
        if emb[1] != hidden:
            gaps.append(f"{emb[0]}={emb[1]:g} beside a hidden dropout of {hidden:g} (both Megatron targets drop the "
                        "embeddings with --hidden-dropout)")
    return gaps


def architecture_gaps(shape: ModelShape) -> list[str]:
    """What neither Megatron target's GPT model can build, named with the shape's value (checked against the
    parsers benchmarks/megatron_parsers.py runs: Megatron-LM megatron/training/arguments.py + TransformerConfig,
    Megatron-DeepSpeed megatron/arguments.py): neither has a parallel attention+MLP block, a norm after the
    embedding or on a sublayer's output, a bias on the output head, ALiBi, a norm other than plain LayerNorm /
    RMSNorm, a token mixer other than softmax attention (Mamba, linear attention: pretrain_gpt.py builds attention
    blocks; Megatron-LM trains Mamba through pretrain_mamba.py), or a vision / audio tower (pretrain_gpt.py builds
    the language model only)."""
    gaps = []
    if shape.parallel_residual:
        gaps.append("a parallel attention + MLP block (parallel_residual: both read the block input; Megatron's "
                    "blocks run attention then MLP)")
    if shape.embedding_norm:
        gaps.append("a LayerNorm after the token embedding (embedding_norm)")
    if shape.qk_norm and shape.qk_norm_scope == "projection":
        gaps.append("q/k norms over the whole q / k projection (qk_norm_scope 'projection'; Megatron-LM's "
                    "--qk-layernorm norms each head)")
    if shape.output_norm:
        gaps.append("a norm on the attention / MLP output before the residual add (output_norm: a post- or "
                    "sandwich-norm block; Megatron's blocks norm the sublayer input only)")
    if shape.lm_head_bias:
        gaps.append("a bias on the output head (lm_head_bias)")
    if not shape.learned_positions and shape.position_encoding == "alibi":
        gaps.append("ALiBi attention biases (position_encoding 'alibi'; no ALiBi position type)")
    if shape.norm_variant is not None:
        gaps.append(f"a {shape.norm_type} that {shape.norm_variant}" if shape.norm_variant.startswith("scales")
                    else f"a norm that is not plain LayerNorm / RMSNorm ({shape.norm_variant})")
    m = shape.measured
    mixers: dict[str, int] = {}
    for layer in (m.layers if m is not None else ()):
        if layer.mixer != "attention":
            mixers[layer.mixer] = mixers.get(layer.mixer, 0) + 1
    if mixers:
        gaps.append(f"{', '.join(f'{n} {k}' for k, n in mixers.items())} token-mixer layers of "
                    f"{shape.num_hidden_layers} (not softmax attention: pretrain_gpt.py builds attention + MLP blocks "
                    "only; Megatron-LM trains Mamba / hybrid models through pretrain_mamba.py)")
    if m is not None and m.vision_params:
        gaps.append(f"vision / audio towers and projectors ({m.vision_params:,} parameters: pretrain_gpt.py builds the "
                    "language model only, so the towers would not be trained; the hf / accelerate targets train them)")
    return gaps


def model_gaps(spec: Spec, shape: ModelShape) -> list[str]:
    """Everything about the spec's model that neither Megatron target can express: `architecture_gaps` (the
    shape) and `config_gaps` (the config's own keys). Both targets refuse on any."""
    return architecture_gaps(shape) + config_gaps(spec, shape)
