"""DS233: the values of every optimizer outside DS230's Adam family, each checked against what its
implementation accepts: the torch.optim constructors DeepSpeed reaches raise ValueError (their checks are
transcribed below, in their order, so the finding quotes torch's own message), and DeepSpeed's own kernels (Lamb,
Lion, CPU Adagrad, Muon) take the values unchecked and train wrongly. Declared with
`dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules`` imports this module after rules_optim (import
``dstoolkit.dsconfig.rules``, never this module alone).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section
from dstoolkit.dsconfig.rules_optim import _number, known_optimizers, optimizer_offloaded


@dataclass(frozen=True)
class Bound:
    """The range one optimizer.params value must lie in. `key` is a params key ("lr"), one element of a list
    value ("eps[1]") or each of the first two ("betas[*]")."""

    key: str
    says: str
    """The implementation's own error text ("{v}": the value, "{i}": the index) when it checks the value, else
    what goes wrong when it does not."""
    default: Any
    """The implementation's default (a legal value, for the fix)."""
    lo: Optional[float] = 0.0
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = True

    @property
    def bound(self) -> str:
        """The range as the messages write it: ">= 0", "> 0", "<= 0", "in [0, 1)"..."""
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        if self.lo is None:
            return f"{'<' if self.hi_open else '<='} {self.hi:g}"
        return f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"

    def accepts(self, v: float) -> bool:
        above = self.lo is None or (v > self.lo if self.lo_open else v >= self.lo)
        return above and (self.hi is None or (v < self.hi if self.hi_open else v <= self.hi))


@dataclass(frozen=True)
class OptProblem:
    """One DS233 problem: where, the value as written, what the implementation does, its source, the fix."""

    pointer: str
    shown: str
    why: str
    source: str
    fix: str


@dataclass(frozen=True)
class Impl:
    """What DeepSpeed builds for an optimizer.type and the values it refuses (`checks`: its constructor raises,
    `Bound.says` is its message) or takes unchecked and mishandles (`says` is what goes wrong)."""

    cls: str
    short: str
    source: str
    checks: bool
    bounds: tuple[Bound, ...]
    extra: Optional[Callable[[Mapping, "Impl"], list[OptProblem]]] = None


def _show(v: Any) -> str:
    return json.dumps(list(v) if isinstance(v, tuple) else v)


def _nesterov(params: Mapping, impl: Impl) -> list[OptProblem]:
    # torch/optim/sgd.py: if nesterov and (momentum <= 0 or dampening != 0): raise ValueError(...)
    m, d = _number(params.get("momentum", 0)), _number(params.get("dampening", 0))
    if params.get("nesterov") is not True or m is None or d is None or (m > 0 and d == 0):
        return []
    return [OptProblem("/optimizer/params/nesterov", f"nesterov=True with momentum={params.get('momentum', 0)!r}, "
                       f"dampening={params.get('dampening', 0)!r}", f"{impl.cls} raises ValueError('Nesterov momentum "
                       "requires a momentum and zero dampening')", impl.source,
                       'set "momentum" > 0 (e.g. 0.9) and "dampening": 0, or "nesterov": false')]


def _rprop_etas(params: Mapping, impl: Impl) -> list[OptProblem]:
    # torch/optim/rprop.py: if not 0.0 < etas[0] < 1.0 < etas[1]: raise ValueError(...)
    etas = params.get("etas")
    nums = [_number(e) for e in etas[:2]] if isinstance(etas, (list, tuple)) and len(etas) >= 2 else [None]
    if None in nums or 0.0 < nums[0] < 1.0 < nums[1]:
        return []
    return [OptProblem("/optimizer/params/etas", f"etas={list(etas)!r}", f"{impl.cls} raises ValueError('Invalid "
                       f"eta values: {etas[0]}, {etas[1]}')", impl.source,
                       "etas must satisfy 0 < etas[0] < 1 < etas[1], e.g. [0.5, 1.2] (torch.optim.Rprop's default)")]


def _lamb_extra(params: Mapping, impl: Impl) -> list[OptProblem]:
    out = []
    lo, hi = _number(params.get("min_coeff", 0.01)), _number(params.get("max_coeff", 10.0))
    if lo is not None and hi is not None and lo > hi:
        out.append(OptProblem("/optimizer/params/min_coeff", f"min_coeff={params.get('min_coeff', 0.01)!r} > "
                              f"max_coeff={params.get('max_coeff', 10.0)!r}", f"{impl.cls} takes it unchecked: the "
                              "trust ratio is clamped to max_coeff and then raised to min_coeff, so every step uses "
                              "min_coeff and LAMB's layer-wise adaptation is off", impl.source,
                              "min_coeff must be <= max_coeff, e.g. 0.01 and 10.0 (FusedLamb's defaults)"))
    if params.get("amsgrad") is True:
        out.append(OptProblem("/optimizer/params/amsgrad", "amsgrad=True", f"{impl.cls} raises RuntimeError('FusedLamb "
                              "does not support the AMSGrad variant.')", "ops/lamb/fused_lamb.py", 'remove "amsgrad"'))
    return out


