"""Facts the DeepSpeed rules read from a config and the command line (`RuleContext`): the bf16 section under
either name, an `enabled` flag as the DeepSpeed version reads it, the sequence-parallel and data-parallel sizes
and the MoE facts (the arithmetic asked of `dstoolkit.layout`), and the AutoEP note the generators quote. Shared
by ``rules`` and ``rules_parallel``.
"""
from __future__ import annotations

from typing import Mapping, Optional

from dstoolkit.dsconfig.facts import LAX_BOOL_STRINGS
from dstoolkit.dsconfig.registry import RuleContext, as_int, section
from dstoolkit.layout.constraints import LayoutFacts
from dstoolkit.layout.dims import data_parallel_size

def _bf16_section(cfg: Mapping) -> tuple[str, dict]:
    if "bf16" in cfg:
        return "bf16", section(cfg, "bf16")
    return "bfloat16", section(cfg, "bfloat16")


def _enabled(sec: dict, ctx: RuleContext) -> bool:
    v = sec.get("enabled", False)
    if v == "auto":
        # 0.16 read `enabled` with get_scalar_param, so "auto" is truthy there; 0.19's pydantic drops it.
        return ctx.deepspeed_version.startswith("0.16") and ctx.mode == "strict"
    if isinstance(v, str) and ctx.mode == "strict" and ctx.deepspeed_version.startswith("0.19"):
        return LAX_BOOL_STRINGS.get(v.lower()) is True  # 0.19's pydantic reads "true" as True (DS102 warns)
    return v is True


def _sp(cfg: Mapping) -> int:
    return as_int(cfg.get("sequence_parallel_size")) or 1


def dp_formula(world: int, tp: int = 1, pp: int = 1, sp: int = 1) -> str:
    """How the data-parallel size comes out of the world size, as the findings write it: "world size 8", or "world
    size 32 / (tp 2 x pp 1 x sp 4)" when any model-parallel degree is not 1 (the terms of LY009's "world 32 / (tp 2
    x pp 1 x sp 4)", which DS213 shows)."""
    if (tp, pp, sp) == (1, 1, 1):
        return f"world size {world}"
    return f"world size {world} / (tp {tp} x pp {pp}" + (f" x sp {sp}" if sp != 1 else "") + ")"


def _dp_size(cfg: Mapping, ctx: RuleContext) -> Optional[int]:
    """dp = world / (tp * pp * sequence_parallel_size) (dstoolkit.layout); None when unknown or not whole."""
    if ctx.world_size is None:
        return None
    return data_parallel_size(ctx.world_size, ctx.tp, ctx.pp, _sp(cfg))


def _layout_facts(cfg: Mapping, ctx: RuleContext, **more) -> LayoutFacts:
    return LayoutFacts(world=ctx.world_size, gpus_per_node=ctx.gpus_per_node, tp=max(ctx.tp, 1),
                       pp=max(ctx.pp, 1), sp=max(_sp(cfg), 1), **more)


def _moe_facts(cfg: Mapping, ctx: RuleContext) -> tuple[Optional[int], Optional[int], Optional[int]]:
    moe = section(section(cfg, "dstoolkit"), "moe")
    n = ctx.num_experts if ctx.num_experts is not None else as_int(moe.get("num_experts"))
    ep = ctx.ep_size if ctx.ep_size is not None else as_int(moe.get("ep_size"))
    k = as_int(moe.get("top_k"))
    return n, ep, k


AUTOEP_TRANSFORMERS_NOTE = (
    "DeepSpeed 0.19.8 AutoEP runs with no released transformers measured here: under transformers 5.x "
    "deepspeed.initialize raises TypeError (_CanRecordRegistry.get() takes 2 positional arguments but 3 were given: "
    "module_inject/auto_ep_presets/base.py calls the output-capturing registry as get(key, default), transformers 5 "
    "made it a dict subclass with get(model)); under transformers 4.57.1 that registry is a plain dict, but the "
    "presets expect transformers 5's fused 3-D experts (gate_up_proj) and fail on 4.x's ModuleList experts "
    "(ValueError: Could not infer hidden_size/ffn_hidden_size from experts module with storage=module_list)")
"""Why AutoEP is not generated: shared by the validator (DS228) and the generator's notes."""


HF_ZERO3_AUTOTP_NOTE = (
    "transformers 5 loads a pretrained checkpoint into a ZeRO-3 model through integrations/deepspeed.py "
    "_load_state_dict_into_zero3_model, which runs the model's weight conversions through "
    "_apply_weight_conversions_to_state_dict (every model has some: conversion_mapping.get_model_conversion_mapping "
    "adds the legacy renamings even for Llama), and that raises NotImplementedError ('Weight conversions ... with "
    "DeepSpeed Tensor Parallelism are not yet implemented') whenever the DeepSpeed config's "
    "tensor_parallel.autotp_size > 1, so from_pretrained fails under HF Trainer / Accelerate (HfDeepSpeedConfig)")
"""Why an HF Trainer / Accelerate run cannot combine ZeRO-3 with AutoTP (shared by the validator, DS247, and the
generator, runplan.autotp.hf_zero3_autotp_refusal): a transformers limit, not DeepSpeed's
(DeepSpeed 0.19.8 itself runs AutoTP at stage 3: runtime/engine.py `_resolve_zero3_param_placement`). Measured:
a tiny saved LlamaForCausalLM, HfDeepSpeedConfig of a stage-3 JSON kept alive (what TrainingArguments(deepspeed=...)
does), from_pretrained raises NotImplementedError with tensor_parallel.autotp_size 8 and loads without the section.
ZeRO-0/1/2 load through the ordinary path (modeling_utils.py: the zero3 branch only under
is_deepspeed_zero3_enabled)."""
