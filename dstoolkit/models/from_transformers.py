"""Any config transformers can build: exact parameter counts from the model itself, on the meta device.

`measure_config(config)` builds the model with `torch.device("meta")` (no memory, no weights, no download),
walks `named_parameters()` (tied weights appear once; buffers are not parameters) and assigns every tensor a
layer and a role (`dstoolkit.models.measured.ROLES`). `shape_from_transformers(config)` wraps the result in a
`ModelShape` whose analytic fields (hidden size, heads, FFN widths, experts, top-k, ...) are filled from the
config for the estimator's formulas, and whose `measured` field carries the exact counts.

torch and transformers are imported inside the functions only (the core must import without them).

- Multimodal configs (`text_config`): the language model is built from the text config and counted; the
  vision/audio towers and projectors are built too and counted in `MeasuredParams.vision_params` (in the total
  and the model states, not in FLOPs or activations: the note says so).
- Models that are not one decoder-only stack are refused (`refusals.not_decoder_only`, `ConfigRefused`):
  encoder-decoders (T5, BART, Whisper: `is_encoder_decoder`; a causal-LM class of such a family, BartForCausalLM,
  builds its decoder alone) and bidirectional encoders (BERT, RoBERTa: a masked-LM family without is_decoder);
  so are types with no causal LM at all (CLIP, ViT: `refusals.not_a_language_model`).
- `quantization_config` is dropped before building (transformers would otherwise try to quantise on load)
  and named in `notes` as ignored: a training run holds the weights unquantised.
- An unknown `model_type` is refused with transformers' reason; where the config's `architectures` names a
  class transformers has, that class is offered, and `model_class=` builds it.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Optional

from dstoolkit.models.attention_facts import attention_facts
from dstoolkit.models.block_facts import block_facts
from dstoolkit.models.measured import ArchFacts, LayerParams, MeasuredParams
from dstoolkit.models.refusals import (ConfigRefused, causal_lm_class, config_refusal, not_a_language_model,
                                       not_decoder_only)
from dstoolkit.models.module_tree import (MODEL_TOPK_KEYS, BuildError, buffers_not_counted, classify, config_value,
                                          is_vision, linear_groups, scan_facts)
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
    model_type = d.get("model_type")
    if model_class:
        try:
            cls = getattr(tf, model_class)
        except Exception:  # noqa: BLE001
            cls = None
        if cls is None or not hasattr(cls, "config_class"):
            raise BuildError(f"transformers {tf.__version__} has no model class {model_class!r}")
        d.pop("model_type", None)
        try:
            return cls, cls.config_class(**d)
        except Exception as exc:  # noqa: BLE001 - the class's config rejecting a value
            raise config_refusal(tf, model_type, exc) from None
    try:
        return None, tf.AutoConfig.for_model(**d)
    except (KeyError, ValueError) as exc:
        if isinstance(exc, ValueError) and "Unrecognized model identifier" not in str(exc):
            raise config_refusal(tf, model_type, exc) from None
        first = str(exc).split(". Should contain")[0].split("\n")[0]
        raise BuildError(f"transformers {tf.__version__} does not know model_type {model_type!r} ({first})",
                         offer_from_architectures(config)) from None
    except Exception as exc:  # noqa: BLE001 - a config class rejecting a value
        raise config_refusal(tf, model_type, exc) from None


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
    refused = not_decoder_only(config.get("model_type"), cfg, text, model_class or type(cfg).__name__)
    if refused is not None and (cls is None or not getattr(cfg, "is_encoder_decoder", False)):
        # before the build: AutoModelForCausalLM would build BART's decoder alone (BartForCausalLM) and count it,
        # BERT's encoder as BertLMHeadModel; a --model-class ForCausalLM of an encoder-decoder family is its decoder
        raise refused
    model = None
    skip_vision = False
    errors: list[str] = []
    if cls is not None:
        try:
            model = _build_on_meta(torch, cls, cfg)
            skip_vision = True
        except Exception as exc:  # noqa: BLE001
            raise BuildError(f"transformers cannot build {model_class}: {type(exc).__name__}: {str(exc)[:300]}") from None
        refused = not_decoder_only(config.get("model_type"), model.config, model.config, model_class)
        if refused is not None:  # a ForCausalLM class sets is_encoder_decoder False on its config
            raise refused
    else:
        try:
            model = _build_on_meta(torch, tf.AutoModelForCausalLM.from_config, text)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"AutoModelForCausalLM: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    vision = 0
    if composite:
        full, full_by = None, None
        for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM", "AutoModel"):
            factory = getattr(tf, auto, None)
            if factory is None:
                continue
            try:
                full = _build_on_meta(torch, factory.from_config, cfg)
                full_by = auto
                break
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{auto}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        if model is None and full_by == "AutoModel":  # only a head-less build (CLIP's dual encoder)
            raise not_a_language_model(tf, config.get("model_type"), cfg, type(full).__name__)
        if model is None and full is not None:
            model, skip_vision = full, True
        elif full is not None:
            vision = sum(p.numel() for n, p in full.named_parameters() if is_vision(n))
    if model is None and all("Unrecognized configuration class" in e for e in errors):
        raise not_a_language_model(tf, config.get("model_type"), cfg, None)  # no auto class builds it (ViT)
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
    blocks = tower_blocks(model if skip_vision else full) if composite and vision else ()
    if composite:
        notes.append(_tower_note(config.get("model_type"), config_value(text, "model_type"), vision,
                                 built=skip_vision or full is not None))
    by_name = buffers_not_counted(model)
    buffers = sum(by_name.values())
    if buffers:
        notes.append(f"{buffers} elements of registered buffers ({', '.join(f'{n}: {k}' for n, k in by_name.items())}) "
                     "are not parameters and are not counted")
    return MeasuredParams(
        model_class=type(model).__name__, transformers_version=tf.__version__,
        embedding=top["embedding"], lm_head=top["lm_head"], final_norms=top["final_norms"], other=top["other"],
        layers=tuple(LayerParams(**rec) for rec in parts["layers"]), buffers_not_counted=buffers,
        vision_params=vision, vision_blocks=blocks if sum(blocks) == vision else (), notes=tuple(notes), linears=linears, arch=arch, tp_plan=merged_tp_plan(model),
    )


def tower_blocks(model) -> tuple[int, ...]:
    """Parameters of a multimodal model's towers and projectors per block (a numbered child such as
    `model.visual.blocks.3`, or the parameter itself), in registration order: how DeepSpeed's flat buffers see them
    (a block straddles a ZeRO partition whole, never the whole tower)."""
    out: dict[str, int] = {}
    for name, p in model.named_parameters():
        if is_vision(name):
            m = re.match(r"(.*?\.\d+)\.", name)
            key = m.group(1) if m else name
            out[key] = out.get(key, 0) + p.numel()
    return tuple(out.values())


def _tower_note(model_type, text_type, vision: int, *, built: bool) -> str:
    """The assumption line of a multimodal config: what of its towers is counted and what is not."""
    head = f"multimodal config ({model_type}): the language model is read from text_config ({text_type}); "
    if not built:
        return head + ("the vision/audio towers and projectors could not be built: their parameters, memory and "
                       "FLOPs are not counted")
    return head + (f"the vision/audio towers and projectors ({vision:,} params) are counted in weights, gradients "
                   "and optimizer states (transformers builds them trainable and HF Trainer optimizes them; frozen "
                   "towers would hold less), not in activations or FLOPs (those depend on the images / audio per "
                   "sample, which the estimate does not take); --seq-len counts the language model's tokens, "
                   "image tokens included")


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
