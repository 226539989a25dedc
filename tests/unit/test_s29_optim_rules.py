"""DS233 (the values of every optimizer outside the Adam family, against what its implementation accepts) and
NAdam's momentum_decay in DS230. The torch-backed types are pinned against torch's own constructors: the rule
refuses exactly what torch refuses and quotes torch's message; DeepSpeed's unchecked kernels (Lamb, Lion, CPU
Adagrad, Muon) are pinned by their exact findings."""
from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.rules import RULES
from dstoolkit.dsconfig.rules_optim_values import DS_IMPLS, TORCH_IMPLS, optimizer_value_problems
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def findings(cfg, codes=("DS230", "DS233"), **ctx):
    return [(f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx) if f.code in codes]


def opt(type_, params, **top):
    return {**BASE, "optimizer": {"type": type_, "params": params}, **top}


def test_sgd_names_every_bad_value_and_quotes_torch():
    assert findings(opt("SGD", {"lr": -1, "momentum": -0.5, "weight_decay": -1e-4})) == [
        ("DS233", "/optimizer/params/lr",
         "optimizer.params lr=-1, momentum=-0.5, weight_decay=-0.0001: torch.optim.SGD raises ValueError('Invalid "
         "learning rate: -1') (torch/optim/sgd.py)",
         "lr must be >= 0, e.g. 0.001 (torch.optim.SGD's default); momentum must be >= 0, e.g. 0 (torch.optim.SGD's "
         "default); weight_decay must be >= 0, e.g. 0 (torch.optim.SGD's default)")]


def test_sgd_nesterov_needs_momentum_and_zero_dampening():
    [(code, pointer, message, fix)] = findings(opt("SGD", {"lr": 0.1, "nesterov": True}))
    assert (code, pointer, fix) == ("DS233", "/optimizer/params/nesterov",
                                    'set "momentum" > 0 (e.g. 0.9) and "dampening": 0, or "nesterov": false')
    assert message == ("optimizer.params nesterov=True with momentum=0, dampening=0: torch.optim.SGD raises "
                       "ValueError('Nesterov momentum requires a momentum and zero dampening') (torch/optim/sgd.py)")
    assert findings(opt("SGD", {"nesterov": True, "momentum": 0.9, "dampening": 0.1}))[0][1] == "/optimizer/params/nesterov"
    assert findings(opt("SGD", {"nesterov": True, "momentum": 0.9})) == []
    assert findings(opt("SGD", {"nesterov": False, "momentum": 0})) == []


def test_musgd_builds_torch_sgd():
    [(_, _, message, _)] = findings(opt("MuSGD", {"lr": 0.1, "momentum": -1}))
    assert message == ("optimizer.params momentum=-1: torch.optim.SGD (mup's MuSGD) raises ValueError('Invalid "
                       "momentum value: -1') (torch/optim/sgd.py)")


def test_adagrad_is_torch_unless_the_optimizer_is_offloaded():
    [(_, pointer, message, fix)] = findings(opt("Adagrad", {"lr": 0.01, "initial_accumulator_value": -0.1}))
    assert pointer == "/optimizer/params/initial_accumulator_value"
    assert message == ("optimizer.params initial_accumulator_value=-0.1: torch.optim.Adagrad raises ValueError("
                       "'Invalid initial_accumulator_value value: -0.1') (torch/optim/adagrad.py)")
    assert fix == "initial_accumulator_value must be >= 0, e.g. 0 (torch.optim.Adagrad's default)"
    offload = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    [(_, _, message, fix)] = findings(opt("adagrad", {"lr": -0.01}, **offload))
    assert message == ("optimizer.params lr=-0.01: DeepSpeed's DeepSpeedCPUAdagrad takes it unchecked: a negative lr "
                       "climbs the loss (ops/csrc/includes/cpu_adagrad.h)")
    assert fix == "lr must be >= 0, e.g. 0.01 (DeepSpeedCPUAdagrad's default)"


