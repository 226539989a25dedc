"""The optimizer and scheduler rules (DS209-DS212): DeepSpeed builds both from the config by name and passes
``params`` as keyword arguments, so an unknown name or keyword fails at engine start. Declared with
`dstoolkit.dsconfig.registry.rule`; the facts (names, accepted keywords) are in ``dstoolkit.dsconfig.facts``.
The value rules (DS230 the Adam family's lr / betas / eps / weight_decay, DS231 gradient_clipping) are also
asked by `dstoolkit resolve` for its flags, through `adam_value_problems` and `gradient_clipping_problem`.
The values of every other optimizer (DS233) are in ``rules_optim_values`` and the LR schedule's values
(DS234-DS235) in ``rules_sched``; both are imported at the end of this module, so the registry keeps the order
DeepSpeed builds in (the optimizer, then the scheduler).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from dstoolkit.common.text import did_you_mean
from dstoolkit.dsconfig.auto import (HF_DEFAULT_BETAS, HF_DEFAULT_EPS, HF_DEFAULT_LR, HF_DEFAULT_MAX_GRAD_NORM,
                                     HF_DEFAULT_WEIGHT_DECAY)
from dstoolkit.dsconfig.facts import (MUON_FIXED, OFFLOAD_OPTIMIZER_DEVICES, ONEBIT_OPTIMIZER_PARAMS,
                                      OPTIMIZER_BUILDS, OPTIMIZER_PARAMS, SCHEDULER_PARAMS, SCHEDULER_REQUIRED,
                                      TORCH_OPTIMIZERS, TORCH_SCHEDULERS, OptimizerBuild)
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section, zero_section


def known_optimizers(version: str) -> dict[str, set[str]]:
    """Lower-case DeepSpeed optimizer names -> every params key one of its classes takes, for a DeepSpeed version
    (which class a config gets, and so the keys it may set: `optimizer_build`)."""
    names = dict(OPTIMIZER_PARAMS)
    if version.startswith("0.16"):
        names = {k: v for k, v in names.items() if k != "muon"}
        names.update(ONEBIT_OPTIMIZER_PARAMS)
    return names


def optimizer_offloaded(cfg: Mapping) -> bool:
    """Whether DeepSpeed builds its CPU optimizers for `cfg` (engine.py zero_use_cpu_optimizer: offload_optimizer
    on cpu / nvme, whatever the stage; the deprecated cpu_offload: true is offload_optimizer cpu)."""
    z = zero_section(cfg)
    off = z.get("offload_optimizer")
    if isinstance(off, dict):
        return off.get("device") in OFFLOAD_OPTIMIZER_DEVICES
    return off is None and z.get("cpu_offload") is True


def optimizer_build(name: str, params: Mapping, cfg: Mapping, version: str = "0.19") -> Optional[OptimizerBuild]:
    """The class DeepSpeed's engine builds for optimizer.type `name` with `params` (runtime/engine.py
    _configure_basic_optimizer), or None for a name it does not know. torch_adam wins over offload
    (get_optimizer_configuration tests it first); a torch.optim name (exact case) is that class."""
    low = name.lower()
    if low in known_optimizers(version) and low in OPTIMIZER_BUILDS:
        builds = OPTIMIZER_BUILDS[low]
        if "torch_adam" in builds and params.get("torch_adam"):
            l2 = low == "adam" and not params.get("adam_w_mode", True)  # effective_adam_w_mode false
            return builds["torch_adam_l2" if l2 else "torch_adam"]
        if "offload" in builds and optimizer_offloaded(cfg):
            return builds["offload"]
        return builds["device"]
    if low in known_optimizers(version):  # the 1-bit optimizers of DeepSpeed 0.16
        return OptimizerBuild(name, frozenset(ONEBIT_OPTIMIZER_PARAMS[low]))
    if name in TORCH_OPTIMIZERS:
        return OptimizerBuild(f"torch.optim.{name}", TORCH_OPTIMIZERS[name], source=f"torch/optim/{low}.py")
    return None


def _other_build(name: str, cfg: Mapping, build: OptimizerBuild, keys: list[str]) -> str:
    """The one config change that makes DeepSpeed build a class of the same type taking all of `keys`, as a fix
    clause (", or ...: X takes them"), or "": torch_adam on or off, or optimizer offload on or off."""
    builds = OPTIMIZER_BUILDS.get(name.lower(), {})
    if build in (builds.get("torch_adam"), builds.get("torch_adam_l2")):
        moves = [("offload" if optimizer_offloaded(cfg) else "device", 'drop "torch_adam"')]
    else:
        moves = [("torch_adam", '"torch_adam": true'),
                 ("offload", 'offload the optimizer (offload_optimizer.device "cpu")') if build is builds.get("device")
                 else ("device", 'turn optimizer offload off (offload_optimizer.device "none")')]
    for path, how in moves:
        other = builds.get(path)
        if other is not None and other.cls != build.cls and set(keys) <= other.keywords:
            return f", or {how}: {other.cls} takes {'it' if len(keys) == 1 else 'them'}"
    return ""


@rule("DS209", "optimizer type unknown or removed")
def _check_optimizer_type(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.type must name a DeepSpeed optimizer (any case: Adam, AdamW, Lamb, Lion, Adagrad, Muon, the mup
    optimizers) or a torch.optim class (exact case); anything else fails at engine start. The 1-bit optimizers
    (OneBitAdam, ZeroOneAdam, OneBitLamb) exist in DeepSpeed 0.16 but were removed in 0.19."""
    name = section(cfg, "optimizer").get("type")
    if name is None or not isinstance(name, str):
        return
    if optimizer_build(name, {}, {}, ctx.deepspeed_version) is not None:
        return
    if name.lower() in ONEBIT_OPTIMIZER_PARAMS:
        raise RuleViolation("/optimizer/type",
                            f"optimizer.type {name!r}: the 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) were "
                            f"removed in DeepSpeed 0.19; the engine fails looking up torch.optim.{name}",
                            'use "Adam"/"AdamW", or target --deepspeed-version 0.16')
    choices = list(known_optimizers(ctx.deepspeed_version)) + list(TORCH_OPTIMIZERS)
    hint = did_you_mean(name, choices)
    raise RuleViolation("/optimizer/type", f"optimizer.type {name!r} is neither a DeepSpeed optimizer nor a "
                        "torch.optim class; the engine fails at start",
                        f"did you mean {hint!r}?" if hint else "use AdamW, Adam, Lamb, Lion, Adagrad or a torch.optim name")


