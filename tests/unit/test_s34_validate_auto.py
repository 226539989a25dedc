"""s34 validate finding 3: OpenRLHF's get_train_ds_config puts "auto" on six ZeRO size keys and hands the dict to
deepspeed.initialize. DeepSpeed 0.19.8 drops "auto" (runtime/config_utils.py DeepSpeedConfigModel.__init__) and
uses the defaults, and trains (measured), so strict mode warns with the default; under HF, Accelerate raises
ValueError for an "auto" it cannot fill (DeepSpeedPlugin.fill_match; measured with accelerate 1.15), so hf mode
keeps the error for the keys HF does not fill and says so."""
from dstoolkit.validate import validate_config

OPENRLHF_Z3 = {
    "steps_per_print": 100, "train_micro_batch_size_per_gpu": 4, "train_batch_size": 128, "gradient_clipping": 1.0,
    "prescale_gradients": False, "wall_clock_breakdown": False, "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "none"},
                          "offload_optimizer": {"device": "cpu", "pin_memory": True}, "sub_group_size": "auto",
                          "stage3_max_live_parameters": "auto", "stage3_max_reuse_distance": "auto",
                          "stage3_param_persistence_threshold": "auto", "stage3_prefetch_bucket_size": "auto",
                          "reduce_bucket_size": "auto", "zero_hpz_partition_size": 1,
                          "zero_quantized_weights": False, "zero_quantized_gradients": False},
}


def _auto(cfg: dict, mode: str) -> list:
    return [(f.severity, f.code, f.pointer, f.message, f.suggestion)
            for f in validate_config(cfg, world_size=8, mode=mode) if f.code in ("DS110", "DS111")]


def test_strict_warns_with_deepspeeds_default():
    got = _auto(OPENRLHF_Z3, "strict")
    assert [(s, c) for s, c, *_ in got] == [("warning", "DS110")] * 6
    assert [f for f in validate_config(OPENRLHF_Z3, world_size=8) if f.severity == "error"] == []
    by = {p: (m, s) for _, _, p, m, s in got}
    assert by["/zero_optimization/sub_group_size"] == (
        '"auto" at /zero_optimization/sub_group_size: DeepSpeed drops it and uses its default 1000000000 '
        "(runtime/config_utils.py DeepSpeedConfigModel)",
        'write "sub_group_size": 1000000000 to say what runs, or validate with --mode hf if HF launches this config')
    assert by["/zero_optimization/reduce_bucket_size"][0] == (
        '"auto" at /zero_optimization/reduce_bucket_size: DeepSpeed drops it and uses its default 500000000 '
        "(runtime/config_utils.py DeepSpeedConfigModel); only HF fills it (HF hidden_size^2)")


def test_hf_mode_errors_say_accelerate_raises():
    got = {p: (s, c, m, fix) for s, c, p, m, fix in _auto(OPENRLHF_Z3, "hf")}
    assert sorted(got) == ["/zero_optimization/stage3_max_live_parameters",
                           "/zero_optimization/stage3_max_reuse_distance", "/zero_optimization/sub_group_size"]
    assert {v[:2] for v in got.values()} == {("error", "DS111")}
    assert got["/zero_optimization/sub_group_size"][2:] == (
        '"auto" at /zero_optimization/sub_group_size: HF Trainer/Accelerate do not fill this key, so Accelerate '
        "raises ValueError ('`zero_optimization.sub_group_size` not found in kwargs') when HF Trainer prepares the "
        "model", "write the value (DeepSpeed's default is 1000000000)")


def test_auto_that_changes_what_runs_stays_an_error_in_strict_mode():
    for zero in ({"stage": "auto"}, {"stage": 2, "overlap_comm": "auto"}):
        [(severity, code, *_)] = _auto({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}, "strict")
        assert (severity, code) == ("error", "DS110"), zero
    [(severity, code, *_)] = _auto({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": "auto"}}, "strict")
    assert (severity, code) == ("error", "DS110")
