"""DS240: optimizer.params and scheduler.params values of the wrong JSON type. DeepSpeed passes both sections on
unchanged (no pydantic model types them), so a quoted number, a null or a one-item betas reaches Python arithmetic
in the optimizer or the schedule and raises, or, for a flag written as a string, is tested for truth ("false" is
true). The kind each key needs is declared once in ``dstoolkit.dsconfig.facts`` (OPTIMIZER_PARAM_KINDS,
SCHEDULER_PARAM_KINDS); the value rules (DS230, DS233-DS235) skip what is not a number and leave it here. Declared
with `dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules`` imports this module (import that, never this
module alone).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from dstoolkit.dsconfig.facts import (BOOL, FLOATABLE, NUMBERS, OPTIMIZER_PARAM_KIND_OVERRIDES,
                                      OPTIMIZER_PARAM_KINDS, PAIR, PAIR_NONE_FIRST, SCHEDULER_PARAM_KINDS,
                                      SCHEDULER_REQUIRED)
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section
from dstoolkit.dsconfig.rules_optim import optimizer_build

PAIR_EXAMPLES = {"betas": [0.9, 0.999], "etas": [0.5, 1.2], "step_sizes": [1e-06, 50], "eps": [None, 0.001]}
"""A legal pair for each pair-valued key (torch's defaults), for the fix."""


@dataclass(frozen=True)
class TypeProblem:
    """One value of the wrong type: where, what it is, the fix."""

    key: str
    shown: str
    fix: str
    flag: bool = False
    """A flag written as a string (taken as true, not refused)."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _numeric_text(v: Any) -> Optional[str]:
    """The number in a quoted number ("1e-3", " 0.9 "), else None."""
    if not isinstance(v, str):
        return None
    try:
        return v.strip() if math.isfinite(float(v)) else None
    except ValueError:
        return None


def _what(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean, which Python does arithmetic with as 1 or 0"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    return "an object" if isinstance(v, dict) else type(v).__name__


def _pair_problem(key: str, v: Any, none_first: bool) -> Optional[str]:
    """Why `v` is not a pair (exactly two numbers; the first may be null when `none_first`), or None."""
    if not isinstance(v, list):
        return _what(v)
    if len(v) != 2:
        return f"{len(v)} item{'' if len(v) == 1 else 's'}, not 2"
    for i, item in enumerate(v):
        if not (_is_number(item) or (item is None and i == 0 and none_first)):
            return f"item {i} is {_what(item)}"
    return None


def _fix(key: str, v: Any, kind: str, required: bool) -> str:
    text = _numeric_text(v)
    if kind in (PAIR, PAIR_NONE_FIRST):
        parts = [_numeric_text(p) for p in v.split(",")] if isinstance(v, str) else [None]
        example = (f"[{', '.join(parts)}]" if len(parts) == 2 and None not in parts else
                   json.dumps(PAIR_EXAMPLES.get(key, [0.9, 0.999])))
        return f"write {key} as a list of two numbers: {example}"
    if kind == BOOL:
        return f"write the boolean without quotes: {v.strip().lower()}" if isinstance(v, str) and v.strip().lower() in (
            "true", "false") else f"write {key} as true or false"
    if text is not None:
        return f"write the number without quotes: {text}"
    if v is None:
        return f"write a number for {key}" + ("" if required else ", or remove it for the default")
    return f"write {key} as a number" + (" or a list of numbers, one per param group" if kind == NUMBERS else "")


def kind_problem(key: str, v: Any, kind: str, required: bool = False) -> Optional[TypeProblem]:
    """The problem with `v` for a key of `kind` (facts: number, numbers, floatable, pair, pair-none-first, bool; a
    trailing "?" also takes null), or None when DeepSpeed takes it. "auto" is check_auto's (DS110 / DS111)."""
    nullable, base = kind.endswith("?"), kind.rstrip("?")
    if isinstance(v, str) and v == "auto":
        return None
    why: Optional[str] = None
    if v is None:
        why = None if nullable or base == BOOL else "not a number"
    elif base in (PAIR, PAIR_NONE_FIRST):
        why = _pair_problem(key, v, base == PAIR_NONE_FIRST)
    elif base == BOOL:
        why = ("a string, which Python takes as true"
               if isinstance(v, str) else _what(v) if isinstance(v, (list, dict)) else None)
    elif base == FLOATABLE:
        why = None if _is_number(v) or _numeric_text(v) is not None else _what(v)
    elif base == NUMBERS and isinstance(v, list):
        bad = [i for i, item in enumerate(v) if not _is_number(item)]
        why = f"item {bad[0]} is {_what(v[bad[0]])}" if bad else None
    elif not _is_number(v):
        why = _what(v)
    if why is None:
        return None
    return TypeProblem(key, f"{key}={json.dumps(v)} ({why})", _fix(key, v, base, required), base == BOOL)


def optimizer_type_problems(cfg: Mapping, version: str = "0.19") -> tuple[str, list[TypeProblem]]:
    """(the class DeepSpeed builds, the optimizer.params values of the wrong type), for a known optimizer.type;
    keys that class does not take are DS210's and skipped."""
    opt = section(cfg, "optimizer")
    name, params = opt.get("type"), opt.get("params")
    if not isinstance(name, str) or not isinstance(params, dict):
        return "", []
    build = optimizer_build(name, params, cfg, version)
    if build is None:
        return "", []
    kinds = {**OPTIMIZER_PARAM_KINDS, **OPTIMIZER_PARAM_KIND_OVERRIDES.get(name, {})}
    out = [p for k, v in params.items() if k in kinds and k in build.keywords
           for p in [kind_problem(k, v, kinds[k], k in build.requires)] if p is not None]
    return build.cls, out


def scheduler_type_problems(cfg: Mapping) -> list[TypeProblem]:
    """The scheduler.params values of the wrong type for a DeepSpeed schedule ([] for torch schedulers: DS239)."""
    sch = section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params")
    if not isinstance(name, str) or name not in SCHEDULER_PARAM_KINDS or not isinstance(params, dict):
        return []
    kinds = SCHEDULER_PARAM_KINDS[name]
    required = SCHEDULER_REQUIRED.get(name, frozenset())
    return [p for k, v in params.items() if k in kinds
            for p in [kind_problem(k, v, kinds[k], k in required)] if p is not None]


@rule("DS240", "optimizer or scheduler value of the wrong type")
def _check_param_types(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.params and scheduler.params reach the optimizer and the LR schedule as written (runtime/engine.py
    _configure_basic_optimizer, _scheduler_from_config), so each value must have the JSON type its constructor
    computes with: a number (not "1e-3", not null), a list of exactly two numbers for betas / etas / step_sizes
    (torch.optim.Adafactor's eps may start with null), a number or a per-param-group list of numbers for the
    DeepSpeed schedules' lr and momentum bounds, and true / false for flags. Measured on a 1-rank gloo engine
    (DeepSpeed 0.19.8, torch 2.13): FusedAdam with lr / eps "1e-3" or weight_decay null raises TypeError
    (multi_tensor_adam) at its first step, betas [0.9], "0.9,0.999" or three items raise ValueError (unpacking two
    betas); torch's SGD momentum "0.9", RMSprop alpha "0.99" and Adagrad lr "0.01" raise TypeError in their range
    checks and Rprop etas [0.5] IndexError; "amsgrad": "false" makes FusedAdam raise RuntimeError (it does not do
    AMSGrad) and torch's AdamW (torch_adam) silently run AMSGrad; "nesterov": "false" makes SGD raise ValueError;
    "lr": true trains at lr 1. WarmupLR's warmup_max_lr "1e-3" or warmup_min_lr null, WarmupDecayLR's
    total_num_steps "100", WarmupCosineLR's warmup_min_ratio null, OneCycle's cycle_min_lr "0.1", decay_lr_rate
    null and cycle_first_stair_count "0", LRRangeTest's lr_range_test_min_lr "0.001" and step_rate "1.0" raise
    TypeError at deepspeed.initialize or the first step; where the TypeError comes from the schedule's step() the
    engine retries step(train_batch_size) instead of failing (runtime/engine.py _take_model_step), so
    WarmupCosineLR's cos_min_ratio "0.1" makes the LR cycle through warmup forever and last_batch_iteration "-1"
    restarts the schedule at step train_batch_size; "cycle_momentum": "false" and "lr_range_test_staircase":
    "false" turn those on. OneCycle float()s its step sizes, so "2000" is taken there. Keys the class does not take
    (DS210, DS212), warmup_num_steps and lr_range_test_step_size (DS234) and "auto" (DS110 / DS111) are reported
    by those rules; torch schedulers' values are DS239's."""
    cls, opt = optimizer_type_problems(cfg, ctx.deepspeed_version)
    sch = scheduler_type_problems(cfg)
    owners = (("optimizer", opt, cls), ("scheduler", sch, section(cfg, "scheduler").get("type")))
    parts = [f"{where}.params {', '.join(p.shown for p in found)}: DeepSpeed hands "
             f"{'it' if len(found) == 1 else 'them'} to {owner} as written" for where, found, owner in owners if found]
    if not parts:
        return
    found = opt + sch
    values = [p for p in found if not p.flag]
    tail = []
    if values:
        tail.append(f"Python arithmetic on {'it' if len(values) == 1 else 'them'} fails with TypeError, IndexError or "
                    "ValueError at deepspeed.initialize or a later step")
    if len(values) < len(found):
        tail.append("a flag written as a string is tested for truth, so \"false\" turns it on")
    effect = "; ".join(tail)
    raise RuleViolation(f"/{'optimizer' if opt else 'scheduler'}/params/{found[0].key}",
                        f"{'; '.join(parts)}. {effect[0].upper()}{effect[1:]}",
                        "; ".join(dict.fromkeys(p.fix for p in found)))
