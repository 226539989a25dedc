"""Each cross-field rule, triggered through validate_config (all findings) and through the model validator of
the same name on DeepSpeedConfig (first error raises), plus a passing case so no rule fires on valid input."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig import DeepSpeedConfig
from dstoolkit.validate import validate_config
from dstoolkit.dsconfig import rules

BASE = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}


def codes(cfg, **kw):
    return {(f.code, f.pointer) for f in validate_config(cfg, **kw) if f.severity == "error"}


def with_(**sections):
    return {**BASE, **sections}


def test_valid_base_has_no_findings():
    assert validate_config(BASE, world_size=4) == []
    DeepSpeedConfig.model_validate(BASE, context={"world_size": 4})


def test_batch_triad_against_world_size():
    assert ("DS201", "/train_batch_size") in codes(BASE, world_size=8)
    f = [x for x in validate_config(BASE, world_size=8) if x.code == "DS201"][0]
    assert "16 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x data-parallel size 8" in f.message
    # keeps the global batch 16 = 2 x 1 x 8; the triad also holds at dp 4 (tp x pp = 2), which the fix names first
    assert f.suggestion.endswith('set "gradient_accumulation_steps": 1') and "tp x pp = 2" in f.suggestion
    with pytest.raises(ValidationError, match="train_batch_size 16 != .* = 32"):
        DeepSpeedConfig.model_validate(BASE, context={"world_size": 8})


def test_batch_triad_uses_dp_after_tp_pp():
    # 16 GPUs, tp 2, pp 2 -> dp 4 -> 2 * 2 * 4 = 16: consistent
    assert codes(BASE, world_size=16, tp=2, pp=2) == set()
    assert ("DS201", "/train_batch_size") in codes(BASE, world_size=16)


def test_batch_triad_without_world_size_checks_divisibility():
    assert ("DS201", "/train_batch_size") in codes({**BASE, "train_batch_size": 10})
    assert codes(BASE) == set()


def test_batch_triad_two_of_three():
    cfg = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 8}
    assert ("DS201", "/train_batch_size") in codes(cfg, world_size=1)
    assert codes({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8}, world_size=2) == set()


def test_no_batch_size():
    assert ("DS202", "") in codes({"gradient_accumulation_steps": 1})


def test_parallel_sizes_divide_world():
    assert ("DS219", "") in codes(BASE, world_size=6, tp=4)


def test_fp16_bf16_exclusive():
    cfg = with_(fp16={"enabled": True}, bf16={"enabled": True})
    assert ("DS203", "/bf16/enabled") in codes(cfg)
    with pytest.raises(ValidationError, match="cannot be simultaneously enabled"):
        DeepSpeedConfig.model_validate(cfg)
    assert codes(with_(fp16={"enabled": True}, bf16={"enabled": False})) == set()


def test_offload_param_needs_stage3():
    # a warning, not an error: DeepSpeed 0.19.8 starts and ignores it (tests/unit/test_validate_false_errors.py)
    cfg = with_(zero_optimization={"stage": 2, "offload_param": {"device": "cpu"}})
    assert codes(cfg) == set()
    warn = [f for f in validate_config(cfg) if f.code == "DS204"]
    assert len(warn) == 1 and warn[0].severity == "warning" and "needs ZeRO stage 3" in warn[0].message
    DeepSpeedConfig.model_validate(cfg)
    assert not [f for f in validate_config(with_(zero_optimization={"stage": 3, "offload_param": {"device": "cpu"}}))
                if f.code == "DS204"]


def test_nvme_needs_path_and_aio():
    cfg = with_(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}})
    assert ("DS205", "/zero_optimization/offload_param/device") in codes(cfg)
    ok_path = with_(zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}})
    warn = [f for f in validate_config(ok_path) if f.code == "DS206"]
    assert len(warn) == 1 and warn[0].severity == "warning"
    assert not [f for f in validate_config({**ok_path, "aio": {"queue_depth": 16}}) if f.code.startswith("DS20")]
    with pytest.raises(ValidationError, match="nvme_path is not set"):
        DeepSpeedConfig.model_validate(cfg)


def test_zeropp_needs_stage3():
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        cfg = with_(zero_optimization={"stage": 2, key: True})
        assert ("DS208", f"/zero_optimization/{key}") in codes(cfg)
    cfg = with_(zero_optimization={"stage": 1, "zero_hpz_partition_size": 8})
    assert ("DS208", "/zero_optimization/zero_hpz_partition_size") in codes(cfg)
    assert codes(with_(zero_optimization={"stage": 3, "zero_quantized_weights": True,
                                          "zero_hpz_partition_size": 8}), gpus_per_node=8) == set()


def test_hpz_divides_world_size():
    cfg = with_(zero_optimization={"stage": 3, "zero_hpz_partition_size": 3})
    assert ("DS207", "/zero_optimization/zero_hpz_partition_size") in codes(cfg, world_size=4)
    with pytest.raises(ValidationError, match="does not divide world size 4"):
        DeepSpeedConfig.model_validate(cfg, context={"world_size": 4})
    # not dividing the GPUs per node spans nodes: DeepSpeed runs it, so a warning
    spans = {**cfg, "train_batch_size": 96}
    assert codes(spans, gpus_per_node=8, world_size=24) == set()
    assert [f.severity for f in validate_config(spans, gpus_per_node=8, world_size=24) if f.code == "DS221"] == ["warning"]


def test_optimizer_type_known():
    assert ("DS209", "/optimizer/type") in codes(with_(optimizer={"type": "AdamWW"}))
    f = [x for x in validate_config(with_(optimizer={"type": "AdamWW"})) if x.code == "DS209"][0]
    assert f.suggestion == "did you mean 'AdamW'?"
    for ok in ("AdamW", "adam", "Lamb", "SGD", "RMSprop"):
        assert codes(with_(optimizer={"type": ok})) == set(), ok
    assert ("DS209", "/optimizer/type") in codes(with_(optimizer={"type": "OneBitAdam"}))
    assert codes(with_(optimizer={"type": "OneBitAdam"}), deepspeed_version="0.16") == set()


def test_optimizer_params_valid_for_type():
    cfg = with_(optimizer={"type": "AdamW", "params": {"lr": 1e-4, "max_grad_norm": 1.0}})
    assert ("DS210", "/optimizer/params/max_grad_norm") in codes(cfg)
    with pytest.raises(ValidationError, match="max_grad_norm"):
        DeepSpeedConfig.model_validate(cfg)
    cfg = with_(optimizer={"type": "AdamW", "params": {"lr": 1e-4, "beta": [0.9, 0.95]}})
    f = [x for x in validate_config(cfg) if x.code == "DS210"][0]
    assert f.pointer == "/optimizer/params/beta" and f.suggestion == "did you mean 'betas'?"


def test_scheduler_type_and_params():
    assert ("DS211", "/scheduler/type") in codes(with_(scheduler={"type": "WarmupCosine"}))
    cfg = with_(scheduler={"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}})
    assert ("DS212", "/scheduler/params") in codes(cfg)
    cfg = with_(scheduler={"type": "WarmupLR", "params": {"warmup_steps": 10}})
    assert ("DS212", "/scheduler/params/warmup_steps") in codes(cfg)
    assert codes(with_(scheduler={"type": "CosineAnnealingLR", "params": {"T_max": 10}})) == set()


def test_reduce_bucket_size_positive():
    cfg = with_(zero_optimization={"stage": 2, "reduce_bucket_size": 0})
    assert ("DS103", "/zero_optimization/reduce_bucket_size") in codes(cfg)
    with pytest.raises(ValidationError, match="reduce_bucket_size"):
        DeepSpeedConfig.model_validate(cfg)


def test_moe_layout_from_section_and_flags():
    cfg = with_(dstoolkit={"moe": {"num_experts": 8, "ep_size": 3}})
    assert ("DS213", "/dstoolkit/moe/ep_size") in codes(cfg)
    # ep 4 divides 8 experts but not dp = 6
    assert ("DS213", "") in codes(BASE | {"train_batch_size": 24}, world_size=6, num_experts=8, ep_size=4)
    assert codes(BASE, world_size=4, num_experts=8, ep_size=4) == set()


def test_moe_rejected_at_stage3():
    cfg = with_(zero_optimization={"stage": 3})
    assert ("DS214", "/zero_optimization/stage") in codes(cfg, num_experts=8, ep_size=2)
    with pytest.raises(ValidationError, match="Native DeepSpeed MoE is not supported with ZeRO Stage 3"):
        DeepSpeedConfig.model_validate({**cfg, "dstoolkit": {"moe": {"num_experts": 8, "ep_size": 2}}})
    assert codes(with_(zero_optimization={"stage": 2}), num_experts=8, ep_size=2) == set()


def test_partial_offload_needs_stage3():
    cfg = with_(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}})
    assert ("DS215", "/zero_optimization/offload_optimizer/ratio") in codes(cfg)


def test_master_weights_need_zero():
    cfg = with_(bf16={"enabled": True, "bf16_master_weights_and_grads": True})
    assert ("DS216", "/bf16/bf16_master_weights_and_grads") in codes(cfg)
    cfg = with_(zero_optimization={"stage": 1}, bf16={"enabled": True, "bf16_optimizer_states": True})
    assert ("DS216", "/bf16/bf16_optimizer_states") in codes(cfg)


def test_compute_grad_norm_and_allreduce_sum():
    assert ("DS217", "/zero_optimization/compute_grad_norm") in codes(
        with_(zero_optimization={"stage": 3, "compute_grad_norm": False}))
    assert ("DS218", "/gradient_allreduce_op") in codes(with_(zero_optimization={"stage": 3},
                                                             gradient_allreduce_op="sum"))


def test_model_validator_runs_the_registry():
    # one model validator, generated from the registry: no hand-copied per-rule validators left to drift
    validators = set(DeepSpeedConfig.__pydantic_decorators__.model_validators)
    assert validators == {"_check_rules"}
    assert list(rules.RULES) and all(r.code == code for code, r in rules.RULES.items())
    # every error rule raises through pydantic: the corpus of triggers below covers each one
    triggers = {
        "DS201": (BASE, {"world_size": 8}), "DS202": ({"gradient_accumulation_steps": 1}, {}),
        "DS203": (with_(fp16={"enabled": True}, bf16={"enabled": True}), {}),
        "DS205": (with_(zero_optimization={"stage": 3, "offload_param": {"device": "nvme"}}), {}),
        "DS207": (with_(zero_optimization={"stage": 3, "zero_hpz_partition_size": 3}), {"world_size": 4}),
        "DS208": (with_(zero_optimization={"stage": 2, "zero_quantized_weights": True}), {}),
        "DS209": (with_(optimizer={"type": "AdamWW"}), {}),
        "DS210": (with_(optimizer={"type": "AdamW", "params": {"beta": 1}}), {}),
        "DS211": (with_(scheduler={"type": "Warmup"}), {}),
        "DS212": (with_(scheduler={"type": "WarmupLR", "params": {"warmup_steps": 1}}), {}),
        "DS213": (with_(dstoolkit={"moe": {"num_experts": 8, "ep_size": 3}}), {}),
        "DS214": (with_(zero_optimization={"stage": 3}, dstoolkit={"moe": {"num_experts": 8}}), {}),
        "DS215": (with_(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}), {}),
        "DS216": (with_(bf16={"enabled": True, "bf16_master_weights_and_grads": True}), {}),
        "DS217": (with_(zero_optimization={"stage": 3, "compute_grad_norm": False}), {}),
        "DS218": (with_(zero_optimization={"stage": 3}, gradient_allreduce_op="sum"), {}),
        "DS219": (BASE, {"world_size": 6, "tp": 4}),
        "DS220": (with_(fp16={"enabled": True, "loss_scale_window": 0}), {}),
        "DS223": (with_(tensor_parallel={"autotp_size": 8}), {"world_size": 4}),
        "DS224": (with_(tensor_parallel={"autotp_size": 2}), {"num_heads": 3}),
        "DS225": (with_(zero_optimization={"stage": 3}, tensor_parallel={"autotp_size": 2}),
                  {"deepspeed_version": "0.16"}),
        "DS226": (with_(sequence_parallel_size=3), {"num_heads": 4}),
        "DS247": (with_(zero_optimization={"stage": 3}, tensor_parallel={"autotp_size": 2}), {"mode": "hf"}),
        "DS227": (with_(expert_parallel={"enabled": True, "autoep_size": 8}), {"world_size": 4}),
        "DS229": (with_(bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"}), {}),
        "DS230": (with_(optimizer={"type": "AdamW", "params": {"lr": -1}}), {}),
        "DS231": (with_(gradient_clipping=-1), {}),
        "DS233": (with_(optimizer={"type": "SGD", "params": {"lr": -1}}), {}),
        "DS234": (with_(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 0}}), {}),
        "DS232": (with_(zero_optimization={"stage": 2}), {"pp": 2}),
        "DS236": (with_(optimizer={"type": "SGD", "params": {"lr": 0.1}}, zero_optimization={"stage": 2}), {}),
        "DS237": (with_(optimizer={"type": "LBFGS", "params": {"lr": 1}}), {}),
        "DS238": (with_(scheduler={"type": "WarmupLR"}), {}),
        "DS239": (with_(scheduler={"type": "CosineAnnealingLR", "params": {}}), {}),
        "DS240": (with_(optimizer={"type": "AdamW", "params": {"lr": "1e-3"}}), {}),
        "DS241": (with_(steps_per_print=0), {}),
        "DS242": (with_(zero_optimization={"stage": 2}, gradient_predivide_factor=2.0), {}),
        "DS243": (with_(zero_optimization={"stage": 1, "allgather_bucket_size": 3}), {}),
        "DS244": (with_(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"},
                                           "zenflow": {"select_interval": 10}}), {}),
        "DS245": (with_(optimizer={"params": {"lr": 1e-3}}), {}),
    }
    errors = {code for code, r in rules.RULES.items() if r.severity == "error"}
    assert set(triggers) == errors
    for code, (cfg, ctx) in triggers.items():
        assert code in {f.code for f in validate_config(cfg, **ctx)}, code
        with pytest.raises(ValidationError) as info:
            DeepSpeedConfig.model_validate(cfg, context=ctx)
        assert info.value.errors()[0]["ctx"]["error"].code == code


def test_rules_never_raise_on_garbage():
    for cfg in ({"zero_optimization": "x"}, {"optimizer": []}, {"fp16": 3, "bf16": None},
                {"train_batch_size": "a", "zero_optimization": {"stage": [1]}}):
        assert isinstance(rules.run_rules(cfg, rules.RuleContext(world_size=3)), list)


def test_fp16_dynamic_loss_scale_window_positive():
    # found by the differential test: DeepSpeed 0.19 refuses loss_scale_window <= 0 with dynamic scaling
    cfg = with_(fp16={"enabled": True, "loss_scale": 0, "loss_scale_window": -1})
    assert ("DS220", "/fp16/loss_scale_window") in codes(cfg)
    assert codes(with_(fp16={"enabled": True, "loss_scale": 128, "loss_scale_window": -1})) == set()
    with pytest.raises(ValidationError, match="loss_scale_window=-1 must be > 0"):
        DeepSpeedConfig.model_validate(cfg)


def test_grad_accum_dtype_other_than_the_models_needs_zero():
    # DeepSpeed 0.19.8 engine._do_optimizer_sanity_check: stage 0 with bf16 + fp32 accumulation raises
    # NotImplementedError; stages 1-3 accept it (stage 1 runs BF16_Optimizer)
    bf16_fp32 = {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}}
    assert ("DS229", "/data_types/grad_accum_dtype") in codes(with_(zero_optimization={"stage": 0}, **bf16_fp32))
    for stage in (1, 2, 3):
        assert not any(c == "DS229" for c, _ in codes(with_(zero_optimization={"stage": stage}, **bf16_fp32)))
    # the model's own dtype is fine at stage 0, and so is fp32 with fp32
    assert not any(c == "DS229" for c, _ in codes(with_(zero_optimization={"stage": 0}, bf16={"enabled": True},
                                                        data_types={"grad_accum_dtype": "bf16"})))
    assert not any(c == "DS229" for c, _ in codes(with_(zero_optimization={"stage": 0},
                                                        data_types={"grad_accum_dtype": "fp32"})))
    # 0.16's engine is not read: no finding under --deepspeed-version 0.16
    assert not any(c == "DS229" for c, _ in codes(with_(zero_optimization={"stage": 0}, **bf16_fp32),
                                                  deepspeed_version="0.16"))


def test_hf_autotp_at_stage3_only_under_hf():
    # transformers' ZeRO-3 loader refuses AutoTP (s37: from_pretrained raised NotImplementedError on the generated
    # ds_config_hf.json); DeepSpeed itself runs it, so strict mode and stages 0-2 are not flagged
    z3 = with_(zero_optimization={"stage": 3}, tensor_parallel={"autotp_size": 2})
    assert ("DS247", "/tensor_parallel/autotp_size") in codes(z3, mode="hf")
    assert not any(c == "DS247" for c, _ in codes(z3))
    for stage in (0, 1, 2):
        assert not any(c == "DS247" for c, _ in codes(with_(zero_optimization={"stage": stage},
                                                            tensor_parallel={"autotp_size": 2}), mode="hf"))
    assert not any(c == "DS247" for c, _ in codes(with_(zero_optimization={"stage": 3},
                                                        tensor_parallel={"autotp_size": 1}), mode="hf"))
