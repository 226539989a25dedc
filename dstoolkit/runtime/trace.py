"""FLOPs per token and saved-activation bytes measured on the model itself (transformers), for any architecture.

For a config without an analytic formula (hybrid Mamba/attention stacks, linear attention, attention sinks,
parallel dense+MoE FFNs, ...) the estimator's 6N + 12LHQT and its itemised activation count are guesses.
`trace_config` measures them instead, on a shrunk copy that a CPU runs in seconds:

1. Depth: the first layers only, enough to hold one layer of every kind the full model has (a kind is the
   layer's mixer + MoE-or-dense + parameter count, from `dstoolkit.models` measured counts). Per-layer
   lists/strings of the config (layer_types, hybrid patterns) are cut to that depth.
2. Vocabulary: 128 tokens; the LM head's 6·h·V per token is added back analytically (the embedding lookup
   has no FLOPs).
3. Experts: a routed-expert layer keeps `top_k` experts, so every token visits all of them and the per-token
   expert FLOPs are exactly top-k experts' (random weights cannot skew the routing). The router's h·E
   matmul is added back for the real E.

One forward and backward of `micro_batch x seq_len` random tokens runs under `torch.utils.flop_counter`
(per-module FLOPs, so each layer is measured on its own) and `torch.autograd.graph.saved_tensors_hooks`
(bytes of the distinct tensors autograd saves, attributed to the layer running when they are saved).
Each full-model layer is then given the measured figures of a shrunk layer of its kind.

Limits: widths are kept, so a layer must fit in host memory in `dtype` (the biggest dense layers of
400B-class models do not: `TraceError`). Data-dependent code that cannot run on random tokens is reported as
a `TraceError` naming the op; the caller then keeps the analytic accounting.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Optional

import torch

from dstoolkit.models import shape_from_hf_dict
from dstoolkit.models.config_keys import EXPERT_KEYS, TOPK_KEYS
from dstoolkit.models.flop_count import attention_flop_mapping
from dstoolkit.models.measured import LayerParams, MeasuredParams

SHRUNK_VOCAB = 128
"""Vocabulary of the traced copy (the LM head is added back analytically)."""
MAX_TRACE_PARAMS = 1_500_000_000
"""Refuse to materialise a shrunk copy larger than this many parameters on the host."""
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


class TraceError(RuntimeError):
    """The model cannot be traced this way (reason in the message); keep the analytic accounting."""


@dataclass(frozen=True)
class TraceResult:
    """FLOPs and activations of the full model, scaled from the traced copy."""

    model_type: str
    seq_len: int
    micro_batch: int
    dtype: str
    traced_layers: int
    """Depth of the shrunk copy."""
    flops_per_token: float
    """Training (forward + backward) FLOPs per token of the full model, LM head included."""
    forward_flops_per_token: float
    layer_flops: tuple[float, ...]
    """Training FLOPs per micro batch of each full-model layer."""
    layer_saved_bytes: tuple[int, ...]
    """Saved-activation bytes per micro batch of each full-model layer."""
    head_saved_bytes: int
    """Saved bytes outside the layers (embedding output, final norm, LM head and loss) of the traced copy
    (shrunk vocabulary: the logits term is recomputed for the real V in `outside_saved_bytes`)."""
    outside_saved_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def saved_bytes(self) -> int:
        return sum(self.layer_saved_bytes) + self.outside_saved_bytes


def _first(d: dict, keys) -> Optional[str]:
    return next((k for k in keys if isinstance(d.get(k), int) and not isinstance(d.get(k), bool)), None)


def _signature(layer: LayerParams) -> tuple:
    return (layer.mixer, layer.num_experts > 0, layer.total)


def _per_layer(key: str, value, n_layers: int) -> bool:
    """A per-layer setting: a list with one entry per layer, or a layer-pattern string (hybrid_override_pattern)."""
    if key == "architectures":
        return False
    if isinstance(value, list):
        return len(value) == n_layers
    return isinstance(value, str) and "pattern" in key and len(value) == n_layers


def truncate_layers(config: dict, n: int) -> dict:
    """A copy of `config` (its text_config for multimodal configs) with only the first `n` layers: the layer
    count and every per-layer list/string of the config's length (layer_types, hybrid patterns) cut to n."""
    d = copy.deepcopy(config.get("text_config") or config)
    if "text_config" in config:
        d.setdefault("model_type", config["text_config"].get("model_type"))
    key = _first(d, _LAYER_KEYS)
    if key is None:
        raise TraceError("the config names no layer count (num_hidden_layers / n_layer / num_layers)")
    full = d[key]
    for k, value in list(d.items()):
        if _per_layer(k, value, full):
            d[k] = value[:n]
    for k in _LAYER_KEYS:
        if k in d:
            d[k] = n
    return d