def _muon_extra(params: Mapping, impl: Impl) -> list[OptProblem]:
    ns = params.get("ns_method")
    if not isinstance(ns, str) or ns in ("standard", "gram"):
        return []
    return [OptProblem("/optimizer/params/ns_method", f"ns_method={ns!r}", f"{impl.cls} fails an assert (ns_method "
                       f"must be one of NS_METHODS, got {ns})", impl.source, 'use "gram" (the default) or "standard"')]


def _inv(what: str) -> str:
    return f"Invalid {what}: {{v}}"


_LR, _WD, _EPS = (Bound("lr", _inv("learning rate"), 0.0), Bound("weight_decay", _inv("weight_decay value"), 0),
                  Bound("eps", _inv("epsilon value"), 0.0))
_ADAM_BETAS = ("a beta of 1 zeroes the bias correction 1 - beta^t the step divides by, above 1 the moments grow "
               "without bound, below 0 they flip sign")
_UPHILL, _GROW, _ZERO_DENOM = ("a negative lr climbs the loss", "a negative weight_decay inflates the weights",
                               "a negative eps can zero the update's denominator")


def _torch(cls: str, *bounds: Bound, extra=None, defaults: Optional[dict] = None) -> Impl:
    """A torch.optim class: its checks, its defaults (`defaults` replaces the generic bounds' default)."""
    bounds = tuple(Bound(b.key, b.says, (defaults or {}).get(b.key, b.default), b.lo, b.hi, b.lo_open, b.hi_open)
                   for b in bounds)
    return Impl(f"torch.optim.{cls}", f"torch.optim.{cls}", f"torch/optim/{cls.lower()}.py", True, bounds, extra)


_SGD = _torch("SGD", _LR, Bound("momentum", _inv("momentum value"), 0), _WD, extra=_nesterov, defaults={"lr": 1e-3})
_ADAGRAD = _torch("Adagrad", _LR, Bound("lr_decay", _inv("lr_decay value"), 0), _WD,
                  Bound("initial_accumulator_value", _inv("initial_accumulator_value value"), 0), _EPS,
                  defaults={"lr": 1e-2, "eps": 1e-10})
