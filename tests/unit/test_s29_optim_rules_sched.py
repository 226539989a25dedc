"""DS234 (scheduler values DeepSpeed 0.19.8's lr_schedules.py raises on when it builds the schedule) and DS235
(values it takes and mishandles). The behaviours pinned here were measured by building the real DeepSpeed
schedules on a one-parameter torch optimizer (see the rule explanations); these tests need neither."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.dsconfig.rules import RULES
from dstoolkit.validate import validate_config

ROOT = Path(__file__).resolve().parents[2]
BASE = {"train_micro_batch_size_per_gpu": 1}
CODES = ("DS234", "DS235")


def findings(cfg, codes=CODES, **ctx):
    return [(f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx) if f.code in codes]


def sched(type_, params, **top):
    return {**BASE, "scheduler": {"type": type_, "params": params}, **top}


# -- DS234 ---------------------------------------------------------------------------------------------------
def test_warmup_steps_written_as_a_float_is_refused():
    # strict: DeepSpeed's own hjson reader turns 1e3 into 1000; hf: HF's json.load keeps the float and WarmupLR raises
    cfg = sched("WarmupLR", {"warmup_max_lr": 1e-3, "warmup_num_steps": 1e3})
    assert findings(cfg) == []
    assert findings(cfg, mode="hf") == [
        ("DS234", "/scheduler/params/warmup_num_steps",
         "scheduler.params warmup_num_steps=1000.0: HF Trainer / Accelerate read the file with json.load, which keeps "
         "the float (accelerate/utils/deepspeed.py), and WarmupLR raises ValueError('warmup_num_steps must be a "
         "positive integer, got 1000.0') (runtime/lr_schedules.py: `not isinstance(warmup_num_steps, int) or "
         "warmup_num_steps <= 0`)", 'write it as an integer: "warmup_num_steps": 1000')]


@pytest.mark.parametrize("type_", ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"])
@pytest.mark.parametrize("steps, got", [(0, "0"), (-5, "-5"), ("10", "10"), (None, "None"), (False, "False"),
                                        (2.5, "2.5")])
def test_warmup_steps_deepspeed_refuses(type_, steps, got):
    params = {"warmup_num_steps": steps, **({} if type_ == "WarmupLR" else {"total_num_steps": 100})}
    [(code, pointer, message, fix)] = findings(sched(type_, params), codes=("DS234",))
    assert (code, pointer) == ("DS234", "/scheduler/params/warmup_num_steps")
    assert f"{type_} raises ValueError('warmup_num_steps must be a positive integer, got {got}')" in message
    assert fix == "use a positive whole number of steps, e.g. 1000 (the default)"


@pytest.mark.parametrize("steps", [1, 2, 1000, True, "auto"])
def test_warmup_steps_deepspeed_accepts(steps):
    for type_ in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        params = {"warmup_num_steps": steps, **({} if type_ == "WarmupLR" else {"total_num_steps": 10000})}
        assert findings(sched(type_, params), codes=("DS234",), mode="hf") == []
        # HF fills "auto" with max(1, warmup_steps) since DeepSpeed 0.19.6 (transformers integrations/deepspeed.py);
        # a 0 written by hand is refused
        assert [c for c, *_ in findings(sched(type_, {**params, "warmup_num_steps": 0}), mode="hf")] == ["DS234"]


def test_range_test_and_one_cycle_sizes():
    [(_, pointer, message, _)] = findings(sched("LRRangeTest", {"lr_range_test_step_size": 100.0}), mode="hf")
    assert pointer == "/scheduler/params/lr_range_test_step_size"
    assert "LRRangeTest raises ValueError('lr_range_test_step_size must be a positive integer, got 100.0')" in message
    one = {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3}
    assert findings(sched("OneCycle", {**one, "cycle_first_step_size": 0, "cycle_second_step_size": -1})) == [
        ("DS234", "/scheduler/params/cycle_first_step_size",
         "scheduler.params cycle_first_step_size=0: OneCycle raises ValueError('cycle_first_step_size must be "
         "positive, got 0.0') (runtime/lr_schedules.py OneCycle._initialize_cycle); cycle_second_step_size=-1: "
         "OneCycle raises ValueError('cycle_second_step_size must be non-negative, got -1.0') (runtime/lr_schedules.py "
         "OneCycle._initialize_cycle)",
         "use a positive number of steps, e.g. 2000 (the default); use >= 0, or leave it out (it then equals "
         "cycle_first_step_size)")]
    # floats are fine for OneCycle (it calls float()), and a second half of 0 too
    assert findings(sched("OneCycle", {**one, "cycle_first_step_size": 2.5, "cycle_second_step_size": 0})) == []


def test_ds234_is_an_error_through_pydantic_and_not_checked_for_016():
    cfg = sched("WarmupLR", {"warmup_num_steps": 0})
    with pytest.raises(ValidationError) as info:
        DeepSpeedConfig.model_validate(cfg)
    assert info.value.errors()[0]["ctx"]["error"].code == "DS234"
    assert findings(cfg, deepspeed_version="0.16") == []


# -- DS235 ---------------------------------------------------------------------------------------------------
def test_warmup_min_above_max_falls_then_climbs_back():
    assert findings(sched("WarmupDecayLR", {"total_num_steps": 20, "warmup_min_lr": 0.1, "warmup_max_lr": 0.01,
                                            "warmup_num_steps": 10})) == [
        ("DS235", "/scheduler/params/warmup_min_lr",
         "WarmupDecayLR: warmup_min_lr=0.1 > warmup_max_lr=0.01: the LR falls from 0.1 to 0.01 during warmup, then "
         "climbs back to 0.1 over the decay (runtime/lr_schedules.py WarmupLR.get_lr: min_lr + (max_lr - min_lr) * "
         "gamma)",
         "warmup_min_lr is where warmup starts (e.g. 0) and warmup_max_lr the peak: make warmup_min_lr <= "
         "warmup_max_lr")]


def test_warmup_defaults_for_the_max():
    # WarmupDecayLR's warmup_max_lr defaults to 0.001, WarmupLR's to the optimizer's lr
    [(_, _, message, _)] = findings(sched("WarmupDecayLR", {"total_num_steps": 20, "warmup_min_lr": 0.02,
                                                            "warmup_num_steps": 10}))
    assert message.startswith("WarmupDecayLR: warmup_min_lr=0.02 > warmup_max_lr=0.001 (WarmupDecayLR's default): the "
                              "LR falls from 0.02 to 0.001")
    cfg = sched("WarmupLR", {"warmup_min_lr": 0.5}, optimizer={"type": "SGD", "params": {"lr": 0.1}})
    assert findings(cfg)[0][2].startswith("WarmupLR: warmup_min_lr=0.5 > warmup_max_lr=0.1 (optimizer.params.lr): ")
    assert findings(sched("WarmupLR", {"warmup_min_lr": 0.5})) == []  # no optimizer section: its lr is unknown
    assert findings(sched("WarmupLR", {"warmup_min_lr": 0.1, "warmup_max_lr": 0.1})) == []


def test_negative_lrs_and_unknown_warmup_type():
    [(_, pointer, message, fix)] = findings(sched("WarmupLR", {"warmup_min_lr": -0.01, "warmup_max_lr": 0.01,
                                                              "warmup_type": "Linear"}))
    assert pointer == "/scheduler/params/warmup_type"
    assert message == ("WarmupLR: warmup_type='Linear' is neither 'log' nor 'linear': DeepSpeed logs 'Using unknown "
                       "warmup_type' and warms up with log (runtime/lr_schedules.py WarmupLR.__init__); warmup_min_lr="
                       "-0.01: a negative learning rate trains uphill (WarmupLR sets it on the optimizer unchecked)")
    assert fix == 'use "linear" or "log" (the default); warmup_min_lr must be >= 0'
    for wt in ("log", "linear", "auto"):
        assert findings(sched("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 5, "warmup_type": wt}),
                        mode="hf") == []


@pytest.mark.parametrize("type_, floor", [("WarmupDecayLR", "warmup_min_lr"), ("WarmupCosineLR", "cos_min_ratio x lr")])
def test_total_steps_shorter_than_warmup(type_, floor):
    [(_, pointer, message, fix)] = findings(sched(type_, {"total_num_steps": 5, "warmup_num_steps": 10}))
    assert (pointer, fix) == ("/scheduler/params/total_num_steps",
                              "total_num_steps counts the warmup too: make it >= warmup_num_steps")
    assert message == (f"{type_}: total_num_steps=5 < warmup_num_steps=10: DeepSpeed only logs it; the LR drops to "
                       f"{floor} when warmup ends at step 10 and stays there (runtime/lr_schedules.py {type_})")
    # the default warmup is 1000 steps
    assert "warmup_num_steps (default)" in findings(sched(type_, {"total_num_steps": 500}))[0][2]
    assert findings(sched(type_, {"total_num_steps": 10, "warmup_num_steps": 10})) == []
    assert findings(sched(type_, {"total_num_steps": "auto", "warmup_num_steps": "auto"}), mode="hf") == []


@pytest.mark.parametrize("params, pointer, says", [
    ({"warmup_min_ratio": 2.0}, "warmup_min_ratio", "the LR falls during warmup, from 2 x lr to lr"),
    ({"warmup_min_ratio": -0.5}, "warmup_min_ratio", "the LR starts at -0.5 x lr, negative: a negative learning rate "
                                                     "trains uphill"),
    ({"cos_min_ratio": 2.0}, "cos_min_ratio", "the LR rises after warmup, from lr to 2 x lr, instead of decaying"),
    ({"cos_min_ratio": -0.5}, "cos_min_ratio", "the cosine is clamped at 0, so the LR reaches 0 before "
                                               "total_num_steps and the last steps train nothing"),
])
def test_cosine_ratios(params, pointer, says):
    cfg = sched("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 10, **params})
    [(_, ptr, message, fix)] = findings(cfg)
    assert (ptr, fix) == (f"/scheduler/params/{pointer}", f"{pointer} must be in [0, 1]")
    assert message == (f"WarmupCosineLR: {pointer}={params[pointer]!r}: {says} (runtime/lr_schedules.py "
                       "WarmupCosineLR.get_lr_ratio)")
    for ok in (0.0, 1.0):
        assert findings(sched("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 10, pointer: ok})) == []


ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
CYCLE = {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 5}


def test_one_cycle_upside_down_and_negative_decay():
    [(_, pointer, message, fix)] = findings(sched("OneCycle", {**CYCLE, "cycle_min_lr": 0.1, "cycle_max_lr": 0.01,
                                                              "decay_step_size": 2, "decay_lr_rate": -0.5}))
    assert pointer == "/scheduler/params/cycle_min_lr"
    assert message == ("OneCycle: cycle_min_lr=0.1 > cycle_max_lr=0.01: the cycle runs upside down, the LR falls from "
                       "0.1 towards 0.01 and the post-cycle phase runs at 0.1, the larger (runtime/lr_schedules.py "
                       "OneCycle._get_cycle_lr); decay_lr_rate=-0.5 with decay_step_size=2: after the cycle the LR is "
                       "cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size), whose divisor reaches 0 after 4 "
                       "steps: the LR grows, then DeepSpeed divides by zero (ZeroDivisionError) or the LR turns "
                       "negative (runtime/lr_schedules.py OneCycle._get_decay_lr)")
    assert fix == "make cycle_min_lr <= cycle_max_lr; decay_lr_rate and decay_step_size must be >= 0"
    assert findings(sched("OneCycle", {**CYCLE, "decay_step_size": 1000, "decay_lr_rate": 0.01})) == []
    assert findings(sched("OneCycle", {**CYCLE, "decay_step_size": 0, "decay_lr_rate": -0.5})) == []  # decay off


def test_one_cycle_momentum_needs_an_optimizer_with_betas():
    bad = {**CYCLE, "cycle_max_mom": 1.2}
    [(_, pointer, message, _)] = findings(sched("OneCycle", bad, **ADAM))
    assert pointer == "/scheduler/params/cycle_max_mom"
    assert message.startswith("OneCycle: cycle_max_mom=1.2: OneCycle sets beta1 of Adam to it unchecked; outside "
                              "[0, 1) the step divides by a zero or negative bias correction 1 - beta1^t")
    # SGD has no betas (DeepSpeed disables the momentum cycle), cycle_momentum false, or no optimizer section
    assert findings(sched("OneCycle", bad, optimizer={"type": "SGD", "params": {"lr": 0.1}})) == []
    assert findings(sched("OneCycle", {**bad, "cycle_momentum": False}, **ADAM)) == []
    assert findings(sched("OneCycle", bad)) == []


@pytest.mark.parametrize("rate, where, steps", [(0.5, "passes 1", 1), (0.01, "passes 1", 23), (-0.5, "falls to 0", 4)])
def test_one_cycle_momentum_decay_leaves_the_unit_interval(rate, where, steps):
    [(_, pointer, message, fix)] = findings(sched("OneCycle", {**CYCLE, "decay_step_size": 2, "decay_mom_rate": rate},
                                                  **ADAM))
    assert (pointer, fix) == ("/scheduler/params/decay_mom_rate", 'use "decay_mom_rate": 0 (the default)')
    assert message == (f"OneCycle: decay_mom_rate={rate:g}: after the cycle OneCycle sets beta1 to cycle_max_mom * (1 + "
                       f"decay_mom_rate * k / decay_step_size), unbounded, so beta1 {where} after {steps} post-cycle "
                       "steps (runtime/lr_schedules.py OneCycle._get_decay_mom)")


def test_one_cycle_replaces_the_configured_beta2():
    cfg = sched("OneCycle", CYCLE, optimizer={"type": "AdamW", "params": {"betas": [0.9, 0.999]}})
    assert findings(cfg) == [
        ("DS235", "/optimizer/params/betas/1",
         "OneCycle: cycle_momentum (on by default) replaces optimizer.params.betas[1]=0.999 with 0.99 from the first "
         "step: OneCycle sets each group's betas to (momentum, 0.99) (runtime/lr_schedules.py "
         "OneCycle._initialize_momentum, step)",
         'set "cycle_momentum": false to keep the optimizer\'s betas, or write betas[1] as 0.99')]
    assert findings(sched("OneCycle", CYCLE, optimizer={"type": "AdamW", "params": {"betas": [0.9, 0.99]}})) == []
    assert findings(sched("OneCycle", {**CYCLE, "cycle_momentum": False},
                          optimizer={"type": "AdamW", "params": {"betas": [0.9, 0.999]}})) == []


def test_range_test_going_negative():
    [(_, pointer, message, fix)] = findings(sched("LRRangeTest", {"lr_range_test_min_lr": 0.01,
                                                                 "lr_range_test_step_size": 2,
                                                                 "lr_range_test_step_rate": -0.5}))
    assert (pointer, fix) == ("/scheduler/params/lr_range_test_step_rate",
                              "lr_range_test_step_rate must be >= 0 (the test raises the LR)")
    assert message == ("LRRangeTest: lr_range_test_step_rate=-0.5: the LR is lr_range_test_min_lr * (1 + step_rate * k "
                       "/ step_size), which falls to 0 after 4 steps and then turns negative (runtime/lr_schedules.py "
                       "LRRangeTest.get_lr)")
    assert findings(sched("LRRangeTest", {"lr_range_test_min_lr": -0.01}))[0][1] == \
        "/scheduler/params/lr_range_test_min_lr"
    assert findings(sched("LRRangeTest", {"lr_range_test_min_lr": 0.0, "lr_range_test_step_rate": 0})) == []


def test_ds235_is_a_warning_pydantic_accepts_and_016_is_not_checked():
    cfg = sched("WarmupLR", {"warmup_min_lr": 0.1, "warmup_max_lr": 0.01})
    assert [(f.code, f.severity) for f in validate_config(cfg) if f.code in CODES] == [("DS235", "warning")]
    DeepSpeedConfig.model_validate(cfg)  # warnings are not raised by the model
    assert findings(cfg, deepspeed_version="0.16") == []


def test_registry_entries_and_order():
    assert (RULES["DS234"].title, RULES["DS234"].severity) == (
        "scheduler value DeepSpeed refuses when it builds the schedule", "error")
    assert (RULES["DS235"].title, RULES["DS235"].severity) == (
        "scheduler value that makes the LR schedule misbehave", "warning")
    codes = list(RULES)
    assert codes.index("DS233") < codes.index("DS234") < codes.index("DS235") < codes.index("DS213")


def test_hf_template_and_torch_schedulers_stay_clean():
    hf = sched("WarmupDecayLR", {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                                 "total_num_steps": "auto"}, optimizer={"type": "AdamW", "params": {"lr": "auto"}})
    assert findings(hf, mode="hf") == [] and findings(hf) == []
    assert findings(sched("CosineAnnealingLR", {"T_max": -1})) == []
    assert findings(sched("WarmupLR", {"warmup_min_lr": [0.1, 0.2], "warmup_max_lr": 0.01})) == []  # per-group lists
    assert [c for c, *_ in findings(sched("WarmupLR", {"warmup_min_lr": 0.1, "warmup_max_lr": 0.01}))] == ["DS235"]


def test_corpus_findings_are_the_one_onecycle_beta2():
    """Both corpora (the repo's and /work/shared's are the same 108 files): only QANet's OneCycle + Adam(betas
    [0.8, 0.999]) config gets a new finding, in both modes; its beta2 becomes 0.99 when DeepSpeed builds the
    schedule (measured)."""
    got = {}
    for path in sorted((ROOT / "tests" / "corpus").iterdir()):
        if path.name == "SOURCES.tsv":
            continue
        text = path.read_bytes().decode("utf-8", "replace")
        for mode in ("strict", "hf"):
            for f in validate_config(text, mode=mode):
                if f.code in ("DS233",) + CODES:
                    got.setdefault(path.name, set()).add((mode, f.code, f.pointer))
    assert got == {"microsoft__DeepSpeedExamples__QANet-Pytorch__ds_bsz512_1cycle.json": {
        ("strict", "DS235", "/optimizer/params/betas/1"), ("hf", "DS235", "/optimizer/params/betas/1")}}
