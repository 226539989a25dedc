"""`dstoolkit fp8 plan` names its own arguments (s36 findings 3, 5, 6): --model-kwargs with a preset names SPEC|MODEL
(fp8 plan has no --model), a DeepSpeed config given as SPEC|MODEL is said to be one, and out-of-range --skip-first /
--skip-last / --cuda are refused by argparse naming the flag and the value."""
from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from dstoolkit.cli import main

CORPUS_DS = pathlib.Path(__file__).parents[1] / "corpus" / "microsoft__DeepSpeedExamples__autotuning__ds_config.json"


def _err(capsys, argv: list[str]) -> str:
    """fp8 plan's exit status must be 2; its last stderr line."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's refusal
        rc = exc.code
    assert rc == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value, shown", [("--skip-first", "-1", "-1"), ("--skip-last", "-2", "-2"),
                                                ("--skip-first", "x", "'x'")])
def test_negative_layer_skips_are_refused_naming_the_flag(capsys, flag, value, shown):
    assert _err(capsys, ["fp8", "plan", "llama-3-8b", flag, value]) == (
        f"dstoolkit fp8 plan: error: argument {flag}: expected a non-negative integer, got {shown}")


@pytest.mark.parametrize("value", ["-1", "abc", "0.5"])
def test_a_cuda_version_that_is_not_one_is_refused_naming_the_flag(capsys, value):
    assert _err(capsys, ["fp8", "plan", "llama-3-8b", "--cuda", value]) == (
        f"dstoolkit fp8 plan: error: argument --cuda: expected a CUDA version MAJOR.MINOR such as 12.8, got {value!r}")


def test_zero_skips_and_a_real_cuda_version_still_plan(capsys):
    assert main(["fp8", "plan", "llama-3-8b", "--skip-first", "0", "--skip-last", "0", "--cuda", "12.8"]) == 0
    assert "llama" in capsys.readouterr().out.lower()


def test_model_kwargs_with_a_preset_names_the_positional_argument(capsys):
    assert _err(capsys, ["fp8", "plan", "llama-3-8b", "--model-kwargs", '{"d": 1}']) == (
        "dstoolkit fp8 plan: error: --model-kwargs is only used with MODEL as package.module:callable (got SPEC|MODEL "
        "'llama-3-8b'); drop --model-kwargs")


def test_a_deepspeed_config_as_the_model_is_named_as_one(tmp_path, capsys):
    ds = tmp_path / "ds.json"
    shutil.copy(CORPUS_DS, ds)
    assert _err(capsys, ["fp8", "plan", str(ds)]) == (
        f"dstoolkit fp8 plan: error: {ds} is a DeepSpeed config (top-level train_micro_batch_size_per_gpu, "
        "gradient_accumulation_steps, gradient_clipping, ...), not a model: fp8 plan takes SPEC|MODEL, a spec .yaml, a "
        "preset name, a Hugging Face config.json or package.module:callable; pass the model it trains, e.g. "
        "`dstoolkit fp8 plan llama-3-8b`")


def test_a_deepspeed_config_with_fp8_settings_points_to_config(tmp_path, capsys):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 8, "bf16": {"enabled": True},
                              "dstoolkit": {"fp8": {"recipe": "delayed"}}}))
    assert _err(capsys, ["fp8", "plan", str(ds)]) == (
        f"dstoolkit fp8 plan: error: {ds} is a DeepSpeed config (top-level train_batch_size, bf16), not a model: "
        "fp8 plan takes SPEC|MODEL, a spec .yaml, a preset name, a Hugging Face config.json or "
        "package.module:callable; its dstoolkit.fp8 settings go in with --config, e.g. "
        f"`dstoolkit fp8 plan llama-3-8b --config {ds}`")
    assert main(["fp8", "plan", "llama-3-8b", "--config", str(ds)]) == 0  # which works
    capsys.readouterr()


def test_an_hf_config_without_model_type_keeps_its_own_error(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    err = _err(capsys, ["fp8", "plan", str(cfg)])
    assert "model_type: required field is missing" in err and "DeepSpeed config" not in err


def test_plan_help_names_the_model_as_the_verb_takes_it(capsys):
    # fp8 plan has no --model flag (the model is its positional SPEC|MODEL); its help said "--model config.json"
    with pytest.raises(SystemExit) as exc:
        main(["fp8", "plan", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--model " not in out and "--model config.json" not in out
    assert "build SPEC|MODEL as a config.json with this transformers class" in out
    assert "with SPEC|MODEL as a package.module:callable: its keyword arguments" in out
