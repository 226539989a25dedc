"""`dstoolkit resolve`: fills "auto" the way HF Trainer does and says what it could not fill."""
from __future__ import annotations

import json

from dstoolkit.cli import main
from dstoolkit.validate import validate_config
from dstoolkit.dsconfig.auto import resolve_auto

HF = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto"}}


def test_hf_formulas_for_zero_buckets():
    r = resolve_auto(HF, world_size=8, hidden_size=4096, micro_batch=4, grad_accum=2, lr=3e-4, total_steps=1000,
                     precision="bf16")
    z = r.config["zero_optimization"]
    # transformers integrations/deepspeed.py: h*h, 0.9*h*h, 10*h
    assert z["reduce_bucket_size"] == 4096 * 4096 == 16_777_216
    assert z["stage3_prefetch_bucket_size"] == int(0.9 * 4096 * 4096) == 15_099_494
    assert z["stage3_param_persistence_threshold"] == 40_960
    assert r.config["train_batch_size"] == 4 * 2 * 8
    assert r.config["optimizer"]["params"]["lr"] == 3e-4 == r.config["scheduler"]["params"]["warmup_max_lr"]
    assert r.config["bf16"]["enabled"] is True and r.unfilled == []
    assert validate_config(r.config, world_size=8) == []
    assert HF["train_batch_size"] == "auto"  # input untouched


def test_batch_triad_uses_data_parallel_size():
    r = resolve_auto(HF, world_size=16, tp=2, pp=2, hidden_size=1024, micro_batch=2, total_steps=10)
    assert r.config["train_batch_size"] == 2 * 1 * 4


def test_reports_what_it_cannot_fill():
    cfg = {**HF, "steps_per_print": "auto"}
    r = resolve_auto(cfg, world_size=2)
    unfilled = dict(r.unfilled)
    assert "--hidden-size" in unfilled["/zero_optimization/reduce_bucket_size"]
    assert "--total-steps" in unfilled["/scheduler/params/total_num_steps"]
    assert "does not fill" in unfilled["/steps_per_print"]


def test_cli_writes_refuses_overwrite_and_exits(tmp_path, capsys):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(HF))
    out = tmp_path / "out.json"
    argv = ["resolve", str(src), "--world-size", "4", "--hidden-size", "2048", "--micro-batch", "2",
            "--total-steps", "100", "--precision", "bf16", "-o", str(out)]
    assert main(argv) == 0
    resolved = json.loads(out.read_text())
    assert resolved["train_batch_size"] == 8 and resolved["zero_optimization"]["reduce_bucket_size"] == 2048 ** 2
    printed = capsys.readouterr().out
    assert "filled   /zero_optimization/reduce_bucket_size = 4194304  (hidden_size^2 = 2048^2)" in printed
    out.write_text("keep me")
    assert main(argv) == 2
    assert out.read_text() == "keep me" and "--force" in capsys.readouterr().err
    assert main(argv + ["--force"]) == 0


def test_cli_partial_exit_1(tmp_path, capsys):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(HF))
    assert main(["resolve", str(src), "--world-size", "4", "-o", str(tmp_path / "o.json")]) == 1
    assert "UNFILLED /zero_optimization/reduce_bucket_size: needs --hidden-size" in capsys.readouterr().out


def test_cli_writes_nothing_when_the_result_has_errors(tmp_path, capsys):
    # train_batch_size 10 cannot be 4 x 1 x dp 2: DeepSpeed would refuse the resolved config, so OUT is not written
    src = tmp_path / "in.json"
    src.write_text(json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}))
    out = tmp_path / "out.json"
    assert main(["resolve", str(src), "--world-size", "2", "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert not out.exists()
    assert f"{src}: error[DS201]" in captured.out and '(set "train_batch_size": 8)' in captured.out
    assert f"{out} not written: the resolved config has 1 error(s)" in captured.err
    # with --force an existing OUT is kept as it was, not replaced by a config DeepSpeed refuses
    out.write_text("keep me")
    assert main(["resolve", str(src), "--world-size", "2", "-o", str(out), "--force", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert out.read_text() == "keep me" and doc["output"] is None and doc["findings"][0]["code"] == "DS201"
    # a value filled from HF's default that breaks the triad is reported the same way (micro 8 x 1 x dp 2 != 8)
    src.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": "auto",
                               "gradient_accumulation_steps": 1}))
    assert main(["resolve", str(src), "--world-size", "2", "-o", str(tmp_path / "o2.json")]) == 1
    assert not (tmp_path / "o2.json").exists() and "error[DS201]" in capsys.readouterr().out
    # a flag that contradicts the fixed train_batch_size is refused as HF Trainer refuses it (exit 2; s36 resolve)
    assert main(["resolve", str(src), "--world-size", "2", "--micro-batch", "3", "-o", str(tmp_path / "o2.json")]) == 2
    assert not (tmp_path / "o2.json").exists()
    assert (f"{src}: train_batch_size is 8 but --micro-batch 3 x grad_accum 1 (config) x data-parallel 2 is 6: "
            'set train_batch_size to "auto" or give --micro-batch x --grad-accum = 4') in capsys.readouterr().err