def _shrink(config: dict, measured: MeasuredParams, full_depth: bool = False) -> tuple[dict, int, list[int], list[str]]:
    """(shrunk text config, depth, full-layer -> traced-layer map, notes)."""
    notes: list[str] = []
    d = copy.deepcopy(config.get("text_config") or config)
    if "text_config" in config:
        d.setdefault("model_type", config["text_config"].get("model_type"))
        notes.append("traced the language model of the multimodal config (text_config)")
    d.pop("quantization_config", None)
    layers = measured.layers
    n = len(layers)
    sigs = [_signature(l) for l in layers]
    wanted = set(sigs)
    depth = n if full_depth else next(i + 1 for i in range(n) if set(sigs[: i + 1]) == wanted)
    if depth > 12 and not full_depth:
        raise TraceError(f"every layer kind first appears within the first {depth} layers; too deep to trace")
    rep = {}
    for i in range(depth):
        rep.setdefault(sigs[i], i)
    mapping = [rep[s] for s in sigs]
    for key, value in list(d.items()):
        if _per_layer(key, value, n):
            d[key] = value[:depth]
    for key in _LAYER_KEYS:
        if key in d:
            d[key] = depth
    d["vocab_size"] = SHRUNK_VOCAB
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if key in d:
            d[key] = 0
    ek, kk = _first(d, EXPERT_KEYS), _first(d, TOPK_KEYS)
    if measured.num_moe_layers:
        if ek is None or kk is None:
            raise TraceError("MoE config without a recognised experts / top-k field: cannot shrink the experts")
        k = d[kk]
        d[ek] = k
        for key in ("n_group", "topk_group"):  # grouped routing: one group holding the k experts
            if key in d:
                d[key] = 1
        notes.append(f"experts shrunk to top-k={k} per MoE layer (every token visits each of them: exact "
                     "per-token expert FLOPs); the router matmul is added back for the real expert count")
    return d, depth, mapping, notes


def _build_small(d: dict, dtype: torch.dtype):
    import transformers  # noqa: PLC0415 - the heavy import only when tracing

    cfg = transformers.AutoConfig.for_model(**d)
    # sdpa attention (what training runs; its CPU kernel gets a FLOP formula below) and the eager expert loop
    # (plain linears the counter sees; grouped-mm kernels have no FLOP formula).
    for attr, value in (("_attn_implementation", "sdpa"), ("_experts_implementation", "eager")):
        try:
            setattr(cfg, attr, value)
        except Exception:  # noqa: BLE001 - a config class without that switch
            pass
    try:
        with torch.device("meta"):
            meta = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError as exc:
        if "scaled_dot_product_attention" not in str(exc):
            raise TraceError(f"transformers cannot build the shrunk copy: {str(exc).splitlines()[0][:200]}") from None
        cfg._attn_implementation = "eager"  # no sdpa path for this architecture: eager attention (matmuls)
        with torch.device("meta"):
            meta = transformers.AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in meta.parameters())
    if n > MAX_TRACE_PARAMS:
        raise TraceError(f"the shrunk copy still has {n / 1e9:.2f}B parameters (limit {MAX_TRACE_PARAMS / 1e9:.1f}B): "
                         "its layers are too wide to run on the host")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype,
                                                          attn_implementation=cfg._attn_implementation)
    model.train()
    for m in model.modules():  # dropout off: masks would add saved bytes the estimator counts separately
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model, cfg


def _layer_list(model, depth: int):
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == depth:
            size = sum(p.numel() for p in mod.parameters())
            if best is None or size > best[2]:
                best = (name, mod, size)
    if best is None:
        raise TraceError("cannot find the decoder layers of the shrunk copy")
    return best[0], best[1]


def _run(model, depth: int, seq_len: int, micro_batch: int):
    from torch.utils.flop_counter import FlopCounterMode

    prefix, layers = _layer_list(model, depth)
    current = [-1]
    saved = [0] * (depth + 1)  # last bucket: outside the layers
    seen: set = set()
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(lambda _m, _a, i=i: current.__setitem__(0, i)))
        hooks.append(layer.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, -1)))

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        # Weights (and views of them, e.g. the transposed matrix a linear saves) are not activations.
        ptr = t.untyped_storage().data_ptr()
        key = (ptr, t.storage_offset(), tuple(t.shape), t.dtype)
        if ptr not in weights and key not in seen:
            seen.add(key)
            saved[current[0]] += t.numel() * t.element_size()
        return t

    ids = torch.randint(0, SHRUNK_VOCAB, (micro_batch, seq_len))
    counter = FlopCounterMode(display=False, custom_mapping=attention_flop_mapping())
    try:
        with counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(input_ids=ids, labels=ids)
            fwd_total = counter.get_total_flops()
            fwd_by_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
            out.loss.backward()
    except Exception as exc:  # noqa: BLE001 - report what stopped the trace; the caller falls back
        raise TraceError(f"tracing failed in {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from None
    finally:
        for h in hooks:
            h.remove()
    total_by_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}

    def module_flops(table: dict, i: int) -> float:
        # FlopCounterMode keys are dotted module paths from the root class name: "<Root>.model.layers.3".
        suffix = f"{prefix}.{i}"
        return float(sum(v for k, v in table.items() if k.endswith(suffix)))

    per_layer = [(module_flops(total_by_module, i), module_flops(fwd_by_module, i)) for i in range(depth)]
    return per_layer, float(counter.get_total_flops()), float(fwd_total), saved


