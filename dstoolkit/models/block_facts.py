"""What a built model's blocks are made of (split from `dstoolkit.models.module_tree`, which finds the layers and
the roles it reads): the norm, the biases, the FFN's gating, width and activation, the positions (RoPE and its
rotary share, a learned table, ALiBi), a parallel attention + MLP block, a norm after the embedding, a bias on the
output head and a shared-expert gate, as `dstoolkit.models.measured.ArchFacts` fields (`block_facts`), and the
ModelShape fields they give (`arch_fields`).

torch is imported inside the functions only (the core imports no torch); nothing here imports transformers.
"""
from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from typing import Any, Optional

from dstoolkit.models.measured import ROW_PARALLEL_NAMES, ArchFacts
from dstoolkit.models.module_tree import (ATTENTION_SEGMENTS, MLP_SEGMENTS, ROUTER_SEGMENTS, BuildError, config_value,
                                          is_vision)
from dstoolkit.models.shape import rope_scaling_of

_ALIBI_KEYS = ("alibi",)
"""Config flags that switch a family to ALiBi (Falcon `alibi`)."""
_PARALLEL_KEYS = ("use_parallel_residual", "parallel_attn", "parallel_residual")
"""Config flags for attention and MLP reading the same input (GPT-NeoX, Falcon, StableLM)."""


SCORE_BIAS = "e_score_correction_bias"
"""The name transformers gives a router's per-expert score-correction bias (DeepseekV3TopkRouter, GLM-4-MoE, ...:
a buffer in transformers 5)."""


def _has_bias(mod) -> bool:
    return getattr(mod, "bias", None) is not None and hasattr(mod.bias, "shape")


def _norm_kind(mod) -> str:
    name = type(mod).__name__
    if "RMS" in name or "Rms" in name:
        return "rmsnorm"
    if "LayerNorm" in name:
        if _has_bias(mod):
            return "layernorm"
        weight = getattr(mod, "weight", None)
        return "layernorm_no_bias" if hasattr(weight, "shape") else "layernorm_no_params"
    return name


def _one_plus_weight(mod) -> bool:
    # Gemma-style norms scale by (1 + weight) (weights initialised at zero); read from the forward's source
    try:
        src = inspect.getsource(type(mod).forward)
    except (OSError, TypeError):
        return False
    return bool(re.search(r"\(\s*1(\.0)?\s*\+\s*self\.weight", src))


def sublayer_output_norm(layer) -> bool:
    """Whether a decoder layer's forward applies one of its norms to an attention or MLP output before the residual
    add (post-norm: OLMo-2's post_attention_layernorm; sandwich: Gemma-2's post_feedforward_layernorm), read from
    the forward's statements in order by data flow: a name assigned from a sublayer call (a child named as
    attention or MLP, module_tree.ATTENTION_SEGMENTS / MLP_SEGMENTS), or from an expression of such a name without
    `+`, holds its output until a `+` makes it a residual sum; a norm child called on it is an output norm. A
    sublayer that is handed the residual adds it itself (BLOOM's self_attention(x, residual)); a pre-norm block
    (Llama) norms the sum; a parallel block (GPT-NeoX) norms the block input. False when the source cannot be
    read."""
    children = dict(layer.named_children())
    norms = {n for n, m in children.items() if "Norm" in type(m).__name__}
    subs = {n for n in children if n.lower() in ATTENTION_SEGMENTS | MLP_SEGMENTS}
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(layer).forward)))
    except (OSError, TypeError, SyntaxError):
        return False
    fn = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if fn is None:
        return False

    def self_calls(node, names) -> list:
        return [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" and n.func.attr in names]

    def names_in(node) -> set:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    def targets(st) -> set:
        tgts = st.targets if isinstance(st, ast.Assign) else [st.target] if isinstance(st, (ast.AnnAssign,
                                                                                        ast.AugAssign)) else []
        return {n.id for t in tgts for n in ast.walk(t) if isinstance(n, ast.Name)}

    fresh: set = set()

    def visit(stmts) -> bool:
        for st in stmts:
            blocks = [getattr(st, k) for k in ("body", "orelse", "finalbody") if isinstance(getattr(st, k, None), list)]
            if blocks:
                if any(visit(b) for b in blocks):
                    return True
                continue
            for c in self_calls(st, norms):
                if c.args and names_in(c.args[0]) & fresh:
                    return True
            added = any(isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ast.Add) for n in ast.walk(st))
            handed = any("residual" in a for c in self_calls(st, subs) for a in names_in(c))
            out = targets(st)
            value = getattr(st, "value", None)
            if added or handed:
                fresh.difference_update(out)
            elif self_calls(st, subs) or (value is not None and names_in(value) & fresh):
                fresh.update(out)
            else:
                fresh.difference_update(out)
        return False

    return visit(fn.body)


