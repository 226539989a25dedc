"""Per-key findings: unknown keys with "did you mean", types, ranges, misplaced keys, stage-ignored keys,
deprecated and removed names, "auto" in strict and hf mode, and positions in the source text."""
from __future__ import annotations

import json

from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def find(cfg, code, **kw):
    return [f for f in validate_config(cfg, **kw) if f.code == code]


def test_typo_top_level_is_an_error_with_the_real_name():
    [f] = find({**BASE, "zero_optimisation": {"stage": 3}}, "DS101")
    assert f.severity == "error" and f.pointer == "/zero_optimisation"
    assert "zero_optimization" in f.suggestion


def test_unknown_top_level_key_did_you_mean():
    [f] = find({**BASE, "gradient_clip": 1.0}, "DS101")
    assert f.suggestion == "did you mean 'gradient_clipping'?"


def test_unknown_key_at_depth_with_did_you_mean():
    cfg = {**BASE, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memmory": True}},
           "activation_checkpointing": {"partition_activation": True}}
    got = {f.pointer: f.suggestion for f in find(cfg, "DS101")}
    assert got == {"/zero_optimization/offload_param/pin_memmory": "did you mean 'pin_memory'?",
                   "/activation_checkpointing/partition_activation": "did you mean 'partition_activations'?"}


def test_the_issue_typo_stage3_param_persitance_threshold():
    cfg = {**BASE, "zero_optimization": {"stage": 3, "stage3_param_persitance_threshold": 1e5}}
    [f] = find(cfg, "DS101")
    assert f.suggestion == "did you mean 'stage3_param_persistence_threshold'?"


def test_string_number_is_a_type_error():
    [f] = find({**BASE, "gradient_clipping": "1.0"}, "DS102")
    assert f.pointer == "/gradient_clipping" and f.suggestion == "write the number without quotes: 1.0"
    [f] = find({**BASE, "fp16": {"enabled": "true"}}, "DS102")
    assert f.suggestion == "write the boolean without quotes: true"


def test_integral_floats_are_ints_but_fractions_are_not():
    assert find({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}, "DS102") == []
    [f] = find({**BASE, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5.5}}, "DS102")
    assert f.pointer == "/zero_optimization/reduce_bucket_size"


def test_config_text_reads_exponent_numbers_as_hjson_does():
    # DeepSpeed reads the file with hjson: 1e3 arrives as the int 1000, 1e10 and above stay floats, which the
    # warmup schedules refuse (DS234). The text parser used to make every integral exponent an int, so 1e30 passed.
    text = ('{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, '
            '"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": %s}}}')
    assert [f.code for f in validate_config(text % "1e3") if f.severity == "error"] == []
    for big in ("1e10", "1e30"):
        [f] = find(text % big, "DS234")
        assert f.pointer == "/scheduler/params/warmup_num_steps" and "must be a positive integer" in f.message


def test_out_of_range_and_enum():
    [f] = find({**BASE, "zero_optimization": {"stage": 4}}, "DS103")
    assert f.pointer == "/zero_optimization/stage" and "0, 1, 2 or 3" in f.message
    [f] = find({**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}}, "DS103")
    assert f.pointer == "/zero_optimization/offload_optimizer/device"


def test_fp16_keys_in_bf16_belong_to_another_section():
    cfg = {**BASE, "bf16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}}
    got = find(cfg, "DS104")
    assert {f.pointer for f in got} == {"/bf16/loss_scale", "/bf16/initial_scale_power"}
    assert all(f.severity == "error" for f in got)
    assert all(f.severity == "warning" for f in find(cfg, "DS104", deepspeed_version="0.16"))


def test_zero_key_at_top_level_and_offload_key_in_zero():
    got = {f.pointer for f in find({**BASE, "reduce_bucket_size": 1e6, "zero_optimization": {"stage": 2,
                                                                                          "device": "cpu"}}, "DS104")}
    assert got == {"/reduce_bucket_size", "/zero_optimization/device"}


def test_stage3_only_keys_at_stage1_are_ignored_warnings():
    cfg = {**BASE, "zero_optimization": {"stage": 1, "stage3_max_live_parameters": 1e9, "sub_group_size": 1e9}}
    got = find(cfg, "DS105")
    assert {f.pointer for f in got} == {"/zero_optimization/stage3_max_live_parameters",
                                        "/zero_optimization/sub_group_size"}
    assert all(f.severity == "warning" and "ignored at stage 1" in f.message for f in got)
    assert find({**BASE, "zero_optimization": {"stage": 3, "round_robin_gradients": True}}, "DS105")


def test_deprecated_names_warn_with_replacement():
    for key, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param"),
                     ("cpu_offload_use_pin_memory", "pin_memory"),
                     ("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save")):
        [f] = [x for x in find({**BASE, "zero_optimization": {"stage": 3, key: False}}, "DS106")]
        assert f.severity == "warning" and new in f.suggestion, key


