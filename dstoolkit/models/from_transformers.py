"""Any config transformers can build: exact parameter counts from the model itself, on the meta device.

`measure_config(config)` builds the model with `torch.device("meta")` (no memory, no weights, no download),
walks `named_parameters()` (tied weights appear once; buffers are not parameters) and assigns every tensor a
layer and a role (`dstoolkit.models.measured.ROLES`). `shape_from_transformers(config)` wraps the result in a
`ModelShape` whose analytic fields (hidden size, heads, FFN widths, experts, top-k, ...) are filled from the
config for the estimator's formulas, and whose `measured` field carries the exact counts.

torch and transformers are imported inside the functions only (the core must import without them).

- Multimodal configs (`text_config`): the language model is built from the text config and counted; the
  vision/audio towers and projectors are built too and reported apart (`MeasuredParams.vision_params`).
- `quantization_config` is dropped before building (transformers would otherwise try to quantise on load)
  and named in `notes` as ignored: a training run holds the weights unquantised.
- An unknown `model_type` is refused with transformers' reason; where the config's `architectures` names a
  class transformers has, that class is offered, and `model_class=` builds it.
"""
from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any, Optional

from dstoolkit.models.attention_facts import attention_facts, window_fields
from dstoolkit.models.block_facts import arch_fields, block_facts
from dstoolkit.models.measured import ArchFacts, LayerParams, MeasuredParams
from dstoolkit.models.module_tree import (MODEL_TOPK_KEYS, BuildError, as_int, buffers_not_counted, classify,
                                          config_value, is_vision, linear_groups, scan_facts)
from dstoolkit.models.shape import ATTENTION_DROPOUT_KEYS, dropout_probability
from dstoolkit.models.tp_plan import merged_tp_plan

class TransformersUnavailable(RuntimeError):
    """torch or transformers is not installed."""


def _import():
    # Lazy on purpose: dstoolkit's core imports no torch; only the transformers model source needs it.
    try:
        # torch-free core: torch only when this runs (dstoolkit[train])
        import torch
        # torch-free core: transformers only when this runs (dstoolkit[hf])
        import transformers
    except ImportError as exc:  # pragma: no cover - exercised only without the hf extra
        raise TransformersUnavailable(f"{exc.name or exc} is not installed") from None
    return torch, transformers


def transformers_version() -> Optional[str]:
    """The installed transformers version, or None when transformers/torch cannot be imported."""
    try:
        _, tf = _import()
    except TransformersUnavailable:
        return None
    return tf.__version__


