"""The user's own module: `--model mypkg.models:build` counted, estimated and planned like any config.

A reference `module.path:attribute` names either a callable returning a `torch.nn.Module` (a builder
function, or an `nn.Module` class) called with keyword arguments (`--model-kwargs '{"d": 256}'`, or
`model.module_kwargs` in a spec), or a module instance. `load_user_model` has it imported and built
(`dstoolkit.models.user_module_build`: on the meta device where its code allows, else on the CPU with a note)
and turns what it built into a `ModelShape`:

- parameters: exact, from `named_parameters()` (tied weights once), by layer and role with the same rules
  as the transformers path (`module_tree.classify`): the blocks are the biggest nn.ModuleList (or
  an nn.Sequential of blocks of one class); a module without blocks is one layer.
- widths for the estimator's activation formulas: hidden size from the input embedding (or a
  `hidden_size` / `d_model` / `n_embd` / `dim` attribute or keyword), heads from nn.MultiheadAttention or
  a `num_heads`-style attribute, FFN widths from the measured MLP parameters.
- FLOPs: there is no formula for someone else's module, so they are traced (`TracedFlops`): one forward
  and backward under `torch.utils.flop_counter` at two sequence lengths, on the meta device when possible.
- linear layers: the `linear_layers()` view FP8 planning reads (`MeasuredParams.linears`).

Inputs for the trace: the module's own `example_inputs(batch_size, seq_len)` when it has one (a tensor, a
tuple of positional arguments or a dict of keyword arguments); else token ids (batch, seq) when it has an
input embedding; else a float tensor (batch, seq, in_features of its first linear). The output may be a
tensor, a tuple/list (its first floating tensor) or an object with `.loss` / `.logits`.

torch is imported inside the functions only: the core imports this module without it. Every input problem
is a `UserModelError` naming the field, the value and the fix, never a traceback.
"""
from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from types import SimpleNamespace
from typing import Any, Optional, Sequence

from pydantic import ValidationError

from dstoolkit.models.flop_count import attention_flop_mapping
from dstoolkit.models.shape_fields import shape_fields
from dstoolkit.models.measured import LayerParams, MeasuredParams, TracedFlops
from dstoolkit.models.module_tree import BuildError, classify, find_layers, linear_groups
from dstoolkit.models.refusals import decoder_only_problem
from dstoolkit.models.shape import ModelShape
from dstoolkit.models.user_module_build import UserModelError, build_user_module, parse_kwargs

TRACE_SEQ_LENS = (128, 256)
"""Sequence lengths of the two traced steps on the meta device (FLOPs per token are affine in T)."""
CPU_TRACE_SEQ_LENS = (32, 64)
"""The same on the CPU (real tensors: kept short)."""
MAX_CPU_TRACE_PARAMS = 200_000_000
"""A module that cannot run on the meta device is traced on the CPU only up to this many parameters."""
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "d_hidden", "width", "d")
_HEADS_KEYS = ("num_attention_heads", "num_heads", "n_heads", "n_head", "heads")
_FFN_KEYS = ("intermediate_size", "ffn_dim", "d_ff", "ffn_hidden_size", "mlp_dim")


def _input_embedding(model, prefix: Optional[str]):
    import torch.nn as nn  # lazy: see build_user_module

    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
            if isinstance(emb, nn.Embedding):
                return emb
        except Exception:  # noqa: BLE001 - a user's method that is not the transformers API
            pass
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Embedding) and (prefix is None or not name.startswith(prefix + ".")):
            return mod
    return None


def _output_head(model, emb, prefix: Optional[str]):
    import torch.nn as nn  # lazy: see build_user_module

    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
            if isinstance(head, nn.Linear):
                return head
        except Exception:  # noqa: BLE001
            pass
    if emb is None:
        return None
    heads = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and m.out_features == emb.num_embeddings
             and (prefix is None or not n.startswith(prefix + "."))]
    return heads[-1] if heads else None


