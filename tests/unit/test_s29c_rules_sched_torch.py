"""DS238 (scheduler.type without params, params without a type) and DS239 (torch schedulers by name). The verdicts
were measured on a 1-rank gloo CPU engine with DeepSpeed 0.19.8 and torch 2.13 (see the rule explanations); the
keyword table is derived here from torch's own constructor signatures, so it cannot drift."""
from __future__ import annotations

import inspect

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.facts import TORCH_OPTIMIZERS, TORCH_SCHEDULER_ARGS
from dstoolkit.dsconfig.rules_sched_torch import NO_MOMENTUM
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def findings(cfg, codes=("DS238", "DS239"), **ctx):
    return [(f.code, f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx)
            if f.code in codes]


def sched(type_, params=None, **top):
    return {**BASE, "scheduler": {"type": type_, **({} if params is None else {"params": params})}, **top}


# -- DS238 ---------------------------------------------------------------------------------------------------
def test_a_type_without_params_fails_and_params_without_a_type_are_dropped():
    assert findings(sched("WarmupLR")) == [
        ("DS238", "error", "/scheduler/type",
         "scheduler.type 'WarmupLR' without scheduler.params: DeepSpeed passes scheduler.params with ** and raises "
         "TypeError('... argument after ** must be a mapping, not NoneType') at engine start (runtime/engine.py "
         "_scheduler_from_config)", 'add "params": {} to build WarmupLR with its defaults')]
    assert findings({**BASE, "scheduler": {"params": {"warmup_num_steps": 10, "warmup_max_lr": 0.5}}}) == [
        ("DS238", "warning", "/scheduler/params",
         "scheduler.params (warmup_num_steps, warmup_max_lr) without scheduler.type: DeepSpeed builds no LR scheduler "
         "(runtime/config.py get_scheduler_name returns None) and ignores these params, so the LR stays at "
         "optimizer.params.lr", 'add "type" (e.g. "WarmupLR"), or remove the scheduler section')]
    # measured: "params": {} builds WarmupLR with its defaults; an empty section builds nothing and loses nothing
    assert findings(sched("WarmupLR", {})) == findings({**BASE, "scheduler": {}}) == []
    assert [c for c, *_ in findings(sched("CosineAnnealingLR"))] == ["DS238"]


# -- DS239 ---------------------------------------------------------------------------------------------------
def test_a_missing_required_argument_is_read_from_the_signature():
    assert findings(sched("CosineAnnealingLR", {})) == [
        ("DS239", "error", "/scheduler/params",
         "scheduler.type 'CosineAnnealingLR': CosineAnnealingLR needs T_max: TypeError(\"CosineAnnealingLR.__init__() "
         "missing 1 required positional argument: 'T_max'\")", 'add "T_max" to scheduler.params')]
    [(_, _, pointer, message, fix)] = findings(sched("CosineAnnealingLR", {"T_max": 10, "Tmax": 10}))
    assert pointer == "/scheduler/params/Tmax"
    assert "TypeError(\"CosineAnnealingLR.__init__() got an unexpected keyword argument 'Tmax'\")" in message
    assert fix == "CosineAnnealingLR takes T_max, eta_min, last_epoch"


def test_torch_schedulers_fail_on_deepspeeds_wrapped_optimizer():
    wrapper = ("with {why} DeepSpeed hands CosineAnnealingLR its {cls} wrapper, not a torch Optimizer, and torch "
               "raises TypeError('{cls} is not an Optimizer') (LRScheduler.__init__; DeepSpeed's own schedules unwrap "
               "it, lr_schedules.py get_torch_optimizer)")
    fix = ("use a DeepSpeed schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest): torch "
           "schedulers from the config only work at ZeRO stage 0 without fp16 / bf16")
    ok = {"T_max": 10}
    for top, cls, why in ((dict(zero_optimization={"stage": 1}), "DeepSpeedZeroOptimizer", "zero_optimization.stage=1"),
                          (dict(zero_optimization={"stage": 3}), "DeepSpeedZeroOptimizer_Stage3",
                           "zero_optimization.stage=3"),
                          (dict(bf16={"enabled": True}), "FP16_Optimizer", "bf16.enabled=true")):
        assert findings(sched("CosineAnnealingLR", ok, **top)) == [
            ("DS239", "error", "/scheduler/type",
             f"scheduler.type 'CosineAnnealingLR': {wrapper.format(why=why, cls=cls)}", fix)]
    # measured: trains at stage 0 in fp32; fp16 on torch's SGD wraps it in FP16_UnfusedOptimizer (engine.py)
    assert findings(sched("CosineAnnealingLR", ok)) == []
    sgd = {**sched("CosineAnnealingLR", ok, fp16={"enabled": True}), "optimizer": {"type": "SGD", "params": {"lr": 1}}}
    assert "FP16_UnfusedOptimizer is not an Optimizer" in findings(sgd)[0][3]