def offer_from_architectures(config: dict) -> Optional[str]:
    """The first class in the config's `architectures` that transformers has (None if none or no transformers)."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        return None
    try:
        _, tf = _import()
    except TransformersUnavailable:
        return None
    for name in archs:
        if isinstance(name, str) and name.isidentifier():
            try:
                if getattr(tf, name, None) is not None:
                    return name
            except Exception:  # noqa: BLE001 - transformers' lazy module may fail to import one class
                continue
    return None


def _make_config(tf, config: dict, model_class: Optional[str]):
    d = {k: v for k, v in config.items() if k != "quantization_config"}
    if model_class:
        try:
            cls = getattr(tf, model_class)
        except Exception:  # noqa: BLE001
            cls = None
        if cls is None or not hasattr(cls, "config_class"):
            raise BuildError(f"transformers {tf.__version__} has no model class {model_class!r}")
        d.pop("model_type", None)
        return cls, cls.config_class(**d)
    model_type = d.get("model_type")
    try:
        return None, tf.AutoConfig.for_model(**d)
    except (KeyError, ValueError) as exc:
        first = str(exc).split(". Should contain")[0].split("\n")[0]
        raise BuildError(f"transformers {tf.__version__} does not know model_type {model_type!r} ({first})",
                         offer_from_architectures(config)) from None
    except Exception as exc:  # noqa: BLE001 - a config class rejecting a value
        raise BuildError(f"transformers {tf.__version__} rejects this {model_type!r} config: "
                         f"{type(exc).__name__}: {str(exc)[:300]}") from None


def _build_on_meta(torch, factory, cfg):
    with torch.device("meta"):
        return factory(cfg)


def _quiet(tf):
    try:
        level = tf.logging.get_verbosity()
        tf.logging.set_verbosity_error()
        return level
    except Exception:  # noqa: BLE001
        return None


def _measure(config: dict, model_class: Optional[str]) -> MeasuredParams:
    torch, tf = _import()
    level = _quiet(tf)
    try:
        return _measure_inner(torch, tf, config, model_class)
    finally:
        if level is not None:
            tf.logging.set_verbosity(level)


def _measure_inner(torch, tf, config: dict, model_class: Optional[str]) -> MeasuredParams:
    notes: list[str] = []
    q = config.get("quantization_config")
    if isinstance(q, dict):
        method = q.get("quant_method") or q.get("quant_algo") or "unknown"
        notes.append(f"quantization_config ({method}) ignored: counts and memory are for the unquantised model "
                     "a training run holds (bf16/fp32 master weights); a frozen quantised base (QLoRA-style) "
                     "would hold less")
    cls, cfg = _make_config(tf, config, model_class)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    composite = text is not cfg
    model = None
    skip_vision = False
    errors: list[str] = []
    if cls is not None:
        try:
            model = _build_on_meta(torch, cls, cfg)
            skip_vision = True
        except Exception as exc:  # noqa: BLE001
            raise BuildError(f"transformers cannot build {model_class}: {type(exc).__name__}: {str(exc)[:300]}") from None
    else:
        try:
            model = _build_on_meta(torch, tf.AutoModelForCausalLM.from_config, text)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"AutoModelForCausalLM: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    vision = 0
    if composite:
        full = None
        for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
            factory = getattr(tf, auto, None)
            if factory is None:
                continue
            try:
                full = _build_on_meta(torch, factory.from_config, cfg)
                break
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{auto}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        if model is None and full is not None:
            model, skip_vision = full, True
        elif full is not None:
            vision = sum(p.numel() for n, p in full.named_parameters() if is_vision(n))
        notes.append(f"multimodal config ({config.get('model_type')}): the language model is counted from "
                     f"text_config ({config_value(text, 'model_type')}); vision/audio towers and projectors are reported "
                     "apart" + ("" if full is not None else " (could not be built, not counted)"))
    if model is None:
        raise BuildError(f"transformers {tf.__version__} cannot build model_type {config.get('model_type')!r}: "
                         + "; ".join(errors), offer_from_architectures(config))
    try:
        n_layers = config_value(text, "num_hidden_layers", "n_layer", "num_layers")
        parts = classify(model, n_layers if isinstance(n_layers, int) else None, config_value(text, *MODEL_TOPK_KEYS), skip_vision)
        attention_facts(model, parts, text)
        scan_facts(model, parts)
        linears = linear_groups(model, parts)
        arch = ArchFacts(**block_facts(model, parts, text, _activation_namer()))
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unexpected module tree: refuse with the reason, never crash
        raise BuildError(f"cannot assign the parameters of {type(model).__name__} to layers and roles: "
                         f"{type(exc).__name__}: {exc}") from None
    top = parts["top"]
    if skip_vision:
        vision = top["vision"]
    buffers = buffers_not_counted(model)
    if buffers:
        notes.append(f"{buffers} elements of registered buffers (router score-correction biases and the like) "
                     "are not parameters and are not counted")
    return MeasuredParams(
        model_class=type(model).__name__, transformers_version=tf.__version__,
        embedding=top["embedding"], lm_head=top["lm_head"], final_norms=top["final_norms"], other=top["other"],
        layers=tuple(LayerParams(**rec) for rec in parts["layers"]), buffers_not_counted=buffers,
        vision_params=vision, notes=tuple(notes), linears=linears, arch=arch, tp_plan=merged_tp_plan(model),
    )


def _activation_namer():
    """module -> the name transformers' ACT2CLS (transformers/activations.py) gives its class (first match), or
    None for a module that is not an activation."""
    try:
        from transformers.activations import ACT2CLS as table  # lazy: optional dependency
    except Exception:  # noqa: BLE001
        return None
    by_class: dict = {}
    for name, entry in table.items():
        cls = entry[0] if isinstance(entry, tuple) else entry
        by_class.setdefault(cls, name)
    return lambda m: by_class.get(type(m))


@lru_cache(maxsize=128)
def _measure_cached(key: str, model_class: Optional[str]) -> MeasuredParams:
    return _measure(json.loads(key), model_class)


def measure_config(config: dict, model_class: Optional[str] = None) -> MeasuredParams:
    """Exact per-layer, per-role parameter counts of `config` as transformers builds it (meta device).

    Args:
        config: A parsed config.json.
        model_class: A transformers class name to build instead of the Auto class (e.g. "DeepseekV3ForCausalLM"
            for a `kimi_k2` config); its `config_class` reads the config's fields.

    Raises:
        TransformersUnavailable: torch or transformers is not installed.
        BuildError: transformers cannot build the config (with `offer` where `architectures` names a class).
    """
    return _measure_cached(json.dumps(config, sort_keys=True, default=str), model_class)


def text_config_of(config: dict, model_class: Optional[str] = None):
    """The transformers config object of the language model (text_config of a multimodal config)."""
    _, tf = _import()
    level = _quiet(tf)
    try:
        _, cfg = _make_config(tf, config, model_class)
    finally:
        if level is not None:
            tf.logging.set_verbosity(level)
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


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
def linear_layers(config: dict, model_class: Optional[str] = None) -> list[dict]:
    """The matmul weights of the language model as transformers builds it, grouped by name pattern.

    For planners that swap or shard linear layers (FP8, TP): one entry per distinct (pattern, shape), with
    the layer index written `{i}` — e.g. `model.layers.{i}.self_attn.q_proj`, `model.layers.{i}.mlp.experts`
    — `count` (how many modules share it), `layers` (indices) and `shape`: (out_features, in_features) for an
    nn.Linear, or the fused expert tensor's own shape (num_experts first) with `fused_experts` True.
    Vision/audio towers are left out.

    Raises:
        TransformersUnavailable, BuildError: as `measure_config`.
    """
    return [dict(g) for g in _linear_layers_cached(json.dumps(config, sort_keys=True, default=str), model_class)]


@lru_cache(maxsize=32)
def _linear_layers_cached(key: str, model_class: Optional[str]) -> tuple:
    torch, tf = _import()
    config = json.loads(key)
    level = _quiet(tf)
    try:
        cls, cfg = _make_config(tf, config, model_class)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        try:
            model = _build_on_meta(torch, cls if cls is not None else tf.AutoModelForCausalLM.from_config,
                                   cfg if cls is not None else text)
        except Exception:  # noqa: BLE001 - a text config with no causal-LM class: the composite model
            model = _build_on_meta(torch, tf.AutoModelForImageTextToText.from_config, cfg)
    finally:
        if level is not None:
            tf.logging.set_verbosity(level)
    groups: dict[tuple, dict] = {}

    def add(name: str, shape: tuple, fused: bool) -> None:
        m = re.search(r"\.(\d+)\.", name)
        layer = int(m.group(1)) if m else -1
        pattern = re.sub(r"\.(\d+)\.", ".{i}.", name, count=1)
        g = groups.setdefault((pattern, shape, fused), dict(pattern=pattern, shape=shape, fused_experts=fused,
                                                            count=0, layers=[]))
        g["count"] += 1
        if layer >= 0:
            g["layers"].append(layer)

    for name, mod in model.named_modules():
        if is_vision(name + "."):
            continue
        if isinstance(mod, torch.nn.Linear):
            add(name, (mod.out_features, mod.in_features), False)
        elif name.rsplit(".", 1)[-1] == "experts" or type(mod).__name__.endswith("Experts"):
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() == 3:
                    add(f"{name}.{pname}", tuple(p.shape), True)
    return tuple(tuple(sorted(g.items())) for g in groups.values())
