"""The precision a DeepSpeed JSON trains in, and why FP8 needs its bf16 section: the one rule `estimate --precision
fp8` (cli.estimate_config.run_precision) and `fp8 plan --config` (a DeepSpeed JSON with dstoolkit.fp8) refuse a
config by, with one wording. No torch import.

FP8 here is FP8 GEMMs over bf16 weights and activations: the spec form writes bf16.enabled for precision fp8
(generate.ds_json), Transformer Engine's FP8 autocast wraps a bf16 model, and DeepSpeed's fp16 engine (loss scaling of
fp16 weights) is not what the FP8 plan's memory and speed figures assume.
"""
from __future__ import annotations

from typing import Any, Optional


def trained_precision(bf16_enabled: bool, bf16_key: str, fp16_enabled: bool) -> tuple[str, str]:
    """(the precision DeepSpeed trains, the config fact that says so): an enabled bf16 (or its alias bfloat16)
    section, else an enabled fp16 section, else fp32."""
    if bf16_enabled:
        return "bf16", f"{bf16_key}.enabled is true"
    if fp16_enabled:
        return "fp16", "fp16.enabled is true"
    return "fp32", "neither bf16 nor fp16 is enabled"


def trained_precision_of_dict(ds: dict) -> tuple[str, str]:
    """`trained_precision` of a raw DeepSpeed JSON (sections that are not objects count as not enabled)."""
    def enabled(key: str) -> bool:
        section: Any = ds.get(key)
        return isinstance(section, dict) and section.get("enabled") is True

    key = "bf16" if isinstance(ds.get("bf16"), dict) else "bfloat16"
    return trained_precision(enabled(key), key, enabled("fp16"))


def fp8_precision_problem(runs: str, section: str, config: str) -> Optional[str]:
    """Why a config that trains `runs` (the fact `section`) cannot run FP8 GEMMs, with the fix; None for bf16."""
    if runs == "bf16":
        return None
    return (f'{section}, so DeepSpeed trains {runs}: enable bf16 in {config} ("bf16": {{"enabled": true}}) for FP8 '
            "GEMMs over bf16")
