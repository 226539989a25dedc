"""DS240: optimizer.params / scheduler.params values of the wrong JSON type. Each refused value below was run
through a 1-rank gloo CPU engine (DeepSpeed 0.19.8, torch 2.13) and fails or misbehaves there (see the rule
explanation); each accepted one trains. The kinds are checked against torch's constructor defaults."""
from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.facts import (BOOL, NUMBER, OPTIMIZER_PARAM_KIND_OVERRIDES, OPTIMIZER_PARAM_KINDS, PAIR,
                                      SCHEDULER_PARAM_KINDS, SCHEDULER_PARAMS, TORCH_OPTIMIZERS)
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def findings(cfg, **ctx):
    return [(f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx) if f.code == "DS240"]


def opt(type_, **params):
    return {**BASE, "optimizer": {"type": type_, "params": params}}


def sched(type_, params, **top):
    return {**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "scheduler": {"type": type_, "params": params}, **top}


def test_the_testers_configs_name_pointer_value_and_fix():
    assert findings(opt("AdamW", lr="1e-3", betas=[0.9])) == [
        ("DS240", "/optimizer/params/lr",
         'optimizer.params lr="1e-3" (a string), betas=[0.9] (1 item, not 2): DeepSpeed hands them to FusedAdam as '
         "written. Python arithmetic on them fails with TypeError, IndexError or ValueError at deepspeed.initialize "
         "or a later step",
         "write the number without quotes: 1e-3; write betas as a list of two numbers: [0.9, 0.999]")]
    assert findings(opt("AdamW", lr=1e-3, betas="0.9,0.999"))[0][3] == (
        "write betas as a list of two numbers: [0.9, 0.999]")
    assert findings(opt("RMSprop", lr=0.01, alpha="0.99"))[0][1:] == (
        "/optimizer/params/alpha",
        'optimizer.params alpha="0.99" (a string): DeepSpeed hands it to torch.optim.RMSprop as written. Python '
        "arithmetic on it fails with TypeError, IndexError or ValueError at deepspeed.initialize or a later step",
        "write the number without quotes: 0.99")
    assert findings(opt("AdamW", lr=1e-3, amsgrad="false")) == [
        ("DS240", "/optimizer/params/amsgrad",
         'optimizer.params amsgrad="false" (a string, which Python takes as true): DeepSpeed hands it to FusedAdam as '
         'written. A flag written as a string is tested for truth, so "false" turns it on',
         "write the boolean without quotes: false")]
    assert findings(opt("Rprop", lr=0.01, etas=[0.5]))[0][3] == "write etas as a list of two numbers: [0.5, 1.2]"
    assert findings(sched("WarmupLR", {"warmup_max_lr": "1e-3", "warmup_min_lr": None})) == [
        ("DS240", "/scheduler/params/warmup_max_lr",
         'scheduler.params warmup_max_lr="1e-3" (a string), warmup_min_lr=null (not a number): DeepSpeed hands them '
         "to WarmupLR as written. Python arithmetic on them fails with TypeError, IndexError or ValueError at "
         "deepspeed.initialize or a later step",
         "write the number without quotes: 1e-3; write a number for warmup_min_lr, or remove it for the default")]


