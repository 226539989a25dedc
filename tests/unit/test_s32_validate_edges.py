"""Smaller disagreements with DeepSpeed 0.19.8 (s32 validate report, finding 12): unknown top-level keys, integral
floats too large for an int64, --ep-size without experts, and missing paths in `validate --format json`."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from dstoolkit.cli import main
from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.validate import validate_config

BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2}}
TOO_BIG = ("a float this large (|value| >= 2**63, about 9.2e18) is no int64: DeepSpeed's pydantic sections refuse it "
           "(int_parsing_size), and no count or size needs it")


def _rows(cfg, **kw):
    return [(f.code, f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **kw)]


# -- unknown top-level keys: DeepSpeed ignores them; only a near-miss of a known key loses the user's setting --------
@pytest.mark.parametrize("key", ["msamp", "cuda_visible_devices", "my_launcher"])
def test_another_tools_top_level_key_is_a_warning(key):
    assert _rows({**BASE, key: {"enabled": True}}) == [
        ("DS101", "warning", f"/{key}", f"unknown key {key!r} in the top level; DeepSpeed ignores unknown top-level "
         "keys silently", "fine if another tool reads it (e.g. MS-AMP's 'msamp'); otherwise check its name: "
         "DeepSpeed never applies it")]


def test_a_near_miss_of_a_known_key_stays_an_error():
    assert _rows({**BASE, "gradient_clip": 1.0}) == [
        ("DS101", "error", "/gradient_clip", "unknown key 'gradient_clip' in the top level; DeepSpeed ignores unknown "
         "top-level keys silently, so the 'gradient_clipping' setting it was meant to be is not applied",
         "did you mean 'gradient_clipping'?")]
    # renamed sections and keys of other sections keep their own errors
    assert [r[:3] for r in _rows({**BASE, "lr_scheduler": {}})] == [("DS101", "error", "/lr_scheduler")]
    assert [r[:3] for r in _rows({**BASE, "overlap_comm": True})] == [("DS104", "error", "/overlap_comm")]


def test_ms_amp_corpus_config_passes_with_the_warning(corpus_dir, capsys):
    path = corpus_dir / "Azure__MS-AMP__examples__ds_config_zero_te_msamp.json"
    assert main(["validate", str(path), "--no-warnings"]) == 0
    assert capsys.readouterr().out == ""


# -- integral floats of 2**63 or more: pydantic's int_parsing_size ---------------------------------------------------
def test_huge_integral_floats_are_errors_naming_the_field():
    cfg = {**BASE, "zero_optimization": {"stage": 3, "reduce_bucket_size": 1e20}}
    assert _rows(cfg) == [
        ("DS102", "error", "/zero_optimization/reduce_bucket_size",
         f"zero_optimization.reduce_bucket_size = 1e+20: expected an integer or 'auto', got number 1e+20: {TOO_BIG}",
         "write a value below 9.2e18 (what DeepSpeed's int64 fields hold)")]
    assert [r[:3] for r in _rows({**BASE, "vocabulary_size": -2.0**63})] == [("DS102", "error", "/vocabulary_size")]
    with pytest.raises(ValidationError, match="int_parsing_size"):
        DeepSpeedConfig.model_validate(cfg)


def test_integral_floats_below_two_to_the_63_and_big_ints_still_pass():
    cfg = {**BASE, "zero_optimization": {"stage": 3, "reduce_bucket_size": 9.2e18}}
    assert _rows(cfg) == []
    assert DeepSpeedConfig.model_validate(cfg).zero_optimization.reduce_bucket_size == 9200000000000000000
    assert _rows({**BASE, "zero_optimization": {"stage": 3, "reduce_bucket_size": 10**20}}) == []


# -- --ep-size without experts ---------------------------------------------------------------------------------------
def test_ep_size_without_num_experts_is_an_input_error_naming_both_flags():
    assert _rows(BASE, ep_size=3, world_size=8) == []  # API callers (the bench) pass an ep_size of their own
    assert _rows(BASE, ep_size=3, world_size=8, ep_needs_experts=True) == [
        ("DS009", "error", "", "--ep-size 3 (ep_size) without --num-experts (num_experts), and the config has no "
         "dstoolkit.moe.num_experts: there are no experts to shard, so the expert-parallel checks cannot run",
         "give --num-experts N (or a dstoolkit.moe section), or drop --ep-size")]
    assert _rows(BASE, ep_size=1, world_size=8, ep_needs_experts=True) == []
    assert _rows(BASE, ep_size=2, num_experts=8, world_size=8, ep_needs_experts=True) == []
    assert _rows({**BASE, "dstoolkit": {"moe": {"num_experts": 8}}}, ep_size=2, world_size=8,
                 ep_needs_experts=True) == []


def test_cli_ep_size_without_num_experts_exits_2(tmp_path, capsys):
    path = tmp_path / "z2.json"
    path.write_text(json.dumps(BASE))
    assert main(["validate", str(path), "--ep-size", "3", "--world-size", "8"]) == 2
    assert "error[DS009]: --ep-size 3 (ep_size) without --num-experts" in capsys.readouterr().out


# -- validate --format json records paths that do not exist ------------------------------------------------------------
def test_missing_paths_are_in_the_json_output(tmp_path, capsys):
    good = tmp_path / "base.json"
    good.write_text(json.dumps(BASE))
    missing = tmp_path / "nope.json"
    (tmp_path / "empty").mkdir()
    rc = main(["validate", str(good), str(missing), str(tmp_path / "empty"), "--format", "json"])
    captured = capsys.readouterr()
    assert rc == 2
    assert json.loads(captured.out) == [
        {"file": str(missing), "pointer": "", "line": None, "column": None, "severity": "error", "code": "DS008",
         "message": "no such file or directory", "suggestion": None},
        {"file": str(tmp_path / "empty"), "pointer": "", "line": None, "column": None, "severity": "error",
         "code": "DS008", "message": "directory contains no *.json config files", "suggestion": None}]
    assert f"dstoolkit validate: error: {missing}: no such file or directory" in captured.err
    # text output: unchanged (stderr line, no finding line)
    assert main(["validate", str(good), str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"dstoolkit validate: error: {missing}: no such file or directory" in captured.err
