"""A transformers model's Hugging Face tensor-parallel plan: (module name pattern, partition style) pairs, as a
trainer that shards by it reads them. What the styles mean to DeepSpeed AutoTP lives in `runplan.autotp`.

transformers declares the plan in three places (transformers 5.x `distributed` mixin): the config class's
`base_model_tp_plan` (the decoder's projections, e.g. `"layers.*.mlp.down_proj": "rowwise"`), the model class's
`_tp_plan` (the causal LMs' `"lm_head": "colwise_gather_output"`) and the built instance's `_tp_plan` (the base
model's plan, prefixed and expanded, set at init). DeepSpeed 0.19.8 merges the three in that order, a pattern
written with a `model.` prefix yielding to the same pattern written without it (runtime/tensor_parallel/config.py
`_get_hf_tp_plan`); `merged_tp_plan` reads a built model the same way. A preset built analytically (no transformers
build) has only its model_type: `tp_plan_of` then reads the config class's declared `base_model_tp_plan`, where every
style a trainer may reject is declared. No torch import (transformers is imported lazily, only for a preset).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

TpPlan = tuple[tuple[str, str], ...]
"""(module name pattern, partition style) pairs, in the merged plan's order."""


def merged_tp_plan(model: Any) -> TpPlan:
    """The plan of a built transformers model: the config's base_model_tp_plan, then the class's `_tp_plan`, then the
    instance's own (module docstring); a later source overrides an earlier one's pattern."""
    config = getattr(model, "config", None)
    sources: Iterable[Optional[Mapping]] = (getattr(config, "base_model_tp_plan", None),
                                            getattr(type(model), "_tp_plan", None),
                                            vars(model).get("_tp_plan") if hasattr(model, "__dict__") else None)
    merged: dict[str, str] = {}
    seen: set[str] = set()
    for plan in sources:
        if not isinstance(plan, Mapping):
            continue
        for pattern, style in plan.items():
            bare = pattern.removeprefix("model.")
            if pattern != bare and bare in seen:
                continue
            merged[str(pattern)] = str(style)
            seen.add(bare)
    return tuple(merged.items())


def declared_tp_plan(model_type: str) -> TpPlan:
    """The `base_model_tp_plan` transformers' config class for `model_type` declares (its text config's for a
    composite one); () when transformers is not installed or does not know the model_type."""
    try:
        from transformers import CONFIG_MAPPING  # lazily: only analytic presets need it
        cls = CONFIG_MAPPING[model_type]
    except (ImportError, KeyError):
        return ()
    plan = getattr(cls, "base_model_tp_plan", None)
    if not plan:
        sub = (getattr(cls, "sub_configs", None) or {}).get("text_config")
        plan = getattr(sub, "base_model_tp_plan", None) if isinstance(sub, type) else None
    return tuple((str(k), str(v)) for k, v in (plan or {}).items())


def tp_plan_of(shape: Any) -> TpPlan:
    """The Hugging Face tp_plan a trainer finds on the model `shape` describes: the built model's merged plan
    (`shape.measured.tp_plan`), else, for a transformers model_type estimated analytically (a preset), the config
    class's declared plan; () for the user's own module (source "user"), which carries none."""
    if getattr(shape, "source", None) == "user":
        return ()
    measured = getattr(shape, "measured", None)
    if measured is not None:
        return tuple(measured.tp_plan)
    return declared_tp_plan(shape.model_type)
