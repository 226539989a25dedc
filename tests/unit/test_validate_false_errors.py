"""The four false errors of issue 18, each on a real config DeepSpeed 0.19.8 accepts and starts.

Each config is a real one (source named beside it); DeepSpeed's verdict was measured with
deepspeed.initialize on 2 gloo CPU ranks (a 2-layer Linear model, one step) and, here, with DeepSpeed's own
DeepSpeedConfig where deepspeed is installed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstoolkit.dsconfig import DeepSpeedConfig
from dstoolkit.validate import validate_config

CORPUS = Path(__file__).resolve().parents[1] / "corpus"


def _errors(cfg, **kw):
    return [(f.code, f.pointer) for f in validate_config(cfg, **kw) if f.severity == "error"]


def _warnings(cfg, **kw):
    return [(f.code, f.pointer) for f in validate_config(cfg, **kw) if f.severity == "warning"]


def _deepspeed_accepts(cfg):
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    # one process, world size 1: drop the global batch so that DeepSpeed derives it for that world
    ds_config.DeepSpeedConfig({k: v for k, v in cfg.items() if k != "train_batch_size"})  # raises when refused


# DeepSpeed's pipeline tutorial config shape (docs/_tutorials/pipeline.md) with pipeline.stages "auto", the
# value DeepSpeed 0.19.8 itself defaults to (runtime/config.py get_pipeline_config: "stages": "auto").
PIPELINE_AUTO = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 10,
                 "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
                 "pipeline": {"pipe_partitioned": True, "grad_partitioned": True, "stages": "auto"}}

# DeepSpeed's ZeRO++ tutorial config (docs/_tutorials/zeropp.md: "zero_hpz_partition_size": 8, one 8-GPU node),
# run on fewer ranks than 8: DeepSpeed clamps the hpZ group to the world size (utils/groups.py
# _create_zero_param_parallel_group: min(group_size, world_size)); measured on 2 gloo ranks: group of 2, trains.
ZEROPP = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 3, "reduce_bucket_size": 10000000, "reduce_scatter": True,
                                "zero_quantized_weights": True, "zero_hpz_partition_size": 8,
                                "zero_quantized_gradients": True, "contiguous_gradients": True, "overlap_comm": True},
          "bf16": {"enabled": True}}


def test_pipeline_stages_auto_is_deepspeeds_default():
    for mode in ("strict", "hf"):
        assert _errors(PIPELINE_AUTO, mode=mode, world_size=32) == [], mode
    assert validate_config(json.dumps(PIPELINE_AUTO, indent=2)) == []
    DeepSpeedConfig.model_validate(PIPELINE_AUTO)
    _deepspeed_accepts(PIPELINE_AUTO)
    # an "auto" nothing fills is still reported
    assert ("DS110", "/pipeline/partition") in _errors({**PIPELINE_AUTO, "pipeline": {"partition": "auto"}})


def test_hpz_larger_than_world_is_a_warning():
    for world in (2, 4):
        assert _errors(ZEROPP, world_size=world, gpus_per_node=8) == [], world
        assert ("DS221", "/zero_optimization/zero_hpz_partition_size") in _warnings(ZEROPP, world_size=world)
    DeepSpeedConfig.model_validate(ZEROPP, context={"world_size": 2, "gpus_per_node": 8})
    msg = [f.message for f in validate_config(ZEROPP, world_size=2) if f.code == "DS221"][0]
    assert "clamps the hpZ group to 2 ranks" in msg
    # still an error where DeepSpeed asserts: 8 does not divide 12
    assert ("DS207", "/zero_optimization/zero_hpz_partition_size") in _errors(
        {**ZEROPP, "train_batch_size": 12}, world_size=12)


# microsoft/DeepSpeedExamples-style shell template: "stage": "$ZERO_STAGE" left quoted, as written out by e.g.
# Megatron-DeepSpeed example scripts that build ds_config.json with a heredoc; after substitution: "1".
def test_stage_string_is_a_warning():
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": "1", "reduce_bucket_size": 500000000}, "bf16": {"enabled": True}}
    assert _errors(cfg, world_size=4) == []
    assert ("DS222", "/zero_optimization/stage") in _warnings(cfg)
    assert DeepSpeedConfig.model_validate(cfg).zero_optimization.stage == 1
    _deepspeed_accepts(cfg)
    # the string stage is the stage for the other rules: offload_param at "1" is DS204, stage-3 keys DS105
    w = _warnings({**cfg, "zero_optimization": {"stage": "1", "offload_param": {"device": "cpu"},
                                                "stage3_max_live_parameters": 1e9}})
    assert ("DS204", "/zero_optimization/offload_param") in w
    assert ("DS105", "/zero_optimization/stage3_max_live_parameters") in w
    assert ("DS103", "/zero_optimization/stage") in _errors({**cfg, "zero_optimization": {"stage": "4"}})


def test_offload_param_below_stage3_is_a_warning():
    # microsoft/DeepSpeed tests/hybrid_engine/hybrid_engine_config.json (corpus): offload_param at stage 0
    text = (CORPUS / "microsoft__DeepSpeed__tests__hybrid_engine__hybrid_engine_config.json").read_text()
    cfg = json.loads(text)
    assert _errors(text, world_size=16) == []
    assert ("DS204", "/zero_optimization/offload_param") in _warnings(text)
    _deepspeed_accepts(cfg)
    # offload_optimizer at stage 0 is not alike: DeepSpeed requires a CPU optimizer for GPU parameters (DS105 error,
    # tests/unit/test_s32_validate_offload_stage0.py); with zero_force_ds_cpu_optimizer false it does nothing
    oo = {**cfg, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}
    assert [f.severity for f in validate_config(oo) if f.pointer == "/zero_optimization/offload_optimizer"] == ["error"]
    oo["zero_force_ds_cpu_optimizer"] = False
    assert [f.severity for f in validate_config(oo) if f.pointer == "/zero_optimization/offload_optimizer"] == ["warning"]
    for stage in (1, 2):
        z = {**cfg, "zero_optimization": {"stage": stage, "offload_param": {"device": "cpu"}}}
        assert _errors(z) == [] and ("DS204", "/zero_optimization/offload_param") in _warnings(z)
