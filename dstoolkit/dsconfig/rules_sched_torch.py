"""How DeepSpeed builds the scheduler section (DS238-DS239). DeepSpeed 0.19.8 reads scheduler.type and
scheduler.params raw (runtime/config.py get_scheduler_name / get_scheduler_params: None without the key) and
engine.py _scheduler_from_config builds `cls(self.optimizer, **params)`, cls being its own schedule
(runtime/lr_schedules.py) or else getattr(torch.optim.lr_scheduler, type). DS238: a type without params fails, params
without a type are dropped. DS239: a torch scheduler's constructor must take the keywords given and the optimizer
DeepSpeed hands it, which under ZeRO, fp16 or bf16 is DeepSpeed's wrapper, not a torch Optimizer. Its keywords come
from torch's constructor signatures (facts.TORCH_SCHEDULER_ARGS, checked against inspect.signature by the tests),
its value checks are torch 2.13's own, transcribed below. Each verdict was measured on a 1-rank gloo CPU engine.
Declared with `dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules`` imports this module (import that,
never this module alone).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from dstoolkit.dsconfig.facts import SCHEDULER_PARAMS, TORCH_SCHEDULER_ARGS, TORCH_SCHEDULERS
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section, zero_stage
from dstoolkit.dsconfig.rule_facts import _bf16_section
from dstoolkit.dsconfig.rules_optim import _number, optimizer_build

TORCH_SRC = "torch/optim/lr_scheduler.py"


@rule("DS238", "scheduler.type without params, or params without a type")
def _check_scheduler_section(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed builds the scheduler with `cls(self.optimizer, **scheduler_params)` (runtime/engine.py
    _scheduler_from_config), and runtime/config.py get_scheduler_params returns None when the section has no
    "params" key: a scheduler.type without params raises TypeError('... argument after ** must be a mapping, not
    NoneType') at deepspeed.initialize (measured with WarmupLR; "params": {} builds it with its defaults;
    "params": null fails the same way and is reported by the type check, DS102). The reverse, params without a
    type, is dropped without a word: get_scheduler_name returns None and no scheduler is built, so the LR stays at
    optimizer.params.lr (measured); a warning. HF Trainer does not add either key (it only fills "auto" values that
    are present)."""
    sch = cfg.get("scheduler") if isinstance(cfg, Mapping) else None
    if not isinstance(sch, dict):
        return
    name, params = sch.get("type"), sch.get("params")
    if isinstance(name, str) and (name in SCHEDULER_PARAMS or name in TORCH_SCHEDULERS) and "params" not in sch:
        raise RuleViolation("/scheduler/type",
                            f"scheduler.type {name!r} without scheduler.params: DeepSpeed passes scheduler.params "
                            "with ** and raises TypeError('... argument after ** must be a mapping, not NoneType') "
                            "at engine start (runtime/engine.py _scheduler_from_config)",
                            f'add "params": {{}} to build {name} with its defaults')
    if name is None and isinstance(params, dict) and params:
        raise RuleViolation("/scheduler/params", f"scheduler.params ({', '.join(params)}) without scheduler.type: "
                            "DeepSpeed builds no LR scheduler (runtime/config.py get_scheduler_name returns None) "
                            "and ignores these params, so the LR stays at optimizer.params.lr",
                            'add "type" (e.g. "WarmupLR"), or remove the scheduler section', severity="warning")


def _wrapped(cfg: Mapping, ctx: RuleContext) -> Optional[tuple[str, str]]:
    """(the class DeepSpeed hands the scheduler instead of a torch Optimizer, why), or None when it hands the torch
    optimizer itself (engine.py _do_optimizer_sanity_check / _configure_optimizer: ZeRO stage 1-3 wraps it in the
    ZeRO optimizer; fp16, and bf16 at stage 0, in FP16_Optimizer for FusedAdam, FP16_UnfusedOptimizer otherwise)."""
    stage = zero_stage(cfg)
    if stage:
        return ("DeepSpeedZeroOptimizer" + ("_Stage3" if stage == 3 else ""), f"zero_optimization.stage={stage}")
    bname, bf16 = _bf16_section(cfg)
    for key, sec in (("fp16", section(cfg, "fp16")), (bname, bf16)):
        if sec.get("enabled") is True:
            opt = section(cfg, "optimizer")
            name, params = opt.get("type"), opt.get("params")
            build = optimizer_build(name, params if isinstance(params, dict) else {}, cfg,
                                    ctx.deepspeed_version) if isinstance(name, str) else None
            cls = ("FP16_Optimizer / FP16_UnfusedOptimizer" if build is None else
                   "FP16_Optimizer" if build.cls == "FusedAdam" else "FP16_UnfusedOptimizer")
            return cls, f"{key}.enabled=true"
    return None