# each measured on the engine: TypeError / ValueError / IndexError, or a flag turned on
@pytest.mark.parametrize("cfg, pointer", [
    (opt("AdamW", lr=None), "/optimizer/params/lr"),
    (opt("AdamW", lr=1e-3, eps="1e-8"), "/optimizer/params/eps"),
    (opt("AdamW", lr=1e-3, weight_decay=None), "/optimizer/params/weight_decay"),
    (opt("AdamW", lr=1e-3, betas=[0.9, 0.999, 0.5]), "/optimizer/params/betas"),
    (opt("AdamW", lr=1e-3, betas=[0.9, "0.999"]), "/optimizer/params/betas"),
    (opt("AdamW", lr=1e-3, betas={"a": 1}), "/optimizer/params/betas"),
    (opt("AdamW", lr=[1e-3]), "/optimizer/params/lr"),
    (opt("AdamW", lr=True), "/optimizer/params/lr"),  # trains at lr 1
    (opt("AdamW", lr=1e-3, amsgrad="false"), "/optimizer/params/amsgrad"),  # FusedAdam: RuntimeError
    (opt("AdamW", lr=1e-3, torch_adam=True, amsgrad="false"), "/optimizer/params/amsgrad"),  # silent AMSGrad
    (opt("SGD", lr=0.1, momentum="0.9"), "/optimizer/params/momentum"),
    (opt("SGD", lr=0.1, nesterov="false"), "/optimizer/params/nesterov"),
    (opt("Adagrad", lr="0.01"), "/optimizer/params/lr"),
    (opt("Lion", lr="1e-4"), "/optimizer/params/lr"),
    (opt("Muon", lr="0.02"), "/optimizer/params/lr"),
    (opt("Adafactor", lr=0.01, eps="1e-3"), "/optimizer/params/eps"),
    (sched("WarmupDecayLR", {"total_num_steps": "100"}), "/scheduler/params/total_num_steps"),
    (sched("WarmupCosineLR", {"total_num_steps": 100, "cos_min_ratio": "0.1"}), "/scheduler/params/cos_min_ratio"),
    (sched("WarmupCosineLR", {"total_num_steps": 100, "warmup_min_ratio": None}), "/scheduler/params/warmup_min_ratio"),
    (sched("WarmupLR", {"warmup_num_steps": 10, "last_batch_iteration": "-1"}),
     "/scheduler/params/last_batch_iteration"),
    (sched("OneCycle", {"cycle_min_lr": "0.1", "cycle_max_lr": 1.0}), "/scheduler/params/cycle_min_lr"),
    (sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_min_mom": "0.8"}),
     "/scheduler/params/cycle_min_mom"),
    (sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "decay_lr_rate": None}),
     "/scheduler/params/decay_lr_rate"),
    (sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_stair_count": "0"}),
     "/scheduler/params/cycle_first_stair_count"),
    (sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": "abc"}),
     "/scheduler/params/cycle_first_step_size"),
    (sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_momentum": "false"}),
     "/scheduler/params/cycle_momentum"),
    (sched("LRRangeTest", {"lr_range_test_min_lr": "0.001"}), "/scheduler/params/lr_range_test_min_lr"),
    (sched("LRRangeTest", {"lr_range_test_step_rate": "1.0"}), "/scheduler/params/lr_range_test_step_rate"),
    (sched("LRRangeTest", {"lr_range_test_staircase": "false"}), "/scheduler/params/lr_range_test_staircase"),
])
def test_refused(cfg, pointer):
    assert [(c, p) for c, p, *_ in findings(cfg)] == [("DS240", pointer)]


# each trains on the engine (or is another rule's: "auto" DS110/111, unknown keys DS210/212, warmup steps DS234)
@pytest.mark.parametrize("cfg", [
    opt("AdamW", lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0, amsgrad=False, foreach=None),
    opt("AdamW", lr="auto", betas="auto", eps="auto", weight_decay="auto"),
    opt("AdamW", lr=1e-3, bogus="x"),
    opt("AdamW"),
    opt("Adafactor", lr=0.01, eps=[None, 1e-3]),
    opt("LBFGS", lr=1, max_eval=None),
    opt("SGD", lr=0.1, nesterov=1, momentum=0.9),
    sched("WarmupLR", {"warmup_max_lr": None, "warmup_min_lr": [0.0], "warmup_type": None, "warmup_num_steps": "10"}),
    sched("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": "10",
                       "cycle_second_step_size": None, "cycle_second_stair_count": None}),
    sched("CosineAnnealingLR", {"T_max": "10"}),
])
def test_accepted(cfg):
    assert findings(cfg, mode="hf") == []


def test_raises_through_pydantic():
    with pytest.raises(ValidationError) as info:
        DeepSpeedConfig.model_validate(opt("AdamW", lr="1e-3"))
    assert info.value.errors()[0]["ctx"]["error"].code == "DS240"


def test_scheduler_kinds_cover_every_deepspeed_keyword_but_the_other_rules():
    for name, keys in SCHEDULER_PARAMS.items():
        others = {"warmup_num_steps", "warmup_type"} if name.startswith("Warmup") else (
            {"lr_range_test_step_size"} if name == "LRRangeTest" else set())
        assert set(SCHEDULER_PARAM_KINDS[name]) | others == keys, name


def test_optimizer_kinds_agree_with_torchs_defaults():
    torch = pytest.importorskip("torch")
    untyped = {"line_search_fn", "ns_coefficients", "adjust_lr_fn", "ns_method"}
    for name in TORCH_OPTIMIZERS:
        kinds = {**OPTIMIZER_PARAM_KINDS, **OPTIMIZER_PARAM_KIND_OVERRIDES.get(name, {})}
        for p in list(inspect.signature(getattr(torch.optim, name).__init__).parameters.values())[2:]:
            if p.name in untyped or p.name == "params":
                continue
            kind, d = kinds[p.name].rstrip("?"), p.default
            if isinstance(d, bool):
                assert kind == BOOL, (name, p.name)
            elif isinstance(d, (int, float)):
                assert kind == NUMBER, (name, p.name)
            elif isinstance(d, tuple):
                assert kind.startswith(PAIR) and len(d) == 2, (name, p.name)
            else:  # None: a flag (foreach, fused) or an optional number (max_eval)
                assert d is None and (kind == BOOL or kinds[p.name].endswith("?")), (name, p.name)