def trace_config(config: dict, *, seq_len: int = 256, micro_batch: int = 1, dtype: torch.dtype = torch.bfloat16,
                 model_class: Optional[str] = None, full_depth: bool = False) -> TraceResult:
    """Measure training FLOPs per token and saved-activation bytes of `config` on a shrunk CPU copy.

    Args:
        config: A parsed config.json (any type transformers builds).
        seq_len, micro_batch: Tokens per sequence and sequences per micro batch of the traced step.
        dtype: Parameter/activation dtype of the traced copy (bf16 like a mixed-precision run).
        model_class: Not supported for tracing yet (the copy is built through the Auto classes).
        full_depth: Run every layer instead of one per kind (a real run of the whole stack, to check the
            per-kind scaling against; only sensible for configs cut with `truncate_layers`).

    Raises:
        TraceError: the config cannot be traced (reason given); keep the analytic accounting.
    """
    if model_class:
        raise TraceError("tracing builds through the Auto classes; a model_class config is not traced yet")
    shape = shape_from_hf_dict(config, source="transformers")
    measured = shape.measured
    small, depth, mapping, notes = _shrink(config, measured, full_depth)
    model, cfg = _build_small(small, dtype)
    if cfg._attn_implementation != "sdpa":
        notes.append(f"{cfg._attn_implementation} attention (no sdpa path in transformers for this architecture): "
                     "saved bytes include the s x s probabilities")
    per_layer, total_small, fwd_small, saved = _run(model, depth, seq_len, micro_batch)
    tokens = seq_len * micro_batch
    h, V = shape.hidden_size, shape.vocab_size
    layer_flops = tuple(per_layer[j][0] for j in mapping)
    layer_fwd = tuple(per_layer[j][1] for j in mapping)
    outside_small = total_small - sum(p[0] for p in per_layer)
    outside_fwd_small = fwd_small - sum(p[1] for p in per_layer)
    head_small = 6.0 * h * SHRUNK_VOCAB * tokens
    head_full = 6.0 * h * V * tokens
    outside = outside_small - head_small + head_full
    outside_fwd = outside_fwd_small - head_small / 3 + head_full / 3
    if measured.num_moe_layers:
        # Router matmul for the real expert count instead of the shrunk one (2·h·E fwd, 6·h·E fwd+bwd per token).
        extra = []
        for i, layer in enumerate(measured.layers):
            if layer.is_moe:
                extra.append(6.0 * h * (layer.num_experts - layer.experts_per_tok) * tokens)
            else:
                extra.append(0.0)
        layer_flops = tuple(f + e for f, e in zip(layer_flops, extra))
        layer_fwd = tuple(f + e / 3 for f, e in zip(layer_fwd, extra))
    elem = torch.finfo(dtype).bits // 8
    logits_small = tokens * SHRUNK_VOCAB * (elem + 4)  # logits and their fp32 upcast for the loss
    logits_full = tokens * V * (elem + 4)
    outside_saved = max(0, saved[-1] - logits_small) + logits_full
    total = sum(layer_flops) + outside
    fwd = sum(layer_fwd) + outside_fwd
    notes.append(f"traced a {depth}-layer copy (vocab {SHRUNK_VOCAB}) with torch.utils.flop_counter and "
                 "saved_tensors_hooks; LM head FLOPs and logits bytes added back for the real vocabulary")
    return TraceResult(
        model_type=str(config.get("model_type")), seq_len=seq_len, micro_batch=micro_batch, dtype=str(dtype),
        traced_layers=depth, flops_per_token=total / tokens, forward_flops_per_token=fwd / tokens,
        layer_flops=layer_flops, layer_saved_bytes=tuple(saved[j] for j in mapping), head_saved_bytes=saved[-1],
        outside_saved_bytes=int(outside_saved), notes=tuple(notes),
    )


def analytic_flops_per_token(config: dict, seq_len: int) -> Optional[float]:
    """The estimator's 6N + 12LHQT for configs with a hand-written reader (None otherwise)."""
    from dstoolkit.estimate.flops import flops_per_token  # runtime sits above estimate

    shape = shape_from_hf_dict(config, source="auto")
    if shape.source != "analytic":
        return None
    return flops_per_token(shape, seq_len).model


__all__ = ["TraceError", "TraceResult", "trace_config", "truncate_layers", "analytic_flops_per_token"]