def test_lamb_coefficients_and_amsgrad():
    [(code, pointer, message, fix)] = findings(opt("Lamb", {"lr": 1e-3, "max_coeff": 0.01, "min_coeff": 0.3}))
    assert (code, pointer) == ("DS233", "/optimizer/params/min_coeff")
    assert message == ("optimizer.params min_coeff=0.3 > max_coeff=0.01: DeepSpeed's FusedLamb takes it unchecked: the "
                       "trust ratio is clamped to max_coeff and then raised to min_coeff, so every step uses min_coeff "
                       "and LAMB's layer-wise adaptation is off (ops/csrc/lamb/fused_lamb_cuda_kernel.cu)")
    assert fix == "min_coeff must be <= max_coeff, e.g. 0.01 and 10.0 (FusedLamb's defaults)"
    # against the defaults (min 0.01, max 10.0)
    assert findings(opt("lamb", {"min_coeff": 20}))[0][2].startswith("optimizer.params min_coeff=20 > max_coeff=10.0")
    assert findings(opt("lamb", {"max_coeff": 0.001}))[0][2].startswith("optimizer.params min_coeff=0.01 > "
                                                                         "max_coeff=0.001")
    [(_, pointer, message, fix)] = findings(opt("Lamb", {"amsgrad": True}))
    assert (pointer, fix) == ("/optimizer/params/amsgrad", 'remove "amsgrad"')
    assert message == ("optimizer.params amsgrad=True: DeepSpeed's FusedLamb raises RuntimeError('FusedLamb does not "
                       "support the AMSGrad variant.') (ops/lamb/fused_lamb.py)")
    [(_, pointer, message, _)] = findings(opt("Lamb", {"betas": [0.9, 1.0], "max_coeff": -1, "min_coeff": -2}))
    assert pointer == "/optimizer/params/betas/1"
    assert message == ("optimizer.params betas[1]=1.0, max_coeff=-1: DeepSpeed's FusedLamb takes it unchecked: a beta "
                       "of 1 zeroes the bias correction 1 - beta^t the step divides by, above 1 the moments grow without "
                       "bound, below 0 they flip sign (ops/csrc/lamb/fused_lamb_cuda_kernel.cu)")
    # a negative max_coeff under the default min_coeff is also pinned to min_coeff: both are named
    assert findings(opt("Lamb", {"max_coeff": -1}))[0][2].startswith(
        "optimizer.params max_coeff=-1, min_coeff=0.01 > max_coeff=-1: DeepSpeed's FusedLamb takes it unchecked: the "
        "trust ratio is clamped to at most max_coeff, so a negative one turns every step uphill")


def test_lion_betas_may_be_one():
    assert findings(opt("Lion", {"lr": 1e-4, "betas": [1.0, 1.0], "weight_decay": 0.0})) == []
    [(_, pointer, message, fix)] = findings(opt("lion", {"betas": [0.9, 1.0001], "weight_decay": -0.1}))
    assert pointer == "/optimizer/params/betas/1"
    assert message.startswith("optimizer.params betas[1]=1.0001, weight_decay=-0.1: DeepSpeed's FusedLion / "
                              "DeepSpeedCPULion takes it unchecked: outside [0, 1] a beta no longer interpolates")
    assert fix == ("betas must be in [0, 1] each, e.g. [0.9, 0.999] (FusedLion's default); weight_decay must be >= 0, "
                   "e.g. 0.0 (FusedLion's default)")