def _num(params: Mapping, key: str, default: Any) -> Optional[float]:
    return _number(params.get(key, default))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# name -> [(key, test(params) -> True when torch refuses, torch's error, fix)]: the constructors' own checks
# (torch 2.13 torch/optim/lr_scheduler.py), plus the two divisions by a step count of 0 (measured: StepLR
# step_size 0 and CosineAnnealingLR T_max 0 raise ZeroDivisionError 'integer modulo by zero').
Check = tuple[str, Callable[[Mapping], bool], str, str]
TORCH_VALUE_CHECKS: dict[str, list[Check]] = {
    "StepLR": [("step_size", lambda p: p.get("step_size") == 0, "ZeroDivisionError('integer modulo by zero') at the "
                "first step", "step_size is the number of steps between decays: use a positive integer")],
    "CosineAnnealingLR": [("T_max", lambda p: p.get("T_max") == 0, "ZeroDivisionError('integer modulo by zero') when "
                           "it is built", "T_max is the number of steps of the half cosine: use a positive integer")],
    "ConstantLR": [("factor", lambda p: (f := _num(p, "factor", 1 / 3)) is not None and not 0 <= f <= 1,
                    "ValueError('Constant multiplicative factor expected to be between 0 and 1.')",
                    "factor must be in [0, 1]")],
    "LinearLR": [("start_factor", lambda p: (f := _num(p, "start_factor", 1 / 3)) is not None and not 0 < f <= 1,
                  "ValueError('Starting multiplicative factor expected to be greater than 0 and less or equal to 1.')",
                  "start_factor must be in (0, 1]"),
                 ("end_factor", lambda p: (f := _num(p, "end_factor", 1.0)) is not None and not 0 <= f <= 1,
                  "ValueError('Ending multiplicative factor expected to be between 0 and 1.')",
                  "end_factor must be in [0, 1]")],
    "CosineAnnealingWarmRestarts": [
        ("T_0", lambda p: "T_0" in p and not (_is_int(p["T_0"]) and p["T_0"] > 0),
         "ValueError('Expected positive integer T_0, but got {v}')", "T_0 must be a positive integer"),
        ("T_mult", lambda p: "T_mult" in p and not (_is_int(p["T_mult"]) and p["T_mult"] >= 1),
         "ValueError('Expected integer T_mult >= 1, but got {v}')", "T_mult must be an integer >= 1")],
    "OneCycleLR": [
        ("total_steps", lambda p: p.get("total_steps") is not None and not (_is_int(p["total_steps"])
                                                                            and p["total_steps"] > 0),
         "ValueError('Expected positive integer total_steps, but got {v}')", "total_steps must be a positive integer"),
        ("total_steps", lambda p: p.get("total_steps") is None and (p.get("epochs") is None
                                                                   or p.get("steps_per_epoch") is None),
         "ValueError('You must define either total_steps OR (epochs AND steps_per_epoch)')",
         'add "total_steps": the number of optimizer steps of the whole run'),
        ("pct_start", lambda p: "pct_start" in p and not (isinstance(p["pct_start"], float)
                                                          and 0 <= p["pct_start"] <= 1),
         "ValueError('Expected float between 0 and 1 pct_start, but got {v}')",
         "pct_start must be a float in [0, 1], written with a decimal point (0.0, not 0)"),
        ("anneal_strategy", lambda p: p.get("anneal_strategy", "cos") not in ("cos", "linear"),
         "ValueError(\"anneal_strategy must be one of 'cos' or 'linear', instead got {v}\")",
         'use "cos" or "linear"')],
    "CyclicLR": [("mode", lambda p: p.get("mode", "triangular") not in ("triangular", "triangular2", "exp_range"),
                  "ValueError('mode is invalid and scale_fn is None')",
                  'use "triangular", "triangular2" or "exp_range"')],
    "ReduceLROnPlateau": [
        ("factor", lambda p: (f := _num(p, "factor", 0.1)) is not None and f >= 1,
         "ValueError('Factor should be < 1.0.')", "factor must be < 1"),
        ("mode", lambda p: p.get("mode", "min") not in ("min", "max"), "ValueError('mode {v} is unknown!')",
         'use "min" or "max"'),
        ("threshold_mode", lambda p: p.get("threshold_mode", "rel") not in ("rel", "abs"),
         "ValueError('threshold mode {v} is unknown!')", 'use "rel" or "abs"')],
}
"""torch scheduler -> the values its constructor (or its first step) refuses, in the order it checks them."""
NO_MOMENTUM = frozenset({"adagrad", "Adadelta", "ASGD", "Adafactor", "LBFGS", "Rprop"})
"""optimizer.type (DeepSpeed's lower case, torch's exact case) whose optimizer has neither 'momentum' nor 'betas' in
its defaults: CyclicLR and OneCycleLR with cycle_momentum on (the default) raise ValueError('optimizer must support
momentum or beta1 with `cycle_momentum` option enabled') (measured with Adagrad)."""


