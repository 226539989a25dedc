"""Any config transformers can build: exact parameter counts from the model itself, on the meta device.

`measure_config(config)` builds the model with `torch.device("meta")` (no memory, no weights, no download),
walks `named_parameters()` (tied weights appear once; buffers are not parameters) and assigns every tensor a
layer and a role (`dstoolkit.models.measured.ROLES`). `shape_from_transformers(config)` wraps the result in a
`ModelShape` whose analytic fields (hidden size, heads, FFN widths, experts, top-k, ...) are filled from the
config for the estimator's formulas, and whose `measured` field carries the exact counts.

torch and transformers are imported inside the functions only: the core (`dstoolkit.models` and above)
must import without them, and only configs outside the analytic families need them.

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
from functools import lru_cache
from typing import Any, Optional

from dstoolkit.models.measured import LayerParams, LinearGroup, MeasuredParams

_VISION_MARKERS = ("vision", "visual", "audio", "multi_modal_projector", "mm_projector", "embed_vision",
                   "embed_audio", "image_newline", "patch_embed", "speech")
_ROUTER_SEGMENTS = frozenset({"gate", "router", "wg", "gating", "gate_network"})
_ATTENTION_SEGMENTS = frozenset({"self_attn", "attention", "attn", "self_attention"})
_MLP_SEGMENTS = frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe"})
_TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "experts_per_token", "top_k_experts", "moe_topk",
              "moe_k", "n_activated_experts", "num_activated_experts", "top_k")


class TransformersUnavailable(RuntimeError):
    """torch or transformers is not installed."""


class BuildError(ValueError):
    """transformers cannot build this config; `offer` names a class from `architectures` it does have."""

    def __init__(self, reason: str, offer: Optional[str] = None):
        self.reason = reason
        self.offer = offer
        super().__init__(reason)


def _import():
    # Lazy on purpose: dstoolkit's core imports no torch; only the transformers model source needs it.
    try:
        import torch
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


def _get(cfg: Any, *keys: str) -> Any:
    for key in keys:
        try:
            value = getattr(cfg, key)
        except Exception:  # noqa: BLE001 - per-layer (heterogeneous) attributes raise on global access
            layers = getattr(cfg, "per_layer_config", None) or []
            try:
                value = [getattr(layer, key) for layer in layers] or None
            except Exception:  # noqa: BLE001
                value = None
        if value is not None:
            return value
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


def _is_vision(name: str) -> bool:
    head = ".".join(name.split(".")[:3]).lower()
    return any(m in head for m in _VISION_MARKERS)


def _find_layers(model, n_layers: Optional[int], *, sequential: bool = False):
    """(prefix, ModuleList) of the decoder layers: the ModuleList with n_layers children holding most params.

    With `sequential` (a user's module) an nn.Sequential of two or more blocks of one class also counts.
    """
    import torch.nn as nn  # lazy: see _import

    best = None
    for name, mod in model.named_modules():
        if _is_vision(name + "."):
            continue
        if not isinstance(mod, nn.ModuleList):
            if not (sequential and isinstance(mod, nn.Sequential) and len(mod) >= 2
                    and len({type(c) for c in mod}) == 1 and any(True for _ in mod.parameters())):
                continue
        if n_layers is not None and len(mod) != n_layers:
            continue
        size = sum(p.numel() for p in mod.parameters())
        if best is None or size > best[2]:
            best = (name, mod, size)
    if best is None and n_layers is not None:
        return _find_layers(model, None, sequential=sequential)
    if best is None:
        raise BuildError(f"cannot find the decoder layers of {type(model).__name__}")
    return best[0], best[1]


def _class_names(mods) -> list[str]:
    return [type(m).__name__ for m in mods]


def _mixer_of(classes: list[str], segs: list[str]) -> Optional[str]:
    joined = " ".join(classes)
    if any(k in joined for k in ("Mamba", "SSM", "ShortConv")):
        return "mamba"
    if any(k in joined for k in ("DeltaNet", "LinearAttention", "Lightning")) or "linear_attn" in segs:
        return "linear_attention"
    if any(k in c for c in classes for k in ("Attention", "Attn")) or any(s in _ATTENTION_SEGMENTS for s in segs):
        return "attention"
    return None


def _num_experts(container, param) -> int:
    import torch.nn as nn  # lazy: see _import

    if isinstance(container, nn.ModuleList):
        return len(container)
    for attr in ("num_experts", "n_routed_experts", "num_local_experts"):
        v = getattr(container, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return int(param.shape[0]) if param.dim() >= 2 else 1


def _classify(model, n_layers: Optional[int], topk_cfg: Any, skip_vision: bool, *, in_emb=None, out_emb=None,
              sequential: bool = False, whole_model_fallback: bool = False) -> dict:
    """Every parameter of `model` assigned a layer and a role (`dstoolkit.models.measured.ROLES`).

    Args:
        n_layers: the config's layer count (None: the biggest ModuleList of blocks).
        topk_cfg: the config's top-k (an int, a per-layer list, or None: read `top_k` from the modules).
        in_emb, out_emb: input embedding / output head modules (default: `get_input_embeddings()` /
            `get_output_embeddings()`, the transformers API).
        sequential, whole_model_fallback: a user's module: an nn.Sequential of blocks counts as the layers;
            with no blocks at all the whole module (embeddings and head aside) is one layer.
    """
    import torch.nn as nn  # lazy: see _import

    try:
        prefix, layer_list = _find_layers(model, n_layers if isinstance(n_layers, int) else None,
                                          sequential=sequential)
        n_blocks = len(layer_list)
    except BuildError:
        if not whole_model_fallback:
            raise
        prefix, layer_list, n_blocks = None, None, 1
    modules = dict(model.named_modules())
    if out_emb is None and hasattr(model, "get_output_embeddings"):
        out_emb = model.get_output_embeddings()
    if in_emb is None and hasattr(model, "get_input_embeddings"):
        in_emb = model.get_input_embeddings()
    in_ids = {id(p) for p in in_emb.parameters()} if in_emb is not None else set()
    out_ids = {id(p) for p in out_emb.parameters()} - in_ids if out_emb is not None else set()
    layers = [dict(index=i, attention=0, dense_mlp=0, routed_experts=0, shared_experts=0, router=0, norms=0,
                   other=0, num_experts=0, experts_per_tok=0, mixer=set()) for i in range(n_blocks)]
    top = dict(embedding=0, lm_head=0, final_norms=0, other=0, vision=0)
    roles: dict[str, str] = {}
    expert_containers: dict[int, dict[str, int]] = {}
    for name, p in model.named_parameters():
        n = p.numel()
        if skip_vision and _is_vision(name):
            top["vision"] += n
            continue
        owner_path = name.rpartition(".")[0]
        owner = modules.get(owner_path)
        if id(p) in in_ids:  # a tied head shares this tensor: counted once, as the embedding
            top["embedding"] += n
            roles[name] = "embedding"
            continue
        if id(p) in out_ids:
            top["lm_head"] += n
            roles[name] = "lm_head"
            continue
        if prefix is None and not isinstance(owner, nn.Embedding):
            i, segs, base = 0, name.split(".")[:-1], ""
        elif prefix is None or not name.startswith(prefix + "."):
            if isinstance(owner, nn.Embedding) or "embed" in owner_path.split(".")[-1]:
                top["embedding"] += n
                roles[name] = "embedding"
            elif owner is not None and "Norm" in type(owner).__name__:
                top["final_norms"] += n
                roles[name] = "norms"
            else:
                top["other"] += n
                roles[name] = "other"
            continue
        else:
            rest = name[len(prefix) + 1:].split(".")
            i = int(rest[0])
            segs = rest[1:-1]
            base = f"{prefix}.{i}"
        chain = [modules[".".join(([base] if base else []) + segs[: j + 1])] for j in range(len(segs))]
        classes = _class_names(chain)
        rec = layers[i]
        lower = [s.lower() for s in segs]
        expert_at = next((j for j, s in enumerate(lower) if s == "experts" or classes[j].endswith("Experts")), None)
        if any("shared" in s for s in lower):
            role = "shared_experts"
        elif expert_at is not None:
            role = "routed_experts"
            key = ".".join(segs[: expert_at + 1])
            expert_containers.setdefault(i, {}).setdefault(key, _num_experts(chain[expert_at], p))
        elif any(s in _ROUTER_SEGMENTS for s in lower) or any(
                ("Router" in c or c.endswith(("Gate", "TopkRouter", "TopKRouter"))) for c in classes):
            role = "router"
        elif (mixer := _mixer_of(classes, lower)) is not None:
            role = "attention"
            rec["mixer"].add(mixer)
        elif owner is not None and "Norm" in type(owner).__name__:
            role = "norms"
        elif any(s in _MLP_SEGMENTS for s in lower) or any(
                k in c for c in classes for k in ("MLP", "FeedForward", "FFN", "Moe", "MoE")):
            role = "dense_mlp"
        elif len(segs) == 1 and type(owner).__name__ in ("Linear", "Conv1D"):
            role = "dense_mlp"  # FFN projections held by the layer itself (OPT fc1/fc2)
        elif prefix is None and isinstance(owner, nn.Linear):
            role = "dense_mlp"  # a user's module without blocks: its linears are its MLP
        else:
            role = "other"
        rec[role] += n
        roles[name] = role
    for i, containers in expert_containers.items():
        num = max(containers.values())
        rec = layers[i]
        rec["num_experts"] = num
        k = topk_cfg
        if isinstance(k, list):
            k = k[i] if i < len(k) else None
        if not isinstance(k, int) or k <= 0:
            here = f"{prefix}.{i}." if prefix is not None else ""
            k = next((getattr(m, "top_k") for path, m in modules.items() if path.startswith(here)
                      and isinstance(getattr(m, "top_k", None), int)), None)
        if not isinstance(k, int) or k <= 0:
            raise BuildError(f"layer {i} has {num} routed experts but the config gives no top-k "
                             f"(looked for {', '.join(_TOPK_KEYS)})")
        rec["experts_per_tok"] = min(k, num)
    for rec in layers:
        kinds = rec.pop("mixer")
        rec["mixer"] = ("attention" if "attention" in kinds else sorted(kinds)[0]) if kinds else "none"
    return dict(top=top, layers=layers, prefix=prefix, roles=roles)


_WINDOW_KEYS = {
    # transformers' layer_types -> the config field bounding the keys one query attends to.
    "sliding_attention": ("sliding_window",),  # Mistral/Gemma/GPT-OSS/MiMo local layers (window of w keys)
    "chunked_attention": ("attention_chunk_size",),  # Llama 4 iRoPE local layers (keys of the query's chunk)
    "indexed_attention": ("index_topk",),  # DeepSeek-V3.2 DSA: the lightning indexer selects top-k keys
}
"""Attention layer types whose quadratic term is bounded (DeepSeek-V3.2 report §2.1: core attention O(L·k))."""


def _attention_facts(model, parts: dict, text_cfg) -> None:
    """Per softmax-attention layer: its width (query heads x q.k head width, from the built module) and the
    keys one query may attend to (`layer_types` of the config: sliding window, chunk, DSA top-k)."""
    prefix, layers = parts["prefix"], parts["layers"]
    if prefix is None:
        return
    heads = _get(text_cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    types = _get(text_cfg, "layer_types")
    modules = dict(model.named_modules())
    for rec in layers:
        if rec["mixer"] != "attention":
            continue
        i = rec["index"]
        kind = types[i] if isinstance(types, (list, tuple)) and i < len(types) and isinstance(types[i], str) \
            else "full_attention"
        rec["attention_kind"] = kind
        keys = _WINDOW_KEYS.get(kind)
        window = _as_int(_get(text_cfg, *keys)) if keys else None
        rec["attention_window"] = window
        here = f"{prefix}.{i}."
        mod = next((m for path, m in modules.items() if path.startswith(here) and "Attention" in type(m).__name__
                    and isinstance(getattr(m, "qk_head_dim", getattr(m, "head_dim", None)), int)), None)
        layer_heads = heads[i] if isinstance(heads, list) and i < len(heads) else heads
        if mod is not None and isinstance(layer_heads, int):
            hd = getattr(mod, "qk_head_dim", None) or getattr(mod, "head_dim")
            rec["attention_width"] = layer_heads * hd


def _scan_facts(model, parts: dict) -> None:
    """Per layer: the widths of its chunked scan or indexer, read from the built module's attributes (gated
    DeltaNet: num_v_heads / head_k_dim / head_v_dim and the chunk size its torch function defaults to; Mamba-2
    mixers: num_heads / head_dim / ssm_state_size / chunk_size; the DSA indexer: n_heads / head_dim)."""
    import inspect
    import sys

    prefix, layers = parts["prefix"], parts["layers"]
    if prefix is None:
        return
    modules = dict(model.named_modules())
    for rec in layers:
        here = f"{prefix}.{rec['index']}."
        for path, m in modules.items():
            if not path.startswith(here):
                continue
            a = lambda *names: all(isinstance(getattr(m, n, None), int) for n in names)  # noqa: E731
            if a("num_v_heads", "head_k_dim", "head_v_dim"):
                fn = getattr(sys.modules[type(m).__module__], "torch_chunk_gated_delta_rule", None)
                chunk = inspect.signature(fn).parameters["chunk_size"].default if fn is not None else None
                if isinstance(chunk, int):
                    rec["scan"] = dict(kind="gated_delta", heads=m.num_v_heads, key_dim=m.head_k_dim,
                                       value_dim=m.head_v_dim, chunk=chunk)
                break
            if a("num_heads", "head_dim", "ssm_state_size", "chunk_size"):
                rec["scan"] = dict(kind="mamba2_ssd", heads=m.num_heads, key_dim=m.ssm_state_size,
                                   value_dim=m.head_dim, chunk=m.chunk_size)
                break
            if a("n_heads", "head_dim", "index_topk"):
                rec["scan"] = dict(kind="dsa_indexer", heads=m.n_heads, key_dim=m.head_dim)
                break


def linear_groups(model, parts: dict, *, head=None, hidden: Optional[int] = None) -> tuple[LinearGroup, ...]:
    """The matmul weights of a built model (`linear_layers()` view), one group per (name pattern, shape):
    nn.Linear modules and fused expert tensors (3-D parameters of an `experts` module), vision towers
    left out, with the role `_classify` gave the weight. `head` / `hidden`: the output head and hidden size
    (default: from `get_output_embeddings()` / `get_input_embeddings()`)."""
    import re

    import torch.nn as nn  # lazy: see _import

    roles = parts["roles"]
    prefix = parts["prefix"]
    groups: dict[tuple, dict] = {}

    def add(name: str, out_f: int, in_f: int, fused: int, role: str) -> None:
        layer, pattern = -1, name
        if prefix is not None and name.startswith(prefix + "."):
            head, _, rest = name[len(prefix) + 1:].partition(".")
            if head.isdigit():
                layer, pattern = int(head), f"{prefix}.{{i}}.{rest}"
        g = groups.setdefault((pattern, out_f, in_f, fused), dict(pattern=pattern, out_features=out_f,
                                                                in_features=in_f, fused_experts=fused,
                                                                role=role, layers=[]))
        if layer >= 0:
            g["layers"].append(layer)

    if head is None and hasattr(model, "get_output_embeddings"):
        head = model.get_output_embeddings()
    for name, mod in model.named_modules():
        if _is_vision(name + "."):
            continue
        if isinstance(mod, nn.Linear):
            role = "lm_head" if mod is head else roles.get(f"{name}.weight", "other")  # a tied head: no own weight
            add(name, mod.out_features, mod.in_features, 0, role)
        elif name.rsplit(".", 1)[-1] == "experts" or type(mod).__name__.endswith("Experts"):
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() != 3:
                    continue
                if hidden is None:
                    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
                    hidden = getattr(emb, "embedding_dim", None)
                e, a, b = (int(x) for x in p.shape)
                # transformers stores (E, out, in) for F.linear, GPT-OSS (E, in, out) for x @ W: the side equal
                # to the hidden size is the input of gate/up and the output of down.
                out_f, in_f = (b, a) if (a == hidden and b != hidden and not re.search(r"down", pname)) else (a, b)
                if a != hidden and b == hidden:
                    out_f, in_f = a, b
                add(f"{name}.{pname}", out_f, in_f, e, roles.get(f"{name}.{pname}", "routed_experts"))
    return tuple(LinearGroup(pattern=g["pattern"], out_features=g["out_features"], in_features=g["in_features"],
                             layers=tuple(g["layers"]), fused_experts=g["fused_experts"], role=g["role"])
                 for g in groups.values())


def _buffers_not_counted(model) -> int:
    return sum(b.numel() for name, b in model.named_buffers()
               if not any(k in name for k in ("inv_freq", "rotary", "rope", "cos_cached", "sin_cached", "causal_mask",
                                              "position_ids", "masked_bias", "bias_mask", "embed_scale")))


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
            vision = sum(p.numel() for n, p in full.named_parameters() if _is_vision(n))
        notes.append(f"multimodal config ({config.get('model_type')}): the language model is counted from "
                     f"text_config ({_get(text, 'model_type')}); vision/audio towers and projectors are reported "
                     "apart" + ("" if full is not None else " (could not be built, not counted)"))
    if model is None:
        raise BuildError(f"transformers {tf.__version__} cannot build model_type {config.get('model_type')!r}: "
                         + "; ".join(errors), offer_from_architectures(config))
    try:
        n_layers = _get(text, "num_hidden_layers", "n_layer", "num_layers")
        parts = _classify(model, n_layers if isinstance(n_layers, int) else None, _get(text, *_TOPK_KEYS), skip_vision)
        _attention_facts(model, parts, text)
        _scan_facts(model, parts)
        linears = linear_groups(model, parts)
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unexpected module tree: refuse with the reason, never crash
        raise BuildError(f"cannot assign the parameters of {type(model).__name__} to layers and roles: "
                         f"{type(exc).__name__}: {exc}") from None
    top = parts["top"]
    if skip_vision:
        vision = top["vision"]
    buffers = _buffers_not_counted(model)
    if buffers:
        notes.append(f"{buffers} elements of registered buffers (router score-correction biases and the like) "
                     "are not parameters and are not counted")
    return MeasuredParams(
        model_class=type(model).__name__, transformers_version=tf.__version__,
        embedding=top["embedding"], lm_head=top["lm_head"], final_norms=top["final_norms"], other=top["other"],
        layers=tuple(LayerParams(**rec) for rec in parts["layers"]), buffers_not_counted=buffers,
        vision_params=vision, notes=tuple(notes), linears=linears,
    )


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


def _as_int(v: Any) -> Optional[int]:
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        return max(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def shape_fields(text_cfg: Any, m: MeasuredParams) -> dict:
    """ModelShape keyword arguments for the estimator's formulas, from the (text) config and the measurement.

    Widths that the config names differently per family (or not at all) are derived from the measured
    counts: the dense FFN width from the dense-MLP parameters of a dense layer, the expert width from one
    routed expert, the shared-expert width from a layer's shared experts. They are effective widths (what a
    gated FFN of that many parameters would have); the exact counts stay in `measured`.
    """
    h = _as_int(_get(text_cfg, "hidden_size", "n_embd", "d_model", "dim"))
    if h is None:
        raise BuildError("the config has no hidden_size (nor n_embd / d_model)")
    heads = _as_int(_get(text_cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")) or 1
    if _get(text_cfg, "multi_query") is True:
        kv = 1
    else:
        kv_raw = _get(text_cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num",
                      "n_kv_heads")
        if isinstance(kv_raw, list) and kv_raw and all(isinstance(x, int) and x > 0 for x in kv_raw):
            kv_raw = math.gcd(*kv_raw)  # per-layer KV heads: what every layer can be split by
        kv = _as_int(kv_raw)
    head_dim = _as_int(_get(text_cfg, "head_dim", "attention_head_dim", "kv_channels"))
    if head_dim is None:
        head_dim = max(1, h // heads)
    if kv is None or heads % kv:
        kv = heads
    vocab = _as_int(_get(text_cfg, "vocab_size", "padded_vocab_size")) or max(1, m.embedding // h)

    def width_of(measured_each: int, named: Optional[int], gated_default: bool) -> tuple[int, bool]:
        # The FFN width the config names when the measured parameters agree with it (biases aside), else the
        # width a gated (3 matrices) or plain (2 matrices) FFN of that many parameters would have.
        if named:
            for gated_try in (True, False):
                w = 3 if gated_try else 2
                if abs(measured_each - w * h * named) <= 0.01 * measured_each:
                    return named, gated_try
        w = 3 if gated_default else 2
        return max(1, measured_each // (w * h)), gated_default

    dense = [l.dense_mlp for l in m.layers if l.dense_mlp]
    inter_cfg = _as_int(_get(text_cfg, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"))
    if dense:
        inter, gated = width_of(max(dense), inter_cfg, True)
    else:
        inter, gated = inter_cfg or 4 * h, True
    kw: dict = dict(
        hidden_size=h, num_hidden_layers=len(m.layers), num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, intermediate_size=max(1, inter), vocab_size=vocab, tie_word_embeddings=m.lm_head == 0,
        mlp_gated=gated, max_position_embeddings=_as_int(_get(text_cfg, "max_position_embeddings", "n_positions")),
        hidden_act=str(_get(text_cfg, "hidden_act", "activation_function") or "silu"),
    )
    if _get(text_cfg, "attention_bias") is True:
        kw["attention_bias"] = True
    moe = [l for l in m.layers if l.is_moe]
    if moe:
        each = max(l.expert_params_each for l in moe)
        named = _as_int(_get(text_cfg, "moe_intermediate_size", "expert_intermediate_size"))
        if named is None and not dense:
            named = inter_cfg  # Mixtral / GPT-OSS name the expert width intermediate_size
        ie, gated_e = width_of(each, named, gated)
        kw.update(num_experts=max(l.num_experts for l in moe), num_experts_per_tok=max(l.experts_per_tok for l in moe),
                  moe_intermediate_size=ie, mlp_gated=gated_e,
                  mlp_only_layers=tuple(l.index for l in m.layers if not l.is_moe))
        shared = max(l.shared_experts for l in moe)
        if shared:
            kw["shared_expert_intermediate_size"] = max(1, shared // ((3 if gated_e else 2) * h))
    mla = {k: _as_int(_get(text_cfg, k)) for k in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")}
    if all(mla.values()):
        kw.update(mla, q_lora_rank=_as_int(_get(text_cfg, "q_lora_rank")), head_dim=None, num_key_value_heads=None)
    return kw


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
    import re

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
        if _is_vision(name + "."):
            continue
        if isinstance(mod, torch.nn.Linear):
            add(name, (mod.out_features, mod.in_features), False)
        elif name.rsplit(".", 1)[-1] == "experts" or type(mod).__name__.endswith("Experts"):
            for pname, p in mod.named_parameters(recurse=False):
                if p.dim() == 3:
                    add(f"{name}.{pname}", tuple(p.shape), True)
    return tuple(tuple(sorted(g.items())) for g in groups.values())
