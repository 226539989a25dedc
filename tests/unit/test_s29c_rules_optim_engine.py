"""DS236 (ZeRO refuses an optimizer it has not tested) and DS237 (LBFGS / SparseAdam cannot step inside the engine).
The verdicts pinned here were measured on a 1-rank gloo CPU engine with DeepSpeed 0.19.8 (see the rule
explanations); the facts they rest on are checked against DeepSpeed's own list and class hierarchy below."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.facts import OPTIMIZER_BUILDS, TORCH_OPTIMIZERS
from dstoolkit.dsconfig.rules_optim import optimizer_build
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def findings(cfg, codes=("DS236", "DS237"), **ctx):
    return [(f.code, f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx)
            if f.code in codes]


def opt(type_, params=None, stage=None, **top):
    cfg = {**BASE, "optimizer": {"type": type_, "params": params or {"lr": 0.1}}, **top}
    if stage is not None:
        cfg["zero_optimization"] = {"stage": stage}
    return cfg


UNTESTED = ("You are using an untested ZeRO Optimizer. Please add <\"zero_allow_untested_optimizer\": true> in the "
            "configuration file to use it.")


def test_sgd_at_zero_2_is_refused_with_deepspeeds_assert():
    assert findings(opt("SGD", stage=2)) == [
        ("DS236", "error", "/optimizer/type",
         "optimizer.type 'SGD' builds torch.optim.SGD, which is not among ZeRO's tested optimizers "
         f"(runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS): at zero_optimization.stage=2 DeepSpeed asserts at "
         f"engine start ('{UNTESTED}')",
         'add "zero_allow_untested_optimizer": true at the top level (DeepSpeed then warns and trains), or use '
         "Adam / AdamW, Adagrad, Lion or Muon")]


# measured: raise at these stages (RMSprop / Adamax at stage 1, SGD at 2, 3 and "2", SGD under offload at 2)
@pytest.mark.parametrize("cfg", [opt("RMSprop", stage=1), opt("Adamax", stage=1), opt("SGD", stage=3),
                                 opt("SGD", stage="2"), opt("NAdam", stage=2), opt("Lamb", stage=2),
                                 opt("SGD", zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}),
                                 opt("SGD", stage=2, zero_allow_untested_optimizer=False)])
def test_untested_classes_are_refused_at_every_zero_stage(cfg):
    assert [c for c, *_ in findings(cfg)] == ["DS236"]


# measured: these train (SGD at stage 0, SGD with the flag, Adagrad / torch_adam AdamW / Muon / offloaded
# Adam, Adagrad and Lion at stage 2); DeepSpeed tests the flag for truth, so the string "false" also lets it through
@pytest.mark.parametrize("cfg", [opt("SGD", stage=0), opt("SGD"),
                                 opt("SGD", stage=2, zero_allow_untested_optimizer=True),
                                 opt("SGD", stage=2, zero_allow_untested_optimizer="false"),
                                 opt("Adagrad", stage=2), opt("AdamW", stage=3),
                                 opt("Adam", {"lr": 0.1, "torch_adam": True}, stage=2),
                                 opt("Muon", {"lr": 0.02}, stage=2), opt("MuAdamW", stage=2),
                                 *[opt(t, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
                                   for t in ("Adam", "Adagrad", "Lion")]])
def test_tested_classes_and_the_flag_pass(cfg):
    assert findings(cfg) == []


def test_one_bit_optimizers_of_016_are_not_judged():
    assert findings(opt("OneBitAdam", stage=2), deepspeed_version="0.16") == []


def test_lbfgs_and_sparse_adam_fail_at_the_first_step():
    assert findings(opt("LBFGS", {"lr": 1})) == [
        ("DS237", "error", "/optimizer/type",
         "optimizer.type 'LBFGS': DeepSpeed builds torch.optim.LBFGS and starts, but the first engine step raises "
         "TypeError(\"LBFGS.step() missing 1 required positional argument: 'closure'\"): torch.optim.LBFGS "
         "re-evaluates the loss through a closure several times per step, and DeepSpeed's engine (and its ZeRO, fp16 "
         "and bf16 wrappers) calls optimizer.step() without one",
         "use a first-order optimizer such as AdamW; L-BFGS needs its own training loop outside the engine")]
    [(code, _, pointer, message, _)] = findings(opt("SparseAdam", {"lr": 1e-3}))
    assert (code, pointer) == ("DS237", "/optimizer/type")
    assert "raises RuntimeError('SparseAdam does not support dense gradients, please consider Adam instead')" in message
    # with the flag at ZeRO-2 both still fail at the step (measured); without it ZeRO refuses them first
    assert [c for c, *_ in findings(opt("LBFGS", {"lr": 1}, stage=2))] == ["DS236", "DS237"]


@pytest.mark.parametrize("code, cfg", [("DS236", opt("SGD", stage=2)), ("DS237", opt("LBFGS", {"lr": 1}))])
def test_both_raise_through_pydantic(code, cfg):
    with pytest.raises(ValidationError) as info:
        DeepSpeedConfig.model_validate(cfg)
    assert info.value.errors()[0]["ctx"]["error"].code == code


def test_zero_tested_agrees_with_deepspeeds_list():
    # runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS (+ MuonWithAuxAdam, appended when it imports), exact types
    pytest.importorskip("deepspeed")
    import torch
    from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
    from deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion
    from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    classes = {"FusedAdam": FusedAdam, "DeepSpeedCPUAdam": DeepSpeedCPUAdam, "torch.optim.AdamW": torch.optim.AdamW,
               "torch.optim.Adam": torch.optim.Adam, "FusedLamb": FusedLamb, "FusedLion": FusedLion,
               "DeepSpeedCPULion": DeepSpeedCPULion, "torch.optim.Adagrad": torch.optim.Adagrad,
               "DeepSpeedCPUAdagrad": DeepSpeedCPUAdagrad, "MuonWithAuxAdam": MuonWithAuxAdam,
               "mup's MuAdam (torch.optim.Adam)": torch.optim.Adam,
               "mup's MuAdamW (torch.optim.AdamW)": torch.optim.AdamW, "mup's MuSGD (torch.optim.SGD)": torch.optim.SGD}
    supported = set(ZERO_SUPPORTED_OPTIMIZERS) | {MuonWithAuxAdam}
    for builds in OPTIMIZER_BUILDS.values():
        for build in builds.values():
            assert build.zero_tested == (classes[build.cls] in supported), build.cls
    for name in TORCH_OPTIMIZERS:  # the torch names DeepSpeed does not own are reached by getattr(torch.optim, name)
        build = optimizer_build(name, {}, {})
        if build.cls.startswith("torch.optim."):
            assert build.zero_tested == (getattr(torch.optim, name) in supported), name
