"""data_types dtypes in every spelling DeepSpeed 0.19.8's DtypeEnum takes (runtime/config.py: "float32",
"torch.bfloat16", "half", ...): accepted, read as the canonical name, and compared as that dtype by the stage-0 rule
(DS229) and the ZeRO-1 BF16_Optimizer choice (DS243)."""
from __future__ import annotations

import pytest

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.facts import FLOAT_DTYPE_SPELLINGS, canonical_dtype
from dstoolkit.validate import validate_config

BF16 = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
FP32 = {"train_micro_batch_size_per_gpu": 1}


def _rows(cfg):
    return [(f.code, f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg)]


@pytest.mark.parametrize("spelling", FLOAT_DTYPE_SPELLINGS["bf16"])
def test_bf16_spellings_with_a_bf16_model_at_stage0_are_no_mix(spelling):
    assert _rows({**BF16, "data_types": {"grad_accum_dtype": spelling}}) == []


@pytest.mark.parametrize("spelling", FLOAT_DTYPE_SPELLINGS["fp32"])
def test_fp32_spellings_with_an_fp32_model_at_stage0_are_no_mix(spelling):
    assert _rows({**FP32, "data_types": {"grad_accum_dtype": spelling, "param_dtype": spelling,
                                         "buffer_dtype": spelling}}) == []


def test_a_real_mix_names_the_spelling_and_its_dtype():
    assert _rows({**BF16, "data_types": {"grad_accum_dtype": "float16"}}) == [
        ("DS229", "error", "/data_types/grad_accum_dtype",
         "data_types.grad_accum_dtype='float16' (fp16) with a bf16 model at ZeRO stage 0: DeepSpeed raises "
         "NotImplementedError ('unsupported mix of model_dtype and grad_accum_dtype')",
         'use "zero_optimization": {"stage": 1} (BF16_Optimizer for bf16 + fp32) or remove data_types.grad_accum_dtype')]
    assert [r[:3] for r in _rows({**BF16, "data_types": {"grad_accum_dtype": "fp32"}})] == [
        ("DS229", "error", "/data_types/grad_accum_dtype")]


def test_unknown_dtype_is_still_refused():
    assert _rows({**FP32, "data_types": {"grad_accum_dtype": "float64"}}) == [
        ("DS103", "error", "/data_types/grad_accum_dtype",
         "data_types.grad_accum_dtype = 'float64': must be 'fp32', 'fp16' or 'bf16'", None)]
    assert canonical_dtype("FP32") is None and canonical_dtype("int8") is None and canonical_dtype(None) is None


def test_the_model_reads_the_canonical_name():
    cfg = DeepSpeedConfig.model_validate({**BF16, "zero_optimization": {"stage": 1},
                                          "data_types": {"grad_accum_dtype": "torch.float32", "param_dtype": "bfloat16",
                                                         "buffer_dtype": "half"}})
    assert (cfg.data_types.grad_accum_dtype, cfg.data_types.param_dtype, cfg.data_types.buffer_dtype) == (
        "fp32", "bf16", "fp16")


@pytest.mark.parametrize("spelling", ["fp32", "float32", "torch.float32", "float"])
def test_zero1_bf16_with_fp32_accumulation_in_any_spelling_is_bf16_optimizer(spelling):
    # BF16_Optimizer takes an odd allgather_bucket_size (DS243 is for DeepSpeedZeroOptimizer only)
    cfg = {**BF16, "zero_optimization": {"stage": 1, "allgather_bucket_size": 500000001},
           "data_types": {"grad_accum_dtype": spelling}}
    assert [f.code for f in validate_config(cfg) if f.severity == "error"] == []
    odd = {**cfg, "data_types": {"grad_accum_dtype": "bf16"}}
    assert [f.code for f in validate_config(odd) if f.severity == "error"] == ["DS243"]