def _attr_int(objs, keys) -> Optional[int]:
    for obj in objs:
        for key in keys:
            v = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _widths(model, emb, kwargs: dict, layers) -> dict:
    """hidden size, heads, FFN width and vocabulary the estimator's activation formulas use."""
    import torch.nn as nn  # lazy: see build_user_module

    roots = [model, getattr(model, "config", None) or {}, kwargs]
    hidden = emb.embedding_dim if emb is not None else _attr_int(roots, _HIDDEN_KEYS)
    linears = [m for m in (layers.modules() if layers is not None else model.modules()) if isinstance(m, nn.Linear)]
    if hidden is None and linears:
        hidden = Counter(m.in_features for m in linears).most_common(1)[0][0]
    if hidden is None:
        raise UserModelError("--model", type(model).__name__, "cannot tell its hidden size (no embedding, no linear "
                             "layer, no hidden_size / d_model attribute)", "give the module a hidden_size attribute")
    heads = None
    for m in model.modules():
        if isinstance(m, nn.MultiheadAttention):
            heads = m.num_heads
            break
    if heads is None:
        heads = _attr_int(roots + list(model.modules()), _HEADS_KEYS)
    if not heads or hidden % heads:
        heads = 1
    vocab = emb.num_embeddings if emb is not None else _attr_int(roots, ("vocab_size", "n_vocab", "num_tokens"))
    return dict(hidden_size=hidden, num_attention_heads=heads, vocab_size=vocab or 1,
                intermediate_size=_attr_int(roots, _FFN_KEYS),
                num_experts_per_tok=_attr_int(roots, ("num_experts_per_tok", "top_k", "moe_top_k")))


def _example_inputs(model, emb, batch: int, seq: int, device: str):
    import torch  # lazy: see build_user_module

    fn = getattr(model, "example_inputs", None)
    if callable(fn):
        with torch.device(device):
            return fn(batch, seq)
    if emb is not None:
        return torch.randint(0, emb.num_embeddings, (batch, seq), device=device)
    first = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
    if first is None:
        raise ValueError("no input embedding, no linear layer and no example_inputs(batch_size, seq_len) method")
    return torch.randn(batch, seq, first.in_features, device=device)