def _problems(name: str, params: Mapping, cfg: Mapping, ctx: RuleContext) -> list[tuple[str, str, str]]:
    """(pointer, what torch / DeepSpeed does, fix) for a torch scheduler, in the order the build meets them."""
    args = TORCH_SCHEDULER_ARGS[name]
    ptr = "/scheduler/params"
    if args.objects:
        return [("/scheduler/type", f"{name} needs {', '.join(args.objects)}: Python "
                 f"{'callables' if 'lr_lambda' in args.objects else 'scheduler instances'}, which a JSON config cannot "
                 "hold, so DeepSpeed cannot build it", f"build the {name} in the training script, or use a DeepSpeed "
                 "schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)")]
    if name == "LRScheduler":
        return [("/scheduler/type", "LRScheduler is torch's abstract base class: its get_lr raises "
                 "NotImplementedError when DeepSpeed builds it", "name a concrete scheduler, e.g. CosineAnnealingLR, "
                 "or a DeepSpeed schedule such as WarmupCosineLR")]
    out = []
    unknown = [k for k in params if k not in args.keywords]
    if unknown:
        error = f"{name}.__init__() got an unexpected keyword argument {unknown[0]!r}"
        out.append((f"{ptr}/{unknown[0]}", f"{', '.join(map(repr, unknown))} not taken by {name}: TypeError({error!r})",
                    f"{name} takes {', '.join(args.keywords)}"))
    missing = [k for k in args.required if k not in params]
    if missing:
        error = (f"{name}.__init__() missing {len(missing)} required positional argument"
                 f"{'s' if len(missing) > 1 else ''}: {', '.join(map(repr, missing))}")
        out.append((ptr, f"{name} needs {', '.join(missing)}: TypeError({error!r})",
                    f'add "{missing[0]}" to scheduler.params'))
    for key, refuses, error, fix in TORCH_VALUE_CHECKS.get(name, []):
        if refuses(params):
            out.append((f"{ptr}/{key}", f"{key}={params.get(key)!r}: {name} raises "
                        f"{error.format(v=params.get(key))} ({TORCH_SRC})", fix))
    kind = section(cfg, "optimizer").get("type")
    if (name in ("CyclicLR", "OneCycleLR") and params.get("cycle_momentum", True) is True and isinstance(kind, str)
            and (kind.lower() in NO_MOMENTUM or kind in NO_MOMENTUM)):
        out.append((f"{ptr}/cycle_momentum", f"cycle_momentum (on by default) with optimizer.type {kind!r}: {name} "
                    "raises ValueError('optimizer must support momentum or beta1 with `cycle_momentum` option "
                    f"enabled') ({TORCH_SRC})", '"cycle_momentum": false'))
    wrapped = _wrapped(cfg, ctx)
    if wrapped:
        cls, why = wrapped
        out.append(("/scheduler/type", f"with {why} DeepSpeed hands {name} its {cls} wrapper, not a torch Optimizer, "
                    f"and torch raises TypeError('{cls} is not an Optimizer') (LRScheduler.__init__; DeepSpeed's own "
                    "schedules unwrap it, lr_schedules.py get_torch_optimizer)", "use a DeepSpeed schedule "
                    "(WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest): torch schedulers from the "
                    "config only work at ZeRO stage 0 without fp16 / bf16"))
    return out


