"""DS230 (the Adam family's lr / betas / eps / weight_decay in the range torch accepts) and DS231 (gradient_clipping
>= 0): the config rules, the same checks on `dstoolkit resolve`'s flags, and agreement with torch's own argument
checks (torch/optim/adam.py Adam.__init__, inherited by AdamW)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from dstoolkit.cli import main
from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.rules_optim import adam_value_problems, gradient_clipping_problem
from dstoolkit.validate import validate_config

ROOT = Path(__file__).resolve().parents[2]
BASE = {"train_micro_batch_size_per_gpu": 1}
NEGATIVE = {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": -1, "betas": [2, -3], "eps": -1,
                                                              "weight_decay": -5}}, "gradient_clipping": -1}
HF = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
      "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                       "warmup_num_steps": "auto", "total_num_steps": "auto"}},
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                            "stage3_param_persistence_threshold": "auto"}}


def value_findings(cfg, **ctx):
    return [(f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx)
            if f.code in ("DS230", "DS231")]


def adam(params, type_="AdamW", **top):
    return {**BASE, "optimizer": {"type": type_, "params": params}, **top}


def test_repro_negative_values_are_two_errors_naming_every_value():
    assert value_findings(NEGATIVE) == [
        ("DS230", "/optimizer/params/lr",
         "optimizer.params lr=-1, betas[0]=2, betas[1]=-3, eps=-1, weight_decay=-5: torch.optim.AdamW raises "
         "ValueError('Invalid learning rate: -1') (torch/optim/adam.py); DeepSpeed's FusedAdam / DeepSpeedCPUAdam "
         "take it unchecked and train wrongly",
         "lr must be >= 0, e.g. 5e-05 (HF's default); betas must be in [0, 1) each, e.g. [0.9, 0.999] (HF's "
         "default); eps must be >= 0, e.g. 1e-08 (HF's default); weight_decay must be >= 0, e.g. 0.0 (HF's default)"),
        ("DS231", "/gradient_clipping",
         "gradient_clipping=-1 is negative: DeepSpeed clips only when gradient_clipping > 0 (runtime/engine.py "
         "'if self.gradient_clipping() > 0.0', the same test in the ZeRO, fp16 and bf16 optimizers), so clipping "
         "is silently off",
         "use a positive maximum norm (HF's default max_grad_norm is 1.0), or 0 to turn clipping off"),
    ]


def test_the_first_bad_value_is_pointed_at():
    [(code, pointer, message, suggestion)] = value_findings(adam({"lr": 1e-3, "betas": [0.9, 1.0]}))
    assert (code, pointer) == ("DS230", "/optimizer/params/betas/1")
    assert message.startswith("optimizer.params betas[1]=1.0: torch.optim.AdamW raises "
                              "ValueError('Invalid beta parameter at index 1: 1.0')")
    assert suggestion == "betas must be in [0, 1) each, e.g. [0.9, 0.999] (HF's default)"
    text = '{"train_micro_batch_size_per_gpu": 1,\n "optimizer": {"type": "AdamW", "params": {"eps": -1e-8}}}'
    [f] = [f for f in validate_config(text, source="c.json") if f.code == "DS230"]
    assert (f.pointer, f.line, f.column) == ("/optimizer/params/eps", 2, 44)  # the key "eps" on line 2


@pytest.mark.parametrize("params, top", [
    ({"lr": 0, "betas": [0, 0.999999], "eps": 0, "weight_decay": 0}, {"gradient_clipping": 0}),
    ({"lr": 0.0, "betas": [0.0, 0.0], "eps": 0.0, "weight_decay": 0.0}, {"gradient_clipping": 0.0}),
    ({"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}, {"gradient_clipping": 1.0}),
    ({"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}, {"gradient_clipping": "auto"}),
    ({"lr": "1e-3", "betas": ["auto", None], "eps": True, "weight_decay": None}, {"gradient_clipping": None}),
])
def test_legal_and_unchecked_values_are_not_flagged(params, top):
    for mode in ("strict", "hf"):
        assert value_findings(adam(params, **top), mode=mode) == []


def test_hf_auto_config_stays_clean():
    assert value_findings(HF, mode="hf") == [] and value_findings(HF) == []


@pytest.mark.parametrize("type_, cls, source", [
    ("Adam", "torch.optim.AdamW", "torch/optim/adam.py"),      # DeepSpeed's Adam runs in AdamW mode by default
    ("adamw", "torch.optim.AdamW", "torch/optim/adam.py"),     # DeepSpeed's names are case-insensitive
    ("MuAdam", "torch.optim.Adam (mup's MuAdam)", "torch/optim/adam.py"),
    ("Adamax", "torch.optim.Adamax", "torch/optim/adamax.py"),
    ("NAdam", "torch.optim.NAdam", "torch/optim/nadam.py"),
    ("RAdam", "torch.optim.RAdam", "torch/optim/radam.py"),
])
def test_adam_family_types(type_, cls, source):
    [(_, _, message, _)] = value_findings(adam({"lr": -0.1}, type_))
    assert message.startswith(f"optimizer.params lr=-0.1: {cls} raises ValueError('Invalid learning rate: -0.1') "
                              f"({source})")


def test_adam_w_mode_false_builds_torch_adam():
    [(_, _, message, _)] = value_findings(adam({"lr": -0.1, "adam_w_mode": False}, "Adam"))
    assert message.startswith("optimizer.params lr=-0.1: torch.optim.Adam raises")


@pytest.mark.parametrize("type_", ["SGD", "Lamb", "Lion", "Adagrad", "RMSprop", "OneBitAdam", "NoSuchOpt", None])
def test_other_optimizers_are_not_judged_by_the_adam_ranges(type_):
    assert value_findings(adam({"lr": -1, "betas": [2, -3]}, type_)) == []


def test_gradient_clipping_alone():
    assert [c for c, *_ in value_findings({**BASE, "gradient_clipping": -0.5})] == ["DS231"]
    assert gradient_clipping_problem(-0.5).startswith("-0.5 is negative")
    for ok in (0, 0.0, 1.0, 1e9, "auto", None, True, float("nan")):
        assert gradient_clipping_problem(ok) is None


def test_pydantic_model_raises_the_rules():
    for cfg, code in ((adam({"lr": -1}), "DS230"), ({**BASE, "gradient_clipping": -1}, "DS231")):
        with pytest.raises(ValidationError) as info:
            DeepSpeedConfig.model_validate(cfg)
        assert info.value.errors()[0]["ctx"]["error"].code == code


torch = pytest.importorskip("torch")


@pytest.mark.parametrize("cls_name", ["Adam", "AdamW", "Adamax", "NAdam", "RAdam"])
def test_agrees_with_torchs_own_checks(cls_name):
    """Every value torch refuses, the rule refuses, and nothing else (the boundaries included)."""
    cls = getattr(torch.optim, cls_name)
    p = [torch.nn.Parameter(torch.zeros(1))]
    grid = {"lr": [-1.0, -1e-12, 0.0, 1e-12, 1.0, 1e6], "eps": [-1.0, -1e-30, 0.0, 1e-8, 10.0],
            "weight_decay": [-5.0, -1e-9, 0.0, 0.01, 100.0]}
    cases = [{k: v} for k, vs in grid.items() for v in vs]
    betas = [-0.5, -1e-9, 0.0, 0.5, 0.999999, 1.0, 1.5]
    cases += [{"betas": (b0, 0.999)} for b0 in betas] + [{"betas": (0.9, b1)} for b1 in betas]
    for kw in cases:
        try:
            cls(p, **kw)
            torch_refuses = False
        except ValueError:
            torch_refuses = True
        assert bool(adam_value_problems(kw)) is torch_refuses, (cls_name, kw)
        findings = value_findings(adam({k: list(v) if k == "betas" else v for k, v in kw.items()}, cls_name))
        assert bool(findings) is torch_refuses, (cls_name, kw)


def test_corpus_has_no_value_errors():
    """The repo's corpus (real configs; DeepSpeed's verdicts in SOURCES.tsv) keeps validating as before."""
    files = sorted(p for p in (ROOT / "tests" / "corpus").iterdir() if p.name != "SOURCES.tsv")
    assert len(files) >= 100
    for path in files:
        text = path.read_bytes().decode("utf-8", "replace")
        for mode in ("strict", "hf"):
            assert value_findings(text, mode=mode) == [], path.name


# -- dstoolkit resolve: the flags that fill these values, checked by the same rules ---------------------------
def _resolve(tmp_path, *flags):
    src = tmp_path / "in.json"
    src.write_text(json.dumps(HF))
    out = tmp_path / "out.json"
    rc = main(["resolve", str(src), "--world-size", "8", "--hidden-size", "4096", "--total-steps", "10",
               "--precision", "bf16", "-o", str(out), *flags])
    return rc, out


def test_resolve_refuses_bad_flags_naming_them(tmp_path, capsys):
    rc, out = _resolve(tmp_path, "--lr", "-1", "--betas", "2", "-3", "--eps", "-1", "--weight-decay", "-5",
                       "--max-grad-norm", "-1")
    assert rc == 2 and not out.exists()
    assert capsys.readouterr().err == (
        "dstoolkit resolve: error: --lr -1.0, --betas B1 2.0, --betas B2 -3.0, --eps -1.0, --weight-decay -5.0: "
        "torch.optim.AdamW raises ValueError('Invalid learning rate: -1.0') (torch/optim/adam.py; rule DS230): "
        "--lr must be >= 0, e.g. 5e-05 (HF's default); --betas must be in [0, 1) each, e.g. 0.9 0.999 (HF's "
        "default); --eps must be >= 0, e.g. 1e-08 (HF's default); --weight-decay must be >= 0, e.g. 0.0 (HF's "
        "default)\n")
    rc, out = _resolve(tmp_path, "--max-grad-norm", "-0.5")
    assert rc == 2 and not out.exists()
    assert capsys.readouterr().err == (
        "dstoolkit resolve: error: --max-grad-norm -0.5 is negative: DeepSpeed clips only when gradient_clipping > 0 "
        "(runtime/engine.py 'if self.gradient_clipping() > 0.0', the same test in the ZeRO, fp16 and bf16 "
        "optimizers), so clipping is silently off (rule DS231): use a positive maximum norm (HF's default "
        "max_grad_norm is 1.0), or 0 to turn clipping off\n")


def test_resolve_accepts_the_boundaries(tmp_path):
    rc, out = _resolve(tmp_path, "--lr", "0", "--betas", "0", "0.999999", "--eps", "0", "--weight-decay", "0",
                       "--max-grad-norm", "0")
    assert rc == 0
    written = json.loads(out.read_text())
    assert written["optimizer"]["params"] == {"lr": 0.0, "betas": [0.0, 0.999999], "eps": 0.0, "weight_decay": 0.0}
    assert written["gradient_clipping"] == 0.0


def test_resolve_does_not_write_a_config_with_bad_fixed_values(tmp_path, capsys):
    src = tmp_path / "in.json"
    src.write_text(json.dumps({**HF, "optimizer": {"type": "AdamW", "params": {"lr": -1, "betas": "auto"}}}))
    out = tmp_path / "out.json"
    rc = main(["resolve", str(src), "--world-size", "8", "--hidden-size", "4096", "--total-steps", "10",
               "--precision", "bf16", "-o", str(out)])
    assert rc == 1 and not out.exists()
    printed = capsys.readouterr()
    assert f"{src}: error[DS230]: optimizer.params lr=-1: torch.optim.AdamW raises" in printed.out
    assert "not written: the resolved config has 1 error(s)" in printed.err