def test_deprecated_and_replacement_together_is_an_error():
    cfg = {**BASE, "zero_optimization": {"stage": 2, "cpu_offload": False, "offload_optimizer": {"device": "cpu"}}}
    assert any(f.severity == "error" for f in find(cfg, "DS106"))


def test_removed_sections_are_errors_that_say_so():
    for key in ("compression_training", "quantize_training", "sparse_attention", "progressive_layer_drop",
                "curriculum_learning"):
        [f] = find({**BASE, key: {"enabled": True}}, "DS107")
        assert f.severity == "error" and "removed" in f.message and f.pointer == f"/{key}"
        assert find({**BASE, key: {"enabled": True}}, "DS107", deepspeed_version="0.16") == []


def test_legacy_aliases_accepted_both_spellings():
    for key in ("stage3_max_live_parameters", "max_live_parameters"):
        assert validate_config({**BASE, "zero_optimization": {"stage": 3, key: 1e9}}) == []


def test_auto_strict_names_who_fills_it():
    [f] = find({**BASE, "gradient_accumulation_steps": "auto"}, "DS110")
    assert "HF gradient_accumulation_steps" in f.message
    # a zero_optimization size key ("allgather_bucket_size") is a warning naming DeepSpeed's default since s34
    # (test_s34_validate_auto); a flag DeepSpeed drops for a stage-dependent default stays an error
    [f] = find({**BASE, "zero_optimization": {"stage": 2, "overlap_comm": "auto"}}, "DS110")
    assert "nothing" in f.message and f.severity == "error"


def test_auto_hf_mode_only_where_hf_fills():
    cfg = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_clipping": "auto",
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                    "weight_decay": "auto"}},
           "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": "auto", "total_num_steps": "auto",
                                                            "warmup_min_lr": "auto", "warmup_max_lr": "auto"}},
           "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_param_persistence_threshold": "auto"}}
    assert [f for f in validate_config(cfg, mode="hf") if f.severity == "error"] == []
    bad = {**cfg, "steps_per_print": "auto", "zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto"}}
    got = {f.pointer: f for f in find(bad, "DS111", mode="hf")}
    assert set(got) == {"/steps_per_print", "/zero_optimization/prefetch_bucket_size"}
    assert "stage3_prefetch_bucket_size" in got["/zero_optimization/prefetch_bucket_size"].suggestion


def test_positions_point_at_the_key_in_the_text():
    text = json.dumps({"train_micro_batch_size_per_gpu": 1,
                       "zero_optimization": {"stage": 2, "comm_overlap": True}}, indent=2)
    [f] = find(text, "DS101", source="c.json")
    line = text.splitlines()[f.line - 1]
    assert line[f.column - 1:].startswith('"comm_overlap"')
    assert f.format_text().startswith(f"c.json:{f.line}:{f.column}: error[DS101]: unknown key 'comm_overlap'")
    assert "did you mean 'overlap_comm'?" in f.format_text()


def test_dstoolkit_section_is_accepted_and_strippable():
    from dstoolkit.dsconfig import strip_dstoolkit_section

    cfg = {**BASE, "dstoolkit": {"moe": {"num_experts": 8, "ep_size": 2, "top_k": 2}}}
    assert validate_config(cfg, world_size=2) == []
    out = strip_dstoolkit_section(cfg)
    assert "dstoolkit" not in out and "dstoolkit" in cfg
    assert find({**BASE, "dstoolkit": {"moe": {"num_experts": 8, "ep": 2}}}, "DS101")[0].pointer == "/dstoolkit/moe/ep"


def test_one_did_you_mean_for_every_caller():
    from dstoolkit.common.text import did_you_mean

    assert did_you_mean("comm_overlap", ["overlap_comm", "stage"]) == "overlap_comm"  # words reordered
    assert did_you_mean("ADAMW", ["AdamW", "Adam"]) == "AdamW"  # case only
    assert did_you_mean("pin_memmory", ["pin_memory", "device"], cutoff=0.72) == "pin_memory"
    assert did_you_mean("xyz", ["pin_memory"]) is None
    # the cutoff is the caller's: spec keys 0.6, GPU names (normalised) 0.5
    assert did_you_mean("micro_bach", ["micro_batch", "seq_len"], cutoff=0.6) == "micro_batch"
    from dstoolkit.hardware.table import gpu_name_error

    assert "did you mean 'H100-SXM'?" in gpu_name_error("H10-SXM")