@rule("DS210", "optimizer parameter invalid for this optimizer")
def _check_optimizer_params(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.params are passed to the class the engine builds as keyword arguments (runtime/engine.py
    _configure_basic_optimizer), and which class that is depends on the type, params.torch_adam and optimizer
    offload (offload_optimizer on cpu / nvme): Adam / AdamW build FusedAdam, DeepSpeedCPUAdam under offload, or
    torch.optim.AdamW with torch_adam; Lion FusedLion, or DeepSpeedCPULion under offload (which takes
    fp32_optimizer_states and not set_grad_none); Adagrad torch.optim.Adagrad, or DeepSpeedCPUAdagrad under offload
    (which takes amsgrad and fp32_optimizer_states and not lr_decay or initial_accumulator_value). A keyword that
    class does not take fails with TypeError at engine start (an error). Muon is different: the engine copies only
    the keys it reads into its param groups (_muon_param_groups: lr, momentum, weight_decay, ns_method, muon_lr for
    the Muon half, lr, betas, eps, weight_decay, adam_lr for the Adam half) and drops the rest without a word, so
    nesterov and ns_steps change nothing (muon_update runs nesterov=True, ns_steps=5): a warning. mup's MuAdam,
    MuAdamW and MuSGD pass the keys on to torch.optim.Adam / AdamW / SGD and fail with KeyError('lr') without an lr
    (mup/optim.py process_param_groups reads kwargs['lr'] for the parameters the engine passes, which set none).
    max_grad_norm is refused by the engine itself (ValueError: gradient clipping is the top-level
    gradient_clipping key). "amsgrad": true, valid for torch's AdamW, makes FusedAdam raise RuntimeError in its
    constructor (ops/adam/fused_adam.py) and DeepSpeedCPUAdam in add_param_group (ops/adam/cpu_adam.py), so the
    job dies before it trains (measured on a 1-rank gloo engine); with torch_adam it runs."""
    opt = section(cfg, "optimizer")
    params = opt.get("params", {})
    if not isinstance(params, dict):
        return
    if "max_grad_norm" in params:
        raise RuleViolation("/optimizer/params/max_grad_norm",
                            f"optimizer.params.max_grad_norm={params['max_grad_norm']!r}: DeepSpeed's engine raises "
                            "ValueError ('max_grad_norm' is not supported as an optimizer parameter)",
                            f'remove it and set top-level "gradient_clipping": {params["max_grad_norm"]!r}')
    name = opt.get("type")
    build = optimizer_build(name, params, cfg, ctx.deepspeed_version) if isinstance(name, str) else None
    if build is None:
        return
    missing = sorted(build.requires - set(params))
    if missing:
        raise RuleViolation("/optimizer/params" if "params" in opt else "/optimizer",
                            f"optimizer.type {name!r} without optimizer.params.{missing[0]}: {build.cls} raises "
                            f"KeyError({missing[0]!r}) at engine start ({build.source} reads kwargs[{missing[0]!r}] "
                            "for the model's parameters, which set none of their own)",
                            f'add "{missing[0]}" to optimizer.params (e.g. 1e-3)')
    unknown = [k for k in params if k not in build.keywords]
    if not unknown and build.amsgrad_raises and params.get("amsgrad") is True:
        raise RuleViolation("/optimizer/params/amsgrad", f"optimizer.params.amsgrad=true: {build.cls} (what {name} "
                            f"builds {build.when}) raises RuntimeError ('{build.cls} does not support the AMSGrad "
                            f"variant.', {build.source}) before the first step",
                            'remove "amsgrad", or set "torch_adam": true (torch.optim.AdamW / Adam run AMSGrad)')
    if not unknown:
        return
    k = unknown[0]
    listed = ", ".join(map(repr, unknown))
    hint = did_you_mean(k, build.keywords)
    if build.drops_unknown:
        fixed = [f"{u}={str(MUON_FIXED[u]).lower()}" for u in unknown if u in MUON_FIXED]
        raise RuleViolation(f"/optimizer/params/{k}",
                            f"optimizer.params {listed}: DeepSpeed's {build.cls} never "
                            f"reads {'it' if len(unknown) == 1 else 'them'}: the engine reads only "
                            f"{', '.join(sorted(build.keywords))} ({build.source}) and drops the rest without a word"
                            + (f"; it always runs {', '.join(fixed)} (original_muon.py muon_update)" if fixed else ""),
                            f"did you mean {hint!r}?" if hint else f"remove {listed}", severity="warning")
    fix = (f"did you mean {hint!r}?" if hint else f"remove {listed} ({build.cls} takes "
           f"{', '.join(sorted(build.keywords))}){_other_build(name, cfg, build, unknown)}")
    raise RuleViolation(f"/optimizer/params/{k}",
                        f"optimizer.params {listed} not accepted by {build.cls}"
                        + (f" (what {name} builds {build.when})" if build.when else "")
                        + "; the engine passes params as keyword arguments and fails with TypeError", fix)


@rule("DS211", "scheduler type unknown")
def _check_scheduler_type(cfg: Mapping, ctx: RuleContext) -> None:
    """scheduler.type must be a DeepSpeed LR schedule (LRRangeTest, OneCycle, WarmupLR, WarmupDecayLR,
    WarmupCosineLR) or a torch.optim.lr_scheduler class, case-sensitive; otherwise the engine fails
    ('DeepSpeed does not recognize LR scheduler')."""
    name = section(cfg, "scheduler").get("type")
    if name is None or not isinstance(name, str):
        return
    if name in SCHEDULER_PARAMS or name in TORCH_SCHEDULERS:
        return
    hint = did_you_mean(name, list(SCHEDULER_PARAMS) + list(TORCH_SCHEDULERS))
    raise RuleViolation("/scheduler/type", f"scheduler.type {name!r} is not a DeepSpeed or torch LR scheduler; "
                        "the engine fails ('DeepSpeed does not recognize LR scheduler')",
                        f"did you mean {hint!r}?" if hint else f"use one of {', '.join(SCHEDULER_PARAMS)}")


@rule("DS212", "scheduler parameter invalid for this scheduler")
def _check_scheduler_params(cfg: Mapping, ctx: RuleContext) -> None:
    """scheduler.params are passed as keyword arguments to the DeepSpeed schedule (runtime/lr_schedules.py): no
    unknown keywords (TypeError at engine start), and the required ones present (OneCycle needs cycle_min_lr
    and cycle_max_lr, WarmupDecayLR and WarmupCosineLR need total_num_steps). torch schedulers' keywords are
    DS239's."""
    sch = section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params", {})
    if not isinstance(name, str) or name not in SCHEDULER_PARAMS or not isinstance(params, dict):
        return
    allowed = SCHEDULER_PARAMS[name]
    unknown = [k for k in params if k not in allowed]
    if unknown:
        hint = did_you_mean(unknown[0], allowed)
        raise RuleViolation(f"/scheduler/params/{unknown[0]}",
                            f"scheduler.params {', '.join(map(repr, unknown))} not accepted by {name} (TypeError at "
                            "engine start)", f"did you mean {hint!r}?" if hint else f"accepted: {', '.join(sorted(allowed))}")
    missing = sorted(SCHEDULER_REQUIRED.get(name, set()) - set(params))
    if missing:
        raise RuleViolation("/scheduler/params", f"{name} needs scheduler.params {', '.join(missing)}",
                            f'add "{missing[0]}"')


# -- optimizer values (DS230, DS231) ----------------------------------------------------------------------
# torch 2.13's Adam-family constructors check their arguments (torch/optim/adam.py Adam.__init__, which
# torch/optim/adamw.py AdamW subclasses; adamax.py, nadam.py and radam.py repeat the same checks):
#     if not 0.0 <= lr:              raise ValueError(f"Invalid learning rate: {lr}")
#     if not 0.0 <= eps:             raise ValueError(f"Invalid epsilon value: {eps}")
#     if not 0.0 <= betas[0] < 1.0:  raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
#     if not 0.0 <= betas[1] < 1.0:  raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
#     if not 0.0 <= weight_decay:    raise ValueError(f"Invalid weight_decay value: {weight_decay}")
ADAM_DS_TYPES = frozenset({"adam", "adamw", "muadam", "muadamw"})
"""DeepSpeed optimizer types (lower case) whose params reach an Adam: DeepSpeed's Adam / AdamW build
torch.optim.AdamW (Adam too unless params.adam_w_mode is false) when params.torch_adam is true, else FusedAdam or
DeepSpeedCPUAdam with the same arguments (runtime/engine.py _configure_basic_optimizer,
get_optimizer_configuration); mup's MuAdam / MuAdamW build torch.optim.Adam / AdamW."""
ADAM_TORCH_TYPES = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam"})
"""torch.optim classes (exact case; DeepSpeed's getattr(torch.optim, type) fallback) with the checks above."""


@dataclass(frozen=True)
class ValueLimit:
    """The range torch's Adam family accepts for one argument: 0 <= value (< below, when set)."""

    below: Optional[float]
    """Exclusive upper bound (1 for the betas), None for none."""
    torch_error: str
    """torch's ValueError text before the value ("{i}": the beta's index)."""

    @property
    def bound(self) -> str:
        """The accepted range as the messages write it: ">= 0" or "in [0, 1)"."""
        return ">= 0" if self.below is None else f"in [0, {self.below:g})"

    def accepts(self, value: float) -> bool:
        return 0.0 <= value and (self.below is None or value < self.below)


ADAM_LIMITS: dict[str, ValueLimit] = {
    "lr": ValueLimit(None, "Invalid learning rate"),
    "betas": ValueLimit(1.0, "Invalid beta parameter at index {i}"),
    "eps": ValueLimit(None, "Invalid epsilon value"),
    "weight_decay": ValueLimit(None, "Invalid weight_decay value"),
}
"""optimizer.params key -> the range torch.optim.Adam / AdamW check (betas: each of the two)."""
NADAM_LIMITS: dict[str, ValueLimit] = {**ADAM_LIMITS, "momentum_decay": ValueLimit(None, "Invalid momentum_decay value")}
"""torch.optim.NAdam checks momentum_decay too (torch/optim/nadam.py: 'if not 0.0 <= momentum_decay')."""
HF_DEFAULTS: dict[str, Any] = {"lr": HF_DEFAULT_LR, "betas": list(HF_DEFAULT_BETAS), "eps": HF_DEFAULT_EPS,
                               "weight_decay": HF_DEFAULT_WEIGHT_DECAY}
"""A legal value of each, to suggest: HF TrainingArguments' defaults (dstoolkit.dsconfig.auto)."""
TORCH_DEFAULTS: dict[str, Any] = {"momentum_decay": 4e-3}
"""The keys HF has no default for: torch's own (NAdam.__init__)."""


def adam_values_fix(problems: list["ValueProblem"], name: Callable[[str], str] = str,
                    show: Callable[[Any], str] = str) -> str:
    """The suggestion for `problems`: each value's range and HF's default (`name` spells the key and `show` the
    value, for a JSON config or for command-line flags)."""
    limits = {p.key: p.limit for p in problems}
    return "; ".join(f"{name(k)} must be {lim.bound}{' each' if k == 'betas' else ''}, e.g. "
                     + (f"{show(HF_DEFAULTS[k])} (HF's default)" if k in HF_DEFAULTS else
                        f"{show(TORCH_DEFAULTS[k])} (torch's default)") for k, lim in limits.items())


@dataclass(frozen=True)
class ValueProblem:
    """One optimizer value outside its range: `key` (and `index` for betas), the value, its limit."""

    key: str
    index: Optional[int]
    value: float
    limit: ValueLimit

    @property
    def where(self) -> str:
        """The value's name: lr, betas[0], ..."""
        return self.key if self.index is None else f"{self.key}[{self.index}]"

    @property
    def torch_error(self) -> str:
        """torch's own ValueError message for this value."""
        return f"{self.limit.torch_error.format(i=self.index)}: {self.value}"


def _number(v: Any) -> Optional[float]:
    """A finite int/float (bools, strings such as "auto", NaN/Infinity: None, reported elsewhere)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def adam_value_problems(params: Mapping[str, Any],
                        limits: Mapping[str, ValueLimit] = ADAM_LIMITS) -> list[ValueProblem]:
    """The lr, betas, eps and weight_decay values in `params` that torch's Adam / AdamW refuse (the checks quoted
    above), in that order; `limits` NADAM_LIMITS adds NAdam's momentum_decay. Values that are not finite numbers
    (HF's "auto", a wrong type, NaN) are skipped: other findings own them."""
    out: list[ValueProblem] = []
    for key, limit in limits.items():
        raw = params.get(key)
        if key == "betas":
            items = list(enumerate(raw[:2])) if isinstance(raw, (list, tuple)) else []
        else:
            items = [(None, raw)]
        for i, v in items:
            n = _number(v)
            if n is not None and not limit.accepts(n):
                out.append(ValueProblem(key, i, v, limit))
    return out


def _adam_class(name: str, params: Mapping, version: str) -> Optional[tuple[str, str]]:
    """(the torch class `optimizer.type` builds or mirrors, the file with its checks), or None when the type is
    not in the Adam family. DeepSpeed's Adam is AdamW unless params.adam_w_mode is false (engine.py:
    effective_adam_w_mode = name == adamw or adam_w_mode, default True)."""
    low = name.lower()
    if low in ADAM_DS_TYPES and low in known_optimizers(version):
        adam = low == "muadam" or (low == "adam" and params.get("adam_w_mode") is False)
        cls = "torch.optim.Adam" if adam else "torch.optim.AdamW"
        return cls + (f" (mup's {name})" if low.startswith("mu") else ""), "torch/optim/adam.py"
    if name in ADAM_TORCH_TYPES:
        return f"torch.optim.{name}", "torch/optim/adam.py" if name == "AdamW" else f"torch/optim/{low}.py"
    return None


@rule("DS230", "Adam optimizer value outside the range torch accepts")
def _check_adam_values(cfg: Mapping, ctx: RuleContext) -> None:
    """For the Adam family (optimizer.type Adam, AdamW, MuAdam, MuAdamW, or torch's Adamax, NAdam, RAdam),
    optimizer.params must hold lr >= 0, eps >= 0, weight_decay >= 0 and both betas in [0, 1): torch 2.13's
    constructors raise ValueError otherwise (torch/optim/adam.py Adam.__init__, inherited by AdamW: "Invalid
    learning rate", "Invalid epsilon value", "Invalid beta parameter at index 0/1", "Invalid weight_decay value";
    adamax.py, nadam.py, radam.py check the same; NAdam also refuses momentum_decay < 0, "Invalid momentum_decay
    value"). DeepSpeed builds torch.optim.Adam / AdamW when params.torch_adam is true; its default FusedAdam and
    DeepSpeedCPUAdam take the same arguments without checking them and train wrongly instead: a negative lr climbs
    the loss, a beta of 1 zeroes the bias correction 1 - beta^t they divide by (ops/csrc/adam/multi_tensor_adam.cu,
    ops/csrc/includes/cpu_adam.h), a beta above 1 makes the moments grow without bound, a negative eps can zero the
    update's denominator, a negative weight_decay inflates the weights. lr 0 is legal (torch accepts it). "auto"
    (HF fills it) is left to DS110 / DS111, values that are not numbers to DS240."""
    opt = section(cfg, "optimizer")
    name, params = opt.get("type"), opt.get("params")
    if not isinstance(name, str) or not isinstance(params, dict):
        return
    found = _adam_class(name, params, ctx.deepspeed_version)
    if found is None:
        return
    cls, source = found
    problems = adam_value_problems(params, NADAM_LIMITS if name == "NAdam" else ADAM_LIMITS)
    if not problems:
        return
    first = problems[0]
    pointer = f"/optimizer/params/{first.key}" + ("" if first.index is None else f"/{first.index}")
    listed = ", ".join(f"{p.where}={p.value!r}" for p in problems)
    unchecked = ("; DeepSpeed's FusedAdam / DeepSpeedCPUAdam take it unchecked and train wrongly"
                 if name.lower() in ("adam", "adamw") else "")
    raise RuleViolation(pointer, f"optimizer.params {listed}: {cls} raises ValueError('{first.torch_error}') "
                        f"({source}){unchecked}", adam_values_fix(problems))


GRADIENT_CLIPPING_FIX = (f"use a positive maximum norm (HF's default max_grad_norm is {HF_DEFAULT_MAX_GRAD_NORM}), "
                         "or 0 to turn clipping off")


def gradient_clipping_problem(value: Any) -> Optional[str]:
    """Why `value` is not a gradient_clipping DeepSpeed honours (a negative number), or None (fine, "auto", or
    not a finite number: other findings own those)."""
    n = _number(value)
    if n is None or n >= 0:
        return None
    return (f"{value!r} is negative: DeepSpeed clips only when gradient_clipping > 0 (runtime/engine.py "
            "'if self.gradient_clipping() > 0.0', the same test in the ZeRO, fp16 and bf16 optimizers), so "
            "clipping is silently off")


@rule("DS231", "gradient_clipping is negative")
def _check_gradient_clipping(cfg: Mapping, ctx: RuleContext) -> None:
    """gradient_clipping is the maximum global gradient norm and must be >= 0. DeepSpeed 0.19 clips only when
    it is > 0 (runtime/engine.py `if self.gradient_clipping() > 0.0`; runtime/zero/stage_1_and_2.py,
    stage3.py, bf16_optimizer.py and fp16/*optimizer.py test `clip_grad > 0.`), so a negative value turns
    clipping off without a word. 0 disables clipping explicitly; "auto" is filled by HF from --max_grad_norm."""
    problem = gradient_clipping_problem(cfg.get("gradient_clipping"))
    if problem:
        raise RuleViolation("/gradient_clipping", f"gradient_clipping={problem}", GRADIENT_CLIPPING_FIX)