TORCH_IMPLS: dict[str, Impl] = {
    "SGD": _SGD,
    "Adadelta": _torch("Adadelta", _LR, Bound("rho", _inv("rho value"), 0.9, hi=1.0, hi_open=False), _EPS, _WD,
                       defaults={"lr": 1.0, "eps": 1e-6}),
    "Adafactor": Impl("torch.optim.Adafactor", "torch.optim.Adafactor", "torch/optim/_adafactor.py", True, (
        Bound("lr", "Learning rate should be >= 0 but is: {v}", 1e-2),
        Bound("beta2_decay", "beta2_decay should be <= 0 but is: {v}", -0.8, lo=None, hi=0.0, hi_open=False),
        Bound("eps[0]", "epsilon1 should be >= 0 but is: {v}", None),
        Bound("eps[1]", "epsilon2 should be >= 0 but is: {v}", 1e-3),
        Bound("d", "Clipping threshold d should be >= 1 but is: {v}", 1.0, lo=1.0),
        Bound("weight_decay", "weight_decay should be >= 0 but is: {v}", 0.0))),
    "ASGD": _torch("ASGD", _LR, _WD, defaults={"lr": 1e-2}),
    "LBFGS": _torch("LBFGS", _LR, defaults={"lr": 1}),
    "RMSprop": _torch("RMSprop", _LR, _EPS, Bound("momentum", _inv("momentum value"), 0), _WD,
                      Bound("alpha", _inv("alpha value"), 0.99), defaults={"lr": 1e-2, "eps": 1e-8}),
    "Rprop": _torch("Rprop", _LR, extra=_rprop_etas, defaults={"lr": 1e-2}),
    "SparseAdam": Impl("torch.optim.SparseAdam", "torch.optim.SparseAdam", "torch/optim/sparse_adam.py", True, (
        Bound("lr", _inv("learning rate"), 1e-3, lo_open=True), Bound("eps", _inv("epsilon value"), 1e-8, lo_open=True),
        Bound("betas[*]", "Invalid beta parameter at index {i}: {v}", [0.9, 0.999], hi=1.0))),
}
"""torch.optim classes DeepSpeed reaches through getattr(torch.optim, type) (exact case; Adam, AdamW, Adagrad
and Muon are DeepSpeed's own names, the Adam family is DS230's), each with its constructor's checks in order."""
DS_IMPLS: dict[str, Impl] = {
    "lamb": Impl("DeepSpeed's FusedLamb", "FusedLamb", "ops/csrc/lamb/fused_lamb_cuda_kernel.cu", False, (
        Bound("lr", _UPHILL, 1e-3), Bound("betas[*]", _ADAM_BETAS, [0.9, 0.999], hi=1.0),
        Bound("eps", _ZERO_DENOM, 1e-8), Bound("weight_decay", _GROW, 0.0),
        Bound("max_coeff", "the trust ratio is clamped to at most max_coeff, so a negative one turns every step "
              "uphill", 10.0)), _lamb_extra),
    "lion": Impl("DeepSpeed's FusedLion / DeepSpeedCPULion", "FusedLion", "ops/csrc/lion/multi_tensor_lion.cu, "
                 "ops/csrc/includes/cpu_lion.h", False, (
                     Bound("lr", _UPHILL + " (DeepSpeedCPULion's scalar tail takes |lr| instead)", 1e-3),
                     Bound("betas[*]", "outside [0, 1] a beta no longer interpolates momentum and gradient: beta1 > 1 "
                           "points the first steps uphill, beta2 > 1 grows the momentum geometrically, a negative "
                           "beta flips signs", [0.9, 0.999], hi=1.0, hi_open=False),
                     Bound("weight_decay", "a negative weight_decay grows the weights every step on the GPU (they "
                           "are multiplied by 1 - lr * weight_decay) and is skipped on the CPU", 0.0))),
    "adagrad": _ADAGRAD,
    "musgd": Impl("torch.optim.SGD (mup's MuSGD)", "torch.optim.SGD", "torch/optim/sgd.py", True, _SGD.bounds,
                  _nesterov),
    "muon": Impl("DeepSpeed's MuonWithAuxAdam", "MuonWithAuxAdam", "runtime/zero/muon/original_muon.py", False, (
        Bound("lr", _UPHILL, 0.02), Bound("muon_lr", _UPHILL, 0.02), Bound("adam_lr", _UPHILL, 3e-4),
        Bound("momentum", "Muon's momentum buffer is momentum * m + (1 - momentum) * g: at 1 it never takes a "
              "gradient (no update), above 1 it grows geometrically, below 0 it flips sign", 0.95, hi=1.0),
        Bound("weight_decay", _GROW, 0), Bound("betas[*]", _ADAM_BETAS, [0.9, 0.95], hi=1.0),
        Bound("eps", _ZERO_DENOM, 1e-10)), _muon_extra),
}
"""DeepSpeed's own optimizer names (lower case) outside the Adam family, and what runtime/engine.py
_configure_basic_optimizer builds for them."""
ADAGRAD_OFFLOAD = Impl("DeepSpeed's DeepSpeedCPUAdagrad", "DeepSpeedCPUAdagrad", "ops/csrc/includes/cpu_adagrad.h",
                       False, (Bound("lr", _UPHILL, 1e-2), Bound("eps", _ZERO_DENOM, 1e-10),
                               Bound("weight_decay", "a negative weight_decay is skipped (applied only when > 0), so "
                                     "no decay runs", 0)))
"""Adagrad with the optimizer offloaded (rules_optim.optimizer_offloaded, as engine.py zero_use_cpu_optimizer)."""


def _impl_for(name: str, cfg: Mapping, version: str) -> Optional[Impl]:
    low = name.lower()
    if low in known_optimizers(version):
        if low == "adagrad" and optimizer_offloaded(cfg):
            return ADAGRAD_OFFLOAD
        return DS_IMPLS.get(low)
    return TORCH_IMPLS.get(name)


def _values(params: Mapping, key: str) -> list[tuple[str, str, Optional[int], Any]]:
    """(pointer suffix, name, index, value) of `key`: "lr", "eps[1]" or "betas[*]" (each of the first two)."""
    name, _, idx = key.partition("[")
    raw = params.get(name)
    if not idx:
        return [(name, name, None, raw)]
    if not isinstance(raw, (list, tuple)):
        return []
    ids = range(min(2, len(raw))) if idx == "*]" else [i for i in [int(idx[:-1])] if i < len(raw)]
    return [(f"{name}/{i}", f"{name}[{i}]", i, raw[i]) for i in ids]


