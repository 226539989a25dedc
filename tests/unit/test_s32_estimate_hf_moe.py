"""HF MoE models at ZeRO-3 are not refused as native DeepSpeed MoE (s32 validate/fp8 report, finding 5): DeepSpeed
0.19.8 asserts 'Native DeepSpeed MoE is not supported with ZeRO Stage 3' only for deepspeed.moe.layer.MoE modules;
transformers' experts are plain nn.Modules. `estimate --model <config.json>` and `validate --mode hf` treat them so;
a preset (built with deepspeed.moe) is still refused."""
from __future__ import annotations

import json
from types import SimpleNamespace

from dstoolkit.cli import main
from dstoolkit.cli.estimate_flags import native_moe_of
from dstoolkit.validate.engine import validate_config

HF = "tests/golden/hf_configs/qwen1.5-moe-a2.7b.json"
Z3 = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3}}


def test_hf_moe_config_is_estimated_at_zero3(tmp_path, capsys):
    cfg = tmp_path / "z3.json"
    cfg.write_text(json.dumps(Z3))
    rc = main(["estimate", "--config", str(cfg), "--model", HF, "--world-size", "8", "--seq-len", "2048"])
    out, err = capsys.readouterr()
    assert rc == 0 and "DS214" not in err
    assert "ZeRO-3" in out.splitlines()[0]
    # the preset of a model dstoolkit builds with deepspeed.moe stays refused
    rc = main(["estimate", "--config", str(cfg), "--model", "mixtral-8x7b", "--world-size", "8", "--seq-len", "2048"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "" and "error[DS214]" in err


def test_validate_mode_hf_is_not_native_moe():
    text = json.dumps(Z3)
    assert [f.code for f in validate_config(text, num_experts=8, mode="hf")] == []
    assert [f.code for f in validate_config(text, num_experts=8)] == ["DS214"]


def test_native_moe_of_each_model_form():
    moe = SimpleNamespace(is_moe=True, measured=None)
    assert native_moe_of(moe, "mixtral-8x7b") is True
    assert native_moe_of(moe, HF) is False
    plain = SimpleNamespace(pattern="layers.{i}.moe.experts.{e}.w1")
    ds = SimpleNamespace(pattern="layers.{i}.moe.deepspeed_moe.experts.deepspeed_experts.{e}.w1")
    assert native_moe_of(SimpleNamespace(is_moe=True, measured=SimpleNamespace(linears=(plain,))), "pkg.mod:fn") is False
    assert native_moe_of(SimpleNamespace(is_moe=True, measured=SimpleNamespace(linears=(ds,))), "pkg.mod:fn") is True
