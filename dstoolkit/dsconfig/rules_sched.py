"""The LR schedule's values (DS234-DS235): DeepSpeed 0.19.8 builds scheduler.type from deepspeed/runtime/
lr_schedules.py with scheduler.params as keyword arguments (engine.py _scheduler_from_config). A few values make
the constructor raise (DS234, an error); others are taken and make the schedule do something the config did not
ask for (DS235, a warning): the LR falls during warmup, turns negative, drops to its floor as warmup ends, or the
optimizer's beta1 leaves [0, 1). Each claim was checked by building the real schedule on a one-parameter torch
optimizer and stepping it. Declared with `dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules``
imports this module after the optimizer rules (import that, never this module alone).

Only DeepSpeed 0.19 is checked: 0.16's lr_schedules.py (warmup_num_steps went through max(2, n) unchecked) is not
installed here to read.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, as_deepspeed_reads, rule, section
from dstoolkit.dsconfig.rules_optim import _number

SOURCE = "runtime/lr_schedules.py"
WARMUP_SCHEDULES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
WARMUP_TYPES = ("log", "linear")
"""WarmupLR / WarmupCosineLR: anything else logs 'Using unknown warmup_type' and warms up with log."""
STEP_DEFAULTS = {"warmup_num_steps": 1000, "lr_range_test_step_size": 2000}
"""The integer step counts DeepSpeed checks with `isinstance(n, int) and n > 0`, and their defaults."""
BETAS_OPTIMIZERS = frozenset({"adam", "adamw", "lamb", "lion", "muadam", "muadamw", "Adamax", "NAdam", "RAdam",
                              "SparseAdam"})
"""optimizer.type (DeepSpeed's lower case, torch's exact case) whose optimizer has 'betas' in its defaults:
OneCycle cycles beta1 only for these ('cycle_momentum is disabled because optimizer ... does not support
momentum' otherwise). FusedAdam, DeepSpeedCPUAdam, FusedLamb, FusedLion, DeepSpeedCPULion and torch's Adam family
all do; MuonWithAuxAdam, Adagrad and SGD do not."""
ONECYCLE_BETA2 = 0.99
"""OneCycle._initialize_momentum and step set each group's betas to (momentum, 0.99)."""


@dataclass(frozen=True)
class SchedProblem:
    """One scheduler value: its pointer, what happens (value and consequence), the fix."""

    pointer: str
    message: str
    fix: str


def _get(params: Mapping, key: str, default: Any) -> Optional[float]:
    """params[key] (or the schedule's default when absent) as a finite number; None for "auto", lists, strings."""
    return _number(params.get(key, default))


def _written(params: Mapping, key: str) -> str:
    return f"{key}={params[key]!r}" if key in params else f"{key} (default)"


def _ptr(key: str) -> str:
    return f"/scheduler/params/{key}"


# -- DS234: what the constructors raise on --------------------------------------------------------------------
def refused(name: str, params: Mapping, mode: str = "strict") -> list[SchedProblem]:
    """The values `name`'s constructor raises ValueError on (0.19.8 lr_schedules.py), each as DeepSpeed receives it
    in `mode` (`as_deepspeed_reads`: strict, DeepSpeed's hjson reader makes an integral float below 1e10 an int; hf,
    HF's json.load keeps the float)."""
    out = []
    for key, default in STEP_DEFAULTS.items():
        owner = WARMUP_SCHEDULES if key == "warmup_num_steps" else ("LRRangeTest",)
        v = params.get(key, default)
        seen = as_deepspeed_reads(v, mode)
        if name not in owner or v == "auto" or (isinstance(seen, int) and seen > 0):
            continue
        integral = _number(v) is not None and v > 0 and float(v).is_integer()
        via = ("HF Trainer / Accelerate read the file with json.load, which keeps the float (accelerate/utils/"
               "deepspeed.py), and " if integral and mode == "hf" else "")
        out.append(SchedProblem(_ptr(key), f"{key}={v!r}: {via}{name} raises ValueError('{key} must be a positive "
                                f"integer, got {v}') ({SOURCE}: `not isinstance({key}, int) or {key} <= 0`)",
                                f'write it as an integer: "{key}": {int(v)}' if integral else
                                f"use a positive whole number of steps, e.g. {default} (the default)"))
    if name == "OneCycle":
        # OneCycle._initialize_cycle: float() of each, then `<= 0` / `< 0` raise
        for key, default, test, must in (("cycle_first_step_size", 2000, lambda x: x <= 0, "positive"),
                                         ("cycle_second_step_size", None, lambda x: x < 0, "non-negative")):
            v = _get(params, key, default)
            if v is not None and test(v):
                out.append(SchedProblem(_ptr(key), f"{key}={params[key]!r}: OneCycle raises ValueError('{key} must be "
                                        f"{must}, got {v}') ({SOURCE} OneCycle._initialize_cycle)",
                                        "use a positive number of steps, e.g. 2000 (the default)" if default else
                                        "use >= 0, or leave it out (it then equals cycle_first_step_size)"))
    return out


@rule("DS234", "scheduler value DeepSpeed refuses when it builds the schedule")
def _check_scheduler_refused(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed 0.19.8 builds the LR schedule at deepspeed.initialize and its constructors raise ValueError
    (runtime/lr_schedules.py): WarmupLR, WarmupDecayLR and WarmupCosineLR need warmup_num_steps to be a positive
    int ('warmup_num_steps must be a positive integer, got ...': `not isinstance(warmup_num_steps, int) or
    warmup_num_steps <= 0`, so 0, negatives, null, strings and 1000.5 fail), LRRangeTest the same of
    lr_range_test_step_size, and OneCycle needs cycle_first_step_size > 0 and cycle_second_step_size >= 0
    (OneCycle._initialize_cycle). A number written as a float is judged as DeepSpeed receives it
    (registry.as_deepspeed_reads): in strict mode DeepSpeed reads the file with hjson, which turns 1000.0, 1e3 or
    2e0 into the ints 1000 and 2 but keeps 1e10 and 1e30 floats (measured with deepspeed.initialize(config=path):
    the first three build WarmupLR, the last two raise); in hf mode HF Trainer / Accelerate read it with json.load
    and pass the float on, which DeepSpeed refuses (measured: 1000.0 in a dict raises). "auto" is left to the other
    findings (HF fills it). Checked for 0.19 only: 0.16's lr_schedules.py is not installed here to read."""
    sch = section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params", {})
    if not ctx.deepspeed_version.startswith("0.19") or not isinstance(name, str) or not isinstance(params, dict):
        return
    problems = refused(name, params, ctx.mode)
    if problems:
        raise RuleViolation(problems[0].pointer, f"scheduler.params {'; '.join(p.message for p in problems)}",
                            "; ".join(p.fix for p in problems))


# -- DS235: what they take and mishandle ---------------------------------------------------------------------
_UPHILL = "a negative learning rate trains uphill"


def _warmup(name: str, params: Mapping, cfg: Mapping, mode: str) -> list[SchedProblem]:
    out = []
    wt = params.get("warmup_type")
    if "warmup_type" in params and wt != "auto" and wt not in WARMUP_TYPES:
        out.append(SchedProblem(_ptr("warmup_type"), f"warmup_type={wt!r} is neither 'log' nor 'linear': DeepSpeed "
                                f"logs 'Using unknown warmup_type' and warms up with log ({SOURCE} "
                                f"{'WarmupCosineLR' if name == 'WarmupCosineLR' else 'WarmupLR'}.__init__)",
                                'use "linear" or "log" (the default)'))
    if name in ("WarmupLR", "WarmupDecayLR"):
        opt_lr = _number(section(section(cfg, "optimizer"), "params").get("lr"))
        lo = _get(params, "warmup_min_lr", 0.0)
        hi = _get(params, "warmup_max_lr", 0.001 if name == "WarmupDecayLR" else opt_lr)
        for key, v in (("warmup_min_lr", lo), ("warmup_max_lr", hi)):
            if key in params and v is not None and v < 0:
                out.append(SchedProblem(_ptr(key), f"{key}={params[key]!r}: {_UPHILL} ({name} sets it on the "
                                        "optimizer unchecked)", f"{key} must be >= 0"))
        if lo is not None and hi is not None and lo > hi:
            back = f", then climbs back to {lo:g} over the decay" if name == "WarmupDecayLR" else ""
            default = " (WarmupDecayLR's default)" if name == "WarmupDecayLR" else " (optimizer.params.lr)"
            out.append(SchedProblem(_ptr("warmup_min_lr"), f"{_written(params, 'warmup_min_lr')} > warmup_max_lr="
                                    f"{hi:g}{'' if 'warmup_max_lr' in params else default}: the LR falls from {lo:g} "
                                    f"to {hi:g} during warmup{back} ({SOURCE} WarmupLR.get_lr: min_lr + (max_lr - "
                                    "min_lr) * gamma)", "warmup_min_lr is where warmup starts (e.g. 0) and "
                                    "warmup_max_lr the peak: make warmup_min_lr <= warmup_max_lr"))
    total, warm = _get(params, "total_num_steps", None), as_deepspeed_reads(params.get("warmup_num_steps", 1000), mode)
    if name != "WarmupLR" and total is not None and isinstance(warm, int) and warm > 0 and total < max(2, warm):
        floor = "warmup_min_lr" if name == "WarmupDecayLR" else "cos_min_ratio x lr"
        out.append(SchedProblem(_ptr("total_num_steps"), f"total_num_steps={params['total_num_steps']!r} < "
                                f"{_written(params, 'warmup_num_steps')}: DeepSpeed only logs it; the LR drops to "
                                f"{floor} when warmup ends at step {max(2, warm)} and stays there ({SOURCE} "
                                f"{name})", "total_num_steps counts the warmup too: make it >= warmup_num_steps"))
    if name == "WarmupCosineLR":
        for key, default, above, below in (
                ("warmup_min_ratio", 0.0, "the LR falls during warmup, from {r:g} x lr to lr",
                 "the LR starts at {r:g} x lr, negative: " + _UPHILL),
                ("cos_min_ratio", 0.0001, "the LR rises after warmup, from lr to {r:g} x lr, instead of decaying",
                 "the cosine is clamped at 0, so the LR reaches 0 before total_num_steps and the last steps train "
                 "nothing")):
            r = _get(params, key, default)
            if r is not None and not 0.0 <= r <= 1.0:
                out.append(SchedProblem(_ptr(key), f"{key}={params[key]!r}: "
                                        f"{(above if r > 1 else below).format(r=r)} ({SOURCE} "
                                        "WarmupCosineLR.get_lr_ratio)", f"{key} must be in [0, 1]"))
    return out


def _one_cycle(params: Mapping, cfg: Mapping) -> list[SchedProblem]:
    out = []
    lo, hi = _get(params, "cycle_min_lr", None), _get(params, "cycle_max_lr", None)
    for key, v in (("cycle_min_lr", lo), ("cycle_max_lr", hi)):
        if v is not None and v < 0:
            out.append(SchedProblem(_ptr(key), f"{key}={params[key]!r}: {_UPHILL} (OneCycle sets it on the optimizer "
                                    "unchecked)", f"{key} must be >= 0"))
    if lo is not None and hi is not None and lo > hi:
        out.append(SchedProblem(_ptr("cycle_min_lr"), f"cycle_min_lr={lo:g} > cycle_max_lr={hi:g}: the cycle runs "
                                f"upside down, the LR falls from {lo:g} towards {hi:g} and the post-cycle phase runs at "
                                f"{lo:g}, the larger ({SOURCE} OneCycle._get_cycle_lr)",
                                "make cycle_min_lr <= cycle_max_lr"))
    dss = _get(params, "decay_step_size", 0)
    rate = _get(params, "decay_lr_rate", 0.0)
    if dss is not None and rate is not None and not math.isclose(dss, 0) and rate / dss < 0:
        out.append(SchedProblem(_ptr("decay_lr_rate"), f"decay_lr_rate={rate:g} with decay_step_size={dss:g}: after "
                                f"the cycle the LR is cycle_min_lr / (1 + decay_lr_rate * k / decay_step_size), whose "
                                f"divisor reaches 0 after {abs(dss / rate):g} steps: the LR grows, then DeepSpeed "
                                "divides by zero (ZeroDivisionError) or the LR turns negative "
                                f"({SOURCE} OneCycle._get_decay_lr)", "decay_lr_rate and decay_step_size must be >= 0"))
    opt = section(cfg, "optimizer")
    kind = opt.get("type") if isinstance(opt.get("type"), str) else ""
    if params.get("cycle_momentum", True) is False or (kind.lower() not in BETAS_OPTIMIZERS
                                                      and kind not in BETAS_OPTIMIZERS):
        return out
    moms = {k: _get(params, k, d) for k, d in (("cycle_min_mom", 0.8), ("cycle_max_mom", 0.9))}
    for key, v in moms.items():
        if v is not None and not 0.0 <= v < 1.0:
            out.append(SchedProblem(_ptr(key), f"{key}={params[key]!r}: OneCycle sets beta1 of {kind} to it unchecked; "
                                    "outside [0, 1) the step divides by a zero or negative bias correction 1 - beta1^t "
                                    f"or the moments grow without bound ({SOURCE} OneCycle.step)",
                                    f"{key} must be in [0, 1)"))
    mom_rate, top = _get(params, "decay_mom_rate", 0.0), moms["cycle_max_mom"]
    leaves = _beta1_leaves(mom_rate, dss, top)
    if leaves:
        out.append(SchedProblem(_ptr("decay_mom_rate"), f"decay_mom_rate={mom_rate:g}: after the cycle OneCycle sets "
                                "beta1 to cycle_max_mom * (1 + decay_mom_rate * k / decay_step_size), unbounded, so "
                                f"beta1 {leaves[1]} after {leaves[0]} post-cycle steps ({SOURCE} "
                                "OneCycle._get_decay_mom)", 'use "decay_mom_rate": 0 (the default)'))
    betas = section(opt, "params").get("betas")
    b2 = _number(betas[1]) if isinstance(betas, list) and len(betas) == 2 else None
    if b2 is not None and b2 != ONECYCLE_BETA2:
        out.append(SchedProblem("/optimizer/params/betas/1", f"cycle_momentum (on by default) replaces "
                                f"optimizer.params.betas[1]={betas[1]!r} with {ONECYCLE_BETA2} from the first step: "
                                f"OneCycle sets each group's betas to (momentum, {ONECYCLE_BETA2}) ({SOURCE} "
                                "OneCycle._initialize_momentum, step)", f'set "cycle_momentum": false to keep the '
                                f"optimizer's betas, or write betas[1] as {ONECYCLE_BETA2}"))
    return out


def _beta1_leaves(rate: Optional[float], dss: Optional[float], top: Optional[float]) -> Optional[tuple[int, str]]:
    """(post-cycle steps, "passes 1" / "falls to 0") after which OneCycle's decayed beta1, top * (1 + rate * k /
    dss), leaves [0, 1); None when the decay is off (rate or dss 0, as DeepSpeed's math.isclose tests) or never
    gets there in a float's range."""
    if None in (rate, dss, top) or not 0 < top < 1 or math.isclose(dss, 0) or math.isclose(rate, 0):
        return None
    slope = rate / dss
    steps = (1 / top - 1) / slope if slope > 0 else -1 / slope if slope else math.inf
    return (math.ceil(steps), "passes 1" if slope > 0 else "falls to 0") if math.isfinite(steps) else None


def _range_test(params: Mapping) -> list[SchedProblem]:
    out = []
    lo, rate = _get(params, "lr_range_test_min_lr", 1e-3), _get(params, "lr_range_test_step_rate", 1.0)
    size = params.get("lr_range_test_step_size", 2000)
    if lo is not None and lo < 0:
        out.append(SchedProblem(_ptr("lr_range_test_min_lr"), f"lr_range_test_min_lr={params['lr_range_test_min_lr']!r}"
                                f": the test starts negative and grows more negative: {_UPHILL} ({SOURCE} "
                                "LRRangeTest.get_lr)", "lr_range_test_min_lr must be >= 0"))
    if rate is not None and rate < 0 and isinstance(size, int) and size > 0:
        out.append(SchedProblem(_ptr("lr_range_test_step_rate"), f"lr_range_test_step_rate={rate:g}: the LR is "
                                "lr_range_test_min_lr * (1 + step_rate * k / step_size), which falls to 0 after "
                                f"{size / -rate:g} steps and then turns negative ({SOURCE} LRRangeTest.get_lr)",
                                "lr_range_test_step_rate must be >= 0 (the test raises the LR)"))
    return out


def misbehaving(name: str, params: Mapping, cfg: Mapping, mode: str = "strict") -> list[SchedProblem]:
    """The values `name` takes and mishandles (DS235), in the order its constructor and schedule read them."""
    if name in WARMUP_SCHEDULES:
        return _warmup(name, params, cfg, mode)
    if name == "OneCycle":
        return _one_cycle(params, cfg)
    return _range_test(params) if name == "LRRangeTest" else []


@rule("DS235", "scheduler value that makes the LR schedule misbehave", severity="warning")
def _check_scheduler_misbehaves(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed 0.19.8's LR schedules (runtime/lr_schedules.py) take these values without a check, and the
    schedule then does something else than the config says (each built on a one-parameter torch optimizer and
    stepped): warmup_type other than "log" / "linear" is logged and replaced by log; WarmupLR / WarmupDecayLR with
    warmup_min_lr > warmup_max_lr (WarmupDecayLR's default max is 0.001, WarmupLR's the optimizer's lr) make the LR
    fall during warmup (WarmupDecayLR then climbs back to warmup_min_lr), and a negative warmup_min_lr /
    warmup_max_lr / cycle_min_lr / cycle_max_lr / lr_range_test_min_lr trains uphill; WarmupDecayLR and
    WarmupCosineLR with total_num_steps < warmup_num_steps only log it and drop the LR to its floor as warmup ends;
    WarmupCosineLR's warmup_min_ratio and cos_min_ratio outside [0, 1] make the LR fall during warmup or start
    negative, rise after warmup, or hit 0 early (the ratio is clamped at 0); OneCycle with cycle_min_lr >
    cycle_max_lr runs upside down, decay_lr_rate / decay_step_size < 0 drives its divisor to 0 (ZeroDivisionError,
    then negative LRs), and with an optimizer that has betas (Adam family, Lamb, Lion) and cycle_momentum on it
    writes cycle_min_mom / cycle_max_mom into beta1 unchecked (outside [0, 1) Adam divides by 1 - beta1^t <= 0),
    decay_mom_rate != 0 takes beta1 past 1 or below 0 (cycle_max_mom * (1 + decay_mom_rate * k /
    decay_step_size) is unbounded), and every step sets betas to (momentum, 0.99), replacing the
    optimizer.params.betas[1] the config wrote; LRRangeTest with lr_range_test_step_rate < 0 reaches 0 and turns
    negative. "auto" and per-group lists are not checked, values that are not numbers are DS240's; 0.19 only."""
    sch = section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params", {})
    if not ctx.deepspeed_version.startswith("0.19") or not isinstance(name, str) or not isinstance(params, dict):
        return
    problems = misbehaving(name, params, cfg, ctx.mode)
    if problems:
        raise RuleViolation(problems[0].pointer, f"{name}: {'; '.join(p.message for p in problems)}",
                            "; ".join(dict.fromkeys(p.fix for p in problems)))
