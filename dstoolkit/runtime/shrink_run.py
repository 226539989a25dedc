"""A shrunk real run of a spec: the spec's model section read as a transformers config (`model_config_of`),
shrunk (`dstoolkit.runtime.shrink.shrink_config`) and its shape read (`prepare_shrunk_run` -> `ShrunkRun`), and a
DeepSpeed JSON's batch fitted to the local ranks (`fit_batch`). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from dstoolkit.runtime.shrink import Shrunk, _is_int, shrink_config
from dstoolkit.runtime.shrink_sizes import ShrinkError, ShrinkSizes

def model_config_of(model_spec: Any, base_dir: Any = None) -> tuple[dict, Optional[str]]:
    """(config mapping, model_class) of a spec's model section: the hf_config file (relative to `base_dir`,
    the spec's folder) or the inline HF fields. A preset has no transformers config to shrink.

    Raises:
        ShrinkError: a preset, or an unreadable / invalid hf_config file.
    """
    import json
    from pathlib import Path

    form = getattr(model_spec, "form", None)
    if form == "module":
        raise ShrinkError("model.module", f"module {model_spec.module!r} is the user's own nn.Module, not a "
                          "transformers config", "drop --shrink (a user module trains as given)")
    if form == "preset":
        raise ShrinkError("model.preset", f"preset {model_spec.preset!r} is the project's own stand-in shape, not a "
                          "transformers config", "give model.hf_config: path/to/config.json (or inline HF fields) "
                          "to train the real architecture shrunk, or drop --shrink")
    if form == "hf_config":
        path = Path(model_spec.hf_config).expanduser()
        if not path.is_absolute():
            path = Path(base_dir if base_dir is not None else Path.cwd()) / path
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ShrinkError("model.hf_config", f"cannot read {str(path)!r} ({exc.strerror or exc})",
                              "check the path (relative to the spec file's folder)") from None
        except json.JSONDecodeError as exc:
            raise ShrinkError("model.hf_config", f"{path}:{exc.lineno}:{exc.colno}: invalid JSON ({exc.msg})",
                              "fix the JSON") from None
        if not isinstance(data, dict):
            raise ShrinkError("model.hf_config", f"{path} holds a {type(data).__name__}, not a config mapping",
                              "point hf_config at a config.json")
        return data, model_spec.model_class
    inline = dict(model_spec.inline)
    inline.pop("name", None)
    return inline, model_spec.model_class


@dataclass(frozen=True)
class ShrunkRun:
    """Everything a shrunk real run needs: the shrunk config, its shape (for the estimate, the monitor's FLOPs
    and the synthetic data's vocabulary), the class to build it with and the capped sequence length."""

    shrunk: Shrunk
    shape: Any
    """`dstoolkit.models.shape.ModelShape` of the shrunk config."""
    model_class: Optional[str]
    seq_len: int
    """min(training.seq_len, sizes.seq_len)."""

    def record(self) -> dict[str, Any]:
        """The JSON-ready facts of the shrink (metrics 'model' event, bench and tune records)."""
        return {"model_type": self.shrunk.model_type, "model_class_requested": self.model_class,
                "shrunk_sizes": self.shrunk.sizes(), "seq_len": self.seq_len,
                "changed": {k: list(v) for k, v in self.shrunk.changed.items()}, "kept": self.shrunk.kept,
                "notes": list(self.shrunk.notes)}


def fit_batch(ds_config: dict, world_size: int, sizes: ShrinkSizes) -> tuple[dict, dict[str, tuple[Any, Any]]]:
    """A copy of a DeepSpeed JSON with its batch triad at most `sizes.micro_batch` x `sizes.grad_accum` per
    rank on `world_size` ranks (train_batch_size = micro x accumulation x world), and what changed. The rest
    of the config (ZeRO stage, offload, precision, buckets, optimizer) is kept: that is the strategy."""
    import json

    cfg = json.loads(json.dumps(ds_config))
    mb = cfg.get("train_micro_batch_size_per_gpu")
    ga = cfg.get("gradient_accumulation_steps")
    tb = cfg.get("train_batch_size")
    mb = mb if _is_int(mb) and mb > 0 else 1
    if not (_is_int(ga) and ga > 0):
        ga = max(1, tb // (mb * world_size)) if _is_int(tb) and tb > 0 else 1
    new_mb, new_ga = min(mb, sizes.micro_batch), min(ga, sizes.grad_accum)
    new = {"train_micro_batch_size_per_gpu": new_mb, "gradient_accumulation_steps": new_ga,
           "train_batch_size": new_mb * new_ga * world_size}
    changed = {k: (cfg.get(k), v) for k, v in new.items() if cfg.get(k) != v}
    cfg.update(new)
    return cfg, changed


def prepare_shrunk_run(spec: Any, base_dir: Any, sizes: ShrinkSizes) -> ShrunkRun:
    """Shrink the spec's model and read the shrunk shape (no torch model is built here).

    Raises:
        ShrinkError: the model cannot be shrunk, or the shrunk config cannot be read (field named).
    """
    from dstoolkit.models import shape_from_hf_dict

    config, model_class = model_config_of(spec.model, base_dir)
    shrunk = shrink_config(config, sizes)
    name = f"{config.get('_name_or_path') or spec.name or shrunk.model_type} (shrunk)"
    try:
        shape = shape_from_hf_dict(shrunk.config, name=str(name), model_class=model_class)
    except ValueError as exc:
        field_name = getattr(exc, "field", None) or "model"
        raise ShrinkError(str(field_name), f"the shrunk config cannot be read: {getattr(exc, 'problem', exc)}",
                          str(getattr(exc, "fix", "report the config"))) from None
    return ShrunkRun(shrunk=shrunk, shape=shape, model_class=model_class,
                     seq_len=min(int(spec.training.seq_len), sizes.seq_len))


__all__ = ["ShrunkRun", "fit_batch", "model_config_of", "prepare_shrunk_run"]