def _loss_of(out):
    import torch  # lazy: see build_user_module

    for attr in ("loss", "logits"):
        v = getattr(out, attr, None)
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return next((t for t in out if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    return None


def _trace_once(model, emb, batch: int, seq: int, device: str) -> tuple[float, float]:
    """(training FLOPs, forward FLOPs) of one step of `batch` x `seq` tokens."""
    import torch  # lazy: see build_user_module
    # torch-free core: torch only when this runs (dstoolkit[train])
    from torch.utils.flop_counter import FlopCounterMode

    x = _example_inputs(model, emb, batch, seq, device)
    counter = FlopCounterMode(display=False, custom_mapping=attention_flop_mapping())
    model.train()
    with counter:
        out = model(**x) if isinstance(x, dict) else model(*x) if isinstance(x, tuple) else model(x)
        fwd = counter.get_total_flops()
        loss = _loss_of(out)
        if loss is None:
            raise ValueError(f"its forward returned {type(out).__name__}, not a tensor (nor .loss / .logits)")
        if not loss.requires_grad:
            raise ValueError("its output does not require grad (no trainable parameter reached it)")
        loss.float().sum().backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops()), float(fwd)


def trace_user_flops(model, emb, device: str) -> tuple[Optional[TracedFlops], Optional[str]]:
    """Training FLOPs per token of a user's module, traced at two sequence lengths (None and the reason when
    it cannot be traced: the estimator then keeps 6N + 12LHQT, and says so)."""
    n = sum(p.numel() for p in model.parameters())
    if device != "meta" and n > MAX_CPU_TRACE_PARAMS:
        return None, (f"not traced: the module did not build on the meta device and has {n / 1e6:.0f}M parameters "
                      f"(CPU tracing limit {MAX_CPU_TRACE_PARAMS / 1e6:.0f}M)")
    t1, t2 = TRACE_SEQ_LENS if device == "meta" else CPU_TRACE_SEQ_LENS
    try:
        f1, fw1 = _trace_once(model, emb, 1, t1, device)
        f2, _ = _trace_once(model, emb, 1, t2, device)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's forward: fall back, with the reason
        return None, f"not traced ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
    per1, per2 = f1 / t1, f2 / t2
    slope = max(0.0, (per2 - per1) / (t2 - t1))
    return TracedFlops(per_token=max(0.0, per1 - slope * t1), per_token_per_seq=slope,
                       forward_fraction=fw1 / f1 if f1 else 1 / 3, seq_lens=(t1, t2), device=device), None


def measure_user_module(model, ref: str, kwargs: dict) -> tuple[MeasuredParams, dict, Any]:
    """(measured counts, width fields, input embedding) of a built user module."""

    try:
        prefix, layer_list = find_layers(model, None, sequential=True)
    except BuildError:
        prefix, layer_list = None, None
    emb = _input_embedding(model, prefix)
    head = _output_head(model, emb, prefix)
    widths = _widths(model, emb, kwargs, layer_list)
    try:
        parts = classify(model, None, widths.pop("num_experts_per_tok"), False, in_emb=emb, out_emb=head,
                          sequential=True, whole_model_fallback=True)
    except BuildError as exc:
        raise UserModelError("--model", ref, exc.reason, "give its MoE layers a top_k attribute") from None
    linears = linear_groups(model, parts, head=head, hidden=widths["hidden_size"])
    top = parts["top"]

    notes = []
    if prefix is None:
        notes.append(f"{ref}: no nn.ModuleList / nn.Sequential of blocks found; the whole module is one layer")
    measured = MeasuredParams(
        model_class=ref, transformers_version=None, embedding=top["embedding"], lm_head=top["lm_head"],
        final_norms=top["final_norms"], other=top["other"],
        layers=tuple(LayerParams(**rec) for rec in parts["layers"]), notes=tuple(notes), linears=linears)
    return measured, widths, emb


def load_user_model(ref: str, kwargs: Any = None, *, field: str = "--model", kwargs_field: str = "--model-kwargs",
                    search_dirs: Sequence[str] = ()) -> ModelShape:
    """A `ModelShape` for the user's module `ref` (module.path:attribute) built with `kwargs`.

    Args:
        ref: `mypkg.models:build` (a callable returning an nn.Module), `mypkg.models:MyNet` (a class), or a
            module-level instance.
        kwargs: Keyword arguments for the call: a mapping, or JSON text (the --model-kwargs form).
        field, kwargs_field: How the two inputs are named in errors (--model / model.module, ...).
        search_dirs: Extra folders to import from (a spec's folder).

    Raises:
        UserModelError: any problem with the reference, the keyword arguments or the module it builds.
    """
    parsed = parse_kwargs(kwargs, kwargs_field)
    return _load_cached(ref, json.dumps(parsed, sort_keys=True, default=str), field, kwargs_field, tuple(search_dirs))


@lru_cache(maxsize=32)
def _load_cached(ref: str, kwargs_json: str, field: str, kwargs_field: str, search_dirs: tuple) -> ModelShape:
    kwargs = json.loads(kwargs_json)
    model, device, notes = build_user_module(ref, kwargs, field=field, kwargs_field=kwargs_field,
                                             search_dirs=search_dirs)
    mcfg = getattr(model, "config", None)
    refused = None if mcfg is None else decoder_only_problem(mcfg, mcfg)
    if refused is not None:
        raise UserModelError(field, ref, f"it builds {type(model).__name__}, {refused[0]}", "give a decoder-only model")
    measured, widths, emb = measure_user_module(model, ref, kwargs)
    traced, why_not = trace_user_flops(model, emb, device)
    notes += list(measured.notes)
    if traced is not None:
        notes.append(f"FLOPs traced on the {traced.device} device at seq {traced.seq_lens[0]} and {traced.seq_lens[1]} "
                     f"(torch.utils.flop_counter): {traced.per_token:.4g} + {traced.per_token_per_seq:.4g}·T per token")
    else:
        notes.append(f"FLOPs: {why_not}; using 6N + 12·L·H·Q·T from the inferred widths")
    notes.append("activation memory: the itemised per-layer count from the inferred widths (hidden "
                 f"{widths['hidden_size']}, {widths['num_attention_heads']} heads), not measured on the module")
    cfg = SimpleNamespace(**{k: v for k, v in widths.items() if v is not None})
    kw = shape_fields(cfg, measured)
    notes += list(kw.pop("notes", ()))
    try:
        return ModelShape(name=ref, model_type="user", source="user", model_class=ref, measured=measured,
                          traced_flops=traced, notes=tuple(notes), **kw)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        raise UserModelError(field, ref, f"its inferred shape is inconsistent: {'.'.join(map(str, e['loc']))}: "
                             f"{e['msg'].removeprefix('Value error, ')}",
                             "give the module hidden_size / num_heads attributes") from None
