"""Explicit JSON null for a top-level section (a Python None dumped as JSON): DeepSpeed 0.19.8's config parser fails
on it for the sections in NULL_REFUSED_TOP_LEVEL (measured with runtime/config.py DeepSpeedConfig, one key at a
time), so validate, the pydantic model and the committed JSON Schema refuse it; bf16 (and the other keys DeepSpeed
reads as unset) stay nullable. estimate's fit advice (planner._plan_variant) never indexes into a null section."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.facts import NULL_REFUSED_TOP_LEVEL
from dstoolkit.validate import validate_config
from dstoolkit.validate.schema_check import Checker

REPO = Path(__file__).resolve().parents[2]
BASE = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}}
TAIL = ("; DeepSpeed 0.19.8 does not read an explicit null as a missing key: its config parser fails on it "
        "(TypeError / AttributeError / ValidationError)")


def _rows(cfg):
    return [(f.code, f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg)]


def test_null_zero_optimization_and_scheduler_are_errors_naming_key_and_fix():
    assert _rows({**BASE, "zero_optimization": None}) == [
        ("DS102", "error", "/zero_optimization",
         "zero_optimization = null: expected an object or a boolean, got null" + TAIL,
         "write an object or delete the key")]
    assert _rows({**BASE, "zero_optimization": {"stage": 2}, "scheduler": None}) == [
        ("DS102", "error", "/scheduler", "scheduler = null: expected an object, got null" + TAIL,
         "write an object or delete the key")]
    assert _rows({**BASE, "sequence_parallel_size": None}) == [
        ("DS102", "error", "/sequence_parallel_size",
         "sequence_parallel_size = null: expected an integer, got null" + TAIL, "write a value or delete the key")]


@pytest.mark.parametrize("key", sorted(NULL_REFUSED_TOP_LEVEL))
def test_every_section_deepspeed_fails_on_is_one_error(key):
    base = {"train_micro_batch_size_per_gpu": 4} if key == "bfloat16" else BASE  # DeepSpeed reads bfloat16 without bf16
    found = validate_config({**base, key: None})
    assert [(f.code, f.severity, f.pointer) for f in found] == [("DS102", "error", f"/{key}")]
    assert found[0].message.startswith(f"{key} = null: ") and found[0].message.endswith(TAIL)


@pytest.mark.parametrize("key", ["bf16", "aio", "expert_parallel", "steps_per_print", "train_batch_size",
                                 "log_level", "communication_data_type", "vocabulary_size", "dstoolkit"])
def test_keys_deepspeed_reads_as_unset_stay_nullable(key):
    assert validate_config({**BASE, key: None}) == []


def test_bfloat16_null_next_to_bf16_is_only_the_ignored_warning():
    # precision_config.get_bfloat16_config reads the legacy name only when bf16 is absent or null
    assert [(f.code, f.severity, f.pointer) for f in validate_config({**BASE, "bfloat16": None})] == [
        ("DS105", "warning", "/bfloat16")]
    legacy = {"train_micro_batch_size_per_gpu": 4, "bf16": None, "bfloat16": {"enabled": True}}
    assert [(f.code, f.severity, f.pointer) for f in validate_config(legacy)] == [("DS106", "warning", "/bfloat16")]


def test_schema_and_model_refuse_null_where_deepspeed_fails():
    for where in ("ds_configs/schema", "dstoolkit/dsconfig"):
        schema = json.loads((REPO / where / "deepspeed_config.schema.json").read_text(encoding="utf-8"))
        assert schema["properties"]["zero_optimization"]["anyOf"] == [{"$ref": "#/$defs/ZeroConfig"},
                                                                     {"type": "boolean"}]
        checker = Checker(schema)
        for key in NULL_REFUSED_TOP_LEVEL:
            assert checker.check(schema["properties"][key], None), (where, key)
        assert checker.check(schema["properties"]["bf16"], None) == []
    with pytest.raises(ValidationError):
        DeepSpeedConfig.model_validate({**BASE, "zero_optimization": None})
    with pytest.raises(ValidationError):
        DeepSpeedConfig.model_validate({**BASE, "optimizer": None})
    assert DeepSpeedConfig.model_validate({**BASE, "zero_optimization": {"stage": 1}}).bf16.enabled is True
    assert DeepSpeedConfig.model_validate({"train_micro_batch_size_per_gpu": 1, "bf16": None}).bf16 is None


def test_fit_advice_variant_of_a_null_zero_section_does_not_crash():
    from dstoolkit.generate.planner import _plan_variant
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models import get_preset
    from dstoolkit.runplan import RunPlan
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW"}}
    plan = RunPlan(shape=get_preset("tiny"), ds_config=ds, world_size=2, gpus_per_node=2, gpu=get_gpu("cpu"),
                   seq_len=128, checkpoint=CheckpointPolicy(kind="none"), precision="bf16")
    broken = plan.model_copy(update={"ds_config": {**ds, "zero_optimization": None}})
    variant = _plan_variant(broken, {"zero_optimization/stage": 3})
    assert variant is not None and variant.ds_config["zero_optimization"] == {"stage": 3}
    legacy = plan.model_copy(update={"ds_config": {**ds, "zero_optimization": True}})
    assert _plan_variant(legacy, {"zero_optimization/stage": 3}) is None


def test_estimate_refuses_a_null_section_in_one_line(tmp_path, capsys):
    from dstoolkit.cli import main

    cfg = tmp_path / "zero_null.json"
    cfg.write_text(json.dumps({**BASE, "zero_optimization": None}))
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-8b", "--world-size", "8", "--seq-len", "2048"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert f"{cfg}:1:87: error[DS102]: zero_optimization = null: " in err
    assert f"dstoolkit estimate: {cfg}: 1 error(s) from validate_config: not estimated" in err