def test_muon():
    [(_, pointer, message, fix)] = findings(opt("Muon", {"lr": 0.02, "ns_method": "fast"}))
    assert (pointer, fix) == ("/optimizer/params/ns_method", 'use "gram" (the default) or "standard"')
    assert message == ("optimizer.params ns_method='fast': DeepSpeed's MuonWithAuxAdam fails an assert (ns_method must "
                       "be one of NS_METHODS, got fast) (runtime/zero/muon/original_muon.py)")
    assert [p.pointer for p in optimizer_value_problems(
        {"optimizer": {"type": "muon", "params": {"adam_lr": -1, "momentum": 1.0, "betas": [0.9, 1], "eps": -1}}})] == [
        "/optimizer/params/adam_lr", "/optimizer/params/momentum", "/optimizer/params/betas/1", "/optimizer/params/eps"]
    assert findings(opt("Muon", {"lr": 0.02, "momentum": 0.95, "ns_method": "standard", "betas": [0.9, 0.95]})) == []
    # DeepSpeed 0.16 has no Muon: the type itself is DS209's finding
    assert findings(opt("Muon", {"momentum": 2}), deepspeed_version="0.16") == []


@pytest.mark.parametrize("type_, params, over", [
    ("Adafactor", {"eps": [None, 1e-3], "d": 1.0, "beta2_decay": 0}, {"d": 0.999}),
    ("Rprop", {"etas": [0.5, 1.2]}, {"etas": [0.5, 1.0]}),
    ("SparseAdam", {"lr": 1e-3, "eps": 1e-8, "betas": [0, 0.999]}, {"lr": 0}),
    ("Adadelta", {"rho": 1.0}, {"rho": 1.0001}), ("RMSprop", {"alpha": 0, "momentum": 0}, {"alpha": -1e-9}),
    ("ASGD", {"lr": 0}, {"lr": -1e-9}), ("LBFGS", {"lr": 0}, {"lr": -1e-9}),
    ("SGD", {"lr": "auto", "momentum": "0.9", "weight_decay": None, "nesterov": True, "dampening": "auto"},
     {"lr": -1e-9}),
])
def test_boundaries_and_unchecked_values(type_, params, over):
    """At the boundary (or not a number: other findings' business) it passes; just over it, DS233."""
    assert findings(opt(type_, params)) == []
    assert [c for c, *_ in findings(opt(type_, {**params, **over}))] == ["DS233"]


def test_the_adam_family_is_ds230s_not_ds233s():
    for type_ in ("AdamW", "adam", "MuAdam", "NAdam", "RAdam", "Adamax"):
        assert [c for c, *_ in findings(opt(type_, {"lr": -1}))] == ["DS230"], type_
    for type_ in ("sgd", "OneBitAdam", "NoSuchOpt"):  # not torch's spelling / removed / unknown: DS209's
        assert findings(opt(type_, {"lr": -1})) == [], type_
    assert [c for c, *_ in findings(opt("SGD", {"lr": -1}))] == ["DS233"]


def test_nadam_momentum_decay_is_ds230():
    [(code, pointer, message, fix)] = findings(opt("NAdam", {"lr": 1e-3, "momentum_decay": -0.004}))
    assert (code, pointer) == ("DS230", "/optimizer/params/momentum_decay")
    assert message == ("optimizer.params momentum_decay=-0.004: torch.optim.NAdam raises ValueError('Invalid "
                       "momentum_decay value: -0.004') (torch/optim/nadam.py)")
    assert fix == "momentum_decay must be >= 0, e.g. 0.004 (torch's default)"
    assert findings(opt("RAdam", {"momentum_decay": -1})) == []  # only NAdam has it (DS210 owns the keyword)


