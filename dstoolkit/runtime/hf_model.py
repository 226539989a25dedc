"""A transformers model of the config's own architecture (shrunk: dstoolkit.runtime.shrink) behind the trainer's
interface (`forward(input_ids, labels)` -> scalar loss), and the spec's recompute policy applied through
transformers' gradient checkpointing.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dstoolkit.spec.checkpoint import CheckpointPolicy

class HFCausalLM(nn.Module):
    """A transformers causal LM behind the trainer's interface: `forward(input_ids, labels)` -> scalar loss.

    `labels` are the next tokens already (as `synthetic_batch` gives them), so the loss is cross-entropy of
    the logits against them directly (HF's own `labels=` would shift them a second time). MoE models that
    return a load-balancing `aux_loss` add it with the config's `router_aux_loss_coef`.
    """

    def __init__(self, hf_model: nn.Module, info: dict) -> None:
        super().__init__()
        self.hf = hf_model
        self.info = info
        """What was built: builder, model_type, class, parameter count, shrunk sizes (the metrics 'model' event)."""
        self.aux_coef = float(getattr(hf_model.config, "router_aux_loss_coef", 0.0) or 0.0)

    def forward(self, input_ids: Tensor, labels: Tensor) -> Tensor:
        out = self.hf(input_ids=input_ids, use_cache=False)
        logits = out.logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        aux = getattr(out, "aux_loss", None)
        if aux is not None and self.aux_coef:
            loss = loss + self.aux_coef * aux.float()
        return loss


class HFBuildError(ValueError):
    """transformers cannot build the (shrunk) config, or the copy is too large to train here."""


def _hf_config(tf, config: dict, model_class: Optional[str]):
    d = {k: v for k, v in config.items() if k not in ("quantization_config", "name", "model_class")}
    try:
        if model_class:
            cls = getattr(tf, model_class, None)
            if cls is None or not hasattr(cls, "config_class"):
                raise HFBuildError(f"model_class={model_class!r}: transformers {tf.__version__} has no such class; "
                                   "give a class name transformers exports (e.g. DeepseekV3ForCausalLM)")
            d.pop("model_type", None)
            return cls, cls.config_class(**d)
        return None, tf.AutoConfig.for_model(**d)
    except HFBuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unknown model_type or a value the config class rejects
        first = str(exc).splitlines()[0][:240] if str(exc) else type(exc).__name__
        raise HFBuildError(f"model_type={config.get('model_type')!r}: transformers {tf.__version__} cannot make "
                           f"its config ({first}); check the model_type, or give model_class") from None


class _DecoderWithHead(nn.Module):
    """A bare transformers decoder (a text config with no *ForCausalLM mapping, e.g. the text model of a
    vision-language config) under an LM head of its own, tied to the input embedding when the config ties."""

    def __init__(self, base: nn.Module, cfg) -> None:
        super().__init__()
        self.model = base
        self.config = cfg
        hidden = cfg.hidden_size
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        if getattr(cfg, "tie_word_embeddings", False) and hasattr(base, "get_input_embeddings"):
            self.lm_head.weight = base.get_input_embeddings().weight

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.model.gradient_checkpointing_enable(**kwargs)

    def forward(self, input_ids: Tensor, use_cache: bool = False):
        from types import SimpleNamespace

        out = self.model(input_ids=input_ids, use_cache=use_cache)
        return SimpleNamespace(logits=self.lm_head(out.last_hidden_state), aux_loss=getattr(out, "aux_loss", None))


def _causal_lm_factory(tf, cfg):
    """AutoModelForCausalLM where the config type has a causal-LM class; else the bare AutoModel decoder
    with an LM head (`_DecoderWithHead`)."""
    if type(cfg) in tf.AutoModelForCausalLM._model_mapping:
        return tf.AutoModelForCausalLM.from_config
    return lambda c: _DecoderWithHead(tf.AutoModel.from_config(c), c)


def _largest_tensor(model: nn.Module) -> str:
    name, p = max(model.named_parameters(), key=lambda kv: kv[1].numel())
    return f"{name} {tuple(p.shape)}"


def _decoder_layers(model: nn.Module) -> Optional[nn.ModuleList]:
    """The decoder-layer list: the ModuleList holding the most parameters."""
    best = None
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod):
            size = sum(p.numel() for p in mod.parameters())
            if best is None or size > best[1]:
                best = (mod, size)
    return best[0] if best else None


def apply_hf_checkpoint_policy(model: HFCausalLM, policy: Optional[CheckpointPolicy]) -> list[str]:
    """Recompute the decoder layers `policy` marks, through transformers' gradient checkpointing (each
    layer's own `gradient_checkpointing` switch, non-reentrant). Returns notes on what could not be applied."""
    if policy is None or policy.kind == "none":
        return []
    layers = _decoder_layers(model.hf)
    if layers is None or not hasattr(model.hf, "gradient_checkpointing_enable"):
        return [f"activation_checkpointing={policy.kind!r} not applied: {type(model.hf).__name__} has no "
                "gradient-checkpointing switch"]
    if policy.kind == "selective":
        return ["activation_checkpointing='selective' (attention core only) has no switch in transformers "
                "layers: ran without recompute"]
    flags = policy.checkpointed_layers(len(layers))
    if not any(flags):
        return []
    model.hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer, flag in zip(layers, flags):
        if hasattr(layer, "gradient_checkpointing"):
            layer.gradient_checkpointing = bool(flag)
    return []


def build_hf_model(config: dict, *, model_class: Optional[str] = None, seed: int = 0,
                   max_params: Optional[int] = None, info: Optional[dict] = None) -> HFCausalLM:
    """Build the transformers model of `config` (fp32, CPU, deterministic weights) for real training.

    Args:
        config: An HF config mapping (normally `dstoolkit.runtime.shrink.shrink_config(...).config`).
        model_class: A transformers class to build instead of the Auto class for the model_type.
        seed: Weight seed (the same on every rank gives the same weights everywhere).
        max_params: Refuse a model above this many parameters (default `shrink.MAX_SHRUNK_PARAMS`).
        info: Extra facts recorded in `HFCausalLM.info` (the shrink's changed/kept fields).

    Raises:
        HFBuildError: transformers cannot build it, or it is larger than `max_params` (naming the largest
            tensor, i.e. the width the shrink left alone).
    """
    from dstoolkit.runtime.shrink import MAX_SHRUNK_PARAMS

    try:
        import transformers as tf
    except ImportError:
        raise HFBuildError("transformers is not installed; pip install 'dstoolkit[hf]' to train a transformers "
                           "architecture") from None
    level = tf.logging.get_verbosity()
    tf.logging.set_verbosity_error()
    try:
        cls, cfg = _hf_config(tf, config, model_class)
        # sdpa attention and the eager expert loop: both run on the CPU accelerator (grouped-mm kernels and
        # flash attention do not); the architecture's own eager path where it has no sdpa one.
        for attr, value in (("_attn_implementation", "sdpa"), ("_experts_implementation", "eager")):
            try:
                setattr(cfg, attr, value)
            except Exception:  # noqa: BLE001 - a config class without that switch
                pass
        if hasattr(cfg, "router_aux_loss_coef") and hasattr(cfg, "output_router_logits"):
            cfg.output_router_logits = True  # the load-balancing loss trains the router as in the real run
        factory = cls if cls is not None else _causal_lm_factory(tf, cfg)

        def make():
            return factory(cfg)

        try:
            with torch.device("meta"):
                meta = make()
        except ValueError as exc:
            if "scaled_dot_product_attention" not in str(exc) and "sdpa" not in str(exc).lower():
                raise
            cfg._attn_implementation = "eager"
            with torch.device("meta"):
                meta = make()
        n = sum(p.numel() for p in meta.parameters())
        limit = max_params or MAX_SHRUNK_PARAMS
        if n > limit:
            raise HFBuildError(f"the model has {n / 1e6:.1f}M parameters (limit {limit / 1e6:.0f}M for a CPU run); "
                               f"largest tensor {_largest_tensor(meta)}: shrink that width (--shrink), or report "
                               "the config field it comes from")
        del meta
        torch.manual_seed(seed)
        hf = make()
    except HFBuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers refusing a value: one line, not a traceback
        first = str(exc).splitlines()[0][:240] if str(exc) else ""
        raise HFBuildError(f"transformers cannot build model_type={config.get('model_type')!r}: "
                           f"{type(exc).__name__}: {first}") from None
    finally:
        tf.logging.set_verbosity(level)
    hf.float().train()
    cls_name = type(hf).__name__ if not isinstance(hf, _DecoderWithHead) else f"{type(hf.model).__name__}+lm_head"
    facts = {"builder": "transformers", "model_type": cfg.model_type, "model_class": cls_name,
             "params": int(sum(p.numel() for p in hf.parameters())),
             "attn_implementation": getattr(cfg, "_attn_implementation", None)}
    return HFCausalLM(hf, {**facts, **(info or {})})
