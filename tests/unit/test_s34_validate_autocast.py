"""s34 validate finding 2: fp16.auto_cast true while fp16 is off. DeepSpeed 0.19.8 reads auto_cast whatever
fp16.enabled says (engine.py _forward_prologue -> _cast_inputs_half): positional float inputs become fp16 under a
bf16 / fp32 model (measured: 'mat1 and mat2 must have the same dtype, but got Half and BFloat16')."""
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}
TAIL = (": DeepSpeed acts on auto_cast whatever fp16.enabled says, so every floating-point positional input to "
        "engine(...) becomes fp16 while the model runs in bf16 / fp32 ('mat1 and mat2 must have the same dtype', or "
        "values beyond +-65504 become inf); keyword inputs are not cast")


def _ds246(cfg: dict, mode: str = "strict", version: str = "0.19") -> list:
    return [(f.severity, f.pointer, f.message) for f in validate_config(cfg, mode=mode, deepspeed_version=version)
            if f.code == "DS246"]


def test_auto_cast_with_fp16_off_and_bf16_on_warns():
    cfg = {**BASE, "fp16": {"enabled": False, "auto_cast": True}, "bf16": {"enabled": True}}
    assert _ds246(cfg) == [("warning", "/fp16/auto_cast", "fp16.auto_cast=true with fp16.enabled false" + TAIL)]
    assert _ds246({**BASE, "fp16": {"auto_cast": True}}) == [
        ("warning", "/fp16/auto_cast", "fp16.auto_cast=true with fp16.enabled false" + TAIL)]


def test_internvl_auto_enabled_warns_in_both_modes():
    cfg = {**BASE, "fp16": {"enabled": "auto", "auto_cast": True}, "bf16": {"enabled": "auto"}}
    assert _ds246(cfg, mode="hf") == [("warning", "/fp16/auto_cast", 'fp16.auto_cast=true with fp16.enabled "auto", '
                                       "which is false unless HF runs with --fp16" + TAIL)]
    assert _ds246(cfg) == [("warning", "/fp16/auto_cast",
                            'fp16.auto_cast=true with fp16.enabled "auto" (dropped: false)' + TAIL)]


def test_auto_cast_with_fp16_on_is_clean():
    assert _ds246({**BASE, "fp16": {"enabled": True, "auto_cast": True}}) == []
    assert _ds246({**BASE, "fp16": {"enabled": "true", "auto_cast": True}}) == []  # pydantic reads "true" as True
    assert _ds246({**BASE, "fp16": {"enabled": False, "auto_cast": False}}) == []
    assert _ds246({**BASE, "fp16": {"enabled": False, "auto_cast": True}}, version="0.16") == []  # not read for 0.16
