"""`--model-class` on the verbs that read a spec (generate, sweep, tune, estimate SPEC, fp8 plan SPEC): the
flag sets the spec's `model.model_class` for this run, as if the spec said it.

`apply_model_class` checks that the spec's model is one --model-class can build (hf_config or inline HF
fields, not a preset or a user module) and names the field when it is not. `load_spec_and_shape_with`
is `dstoolkit.generate.load_spec_and_shape` with the override; `spec_file_with` writes the overridden spec
to a temporary file for verbs that read the file themselves (tune). No torch import.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union


def apply_model_class(spec, model_class: Optional[str], where: str = "") -> None:
    """Set `spec.model.model_class` from --model-class (no-op for None).

    Raises:
        ValueError: the spec's model is a preset or a user module, or the class name is not an identifier.
    """
    if model_class is None:
        return
    prefix = f"{where}: " if where else ""
    if not model_class.isidentifier():
        raise ValueError(f"{prefix}--model-class {model_class!r}: not a class name (e.g. DeepseekV3ForCausalLM)")
    m = spec.model
    if m.form == "preset":
        raise ValueError(f"{prefix}--model-class {model_class}: the spec's model is the preset {m.preset!r} "
                         "(model.preset); --model-class builds an HF config (model.hf_config or inline fields)")
    if m.form == "module":
        raise ValueError(f"{prefix}--model-class {model_class}: the spec's model is your module {m.module!r} "
                         "(model.module), built by its own code; drop --model-class")
    if m.model_class is not None and m.model_class != model_class:
        raise ValueError(f"{prefix}--model-class {model_class} contradicts the spec's model.model_class "
                         f"{m.model_class!r}; drop one of them")
    m.model_class = model_class


def load_spec_and_shape_with(path: Union[str, Path], model_class: Optional[str], targets: Sequence[str] = ()):
    """`load_spec_and_shape(path, targets)` with --model-class applied to the spec before its model is resolved.
    `targets`: the command line's --target values (they replace the spec's `targets`, `spec.load_spec`).

    Raises:
        SpecLoadError: as `load_spec_and_shape`, and for a --model-class the spec's model cannot take.
    """
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.io import SpecLoadError, load_spec_and_shape

    if model_class is None:
        return load_spec_and_shape(path, targets)
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.calibration import calibration_for_spec
    from dstoolkit.models.resolve import resolve_spec_model
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.spec import load_spec

    p = Path(path)  # a missing file or a folder: load_spec's SpecError says which
    try:
        spec = load_spec(p, targets=targets)
        apply_model_class(spec, model_class, f"{p}: error")
        shape = resolve_spec_model(spec)
        calibration_for_spec(spec)
    except ValueError as exc:
        raise SpecLoadError(str(exc)) from None
    except OSError as exc:
        raise SpecLoadError(f"{p}: error: cannot read ({exc.strerror or exc})") from None
    return spec, shape


def spec_file_with(path: Union[str, Path], model_class: Optional[str], folder: Path) -> Path:
    """The spec at `path` with model.model_class set, written as `folder/<same name>` (relative hf_config and
    cluster.calibration paths made absolute, so the copy reads the same files). Returns `path` itself when
    `model_class` is None.

    Raises:
        ValueError: as `apply_model_class` (checked on the loaded spec first).
    """
    if model_class is None:
        return Path(path)
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    import yaml

    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.spec import load_spec

    src = Path(path)
    spec = load_spec(src)  # SpecError names the YAML line
    apply_model_class(spec, model_class, str(src))
    data = yaml.safe_load(src.read_text(encoding="utf-8"))
    model = data.setdefault("model", {})
    model["model_class"] = model_class
    base = src.resolve().parent
    if isinstance(model.get("hf_config"), str) and not Path(model["hf_config"]).expanduser().is_absolute():
        model["hf_config"] = str(base / model["hf_config"])
    cluster = data.get("cluster") or {}
    cal = cluster.get("calibration")
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.calibration import NONE_VALUES, REFERENCE

    keep = set(NONE_VALUES) | {REFERENCE, "auto"}
    if isinstance(cal, str) and cal.strip().lower() not in keep and not Path(cal).expanduser().is_absolute():
        cluster["calibration"] = str(base / cal)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / src.name
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out
