"""What the transformers model source refuses before or right after the build (split from models.from_transformers),
each in one line naming the field: a value the config class rejects, a model that is not one decoder-only stack
(encoder-decoder, bidirectional encoder), a type with no causal language model. transformers is imported lazily,
only its auto mappings."""
from __future__ import annotations

import re
from typing import Optional

from dstoolkit.models.module_tree import BuildError


class ConfigRefused(BuildError):
    """transformers builds the type but refuses these values, or the model is not one the estimator models
    (encoder-decoder); `field` names the config key where one can be named, `fix` says what to do."""

    def __init__(self, reason: str, field: Optional[str] = None, fix: Optional[str] = None):
        super().__init__(reason)
        self.field = field
        self.fix = fix


def config_refusal(tf, model_type: Optional[str], exc: BaseException) -> ConfigRefused:
    """One line from a config class's refusal: the innermost cause's message (transformers 5 wraps a validator's
    ValueError in huggingface_hub's StrictDataclassClassValidationError), naming the first `key`=value it cites."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = " ".join(str(root).split())[:300]
    named = re.search(r"`(\w+)`\s*=", text)
    field = named.group(1) if named else None
    return ConfigRefused(f"transformers {tf.__version__} refuses this {model_type!r} config: {type(root).__name__}: "
                         f"{text}", field, f"fix {field}" if field else "fix the value the message names")


def causal_lm_class(model_type) -> Optional[str]:
    """The causal-LM class transformers maps `model_type` to (Qwen3MoeForCausalLM for qwen3_moe), or None (no such
    class, or no transformers). Imports transformers' auto mapping only, lazily."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as causal  # lazy
    except Exception:  # noqa: BLE001 - no transformers
        return None
    return causal.get(model_type) if isinstance(model_type, str) else None


def _bidirectional(text) -> bool:
    """The (text) config is an encoder's that is not switched to decoding: transformers registers a masked-LM head
    for its model_type (MODEL_FOR_MASKED_LM_MAPPING_NAMES: BERT, RoBERTa, ELECTRA, ...) and the config sets neither
    is_decoder nor XLM's causal. AutoModelForCausalLM still builds such a config (BertLMHeadModel, warning "add
    is_decoder=True"), but its self-attention is then bidirectional (BertLayer: is_causal=config.is_decoder)."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES as masked  # lazy
    except Exception:  # noqa: BLE001
        return False
    return (getattr(text, "model_type", None) in masked and getattr(text, "is_decoder", False) is not True
            and getattr(text, "causal", False) is not True)


def decoder_only_problem(cfg, text) -> Optional[tuple[str, str]]:
    """(problem, config key) when the model of config `cfg` (text config `text`) is not one decoder-only stack: an
    encoder-decoder (T5, BART, Whisper: is_encoder_decoder) or a bidirectional encoder (`_bidirectional`); None
    otherwise. The estimator models one causal stack (its activations, FLOPs with the causal-attention halving,
    Megatron's GPT), so an encoder stack, a second length, cross-attention or attention to later tokens would be
    silently miscounted. The one rule of the transformers source and user modules."""
    if getattr(cfg, "is_encoder_decoder", False) is True or getattr(text, "is_encoder_decoder", False) is True:
        return ("an encoder-decoder model: not estimated (the estimator models one decoder-only stack; the encoder, "
                "source / target lengths and cross-attention would be left out)", "model_type")
    if _bidirectional(text):
        return ("an encoder-only model (bidirectional self-attention: is_decoder is not true): not estimated (the "
                "estimator models a causal decoder-only language model)", "is_decoder")
    return None


def not_decoder_only(model_type: Optional[str], cfg, text, built: str) -> Optional[ConfigRefused]:
    """`decoder_only_problem` as the transformers source's refusal of `model_type` (`built`: the class or config
    class named), with the fix."""
    found = decoder_only_problem(cfg, text)
    if found is None:
        return None
    problem, field = found
    if field == "is_decoder":
        fix = "estimate a decoder-only model; set is_decoder: true only if it is trained as a causal LM"
    else:
        decoder = causal_lm_class(model_type)
        fix = ("estimate a decoder-only model: any causal LM transformers builds, multimodal ones by their "
               "text_config" + (f"; for this model's decoder alone as a causal LM, --model-class {decoder}"
                                if decoder else ""))
    return ConfigRefused(f"{model_type!r} ({built}) is {problem}", field, fix)


def not_a_language_model(tf, model_type: Optional[str], cfg, built: Optional[str]) -> ConfigRefused:
    """The refusal of a type transformers knows but has no causal-LM (or image-text-to-text) class for: CLIP, ViT,
    wav2vec2 ... (`built`: the head-less class AutoModel built, if any)."""
    name = type(cfg).__name__.removesuffix("Config") or str(model_type)
    return ConfigRefused(f"{name} is not a causal language model: transformers {tf.__version__} has no causal-LM "
                         f"class for model_type {model_type!r}" + (f" (AutoModel builds {built}, without a "
                                                                   "language-model head)" if built else ""),
                         "model_type", "estimate a decoder-only language model (a config AutoModelForCausalLM "
                         "builds, or a multimodal model with a text_config)")