def _qk_norm_scope(layer_mods: list, text_cfg) -> Optional[str]:
    """The q / k norms a layer's attention module holds as its own children (q_norm, k_norm, q_layernorm,
    query_layernorm ...; not multi-latent attention's q_a / kv_a norms, nor an indexer's, which sit deeper):
    "head" when their width is the attention module's head_dim (else hidden / heads), "projection" when wider;
    None without such norms."""
    by_path = dict(layer_mods)
    widths = set()
    head = None
    for path, m in layer_mods:
        if "." not in path or "Norm" not in type(m).__name__ or getattr(m, "weight", None) is None:
            continue
        parent, name = path.rsplit(".", 1)
        if name.lower()[:1] not in ("q", "k") or parent.rsplit(".", 1)[-1].lower() not in ATTENTION_SEGMENTS:
            continue
        if name.lower().startswith(("q_a", "kv_a")):
            continue  # multi-latent attention's norms of its compressed q / kv (q_a_layernorm): part of MLA
        widths.add(int(m.weight.shape[-1]))
        head = head or getattr(by_path.get(parent), "head_dim", None)
    if not widths:
        return None
    if not isinstance(head, int):
        hidden = config_value(text_cfg, "hidden_size", "n_embd", "d_model")
        heads = config_value(text_cfg, "num_attention_heads", "n_head", "num_heads")
        head = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
    return "head" if widths == {head} else "projection"


def block_facts(model, parts: dict, text_cfg, act_name=None) -> dict:
    """The `ArchFacts` fields of a built model (`dstoolkit.models.measured.ArchFacts`): read from the first decoder
    layer with softmax attention and a dense FFN (norm, biases, FFN gating and width, activation), the modules
    outside the layers (position table, rotary module, embedding norm, head bias) and the config's flags where the
    modules do not show it (ALiBi, parallel residual). `act_name(module)`: the name transformers gives an
    activation module (None: unknown)."""
    import torch.nn as nn  # lazy: the core imports no torch

    prefix, layers, roles = parts["prefix"], parts["layers"], parts["roles"]
    modules = dict(model.named_modules())
    facts: dict = {}
    if prefix is None:
        return facts
    in_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    facts["lm_head_bias"] = head is not None and _has_bias(head)
    tensors = [n for n, _ in model.named_buffers()] + [n for n, _ in model.named_parameters()]
    facts["router_score_bias"] = any(n.startswith(prefix + ".") and n.endswith(SCORE_BIAS) for n in tensors)

    def layer_modules(i: int):
        here = f"{prefix}.{i}."
        return [(path[len(here):], m) for path, m in modules.items() if path.startswith(here)]

    def role_of(path_in_layer: str, i: int, m) -> Optional[str]:
        for pname, _ in m.named_parameters(recurse=False):
            return roles.get(f"{prefix}.{i}.{path_in_layer}.{pname}")
        return None

    attn_layers = [r["index"] for r in layers if r["mixer"] == "attention"]
    dense_layers = [r["index"] for r in layers if r["dense_mlp"]]
    i_attn = attn_layers[0] if attn_layers else None
    i_mlp = next((i for i in dense_layers if i in attn_layers), dense_layers[0] if dense_layers else None)
    norms = []
    if i_attn is not None:
        qkv_bias = o_bias = False
        attn_modules = layer_modules(i_attn)
        for path, m in attn_modules:
            if "Norm" in type(m).__name__ and "." not in path:
                norms.append(m)
            if not isinstance(m, nn.Linear) and type(m).__name__ != "Conv1D":
                continue
            if role_of(path, i_attn, m) != "attention":
                continue
            if path.rsplit(".", 1)[-1] in ROW_PARALLEL_NAMES:
                o_bias = o_bias or _has_bias(m)
            else:
                qkv_bias = qkv_bias or _has_bias(m)
        facts.update(qkv_bias=qkv_bias, o_bias=o_bias)
        has_mlp = any(r["index"] == i_attn and (r["dense_mlp"] or r["routed_experts"]) for r in layers)
        flag = config_value(text_cfg, *_PARALLEL_KEYS)
        facts["parallel_residual"] = flag is True or (flag is None and has_mlp and len(norms) == 1)
        facts["qk_norm"] = _qk_norm_scope(attn_modules, text_cfg)
        layer_mod = modules.get(f"{prefix}.{i_attn}")
        facts["output_norm"] = layer_mod is not None and sublayer_output_norm(layer_mod)
        if norms:
            facts["norm"] = _norm_kind(norms[0])
            facts["norm_one_plus_weight"] = _one_plus_weight(norms[0])
    if i_mlp is not None:
        lin = [(path, m) for path, m in layer_modules(i_mlp) if isinstance(m, nn.Linear)
               and role_of(path, i_mlp, m) == "dense_mlp"]
        facts["mlp_bias"] = any(_has_bias(m) for _, m in lin)
        down = [m for path, m in lin if path.rsplit(".", 1)[-1] in ROW_PARALLEL_NAMES]
        if len(down) == 1:
            width = down[0].in_features
            ups = [m for _, m in lin if m is not down[0]]
            facts["mlp_width"] = width
            facts["mlp_gated"] = len(ups) >= 2 or any(m.out_features == 2 * width for m in ups)
    i_act = i_mlp if i_mlp is not None else (layers[0]["index"] if layers else None)
    if i_act is not None and act_name is not None:
        leaves = [(path, m) for path, m in layer_modules(i_act) if not list(m.children())
                  and not list(m.parameters(recurse=False))]
        leaves = [(p, m) for p, m in leaves if not any(seg in ROUTER_SEGMENTS for seg in p.lower().split("."))]
        ffn = [(p, m) for p, m in leaves if any(k in p.lower() for k in ("mlp", "expert", "ffn", "feed_forward"))]
        for path, m in ffn + leaves:
            name = act_name(m)
            if name is not None:
                facts["activation"] = name
                break
        else:  # an activation module transformers does not name (BLOOM's BloomGelu): its class name
            odd = next((type(m).__name__ for _, m in ffn if any(k in type(m).__name__.lower()
                                                               for k in ("gelu", "relu", "silu", "swish", "act"))), None)
            if odd is not None:
                facts["activation"] = odd
    shared_gate = False
    for name, m in modules.items():
        if isinstance(m, nn.Linear) and m.out_features == 1 and roles.get(f"{name}.weight") == "shared_experts":
            shared_gate = True
            break
    facts["shared_expert_gate"] = shared_gate
    # positions: the config's ALiBi flag, a rotary module, a position table beside the token embedding, or an
    # ALiBi builder in the family's modelling module
    rotary = next((m for path, m in modules.items() if "Rotary" in type(m).__name__ and not is_vision(path + ".")), None)
    table = next((m for path, m in modules.items() if isinstance(m, nn.Embedding) and m is not in_emb
                  and not path.startswith(prefix + ".") and not is_vision(path + ".")
                  and "pos" in path.rsplit(".", 1)[-1].lower()), None)
    family = sys.modules.get(type(model).__module__)
    if config_value(text_cfg, *_ALIBI_KEYS) is True:
        facts["positions"] = "alibi"
    elif rotary is not None:
        facts["positions"] = "rope"
        inv = getattr(rotary, "inv_freq", None)
        if inv is not None and hasattr(inv, "shape") and inv.dim() == 1:
            facts["rotary_dim"] = 2 * int(inv.shape[0])
    elif table is not None:
        facts["positions"] = "learned"
    elif family is not None and any("alibi" in n.lower() for n in vars(family)):
        facts["positions"] = "alibi"
    else:
        facts["positions"] = "none"
    facts["embedding_norm"] = any("Norm" in type(m).__name__ and not path.startswith(prefix + ".")
                                  and "emb" in path.rsplit(".", 1)[-1].lower() and not is_vision(path + ".")
                                  for path, m in modules.items())
    return facts


