"""`fp16`, `bf16` (alias `bfloat16`), `torch_autocast` and `data_types`, mirroring deepspeed 0.19.8
``runtime/precision_config.py`` (DeepSpeedFP16Config, DeepSpeedBF16Config) and ``runtime/config.py``.

In 0.19 the bf16 section is a strict pydantic model: fp16 loss-scaling keys inside `bf16` are rejected
(``bf16 section has non-bf16 keys``); 0.16 read bf16 with get_scalar_param and ignored them.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import AfterValidator, Field, WithJsonSchema
from typing_extensions import Annotated

from dstoolkit.dsconfig.base import Bool, BoolOrAuto, DSModel, Float, Int

from dstoolkit.dsconfig.facts import (BF16_ONLY_KEYS, FLOAT_DTYPE_SPELLINGS, FP16_ONLY_KEYS,  # noqa: F401
                                      canonical_dtype)


class FP16Config(DSModel):
    """`fp16`: mixed precision with fp16 compute and dynamic or static loss scaling."""

    enabled: BoolOrAuto = False
    """Train in fp16. Exclusive with bf16.enabled. HF fills "auto" from --fp16."""
    auto_cast: Bool = False
    """Cast module inputs to fp16 automatically."""
    loss_scale: Float = Field(0.0, ge=0)
    """Static loss scale; 0 selects dynamic loss scaling (>= 0)."""
    initial_scale_power: Int = 16
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: Int = 1000
    """Steps without overflow before the dynamic scale grows; > 0 when dynamic scaling is on."""
    hysteresis: Int = 2
    """Overflows tolerated before the scale is lowered."""
    consecutive_hysteresis: Bool = False
    """Refill hysteresis after each step without overflow."""
    min_loss_scale: Int = 1
    """Floor of the dynamic loss scale; > 0 when dynamic scaling is on."""
    fp16_master_weights_and_grads: Bool = False
    """Keep master weights in fp16 (DeepSpeedCPUAdam only); needs ZeRO stage 1-3."""


class BF16Config(DSModel):
    """`bf16` (legacy name `bfloat16`): bf16 mixed precision; no loss scaling."""

    enabled: BoolOrAuto = False
    """Train in bf16. Exclusive with fp16.enabled. HF fills "auto" from --bf16."""
    immediate_grad_update: Bool = False
    """Apply gradient updates immediately rather than delayed."""
    check_grad_overflow: Bool = True
    """Skip the step on inf/nan gradients (0.19 default true)."""
    bf16_master_weights_and_grads: Bool = False
    """Keep master weights and gradients in bf16; needs ZeRO stage 1-3."""
    bf16_optimizer_states: Bool = False
    """Keep optimizer states in bf16; needs bf16_master_weights_and_grads and ZeRO stage 1-3."""


DtypeName = Literal["fp16", "float16", "torch.float16", "half", "fp32", "float32", "torch.float32", "float",
                    "bf16", "bfloat16", "torch.bfloat16", "int8", "torch.int8"]
"""Spellings DeepSpeed's DtypeEnum accepts (runtime/config.py)."""


class TorchAutocastConfig(DSModel):
    """`torch_autocast`: use torch.autocast instead of DeepSpeed's fp16/bf16 wrappers."""

    enabled: Bool = False
    """Enable torch.autocast in forward."""
    dtype: Optional[DtypeName] = None
    """Lower-precision dtype (e.g. bfloat16)."""
    lower_precision_safe_modules: Optional[list[str]] = None
    """Fully qualified module classes whose params may be cast (e.g. torch.nn.modules.linear.Linear)."""


_FLOAT_SPELLINGS = [s for spellings in FLOAT_DTYPE_SPELLINGS.values() for s in spellings]
FloatDtype = Annotated[Literal["fp32", "float32", "torch.float32", "float", "fp16", "float16", "torch.float16", "half",
                               "bf16", "bfloat16", "torch.bfloat16"],
                       AfterValidator(canonical_dtype),
                       WithJsonSchema({"type": "string", "enum": _FLOAT_SPELLINGS,
                                       "x-shown-enum": list(FLOAT_DTYPE_SPELLINGS)})]
"""A floating-point dtype in any spelling DeepSpeed's DtypeEnum takes ("float32", "torch.bfloat16", "half", ...),
read as its canonical name (fp32 / fp16 / bf16)."""


class DataTypesConfig(DSModel):
    """`data_types`: dtypes of gradient accumulation, parameters and buffers."""

    grad_accum_dtype: Optional[FloatDtype] = None
    """Dtype of the gradient accumulation buffer (default: the training dtype); any DtypeEnum spelling."""
    param_dtype: Optional[FloatDtype] = None
    """Dtype parameters are cast to (None: keep)."""
    buffer_dtype: Optional[FloatDtype] = None
    """Dtype buffers are cast to (None: keep)."""
    keep_in_fp32_modules: Union[Literal["auto"], list[str]] = "auto"
    """Name patterns of modules whose buffers stay fp32 under bf16/fp16 ("auto" or a list)."""