def test_hf_auto_and_corpus_style_configs_stay_clean():
    hf = opt("Lamb", {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"})
    assert findings(hf, mode="hf") == [] and findings(hf) == []
    # tests/corpus bing_bert LAMB config, and the same with its coefficients swapped
    bing = {"lr": 0.011, "weight_decay": 0.01, "bias_correction": False, "max_coeff": 0.3, "min_coeff": 0.01}
    assert findings(opt("Lamb", bing)) == []
    assert findings(opt("Lamb", {**bing, "max_coeff": 0.01, "min_coeff": 0.3}))[0][:2] == (
        "DS233", "/optimizer/params/min_coeff")


def test_registry_entry_and_pydantic():
    r = RULES["DS233"]
    assert (r.title, r.severity) == ("optimizer value outside the range its implementation accepts", "error")
    assert all(src in r.explanation for src in ("torch/optim/sgd.py", "fused_lamb_cuda_kernel.cu", "multi_tensor_lion.cu",
                                                "original_muon.py", "sparse_adam.py", "_adafactor.py"))
    codes = list(RULES)
    assert codes.index("DS231") < codes.index("DS233") < codes.index("DS213")
    with pytest.raises(ValidationError, match=r"torch.optim.RMSprop raises ValueError\('Invalid alpha value: -1'\)"):
        DeepSpeedConfig.model_validate(opt("RMSprop", {"alpha": -1}))


torch = pytest.importorskip("torch")

GRIDS = {
    "SGD": {"lr": [-1, 0, 1e-3], "momentum": [-0.1, 0, 0.9], "weight_decay": [-1e-9, 0], "dampening": [0, 0.1],
            "nesterov": [False, True]},
    "Adagrad": {"lr": [-1, 0], "lr_decay": [-1, 0], "weight_decay": [-1, 0], "initial_accumulator_value": [-1, 0],
                "eps": [-1, 0, 1e-10]},
    "Adadelta": {"lr": [-1, 0, 1.0], "rho": [-0.1, 0, 1.0, 1.0001], "eps": [-1e-9, 0], "weight_decay": [-1, 0]},
    "Adafactor": {"lr": [-1, 0], "beta2_decay": [0.1, 0, -0.8], "eps": [[None, 1e-3], [-1, 1e-3], [0, -1e-3]],
                  "d": [0.99, 1, 2], "weight_decay": [-1, 0]},
    "ASGD": {"lr": [-1, 0, 1], "weight_decay": [-1, 0]},
    "LBFGS": {"lr": [-1e-12, 0, 1]},
    "RMSprop": {"lr": [-1, 0], "eps": [-1, 0], "momentum": [-1, 0], "weight_decay": [-1, 0], "alpha": [-1, 0, 0.99]},
    "Rprop": {"lr": [-1, 0], "etas": [[0.5, 1.2], [0, 1.2], [1, 1.2], [0.5, 1], [-0.5, 2]]},
    "SparseAdam": {"lr": [-1, 0, 1e-3], "eps": [-1, 0, 1e-8], "betas": [[0.9, 0.999], [1, 0.9], [0.9, -0.1], [0, 0]]},
}


@pytest.mark.parametrize("cls_name", sorted(GRIDS))
def test_agrees_with_torchs_own_checks(cls_name):
    """Every grid point: the rule refuses exactly when torch's constructor raises, and quotes its message."""
    assert cls_name in TORCH_IMPLS or cls_name.lower() in DS_IMPLS
    cls = getattr(torch.optim, cls_name)
    grid = GRIDS[cls_name]
    for combo in itertools.product(*grid.values()):
        kw = dict(zip(grid, combo))
        try:
            cls([torch.nn.Parameter(torch.zeros(2, 2))], **{k: tuple(v) if isinstance(v, list) else v
                                                              for k, v in kw.items()})
            torch_says = None
        except ValueError as exc:
            torch_says = str(exc)
        problems = optimizer_value_problems({"optimizer": {"type": cls_name, "params": kw}})
        ours = problems[0].why.split("raises ValueError('", 1)[1][:-2] if problems else None
        assert ours == torch_says, (cls_name, kw)


def test_nadam_momentum_decay_agrees_with_torch():
    for md in (-1, -1e-12, 0, 4e-3):
        try:
            torch.optim.NAdam([torch.nn.Parameter(torch.zeros(1))], momentum_decay=md)
            refused = False
        except ValueError:
            refused = True
        assert bool(findings(opt("NAdam", {"momentum_decay": md}))) is refused, md
