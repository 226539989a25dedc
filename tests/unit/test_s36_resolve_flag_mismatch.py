"""`dstoolkit resolve`: a flag that contradicts a value the config fixes (not "auto") is refused, as HF Trainer
refuses it (transformers integrations/deepspeed.py HfTrainerDeepSpeedConfig.fill_match / trainer_config_finalize:
"Please correct the following DeepSpeed config values that mismatch TrainingArguments values").

Before: `resolve fixed_many.json --world-size 8 --micro-batch 2 --grad-accum 8 --lr 3e-4 --max-grad-norm 1.0
--precision fp16 -o o6.json` printed 'wrote o6.json: 4 filled, 0 not filled', exit 0, and o6.json kept micro 4,
grad_accum 2, lr 1e-4, clipping 0.5 and bf16: all five flags dropped without a word.
"""
from __future__ import annotations

import json
import types

import pytest

from dstoolkit.cli import main

FIXED_MANY = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "gradient_clipping": 0.5, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": "auto", "eps": "auto",
                                                        "weight_decay": "auto"}}}
FLAGS = ["--world-size", "8", "--micro-batch", "2", "--grad-accum", "8", "--lr", "3e-4", "--max-grad-norm", "1.0",
         "--precision", "fp16"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fixed_many.json").write_text(json.dumps(FIXED_MANY))
    return tmp_path


def test_contradicting_flags_are_refused_one_line_each_and_nothing_is_written(here, capsys):
    assert main(["resolve", "fixed_many.json", *FLAGS, "-o", "o6.json"]) == 2
    captured = capsys.readouterr()
    assert not (here / "o6.json").exists() and captured.out == ""
    assert captured.err.splitlines() == [
        'fixed_many.json: train_micro_batch_size_per_gpu is 4 but --micro-batch is 2: '
        'set train_micro_batch_size_per_gpu to "auto" or drop --micro-batch',
        'fixed_many.json: gradient_accumulation_steps is 2 but --grad-accum is 8: '
        'set gradient_accumulation_steps to "auto" or drop --grad-accum',
        'fixed_many.json: gradient_clipping is 0.5 but --max-grad-norm is 1.0: '
        'set gradient_clipping to "auto" or drop --max-grad-norm',
        'fixed_many.json: optimizer.params.lr is 0.0001 but --lr is 0.0003: '
        'set optimizer.params.lr to "auto" or drop --lr',
        'fixed_many.json: bf16.enabled is true but --precision fp16 makes it false: '
        'set bf16.enabled to "auto" or drop --precision',
        "o6.json not written: HF Trainer refuses a DeepSpeed config value that mismatches its TrainingArguments "
        "(transformers integrations/deepspeed.py trainer_config_finalize); fix the 5 value(s) above and rerun"]


def test_an_existing_out_is_kept(here, capsys):
    (here / "o6.json").write_text("keep me")
    assert main(["resolve", "fixed_many.json", *FLAGS, "-o", "o6.json", "--force"]) == 2
    assert (here / "o6.json").read_text() == "keep me"


def test_flags_equal_to_the_fixed_values_still_write(here, capsys):
    # 1e-4 == 0.0001 and --max-grad-norm 0.5 == 0.5: fill_match compares with ==
    assert main(["resolve", "fixed_many.json", "--world-size", "8", "--micro-batch", "4", "--grad-accum", "2",
                 "--lr", "0.0001", "--max-grad-norm", "0.5", "--precision", "bf16", "-o", "eq.json"]) == 0
    out = json.loads((here / "eq.json").read_text())
    assert out == {**FIXED_MANY, "train_batch_size": 64,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                             "weight_decay": 0.0}}}
    assert "wrote eq.json: 4 filled, 0 not filled" in capsys.readouterr().err


