"""A transformers model's Hugging Face tensor-parallel plan: (module name pattern, partition style) pairs, as a
trainer that shards by it reads them. What the styles mean to DeepSpeed AutoTP lives in `runplan.autotp`.

transformers declares the plan in three places (transformers 5.x `distributed` mixin): the config class's
`base_model_tp_plan` (the decoder's projections, e.g. `"layers.*.mlp.down_proj": "rowwise"`), the model class's
`_tp_plan` (the causal LMs' `"lm_head": "colwise_gather_output"`) and the built instance's `_tp_plan` (the base
model's plan, prefixed and expanded, set at init). DeepSpeed 0.19.8 merges the three in that order, a pattern
written with a `model.` prefix yielding to the same pattern written without it (runtime/tensor_parallel/config.py
`_get_hf_tp_plan`); `merged_tp_plan` reads a built model the same way. A preset built analytically (no transformers
build) has only its model_type: `tp_plan_of` then reads the config class's declared `base_model_tp_plan` (where every
style a trainer may reject is declared) from its source. No torch or transformers import.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
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


@functools.lru_cache(maxsize=None)
def declared_tp_plan(model_type: str) -> TpPlan:
    """The `base_model_tp_plan` transformers' config class for `model_type` declares (its text config's for a
    composite one); () when transformers is not installed or does not know the model_type.

    Read first from the class's source (transformers/models/<model_type>/configuration_<model_type>.py, the class
    whose `model_type` it is), without importing transformers, which imports torch: a preset's spec (llama,
    mixtral, deepseek_v3) is validated, swept and generated without torch. A model_type whose plan is not written
    there (another folder, an inherited plan: 96 of transformers 5's 831) is read from the imported class."""
    return _source_plan(model_type) or _imported_plan(model_type)


def _imported_plan(model_type: str) -> TpPlan:
    try:
        from transformers import CONFIG_MAPPING  # imports torch: only where the source does not say
        cls = CONFIG_MAPPING[model_type]
    except (ImportError, KeyError):
        return ()
    plan = getattr(cls, "base_model_tp_plan", None)
    if not plan:
        sub = (getattr(cls, "sub_configs", None) or {}).get("text_config")
        plan = getattr(sub, "base_model_tp_plan", None) if isinstance(sub, type) else None
    return tuple((str(k), str(v)) for k, v in (plan or {}).items())


def _source_plan(model_type: str) -> TpPlan:
    spec = importlib.util.find_spec("transformers")  # the package's location; finding it imports nothing
    if spec is None or not spec.submodule_search_locations:
        return ()
    folder = model_type.replace("-", "_")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / folder / f"configuration_{folder}.py"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ()
    classes = {c.name: _class_literals(c) for c in tree.body if isinstance(c, ast.ClassDef)}
    own = next((attrs for attrs in classes.values() if attrs.get("model_type") == model_type), None)
    if own is None:
        return ()
    plan = own.get("base_model_tp_plan")
    if not plan:
        text = (own.get("sub_configs") or {}).get("text_config")
        plan = classes.get(text, {}).get("base_model_tp_plan") if isinstance(text, str) else None
    return tuple((str(k), str(v)) for k, v in (plan or {}).items())


def _class_literals(cls: ast.ClassDef) -> dict[str, Any]:
    """A class body's assignments whose values are literals (a name stands for itself: sub_configs' classes)."""
    out: dict[str, Any] = {}
    for node in cls.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) and node.value is not None else None)
        if not isinstance(target, ast.Name):
            continue
        value = node.value
        if isinstance(value, ast.Dict):  # sub_configs = {"text_config": SomeConfig}: keep the class's name
            value = ast.Dict(keys=value.keys, values=[ast.Constant(v.id) if isinstance(v, ast.Name) else v
                                                      for v in value.values])
        try:
            out[target.id] = ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError):
            continue
    return out


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
