"""`fp8 plan --config` with a DeepSpeed JSON (s32 validate/fp8 report, finding 11): one without a dstoolkit.fp8
section is named as such, one that trains fp16 is refused by the rule `estimate --precision fp8` refuses it by
(`dstoolkit.fp8.ds_precision`), with the same reason."""
from __future__ import annotations

import json

from dstoolkit.cli import main


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_deepspeed_json_without_fp8_section(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    rc, out, err = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"dstoolkit fp8 plan: error: {cfg} is a DeepSpeed config without a dstoolkit.fp8 section: add one "
        '("dstoolkit": {"fp8": {"recipe": "delayed"}}, fields of Fp8Config), or drop --config and pass --recipe / '
        "--fp8-format / --skip-first / --skip-last"]


def test_fp16_deepspeed_json_refused_as_estimate_refuses_it(tmp_path, capsys):
    cfg = tmp_path / "ds16.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "fp16": {"enabled": True}, "zero_optimization": {"stage": 2},
                               "dstoolkit": {"fp8": {"recipe": "delayed"}}}))
    reason = (f'fp16.enabled is true, so DeepSpeed trains fp16: enable bf16 in {cfg} ("bf16": {{"enabled": true}}) '
              "for FP8 GEMMs over bf16")
    rc, out, err = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 2 and out == ""
    assert err.splitlines() == [f"dstoolkit fp8 plan: error: dstoolkit.fp8 in {cfg} asks for FP8 GEMMs, but {reason}, "
                                "or remove the dstoolkit.fp8 section"]
    rc, out, err = _run(["estimate", "--config", str(cfg), "--model", "llama-3-8b", "--world-size", "8",
                         "--precision", "fp8"], capsys)
    assert rc == 2
    assert err.splitlines() == [f"dstoolkit estimate: error: --precision fp8 contradicts {cfg}: {reason}, or drop "
                                "--precision (the config's fp16 is estimated)"]


def test_fp8_section_off_is_not_refused_and_bf16_plans(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"bf16": {"enabled": true}, // hjson comment, as DeepSpeed reads it\n'
                   ' "dstoolkit": {"fp8": {"layers": {"skip_first_layers": 31}}},}')
    rc, out, _ = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 0 and out.splitlines()[1].startswith("7 linear layers swapped")
    cfg.write_text(json.dumps({"fp16": {"enabled": True}, "dstoolkit": {"fp8": {"enabled": False}}}))
    rc, out, _ = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 0 and out.splitlines()[1].startswith("0 linear layers swapped")