def test_all_auto_config_is_unchanged(here, capsys):
    auto = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                      "weight_decay": "auto"}}}
    (here / "auto.json").write_text(json.dumps(auto))
    assert main(["resolve", "auto.json", *FLAGS, "-o", "o.json"]) == 0
    assert json.loads((here / "o.json").read_text()) == {
        "train_batch_size": 128, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
        "gradient_clipping": 1.0, "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                                  "weight_decay": 0.0}}}
    assert "wrote o.json: 9 filled, 0 not filled" in capsys.readouterr().err


def test_scheduler_precision_and_batch_size_lines():
    from dstoolkit.dsconfig.auto import flag_mismatches
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2,
           "fp16": {"enabled": False}, "bf16": {"enabled": "auto"},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 1e-3,
                                                        "warmup_min_lr": 7}},
           "zero_optimization": {"reduce_bucket_size": 5}}
    lines = [m.line("t.json") for m in flag_mismatches(cfg, dp=6, micro_batch=2, warmup_steps=0, lr=2e-3,
                                                        precision="fp16", total_steps=10)]
    assert lines == [
        't.json: train_batch_size is 64 but --micro-batch 2 x grad_accum 2 (config) x data-parallel 6 is 24: '
        'set train_batch_size to "auto" (64 is not a multiple of data-parallel 6)',
        't.json: scheduler.params.warmup_max_lr is 0.001 but --lr is 0.002: '
        'set scheduler.params.warmup_max_lr to "auto" or drop --lr',
        't.json: fp16.enabled is false but --precision fp16 makes it true: set fp16.enabled to "auto" or drop --precision',
        't.json: scheduler.params.warmup_num_steps is 5 but --warmup-steps is 0 (filled as 1): '
        'set scheduler.params.warmup_num_steps to "auto" or drop --warmup-steps']
    # fill_only keys (warmup_min_lr, the zero bucket sizes) and flags not given are not compared
    assert flag_mismatches(cfg, dp=8) == []
    assert flag_mismatches(cfg, dp=8, warmup_steps=5, micro_batch=4, lr=1e-3, precision="bf16") == []


@pytest.mark.parametrize("cfg,keys", [
    (FIXED_MANY, ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
                  "optimizer.params.lr", "bf16.enabled"]),
    (
    {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
     "fp16": {"enabled": False}, "bf16": {"enabled": False},
     "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.1}},
     "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 1, "warmup_max_lr": 3e-4,
                                                       "warmup_num_steps": 1, "total_num_steps": 50}}},
     ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "optimizer.params.betas",
      "optimizer.params.eps", "optimizer.params.weight_decay", "fp16.enabled", "scheduler.params.total_num_steps"]),
    ({"train_batch_size": 128, "gradient_clipping": 1.0, "fp16": {"enabled": True}, "bf16": {},
      "optimizer": {"params": {"betas": [0.9, 0.999]}}}, []),
])
def test_the_same_keys_as_transformers(cfg, keys):
    """Every flag given, so TrainingArguments holds exactly the flags: the keys HF refuses are the keys resolve does."""
    from dstoolkit.dsconfig.auto import flag_mismatches
    deepspeed_mod = pytest.importorskip("transformers.integrations.deepspeed")
    flags = dict(micro_batch=2, grad_accum=8, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 max_grad_norm=1.0, warmup_steps=0, total_steps=100, precision="fp16")
    args = types.SimpleNamespace(
        world_size=8, per_device_train_batch_size=2, gradient_accumulation_steps=8, max_grad_norm=1.0,
        learning_rate=3e-4, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
        save_on_each_node=False, fp16=True, fp16_full_eval=False, bf16=False, bf16_full_eval=False,
        get_warmup_steps=lambda n: 0)
    hf = deepspeed_mod.HfTrainerDeepSpeedConfig(json.loads(json.dumps(cfg)))
    hf.trainer_config_process(args)
    try:
        hf.trainer_config_finalize(args, None, 100)  # adds total_num_steps / warmup_num_steps, raises on any
    except ValueError as exc:
        assert "mismatch TrainingArguments" in str(exc)
    hf_keys = [line.split()[2].split("=")[0] for line in hf.mismatches]  # "- ds KEY=VALUE vs hf ..."
    assert [m.key for m in flag_mismatches(cfg, dp=8, **flags)] == hf_keys == keys
