"""Model shapes (HF config.json reader, presets) and exact parameter counts. No torch at import.

Configs of the hand-written families are read analytically; any other config transformers can build is
built on the meta device by `dstoolkit.models.from_transformers` (torch and transformers imported lazily,
inside its functions); the user's own nn.Module (`--model package.module:callable`) by
`dstoolkit.models.user_module` (torch imported lazily). `dstoolkit.runtime.model` is the project's torch model and is never imported here.
"""
from .shape import ModelShape
from .presets import PRESETS, get_preset
from .hf import FAMILIES, HFConfigError, load_hf_config, shape_from_hf_dict, shape_from_transformers
from .measured import LayerParams, MeasuredParams, measured_layout
from .params import ParamCount, count_measured, count_params
from .resolve import check_model_fits_spec, load_model, resolve_model, resolve_spec_model
from .user_module import load_user_model
from .user_module_build import UserModelError, is_module_ref

__all__ = [
    "ModelShape",
    "PRESETS",
    "get_preset",
    "FAMILIES",
    "HFConfigError",
    "load_hf_config",
    "shape_from_hf_dict",
    "shape_from_transformers",
    "LayerParams",
    "MeasuredParams",
    "measured_layout",
    "count_measured",
    "ParamCount",
    "count_params",
    "resolve_model",
    "load_model",
    "resolve_spec_model",
    "check_model_fits_spec",
    "UserModelError",
    "is_module_ref",
    "load_user_model",
]
