"""How a built model is read, whoever built it (transformers from a config, or the user's own module):
the decoder layers, every parameter's layer and role (`dstoolkit.models.measured.ROLES`), per-layer attention
and scan facts, the linear layers planners read, and the buffers that are not parameters. What the blocks are made
of (norm, biases, positions) is `dstoolkit.models.block_facts`.

torch is imported inside the functions only (the core imports no torch); nothing here imports transformers.
"""
from __future__ import annotations

import inspect
import re
import sys
from typing import Any, Optional

from dstoolkit.models.config_keys import TOPK_KEYS
from dstoolkit.models.measured import LinearGroup

_VISION_MARKERS = ("vision", "visual", "audio", "multi_modal_projector", "mm_projector", "embed_vision",
                   "embed_audio", "image_newline", "patch_embed", "speech")
ROUTER_SEGMENTS = frozenset({"gate", "router", "wg", "gating", "gate_network"})
ATTENTION_SEGMENTS = frozenset({"self_attn", "attention", "attn", "self_attention"})
MLP_SEGMENTS = frozenset({"mlp", "feed_forward", "ffn", "block_sparse_moe", "moe"})
MODEL_TOPK_KEYS = TOPK_KEYS + ("n_activated_experts", "num_activated_experts", "top_k")
"""Top-k keys read from a built model's config: the shared ones and names only some families use."""


class BuildError(ValueError):
    """The model cannot be built (transformers refuses the config) or read (no decoder layers found); `offer`
    names a class from the config's `architectures` that transformers does have."""

    def __init__(self, reason: str, offer: Optional[str] = None):
        self.reason = reason
        self.offer = offer
        super().__init__(reason)


def config_value(cfg: Any, *keys: str) -> Any:
    """The first of `keys` a config object has (a per-layer list where the config holds per-layer configs)."""
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


def as_int(v: Any) -> Optional[int]:
    """A positive int, or the largest of a per-layer list of ints; None otherwise."""
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        return max(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def is_vision(name: str) -> bool:
    head = ".".join(name.split(".")[:3]).lower()
    return any(m in head for m in _VISION_MARKERS)


def find_layers(model, n_layers: Optional[int], *, sequential: bool = False):
    """(prefix, ModuleList) of the decoder layers: the ModuleList with n_layers children holding most params.

    With `sequential` (a user's module) an nn.Sequential of two or more blocks of one class also counts.
    """
    import torch.nn as nn  # lazy: the core imports no torch

    best = None
    for name, mod in model.named_modules():
        if is_vision(name + "."):
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
        return find_layers(model, None, sequential=sequential)
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
    if any(k in c for c in classes for k in ("Attention", "Attn")) or any(s in ATTENTION_SEGMENTS for s in segs):
        return "attention"
    return None


def _num_experts(container, param) -> int:
    import torch.nn as nn  # lazy: the core imports no torch

    if isinstance(container, nn.ModuleList):
        return len(container)
    for attr in ("num_experts", "n_routed_experts", "num_local_experts"):
        v = getattr(container, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return int(param.shape[0]) if param.dim() >= 2 else 1


def classify(model, n_layers: Optional[int], topk_cfg: Any, skip_vision: bool, *, in_emb=None, out_emb=None,
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
    import torch.nn as nn  # lazy: the core imports no torch

    try:
        prefix, layer_list = find_layers(model, n_layers if isinstance(n_layers, int) else None,
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
        if skip_vision and is_vision(name):
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
        elif any(s in ROUTER_SEGMENTS for s in lower) or any(
                ("Router" in c or c.endswith(("Gate", "TopkRouter", "TopKRouter"))) for c in classes):
            role = "router"
        elif (mixer := _mixer_of(classes, lower)) is not None:
            role = "attention"
            rec["mixer"].add(mixer)
        elif owner is not None and "Norm" in type(owner).__name__:
            role = "norms"
        elif any(s in MLP_SEGMENTS for s in lower) or any(
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
                             f"(looked for {', '.join(MODEL_TOPK_KEYS)}): set the experts each token is routed to "
                             f"in the config, e.g. \"num_experts_per_tok\": 2")
        rec["experts_per_tok"] = min(k, num)
    for rec in layers:
        kinds = rec.pop("mixer")
        rec["mixer"] = ("attention" if "attention" in kinds else sorted(kinds)[0]) if kinds else "none"
    return dict(top=top, layers=layers, prefix=prefix, roles=roles)


def keyword_default(fn, name: str):
    """The default of keyword `name` of function `fn`, or None. Looks through wrappers: functools.wraps chains, and
    the nn.Module that transformers' hub-kernel decorator (`use_kernel_func_from_hub_with_fallback`, transformers
    >= 5.25 with `kernels` installed) puts around the torch fallback, whose forward closes over the original."""

    seen, todo = set(), [fn]
    while todo:
        f = todo.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        try:
            param = inspect.signature(f).parameters.get(name)
        except (TypeError, ValueError):
            param = None
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
        todo.append(getattr(f, "__wrapped__", None))
        forward = getattr(type(f), "forward", None) if not inspect.isfunction(f) else None
        for fun in (f, forward):
            for cell in (getattr(fun, "__closure__", None) or ()):
                try:
                    value = cell.cell_contents
                except ValueError:
                    continue
                if callable(value):
                    todo.append(value)
    return None


def scan_facts(model, parts: dict) -> None:
    """Per layer: the widths of its chunked scan or indexer, read from the built module's attributes (gated
    DeltaNet: num_v_heads / head_k_dim / head_v_dim and the chunk size its torch function defaults to; Mamba-2
    mixers: num_heads / head_dim / ssm_state_size / chunk_size; the DSA indexer: n_heads / head_dim)."""

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
                if fn is None:
                    break
                chunk = keyword_default(fn, "chunk_size")
                if not isinstance(chunk, int):
                    raise BuildError(f"{type(m).__name__} at {path}: cannot read the chunk size of "
                                     f"torch_chunk_gated_delta_rule ({type(fn).__name__}); its scan FLOPs need it")
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
    left out, with the role `classify` gave the weight. `head` / `hidden`: the output head and hidden size
    (default: from `get_output_embeddings()` / `get_input_embeddings()`)."""

    import torch.nn as nn  # lazy: the core imports no torch

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
        if is_vision(name + "."):
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


def buffers_not_counted(model) -> dict[str, int]:
    """Elements of the registered buffers that hold model state (not rotary tables, masks or index ranges), by the
    buffer's own name (`e_score_correction_bias`, BERT's `token_type_ids`): not parameters, so not counted."""
    out: dict[str, int] = {}
    for name, b in model.named_buffers():
        if not any(k in name for k in ("inv_freq", "rotary", "rope", "cos_cached", "sin_cached", "causal_mask",
                                       "position_ids", "masked_bias", "bias_mask", "embed_scale")):
            leaf = name.rsplit(".", 1)[-1]
            out[leaf] = out.get(leaf, 0) + b.numel()
    return out
