"""Read a Hugging Face `config.json` (or its dict) into a `ModelShape` (no torch, no transformers import here).

Two sources: the hand-written readers of `FAMILIES` (models.hf_families: exact, fast, no torch: the sweep calls
the estimator thousands of times), and for every other `model_type` transformers itself
(`dstoolkit.models.from_transformers`: the model is built on the meta device and counted, imported lazily).
An unknown type that transformers cannot build either is refused with transformers' reason; where the
config's `architectures` names a class transformers has, that class is offered (`model_class=`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Union

from pydantic import ValidationError

from dstoolkit.models import from_transformers as _tf
from dstoolkit.models.hf_families import FAMILIES, MISSING, HFConfigError, check_rotary_dim, dropout
from dstoolkit.models.hf_keys import check_unknown_keys
from dstoolkit.models.shape import ATTENTION_DROPOUT_KEYS, ModelShape
from dstoolkit.models.shape_fields import shape_fields

__all__ = ["FAMILIES", "HFConfigError", "hf_config_file", "load_hf_config", "shape_from_hf_dict", "shape_from_transformers"]


def _norm_type_name(t: str) -> str:
    return "".join(ch for ch in t.lower() if ch.isalnum())


def _safe_spelling(model_type: str) -> Optional[str]:
    """A known model_type that differs from `model_type` only in case or separators (qwen2-moe -> qwen2_moe).

    Deliberately not a spelling-distance guess: neighbours by spelling are different architectures
    (jamba -> llama miscounts by -23%), so following such a hint would silently give a wrong count.
    """
    known = set(FAMILIES)
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES  # lazy: optional dependency
        known |= set(CONFIG_MAPPING_NAMES)
    except Exception:  # noqa: BLE001 - no transformers: the analytic families only
        pass
    key = _norm_type_name(model_type)
    return next((k for k in sorted(known) if _norm_type_name(k) == key and k != model_type), None)


def _refusal_fix(config: dict, model_type: str, offer: Optional[str]) -> str:
    hints = []
    close = _safe_spelling(model_type)
    if close:
        hints.append(f"did you mean {close!r}?")
    if offer:
        hints.append(f"the config's architectures names {offer!r}, which transformers has: build it with "
                     f"--model-class {offer} (inline spec: model_class: {offer})")
    if hints:
        return "; ".join(hints)
    return ("give a config.json that transformers can build (any model_type it knows), or name a transformers "
            f"class with --model-class; hand-written readers: {', '.join(FAMILIES)}")


def shape_from_transformers(config: dict, name: Optional[str] = None, *,
                            model_class: Optional[str] = None) -> ModelShape:
    """Build the model of `config` with transformers on the meta device and wrap its exact counts in a shape.

    Raises:
        HFConfigError: transformers is missing, or cannot build the config (reason, and the class offered
            from `architectures` when there is one).
    """
    model_type = str(config.get("model_type"))
    display = name or config.get("name") or config.get("_name_or_path") or model_type
    clean = {k: v for k, v in config.items() if k not in ("name", "model_class")}
    # refused before the build: some families' modules refuse it in words that do not name the key, others read
    # it only in forward and would build
    text = clean.get("text_config")
    for d in (clean, text if isinstance(text, dict) else {}):
        for key in ATTENTION_DROPOUT_KEYS:
            if d.get(key) is not None:
                dropout(d, key, 0.0)
    try:
        measured = _tf.measure_config(clean, model_class)
        kwargs = shape_fields(_tf.text_config_of(clean, model_class), measured)
    except _tf.TransformersUnavailable as exc:
        raise HFConfigError("model_type", f"model_type {model_type!r} has no hand-written reader and the "
                            f"transformers model source is unavailable ({exc})",
                            "pip install 'dstoolkit[hf]' (then any type transformers builds is accepted), or use "
                            f"one of: {', '.join(FAMILIES)}") from None
    except _tf.ConfigRefused as exc:
        raise HFConfigError(exc.field, exc.reason, exc.fix) from None
    except _tf.BuildError as exc:
        raise HFConfigError("model_class" if model_class else "model_type",
                            f"unsupported model_type {model_type!r}: {exc.reason}",
                            _refusal_fix(config, model_type, exc.offer)) from None
    except Exception as exc:  # noqa: BLE001 - a config transformers accepts but we cannot read: refuse, never crash
        raise HFConfigError("model_type", f"model_type {model_type!r}: reading the transformers build failed "
                            f"({type(exc).__name__}: {str(exc)[:200]})",
                            "check the config's sizes; report it if transformers builds it") from None
    try:
        return ModelShape(name=str(display), model_type=model_type, source="transformers",
                          model_class=measured.model_class, measured=measured,
                          notes=measured.notes + tuple(kwargs.pop("notes", ())), **kwargs)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        field = str(e["loc"][0]) if e["loc"] else None
        raise HFConfigError(field, e["msg"].removeprefix("Value error, "),
                            "the transformers build gave a shape the estimator cannot use; report it") from None


def shape_from_hf_dict(config: dict, name: Optional[str] = None, *, strict: bool = False,
                       model_class: Optional[str] = None, source: str = "auto") -> ModelShape:
    """Build a `ModelShape` from a Hugging Face config mapping.

    Args:
        config: The parsed config.json (or an inline spec mapping with HF field names). An inline
            `model_class: ClassName` key is read like the `model_class` argument.
        name: Display name; defaults to `_name_or_path` or the model_type.
        strict: Also reject keys that are neither read nor known to be irrelevant (typos), with a
            did-you-mean. Used for inline spec fields; a real config.json is read leniently. Applies to the
            hand-written families (transformers decides what the other types accept).
        model_class: Build this transformers class (e.g. "DeepseekV3ForCausalLM" for a kimi_k2 config)
            instead of resolving `model_type`; implies source "transformers".
        source: "auto" (hand-written reader for `FAMILIES`, transformers for every other type),
            "analytic" (hand-written readers only) or "transformers" (always build with transformers).

    Returns:
        The model shape (`shape.source` says which path was used).

    Raises:
        HFConfigError (a ValueError): unknown `model_type` that transformers cannot build either (with the
            reason, and the class from `architectures` to use when transformers has it), a missing or
            mistyped field (naming it), or an inconsistent shape.
    """
    if not isinstance(config, dict):
        raise HFConfigError(None, f"expected a mapping of HF config fields, got {type(config).__name__}",
                            "pass the parsed config.json")
    if source not in ("auto", "analytic", "transformers"):
        raise ValueError(f"source={source!r}: expected auto, analytic or transformers")
    if model_class is None and "model_class" in config:
        model_class = config["model_class"]
        if not isinstance(model_class, str) or not model_class.isidentifier():
            raise HFConfigError("model_class", f"expected a transformers class name, got {model_class!r}",
                                "e.g. model_class: DeepseekV3ForCausalLM")
        config = {k: v for k, v in config.items() if k != "model_class"}
    model_type = config.get("model_type")
    if model_type is None and model_class is None:
        raise HFConfigError("model_type", "required field is missing",
                            f"add model_type (one of: {', '.join(FAMILIES)}, or any type transformers knows)")
    fam = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if model_class is not None or source == "transformers" or (fam is None and source == "auto"):
        if not isinstance(model_type, (str, type(None))):
            raise HFConfigError("model_type", f"expected a string, got {model_type!r}", "fix model_type")
        return shape_from_transformers(config, name, model_class=model_class)
    if fam is None:
        raise HFConfigError("model_type", f"unsupported model_type {model_type!r} (analytic readers only)",
                            _refusal_fix(config, str(model_type), None) if isinstance(model_type, str)
                            else f"supported: {', '.join(FAMILIES)}")
    if strict:
        check_unknown_keys(config, fam)
    try:
        kwargs = fam.read(config)
    except HFConfigError as exc:
        if exc.problem != MISSING:
            raise
        cls = _tf.offer_from_architectures(config) or _tf.causal_lm_class(model_type) or "<its transformers class>"
        raise HFConfigError(exc.field, exc.problem, f"{exc.fix}; or let transformers read the config, with its "
                            f"defaults: --model-class {cls} (spec: model_class: {cls})") from None
    check_rotary_dim(config, kwargs)
    display = name or config.get("name") or config.get("_name_or_path") or model_type
    try:
        return ModelShape(name=str(display), model_type=model_type, **kwargs)
    except ValidationError as exc:
        e = exc.errors(include_url=False)[0]
        field = str(e["loc"][0]) if e["loc"] else None
        msg = e["msg"].removeprefix("Value error, ")
        raise HFConfigError(field, f"{msg} (got {e.get('input')!r})" if field else msg,
                            "fix the config so the shape is consistent") from None


class HFConfigUnreadable(HFConfigError):
    """The config file cannot be read as JSON text (missing, unreadable, not UTF-8, invalid JSON): bad input, which
    the CLI answers with exit 2 (a spec's finding SP006), not a finding about the model."""


def hf_config_file(path: Union[str, Path]) -> Path:
    """The config file a `--model` / `hf_config:` path names: the file itself, or `config.json` inside a folder
    (how Hugging Face models are saved). The one resolver of both entry points.

    Raises:
        HFConfigError: a folder without config.json."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise HFConfigError(None, f"folder {str(p)!r} has no config.json",
                                "give the folder a Hugging Face model was saved to (it holds config.json), or "
                                "the config file itself")
        p = p / "config.json"
    return p


def load_hf_config(path: Union[str, Path], name: Optional[str] = None, *, model_class: Optional[str] = None,
                   source: str = "auto") -> ModelShape:
    """Read a Hugging Face `config.json` into a `ModelShape`.

    Args:
        path: The config file (a directory holding config.json also works).
        name: Display name; defaults to the folder name for `config.json`, else the file's stem.
        model_class, source: as for `shape_from_hf_dict`.

    Raises:
        HFConfigError (a ValueError): unreadable file, invalid JSON, or the errors of `shape_from_hf_dict`.
    """
    p = hf_config_file(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise HFConfigUnreadable(None, f"cannot read HF config {str(p)!r}: {exc.strerror or exc}",
                                 "check the path; relative paths in a spec resolve against the spec's folder") from None
    except UnicodeDecodeError as exc:
        raise HFConfigUnreadable(None, f"cannot read HF config {str(p)!r}: not UTF-8 text ({exc.reason} at byte "
                                 f"{exc.start}): not a JSON config.json",
                                 "give the model's config.json (a Hugging Face model folder holds one), not a "
                                 "weights or binary file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HFConfigUnreadable(None, f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}", "fix the JSON") from None
    if name is None:
        name = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    return shape_from_hf_dict(data, name=name, model_class=model_class, source=source)