# measured on the engine: each raises with torch's own message
@pytest.mark.parametrize("type_, params, pointer, says", [
    ("StepLR", {"step_size": 0}, "/scheduler/params/step_size", "ZeroDivisionError('integer modulo by zero')"),
    ("CosineAnnealingLR", {"T_max": 0}, "/scheduler/params/T_max", "ZeroDivisionError('integer modulo by zero')"),
    ("LinearLR", {"start_factor": 0}, "/scheduler/params/start_factor",
     "ValueError('Starting multiplicative factor expected to be greater than 0 and less or equal to 1.')"),
    ("LinearLR", {"end_factor": 2}, "/scheduler/params/end_factor",
     "ValueError('Ending multiplicative factor expected to be between 0 and 1.')"),
    ("ConstantLR", {"factor": 2}, "/scheduler/params/factor",
     "ValueError('Constant multiplicative factor expected to be between 0 and 1.')"),
    ("CosineAnnealingWarmRestarts", {"T_0": 10.0}, "/scheduler/params/T_0",
     "ValueError('Expected positive integer T_0, but got 10.0')"),
    ("CosineAnnealingWarmRestarts", {"T_0": 10, "T_mult": 0}, "/scheduler/params/T_mult",
     "ValueError('Expected integer T_mult >= 1, but got 0')"),
    ("OneCycleLR", {"max_lr": 0.01}, "/scheduler/params/total_steps",
     "ValueError('You must define either total_steps OR (epochs AND steps_per_epoch)')"),
    ("OneCycleLR", {"max_lr": 0.01, "total_steps": 100.0}, "/scheduler/params/total_steps",
     "ValueError('Expected positive integer total_steps, but got 100.0')"),
    ("OneCycleLR", {"max_lr": 0.01, "total_steps": 100, "pct_start": 0}, "/scheduler/params/pct_start",
     "ValueError('Expected float between 0 and 1 pct_start, but got 0')"),
    ("OneCycleLR", {"max_lr": 0.01, "total_steps": 100, "anneal_strategy": "cosine"},
     "/scheduler/params/anneal_strategy",
     "ValueError(\"anneal_strategy must be one of 'cos' or 'linear', instead got cosine\")"),
    ("CyclicLR", {"base_lr": 0.001, "max_lr": 0.01, "mode": "tri"}, "/scheduler/params/mode",
     "ValueError('mode is invalid and scale_fn is None')"),
    ("ReduceLROnPlateau", {"factor": 1.0}, "/scheduler/params/factor", "ValueError('Factor should be < 1.0.')"),
    ("ReduceLROnPlateau", {"threshold_mode": "relative"}, "/scheduler/params/threshold_mode",
     "ValueError('threshold mode relative is unknown!')"),
])
def test_values_torch_refuses(type_, params, pointer, says):
    [(code, _, got_pointer, message, _)] = findings(sched(type_, params))
    assert (code, got_pointer) == ("DS239", pointer)
    assert f"{type_} raises {says}" in message and message.endswith("(torch/optim/lr_scheduler.py)")


@pytest.mark.parametrize("type_, params", [("StepLR", {"step_size": 2}), ("MultiStepLR", {"milestones": [2, 4]}),
                                           ("ExponentialLR", {"gamma": 0.9}), ("PolynomialLR", {"total_iters": 0}),
                                           ("OneCycleLR", {"max_lr": 0.01, "total_steps": 100}),
                                           ("OneCycleLR", {"max_lr": 0.01, "epochs": 2, "steps_per_epoch": 50}),
                                           ("CyclicLR", {"base_lr": 0.001, "max_lr": 0.01}),
                                           ("CosineAnnealingWarmRestarts", {"T_0": 10})])