def _rope_scaling_of_config(text_cfg: Any):
    """The config object's rope scaling (rope_parameters in transformers 5, rope_scaling before), checked by the
    one parser (shape.rope_scaling_of); per-layer-type parameters (Gemma-3): the full-attention layers'."""
    for key in ("rope_parameters", "rope_scaling"):
        value = config_value(text_cfg, key)
        if isinstance(value, dict) and value and all(isinstance(v, dict) or v is None for v in value.values()):
            value = value.get("full_attention") or next((v for v in value.values() if v), None)
        if value is not None:
            try:
                return rope_scaling_of(value, key)
            except ValueError as exc:
                raise BuildError(str(exc)) from None
    return None


NORM_VARIANTS = {"layernorm_no_bias": "LayerNorm without bias",
                 "layernorm_no_params": "LayerNorm without weight or bias (non-parametric)"}
"""How ModelShape.norm_variant words the LayerNorms `_norm_kind` tells apart from plain LayerNorm."""


def arch_fields(text_cfg: Any, arch: ArchFacts, head_dim: int) -> dict:
    """ModelShape fields of what the blocks are made of (block_facts of the built model): norm, biases, positions,
    rotary share, residual wiring, embedding norm, head bias."""
    kw: dict = dict(attention_bias=arch.qkv_bias, o_proj_bias=arch.o_bias, mlp_bias=arch.mlp_bias,
                    lm_head_bias=arch.lm_head_bias, parallel_residual=arch.parallel_residual,
                    embedding_norm=arch.embedding_norm, output_norm=arch.output_norm,
                    qk_norm=arch.qk_norm is not None, qk_norm_scope=arch.qk_norm or "head",
                    rope_scaling=_rope_scaling_of_config(text_cfg))
    if arch.norm in ("rmsnorm", "layernorm"):
        kw["norm_type"] = arch.norm
    elif arch.norm in NORM_VARIANTS:
        kw["norm_type"], kw["norm_variant"] = "layernorm", NORM_VARIANTS[arch.norm]
    else:
        kw["norm_variant"] = f"norm module {arch.norm}"
    if arch.norm_one_plus_weight:
        kw["norm_variant"] = "scales by (1 + weight)"
    if arch.positions == "learned":
        kw["learned_positions"] = True
    else:
        kw["position_encoding"] = arch.positions
    if arch.rotary_dim and head_dim and arch.rotary_dim < head_dim:
        kw["rotary_fraction"] = arch.rotary_dim / head_dim
    return kw
