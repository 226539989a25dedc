"""Resolve a spec's `model:` section (preset / hf_config / inline HF fields) to a `ModelShape`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from dstoolkit.models.hf import HFConfigError, load_hf_config, shape_from_hf_dict
from dstoolkit.models.presets import get_preset
from dstoolkit.models.shape import ModelShape
from dstoolkit.schemas.spec import ModelSpec


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
            return load_hf_config(path)
        except HFConfigError as exc:
            where = f"in {path}: {exc.field}: " if exc.field else ""
            raise model_spec.error("hf_config", where + exc.problem, exc.fix) from None
    inline = model_spec.inline
    try:
        return shape_from_hf_dict(inline, name=str(inline.get("name") or inline.get("model_type")), strict=True)
    except HFConfigError as exc:
        unknown_key = exc.field in inline and exc.problem.startswith(("unknown field", "not a field"))
        raise model_spec.error(exc.field, exc.problem, exc.fix, at_key=unknown_key) from None