def optimizer_value_problems(cfg: Mapping, version: str = "0.19") -> list[OptProblem]:
    """DS233's problems in `cfg`'s optimizer.params, in the order its implementation checks them ([] for the Adam
    family, unknown types, and values that are not finite numbers: other findings own those)."""
    opt = section(cfg, "optimizer")
    name, params = opt.get("type"), opt.get("params")
    impl = _impl_for(name, cfg, version) if isinstance(name, str) and isinstance(params, dict) else None
    if impl is None:
        return []
    out = []
    for b in impl.bounds:
        for ptr, where, i, raw in _values(params, b.key):
            n = _number(raw)
            if n is None or b.accepts(n):
                continue
            why = (f"{impl.cls} raises ValueError('{b.says.format(v=raw, i=i)}')" if impl.checks else
                   f"{impl.cls} takes it unchecked: {b.says}")
            fix = (f"{b.key.partition('[')[0]} must be {b.bound}{' each' if b.key.endswith('[*]') else ''}, e.g. "
                   f"{_show(b.default)} ({impl.short}'s default)")
            out.append(OptProblem(f"/optimizer/params/{ptr}", f"{where}={raw!r}", why, impl.source, fix))
    return out + (impl.extra(params, impl) if impl.extra else [])


@rule("DS233", "optimizer value outside the range its implementation accepts")
def _check_optimizer_values(cfg: Mapping, ctx: RuleContext) -> None:
    """For every optimizer.type outside DS230's Adam family, optimizer.params must hold the values its
    implementation accepts. torch's constructors raise ValueError (torch 2.13): SGD, and mup's MuSGD which builds
    it, lr / momentum / weight_decay >= 0 and nesterov only with momentum > 0 and dampening 0 (torch/optim/sgd.py);
    Adagrad (DeepSpeed's "adagrad" builds torch.optim.Adagrad) lr / lr_decay / weight_decay /
    initial_accumulator_value / eps >= 0 (adagrad.py); Adadelta lr / eps / weight_decay >= 0, rho in [0, 1]
    (adadelta.py); Adafactor lr >= 0, beta2_decay <= 0, eps[0] (or null) / eps[1] >= 0, d >= 1, weight_decay >= 0
    (_adafactor.py); ASGD lr / weight_decay >= 0 (asgd.py); LBFGS lr >= 0 (lbfgs.py); RMSprop lr / eps / momentum /
    weight_decay / alpha >= 0 (rmsprop.py); Rprop lr >= 0, 0 < etas[0] < 1 < etas[1] (rprop.py); SparseAdam lr > 0,
    eps > 0, betas in [0, 1) (sparse_adam.py). DeepSpeed's own kernels check nothing and train wrongly instead:
    Lamb (FusedLamb, ops/csrc/lamb/fused_lamb_cuda_kernel.cu) needs lr / eps / weight_decay >= 0, betas in [0, 1)
    (the step divides by 1 - beta^t), max_coeff >= 0 and min_coeff <= max_coeff (the trust ratio is clamped to
    max_coeff and then raised to min_coeff, so a larger min_coeff pins every step to it); its amsgrad=true raises
    RuntimeError (ops/lamb/fused_lamb.py). Lion (FusedLion, DeepSpeedCPULion: ops/csrc/lion/multi_tensor_lion.cu,
    ops/csrc/includes/cpu_lion.h) needs lr >= 0 (a negative one climbs, except in DeepSpeedCPULion's scalar tail,
    which takes |lr|), weight_decay >= 0 (the GPU multiplies the weights by 1 - lr * weight_decay > 1, the CPU
    skips it) and betas in [0, 1] (they interpolate momentum and gradient; beta1 > 1 points the first steps
    uphill). Adagrad under CPU / NVMe optimizer offload is DeepSpeedCPUAdagrad (ops/csrc/includes/cpu_adagrad.h):
    lr / eps / weight_decay >= 0, unchecked (a negative lr climbs, a negative eps drives the weights to -inf, a
    negative weight_decay is skipped). The CPU claims were measured on DeepSpeed 0.19.8's JIT-built ops. Muon (MuonWithAuxAdam,
    runtime/zero/muon/original_muon.py) needs lr / muon_lr / adam_lr / weight_decay / eps >= 0, momentum and betas
    in [0, 1), and ns_method "gram" or "standard" (an assert). "auto" is left to DS110 / DS111 and values that are
    not numbers to DS240; the 1-bit optimizers of DeepSpeed 0.16 are not checked."""
    problems = optimizer_value_problems(cfg, ctx.deepspeed_version)
    if problems:
        first = problems[0]
        raise RuleViolation(first.pointer, f"optimizer.params {', '.join(p.shown for p in problems)}: {first.why} "
                            f"({first.source})", "; ".join(dict.fromkeys(p.fix for p in problems)))
