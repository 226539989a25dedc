"""DS241-DS245 and the ZenFlow field bounds: configs DeepSpeed 0.19.8 refuses at deepspeed.initialize or at the first
step, which `dstoolkit validate` passed before (tester findings s30 #6-#10). Each verdict below was measured with a
1-rank gloo CPU engine (deepspeed.initialize + steps), the gradient_predivide_factor ZeRO-1 / ZeRO-3 cases on 2 ranks.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.validate import validate_config

BASE = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}


def _cfg(zero=None, **top):
    cfg = json.loads(json.dumps(BASE))
    if zero is not None:
        cfg["zero_optimization"] = zero
    cfg.update(top)
    return cfg


def _codes(cfg, code, **kw):
    return [f for f in validate_config(json.dumps(cfg), **kw) if f.code == code]


# -- DS241 steps_per_print ----------------------------------------------------------------------------------
def test_steps_per_print_zero_is_an_error():
    (f,) = _codes(_cfg(steps_per_print=0), "DS241")
    assert f.severity == "error" and f.pointer == "/steps_per_print"
    assert "ZeroDivisionError" in f.message and "_take_model_step" in f.message and "positive" in f.suggestion
    with pytest.raises(ValueError, match="steps_per_print=0"):
        DeepSpeedConfig.model_validate(_cfg(steps_per_print=0))


def test_steps_per_print_zero_is_an_error_under_016_too():
    assert [f.severity for f in _codes(_cfg(steps_per_print=0), "DS241", deepspeed_version="0.16")] == ["error"]


def test_negative_steps_per_print_runs_and_is_a_warning():
    (f,) = _codes(_cfg(steps_per_print=-1), "DS241")
    assert f.severity == "warning" and "every 1 step" in f.message and '"steps_per_print": 1' in f.suggestion


@pytest.mark.parametrize("v", [1, 100, None])
def test_positive_or_null_steps_per_print_passes(v):
    assert _codes(_cfg(steps_per_print=v), "DS241") == []


# -- DS242 gradient_predivide_factor / prescale_gradients -------------------------------------------------------
@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("gpf", [2.0, 0, -1.0])
def test_predivide_factor_with_reduce_scatter_at_stage_2_3(stage, gpf):
    (f,) = _codes(_cfg({"stage": stage}, gradient_predivide_factor=gpf), "DS242")
    assert f.pointer == "/gradient_predivide_factor" and f.severity == "error"
    assert f"not yet supported with ZeRO-{stage} with reduce scatter enabled" in f.message
    assert '"reduce_scatter": false' in f.suggestion


@pytest.mark.parametrize("stage", [2, 3])
def test_prescale_with_reduce_scatter_at_stage_2_3(stage):
    (f,) = _codes(_cfg({"stage": stage}, prescale_gradients=True), "DS242")
    assert f.pointer == "/prescale_gradients" and "pre-scale gradients is not yet supported" in f.message


@pytest.mark.parametrize("cfg", [
    _cfg({"stage": 1}, gradient_predivide_factor=2.0),               # stage 1: no assert (measured)
    _cfg({"stage": 1}, gradient_predivide_factor=0),                 # stage 1 reduce-scatter never reads it
    _cfg({"stage": 1}, prescale_gradients=True),
    _cfg({"stage": 0}, gradient_predivide_factor=-1.0),
    _cfg({"stage": 2, "reduce_scatter": False}, gradient_predivide_factor=2.0),
    _cfg({"stage": 3, "reduce_scatter": False}, prescale_gradients=True),
    _cfg({"stage": 2}, gradient_predivide_factor=2.0, gradient_allreduce_op="sum"),  # no gradient_average: no assert
    _cfg({"stage": 0}, gradient_predivide_factor=0, prescale_gradients=True),       # factor not read
])
def test_predivide_cases_deepspeed_trains(cfg):
    assert _codes(cfg, "DS242") == []


@pytest.mark.parametrize("zero,needle", [
    ({"stage": 0}, "ZeroDivisionError"),
    ({"stage": 1, "reduce_scatter": False}, "ZeroDivisionError"),
    ({"stage": 2, "reduce_scatter": False}, "ZeroDivisionError"),
    ({"stage": 3, "reduce_scatter": False}, "inf"),
])
def test_zero_predivide_factor_divides_by_zero(zero, needle):
    (f,) = _codes(_cfg(zero, gradient_predivide_factor=0), "DS242")
    assert needle in f.message and f.severity == "error"


# -- DS243 allgather_bucket_size alignment -----------------------------------------------------------------------
@pytest.mark.parametrize("stage", [1, 2])
def test_odd_allgather_bucket_at_zero_1_2(stage):
    (f,) = _codes(_cfg({"stage": stage, "allgather_bucket_size": 500000001}), "DS243")
    assert f.pointer == "/zero_optimization/allgather_bucket_size"
    assert "multiple of nccl_start_alignment_factor, 2" in f.message and "500000002" in f.suggestion


@pytest.mark.parametrize("cfg", [
    _cfg({"stage": 0, "allgather_bucket_size": 3}),
    _cfg({"stage": 3, "allgather_bucket_size": 3}),
    _cfg({"stage": 2, "allgather_bucket_size": 0}),
    _cfg({"stage": 2, "reduce_bucket_size": 500000001}),
    _cfg({"stage": 1, "allgather_bucket_size": 3}, bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}),
])
def test_allgather_cases_deepspeed_trains(cfg):
    assert _codes(cfg, "DS243") == []


def test_odd_allgather_at_stage_2_bf16_is_refused():
    assert _codes(_cfg({"stage": 2, "allgather_bucket_size": 3}, bf16={"enabled": True}), "DS243")


# -- DS244 ZenFlow ------------------------------------------------------------------------------------------------
def _zf(stage=2, cpu_offload=True, zextra=None, **zf):
    z = {"stage": stage, "zenflow": zf, **(zextra or {})}
    if cpu_offload:
        z["offload_optimizer"] = {"device": "cpu"}
    return _cfg(z)


@pytest.mark.parametrize("cfg,ptr,needle", [
    (_zf(topk_ratio=0.1, select_interval=100), "/select_interval", "If use auto select strategy"),
    (_zf(stage=1, select_interval=100), "/select_interval", "If use auto select strategy"),
    (_zf(stage=3, select_interval=100), "/select_interval", "If use auto select strategy"),
    (_zf(select_strategy="step"), "/select_interval", "select_interval must be a number"),
    (_zf(select_strategy="epoch"), "/select_interval", "select_interval must be a number"),
    (_zf(select_strategy="step", select_interval=2, update_interval=4), "/select_interval", "greater or equal"),
    (_zf(select_strategy="step", select_interval=-1, update_interval=4), "/select_interval", "greater or equal"),
    (_zf(select_strategy="epoch", select_interval=1, update_interval=4, steps_per_epoch=2), "/select_interval",
     "greater or equal"),
    (_zf(cpu_offload=False), "", "Zenflow must be used with cpu offload"),
    (_zf(offload=True), "/offload", "should be used with overlap_comm"),
    (_zf(stage=3, zextra={"overlap_comm": False}, offload=True), "/offload", "overlap_comm"),
    (_zf(stage=0), "", "AttributeError"),
])
def test_zenflow_refusals(cfg, ptr, needle):
    (f,) = _codes(cfg, "DS244")
    assert f.pointer == "/zero_optimization/zenflow" + ptr and needle in f.message and f.severity == "error"


@pytest.mark.parametrize("cfg", [
    _zf(topk_ratio=0.1, select_strategy="step", select_interval=100),
    _zf(),
    _zf(select_strategy="epoch", select_interval=2),
    _zf(select_strategy="step", select_interval=0, update_interval=4),
    _zf(select_strategy="step", select_interval=4, update_interval=4),
    _zf(zextra={"overlap_comm": True}, offload=True),
])
def test_zenflow_configs_deepspeed_trains(cfg):
    assert _codes(cfg, "DS244") == []


def test_zenflow_does_not_exist_in_016():
    (f,) = _codes(_zf(topk_ratio=0.1, select_strategy="step", select_interval=100), "DS244", deepspeed_version="0.16")
    assert f.pointer == "/zero_optimization/zenflow" and "0.16 has no ZenFlow" in f.message


def test_zenflow_at_stage_0_is_not_called_without_effect():
    found = validate_config(json.dumps(_zf(stage=0)))
    assert not [f for f in found if f.pointer == "/zero_optimization/zenflow" and f.code == "DS105"]


@pytest.mark.parametrize("key,value,needle", [("update_interval", 0, "greater than 0"),
                                              ("topk_ratio", 1.0, "less than 1"), ("topk_ratio", 0.0, "greater than 0")])
def test_zenflow_field_bounds_are_deepspeeds(key, value, needle):
    found = [f for f in validate_config(json.dumps(_zf(**{key: value}))) if f.code == "DS103"]
    assert len(found) == 1 and found[0].pointer == f"/zero_optimization/zenflow/{key}" and needle in found[0].message


# -- DS245 optimizer.params without type ---------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["strict", "hf"])
def test_optimizer_params_without_type(mode):
    cfg = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "optimizer": {"params": {"lr": 1e-3}}}
    (f,) = _codes(cfg, "DS245", mode=mode)
    assert f.severity == "error" and f.pointer == "/optimizer/params"
    assert "without optimizer.type" in f.message and "ignored" in f.message and '"type"' in f.suggestion


@pytest.mark.parametrize("opt", [{"type": "AdamW", "params": {"lr": 1e-3}}, {"params": {}}, {}])
def test_optimizer_with_type_or_without_params_passes(opt):
    assert _codes({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "optimizer": opt}, "DS245") == []


def test_new_rules_are_documented():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "rules.md").read_text(encoding="utf-8")
    for code in ("DS241", "DS242", "DS243", "DS244", "DS245"):
        assert code in text
