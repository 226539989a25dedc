"""`dstoolkit resolve`: a flag value that is not a finite number, or a negative --warmup-steps, is an input error
naming the flag (exit 2, OUT not written).

Before: `--warmup-steps -3` was filled as 1 ("--warmup-steps -3, raised to 1 as transformers does"), exit 0;
`--lr nan` was filled and then blamed on the input file ("in.json: error[DS002]: /optimizer/params/lr = nan ... fix
in.json"), exit 1; `--max-grad-norm inf`, `--eps nan`, `--betas 0.9 nan` were accepted without a word.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main

AUTO = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                  "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "warmup_max_lr": "auto"}}}
NOT_FINITE = ("not a finite number; JSON cannot hold it and DeepSpeed would not train with it: give {flag} a finite "
              "number")


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.json").write_text(json.dumps(AUTO))
    return tmp_path


def _resolve(*flags):
    return main(["resolve", "in.json", "-o", "out.json", "--world-size", "2", *flags])


@pytest.mark.parametrize("flags,shown,flag", [
    (["--lr", "nan"], "--lr nan", "--lr"),
    (["--lr", "inf"], "--lr inf", "--lr"),
    (["--eps", "nan"], "--eps nan", "--eps"),
    (["--weight-decay=-inf"], "--weight-decay -inf", "--weight-decay"),
    (["--max-grad-norm", "inf"], "--max-grad-norm inf", "--max-grad-norm"),
    (["--betas", "0.9", "nan"], "--betas B2 nan", "--betas B2"),
    (["--betas", "inf", "0.999"], "--betas B1 inf", "--betas B1"),
])
def test_non_finite_flag_values_are_refused_naming_the_flag(cfg, capsys, flags, shown, flag):
    assert _resolve(*flags) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"dstoolkit resolve: error: {shown}: {NOT_FINITE.format(flag=flag)}\n"
    assert not (cfg / "out.json").exists()


def test_negative_warmup_steps_are_refused(cfg, capsys):
    assert _resolve("--warmup-steps", "-3") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("dstoolkit resolve: error: --warmup-steps -3: must be >= 0 (optimizer steps of "
                            "learning-rate warm-up; 0 is raised to 1 as transformers does)\n")
    assert not (cfg / "out.json").exists()


def test_zero_warmup_steps_are_still_raised_to_one(cfg, capsys):
    """Guard (passes before the change too): 0 is what transformers raises to 1."""
    assert _resolve("--warmup-steps", "0") == 0
    assert json.loads((cfg / "out.json").read_text())["scheduler"]["params"]["warmup_num_steps"] == 1
    assert "--warmup-steps 0, raised to 1 as transformers does" in capsys.readouterr().out


def test_finite_values_still_fill(cfg):
    """Guard: finite values are written as given."""
    assert _resolve("--lr", "3e-4", "--betas", "0.9", "0.95", "--eps", "1e-8", "--weight-decay", "0.1",
                    "--max-grad-norm", "1.0", "--warmup-steps", "10") == 0
    out = json.loads((cfg / "out.json").read_text())
    assert out["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
    assert out["gradient_clipping"] == 1.0 and out["scheduler"]["params"]["warmup_num_steps"] == 10


@pytest.mark.parametrize("value", ["nan,1", "0.25,inf"])
def test_tune_bucket_scales_must_be_finite(repo_root, tmp_path, capsys, value):
    """Before: "dstoolkit tune: error: bucket_scale: Input should be greater than 0" (nan), inf accepted."""
    rc = main(["tune", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--budget", "1", "--mode", "estimate", "-o",
               str(tmp_path / "t"), "--bucket-scales", value, "--no-progress"])
    assert rc == 2
    assert capsys.readouterr().err == (f"dstoolkit tune: error: --bucket-scales {value!r}: expected positive numbers, "
                                       "e.g. 0.25,1\n")
    assert not (tmp_path / "t").exists()
