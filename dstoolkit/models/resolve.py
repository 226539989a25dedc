"""Resolve a spec's `model:` section (preset / hf_config / module / inline HF fields) to a `ModelShape`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from dstoolkit.models.hf import HFConfigError, HFConfigUnreadable, load_hf_config, shape_from_hf_dict
from dstoolkit.models.presets import get_preset
from dstoolkit.models.shape import ModelShape, position_table_problem
from dstoolkit.models.user_module import load_user_model
from dstoolkit.models.user_module_build import UserModelError, is_module_ref
from dstoolkit.spec import ModelSpec, Spec


def load_model(name_or_path: Union[str, Path], model_class: Optional[str] = None,
               model_kwargs: Optional[str] = None, *, field: str = "--model") -> ModelShape:
    """A preset name, a path to a Hugging Face config.json (or its folder), or the user's own module: the
    `--model` argument of CLIs.

    Args:
        name_or_path: "llama-3-8b", "path/to/config.json", "path/to/model_dir", or "mypkg.models:build"
            (a callable returning an nn.Module, or an nn.Module class: `dstoolkit.models.user_module`). Any
            config that transformers can build is accepted (types without a hand-written reader are built
            on the meta device).
        model_class: The `--model-class` argument: a transformers class to build the config with (for a
            model_type transformers does not know, e.g. kimi_k2 -> DeepseekV3ForCausalLM).
        model_kwargs: The `--model-kwargs` argument: a JSON object of keyword arguments for a user module.

    Raises:
        ValueError: unknown preset (with did-you-mean, listing presets), an unreadable/invalid config, or a
            user module that cannot be used (`UserModelError`: field, value and fix).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if is_module_ref(text):
        if model_class is not None:
            raise ValueError(f"--model-class {model_class} builds a config.json, not the module {text!r} "
                             "(drop --model-class)")
        return load_user_model(text, model_kwargs, field=field)
    if model_kwargs is not None:
        raise ValueError(f"--model-kwargs is only used with --model package.module:callable (got --model {text!r})")
    if path.exists() or text.endswith(".json") or "/" in text or "\\" in text:
        return load_hf_config(path, model_class=model_class)
    if model_class is not None:
        raise ValueError(f"--model-class {model_class} needs a config.json, not the preset name {text!r}")
    try:
        return get_preset(text)
    except ValueError as exc:
        raise ValueError(f"{str(exc)[:-1]}; or give a path to an HF config.json) (or your module as "
                         "package.module:callable)") from None


def resolve_model(model_spec: ModelSpec, base_dir: Optional[Union[str, Path]] = None) -> ModelShape:
    """Turn the spec's model section into a shape.

    Args:
        model_spec: `spec.model`.
        base_dir: Folder that a relative `hf_config` path resolves against (pass `spec.base_dir`,
            the spec file's folder); defaults to the current directory.

    Returns:
        The `ModelShape`.

    Raises:
        SpecError (a ValueError): unknown preset (with did-you-mean), unreadable or invalid hf_config,
            unsupported model_type, a missing/mistyped/misspelt inline field. When the spec came from
            `load_spec`, the message points at the YAML line of the offending key.
    """
    form = model_spec.form
    if form == "preset":
        try:
            return get_preset(model_spec.preset)
        except ValueError as exc:
            problem, _, fix = str(exc).partition(" (")
            raise model_spec.error("preset", problem, fix.rstrip(")")) from None
    if form == "hf_config":
        path = Path(model_spec.hf_config).expanduser()
        if not path.is_absolute():
            path = Path(base_dir if base_dir is not None else Path.cwd()) / path
        try:
            return load_hf_config(path, model_class=model_spec.model_class)
        except HFConfigError as exc:
            where = f"in {path}: {exc.field}: " if exc.field else ""
            raise model_spec.error("hf_config", where + exc.problem, exc.fix,
                                   code="SP006" if isinstance(exc, HFConfigUnreadable) else "SP004") from None
    if form == "module":
        try:
            return load_user_model(model_spec.module, model_spec.module_kwargs, field="model.module",
                                   kwargs_field="model.module_kwargs",
                                   search_dirs=(str(base_dir),) if base_dir is not None else ())
        except UserModelError as exc:
            at = "module_kwargs" if exc.field == "model.module_kwargs" else "module"
            raise model_spec.error(at, f"{exc.value!r}: {exc.problem}", exc.fix) from None
    inline = model_spec.inline
    if model_spec.model_class is not None:
        inline = {**inline, "model_class": model_spec.model_class}  # the inline form reads it like a config key
    try:
        return shape_from_hf_dict(inline, name=str(inline.get("name") or inline.get("model_type")), strict=True)
    except HFConfigError as exc:
        unknown_key = exc.field in inline and exc.problem.startswith(("unknown field", "not a field"))
        raise model_spec.error(exc.field, exc.problem, exc.fix, at_key=unknown_key) from None


def check_model_fits_spec(spec: Spec, shape: ModelShape) -> None:
    """Rules between the training plan and the resolved model (the spec alone cannot check them).

    - `training.seq_len` fits a learned position table (`position_table_problem`).
    - `training.ep` > 1 needs an MoE model, and must divide the number of routed experts
      (DeepSpeed MoE: each of the ep ranks holds num_experts / ep experts).
    - `training.tp` must divide the attention heads and, for GQA, the KV heads (Megatron-LM shards whole
      heads and whole query groups over TP ranks).

    Raises:
        SpecError: located at the offending training field when the spec came from `load_spec`.
    """
    t = spec.training
    table = position_table_problem(shape, t.seq_len, "training.seq_len")
    if table is not None:
        raise spec.error(("training", "seq_len"), table, f"seq_len <= {shape.max_position_embeddings}")
    if isinstance(t.ep, int) and t.ep > 1:
        if not shape.is_moe:
            raise spec.error(("training", "ep"), f"training.ep={t.ep} but model {shape.name!r} is dense (no experts)",
                             "set ep: 1 (or auto) for a dense model")
        if shape.num_experts % t.ep:
            raise spec.error(("training", "ep"),
                             f"training.ep={t.ep} does not divide the {shape.num_experts} routed experts of {shape.name!r}",
                             f"pick a divisor of {shape.num_experts}")
    if isinstance(t.tp, int) and t.tp > 1:
        if shape.num_attention_heads % t.tp:
            raise spec.error(("training", "tp"),
                             f"training.tp={t.tp} does not divide num_attention_heads={shape.num_attention_heads}",
                             f"pick a divisor of {shape.num_attention_heads}")
        if not shape.is_mla and shape.kv_heads % t.tp:
            raise spec.error(("training", "tp"),
                             f"training.tp={t.tp} does not divide num_key_value_heads={shape.kv_heads}",
                             f"pick a divisor of {shape.kv_heads} (Megatron shards whole KV groups)")


def resolve_spec_model(spec: Spec) -> ModelShape:
    """`resolve_model(spec.model, spec.base_dir)` followed by `check_model_fits_spec`.

    Raises:
        SpecError: as `resolve_model` and `check_model_fits_spec`.
    """
    shape = resolve_model(spec.model, spec.base_dir)
    check_model_fits_spec(spec, shape)
    return shape