def test_what_trains(type_, params):
    assert findings(sched(type_, params)) == []  # measured: each builds and steps at stage 0 in fp32


def test_cycle_momentum_needs_momentum_or_betas():
    cfg = {**sched("CyclicLR", {"base_lr": 0.001, "max_lr": 0.01}), "optimizer": {"type": "Adagrad", "params": {}}}
    [(_, _, pointer, message, fix)] = findings(cfg)
    assert (pointer, fix) == ("/scheduler/params/cycle_momentum", '"cycle_momentum": false')
    assert "ValueError('optimizer must support momentum or beta1 with `cycle_momentum` option enabled')" in message
    cfg["optimizer"] = {"type": "SGD", "params": {"lr": 0.1}}  # measured: SGD has a momentum default and trains
    assert findings(cfg) == []


@pytest.mark.parametrize("type_, params", [("LambdaLR", {"lr_lambda": "lambda s: 1.0"}), ("LambdaLR", {}),
                                           ("MultiplicativeLR", {"lr_lambda": "x"}),
                                           ("SequentialLR", {"milestones": [2]}), ("ChainedScheduler", {})])
def test_schedulers_that_need_python_objects(type_, params):
    [(_, _, pointer, message, _)] = findings(sched(type_, params))
    assert pointer == "/scheduler/type"
    assert "which a JSON config cannot hold, so DeepSpeed cannot build it" in message


def test_the_abstract_base_and_reduce_on_plateau():
    [(_, _, _, message, _)] = findings(sched("LRScheduler", {}))
    assert "abstract base class: its get_lr raises NotImplementedError" in message
    # measured: the LR falls 1e-3 -> 1e-4 -> 1e-5 -> 1e-6 every 11 steps whatever the loss
    assert findings(sched("ReduceLROnPlateau", {"patience": 4, "factor": 0.5})) == [
        ("DS239", "error", "/scheduler/type",
         "ReduceLROnPlateau.step(metrics) needs the validation loss, but DeepSpeed's engine calls step() without it, "
         "catches the TypeError and calls step(train_batch_size) instead (runtime/engine.py _take_model_step): the "
         "'metric' is a constant that never improves, so the LR is multiplied by factor 0.5 every patience + 1 = 5 "
         "steps whatever the loss",
         "leave the scheduler section out and step ReduceLROnPlateau yourself with the validation loss, outside the "
         "engine (the engine steps any scheduler it is given the same way)")]


@pytest.mark.parametrize("code, cfg", [("DS238", sched("WarmupLR")), ("DS239", sched("CosineAnnealingLR", {}))])
def test_both_raise_through_pydantic(code, cfg):
    with pytest.raises(ValidationError) as info:
        DeepSpeedConfig.model_validate(cfg)
    assert info.value.errors()[0]["ctx"]["error"].code == code


def test_keyword_table_is_torchs_signatures():
    lrs = pytest.importorskip("torch.optim.lr_scheduler")
    names = {n for n, c in vars(lrs).items() if isinstance(c, type) and issubclass(c, lrs.LRScheduler)}
    assert set(TORCH_SCHEDULER_ARGS) == names - {"_LRScheduler"}
    for name, args in TORCH_SCHEDULER_ARGS.items():
        params = list(inspect.signature(getattr(lrs, name).__init__).parameters.values())[1:]
        rest = params[1:]  # DeepSpeed passes its optimizer positionally: it fills the first parameter
        objects = tuple(p.name for p in params if p.default is inspect.Parameter.empty
                        and ("Callable" in str(p.annotation) or "LRScheduler" in str(p.annotation)))
        assert args.keywords == tuple(p.name for p in rest), name
        assert args.required == tuple(p.name for p in rest if p.default is inspect.Parameter.empty), name
        assert args.objects == objects, name


def test_no_momentum_set_is_torchs_defaults():
    torch = pytest.importorskip("torch")
    p = [torch.nn.Parameter(torch.zeros(2))]
    for name in TORCH_OPTIMIZERS:
        if name == "Muon":  # "muon" is DeepSpeed's own MuonWithAuxAdam
            continue
        defaults = getattr(torch.optim, name)(p, lr=0.1).defaults
        lacks = "momentum" not in defaults and "betas" not in defaults
        assert lacks == (name in NO_MOMENTUM or name.lower() in NO_MOMENTUM), name
