"""Model shapes (HF config.json reader, presets) and exact parameter counts. No torch at import.

`dstoolkit.runtime.model` is the one torch module here and is never imported by this package.
"""
from .shape import ModelShape
from .presets import PRESETS, get_preset
from .hf import FAMILIES, HFConfigError, load_hf_config, shape_from_hf_dict
from .params import ParamCount, count_params
from .resolve import check_model_fits_spec, load_model, resolve_model, resolve_spec_model

__all__ = [
    "ModelShape",
    "PRESETS",
    "get_preset",
    "FAMILIES",
    "HFConfigError",
    "load_hf_config",
    "shape_from_hf_dict",
    "ParamCount",
    "count_params",
    "resolve_model",
    "load_model",
    "resolve_spec_model",
    "check_model_fits_spec",
]
