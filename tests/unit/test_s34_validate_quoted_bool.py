"""s34 validate finding 6: a quoted boolean in a section DeepSpeed 0.19.8 reads through its lax pydantic models
(fp16.enabled, offload_optimizer.pin_memory...) is read as the boolean (measured: "false" trains fp32, "true"
builds FP16_Optimizer): a warning. Raw-read keys (wall_clock_breakdown: TypeError) and, in hf mode, the precision
flags HF reads itself stay errors."""
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def _ds102(cfg: dict, mode: str = "strict") -> list:
    return [(f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, mode=mode)
            if f.code == "DS102"]


def test_quoted_booleans_in_pydantic_sections_warn():
    assert _ds102({**BASE, "fp16": {"enabled": "false"}}) == [(
        "warning", "/fp16/enabled", "fp16.enabled = 'false': a quoted boolean; DeepSpeed's pydantic config reads it "
        "as false (lax bool)", "write the boolean without quotes: false")]
    cfg = {**BASE, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": "False"}}}
    for mode in ("strict", "hf"):
        assert _ds102(cfg, mode) == [(
            "warning", "/zero_optimization/offload_optimizer/pin_memory", "zero_optimization.offload_optimizer."
            "pin_memory = 'False': a quoted boolean; DeepSpeed's pydantic config reads it as false (lax bool)",
            "write the boolean without quotes: false")]


def test_quoted_true_counts_as_enabled_for_the_rules():
    errors = [f.code for f in validate_config({**BASE, "fp16": {"enabled": "true"}, "bf16": {"enabled": "1"}})
              if f.severity == "error"]
    assert errors == ["DS203"]  # DeepSpeed asserts 'bfloat16 and fp16 modes cannot be simultaneously enabled'


def test_hf_flags_and_raw_keys_stay_errors():
    [(severity, _, message, _)] = _ds102({**BASE, "fp16": {"enabled": "false"}}, mode="hf")
    assert severity == "error" and message.endswith("but HF reads this flag itself (a mismatch for "
                                                    "HfTrainerDeepSpeedConfig.fill_match, true for is_true)")
    [(severity, pointer, _, _)] = _ds102({**BASE, "wall_clock_breakdown": "false"})
    assert (severity, pointer) == ("error", "/wall_clock_breakdown")
    [(severity, _, _, _)] = _ds102({**BASE, "fp16": {"enabled": "maybe"}})
    assert severity == "error"
