"""`dstoolkit estimate --config ds.json --precision P` refuses a precision the config does not train in.

Before, --precision silently replaced the config's: fp16.enabled with --precision fp32 was estimated as fp32 (and
bf16.enabled with --precision fp16 as fp16), exit 0, nothing in the assumptions or warnings. DeepSpeed trains what
the config enables (bf16 / fp16 section, else fp32), so a --precision must repeat it; fp8 is FP8 GEMMs over bf16
(the spec form writes bf16.enabled for precision fp8, generate/ds_json.py), so it needs the bf16 section.
"""
from __future__ import annotations

import json
import re

from tests.unit.estimate_cli_runs import run_estimate as _run, estimate_error as _error

BASE = ["--model", "llama-3-8b", "--world-size", "8"]


def _cfg(tmp_path, name, **sections):
    path = tmp_path / name
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, **sections}))
    return path


def _header(capsys, cfg, *flag) -> str:
    """The precision the first line states, for a run that is estimated."""
    rc, out, err = _run(capsys, "--config", cfg, *BASE, *flag)
    assert rc in (0, 1), err
    return re.search(r"; ZeRO-\d, (\w+), micro batch", out.splitlines()[0]).group(1)


def test_fp16_config_refuses_fp32(tmp_path, capsys):
    cfg = _cfg(tmp_path, "fp16.json", fp16={"enabled": True})
    assert _error(capsys, "--config", cfg, *BASE, "--precision", "fp32") == (
        f"--precision fp32 contradicts {cfg}: fp16.enabled is true, so DeepSpeed trains fp16: drop --precision (the "
        f"config's fp16 is estimated), or disable fp16 in {cfg} for an fp32 run")
    assert _header(capsys, cfg) == _header(capsys, cfg, "--precision", "fp16") == "fp16"  # the config's, repeated


def test_bf16_config_refuses_fp16(tmp_path, capsys):
    cfg = _cfg(tmp_path, "bf16.json", bf16={"enabled": True})
    assert _error(capsys, "--config", cfg, *BASE, "--precision", "fp16") == (
        f"--precision fp16 contradicts {cfg}: bf16.enabled is true, so DeepSpeed trains bf16: drop --precision (the "
        f"config's bf16 is estimated), or enable fp16 in {cfg} instead of bf16")
    assert _header(capsys, cfg, "--precision", "bf16") == "bf16"
    # the legacy section name is named as written
    legacy = _cfg(tmp_path, "bfloat16.json", bfloat16={"enabled": True})
    assert _error(capsys, "--config", legacy, *BASE, "--precision", "fp32").startswith(
        f"--precision fp32 contradicts {legacy}: bfloat16.enabled is true, so DeepSpeed trains bf16: ")


def test_fp8_needs_the_bf16_section(tmp_path, capsys):
    cfg = _cfg(tmp_path, "fp16.json", fp16={"enabled": True})
    assert _error(capsys, "--config", cfg, *BASE, "--precision", "fp8") == (
        f"--precision fp8 contradicts {cfg}: fp16.enabled is true, so DeepSpeed trains fp16: enable bf16 in {cfg} "
        "(\"bf16\": {\"enabled\": true}) for FP8 GEMMs over bf16, or drop --precision (the config's fp16 is "
        "estimated)")
    # FP8 GEMMs over a bf16 config, as the spec form models precision fp8 (generate/ds_json.py)
    assert _header(capsys, _cfg(tmp_path, "bf16.json", bf16={"enabled": True}), "--precision", "fp8") == "fp8"


def test_an_fp32_config_refuses_a_16_bit_precision(tmp_path, capsys):
    cfg = _cfg(tmp_path, "fp32.json")
    assert _error(capsys, "--config", cfg, *BASE, "--precision", "bf16") == (
        f"--precision bf16 contradicts {cfg}: neither bf16 nor fp16 is enabled, so DeepSpeed trains fp32: drop "
        f"--precision (the config's fp32 is estimated), or enable bf16 in {cfg} (\"bf16\": {{\"enabled\": true}})")
    assert _header(capsys, cfg) == _header(capsys, cfg, "--precision", "fp32") == "fp32"
    disabled = _cfg(tmp_path, "off.json", bf16={"enabled": False}, fp16={"enabled": False})
    assert _error(capsys, "--config", disabled, *BASE, "--precision", "fp16").startswith(
        f"--precision fp16 contradicts {disabled}: neither bf16 nor fp16 is enabled, so DeepSpeed trains fp32: ")