@rule("DS239", "torch LR scheduler DeepSpeed cannot build from the config or steps wrongly")
def _check_torch_scheduler(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed 0.19.8 accepts a torch.optim.lr_scheduler class name as scheduler.type (engine.py
    _scheduler_from_config: getattr(torch.optim.lr_scheduler, type)(self.optimizer, **params)), and refuses it at
    deepspeed.initialize when: the constructor needs Python objects (LambdaLR and MultiplicativeLR a callable
    lr_lambda, SequentialLR and ChainedScheduler scheduler instances) or is the abstract LRScheduler
    (NotImplementedError from get_lr); a keyword is unknown or a required one missing (TypeError; both read from
    torch 2.13's constructor signatures, facts.TORCH_SCHEDULER_ARGS); a value fails the constructor's own check
    (ConstantLR factor in [0, 1], LinearLR start_factor in (0, 1] and end_factor in [0, 1],
    CosineAnnealingWarmRestarts T_0 a positive int and T_mult an int >= 1, OneCycleLR total_steps a positive int or
    epochs and steps_per_epoch, pct_start a float in [0, 1] (0 and 1 written as ints fail), anneal_strategy,
    CyclicLR mode, ReduceLROnPlateau factor < 1, mode and threshold_mode), or divides by 0 (StepLR step_size 0 at
    the first step, CosineAnnealingLR T_max 0); CyclicLR / OneCycleLR cycle momentum on an optimizer with neither
    momentum nor betas (Adagrad, ...); and, whatever the params, when DeepSpeed wraps the optimizer: at ZeRO stage
    1-3 (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3) and with fp16 or bf16 enabled at stage 0
    (FP16_Optimizer for FusedAdam, FP16_UnfusedOptimizer otherwise), torch's LRScheduler.__init__ raises
    TypeError('... is not an Optimizer'), because DeepSpeed hands the scheduler its wrapper (its own schedules
    unwrap it; torch's do not). The fp16 case is read from engine.py (this CPU refuses fp16: 'Type fp16 is not
    supported on your device'), the others measured. Measured on a 1-rank gloo engine: CosineAnnealingLR with {}
    (missing T_max), with T_max 0 and with an unknown key, StepLR step_size 0, LinearLR start_factor 0, ConstantLR
    factor 2, CosineAnnealingWarmRestarts T_0 10.0, OneCycleLR without total_steps and with pct_start 0, CyclicLR
    mode "tri" and on Adagrad, LambdaLR, MultiplicativeLR, ChainedScheduler, SequentialLR and LRScheduler all raise;
    CosineAnnealingLR with T_max 10 trains at stage 0 and raises at stages 1, 2 ('DeepSpeedZeroOptimizer is not an
    Optimizer'), 3 ('DeepSpeedZeroOptimizer_Stage3 ...') and with bf16 ('FP16_Optimizer is not an Optimizer').
    ReduceLROnPlateau builds but steps wrongly: its step(metrics) needs the validation loss, the engine calls step()
    without it, catches the TypeError and calls step(train_batch_size) (runtime/engine.py _take_model_step), so the
    "metric" is a constant that never improves and the LR is cut by factor every patience + 1 steps whatever the
    loss (measured: 1e-3 down to 1e-6 in 34 steps with the defaults)."""
    sch = section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params")
    if not isinstance(name, str) or name not in TORCH_SCHEDULER_ARGS or not isinstance(params, dict):
        return
    problems = _problems(name, params, cfg, ctx)
    if problems:
        raise RuleViolation(problems[0][0], f"scheduler.type {name!r}: {'; '.join(m for _, m, _ in problems)}",
                            "; ".join(dict.fromkeys(f for _, _, f in problems)))
    if name == "ReduceLROnPlateau":
        factor, patience = params.get("factor", 0.1), params.get("patience", 10)
        raise RuleViolation("/scheduler/type", "ReduceLROnPlateau.step(metrics) needs the validation loss, but "
                            "DeepSpeed's engine calls step() without it, catches the TypeError and calls "
                            "step(train_batch_size) instead (runtime/engine.py _take_model_step): the 'metric' is a "
                            f"constant that never improves, so the LR is multiplied by factor {factor} every "
                            f"patience + 1 = {patience + 1 if _is_int(patience) else '?'} steps whatever the loss",
                            "leave the scheduler section out and step ReduceLROnPlateau yourself with the validation "
                            "loss, outside the engine (the engine steps any scheduler it is given the same way)")
