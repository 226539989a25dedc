"""The optimizer and scheduler rules (DS209-DS212): DeepSpeed builds both from the config by name and passes
``params`` as keyword arguments, so an unknown name or keyword fails at engine start. Declared with
`dstoolkit.dsconfig.registry.rule`; the facts (names, accepted keywords) are in ``dstoolkit.dsconfig.facts``.
"""
from __future__ import annotations

from typing import Mapping, Optional

from dstoolkit.common.text import did_you_mean
from dstoolkit.dsconfig.facts import (ONEBIT_OPTIMIZER_PARAMS, OPTIMIZER_PARAMS, SCHEDULER_PARAMS, SCHEDULER_REQUIRED,
                                      TORCH_OPTIMIZERS, TORCH_SCHEDULERS)
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section


def known_optimizers(version: str) -> dict[str, set[str]]:
    """Lower-case DeepSpeed optimizer names -> accepted params, for a DeepSpeed version."""
    names = dict(OPTIMIZER_PARAMS)
    if version.startswith("0.16"):
        names = {k: v for k, v in names.items() if k != "muon"}
        names.update(ONEBIT_OPTIMIZER_PARAMS)
    return names


def _optimizer_params_for(name: str, version: str) -> Optional[set[str]]:
    ds = known_optimizers(version)
    if name.lower() in ds:
        return ds[name.lower()]
    if name in TORCH_OPTIMIZERS:
        return TORCH_OPTIMIZERS[name]
    return None


@rule("DS209", "optimizer type unknown or removed")
def _check_optimizer_type(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.type must name a DeepSpeed optimizer (any case: Adam, AdamW, Lamb, Lion, Adagrad, Muon, the mup
    optimizers) or a torch.optim class (exact case); anything else fails at engine start. The 1-bit optimizers
    (OneBitAdam, ZeroOneAdam, OneBitLamb) exist in DeepSpeed 0.16 but were removed in 0.19."""
    name = section(cfg, "optimizer").get("type")
    if name is None or not isinstance(name, str):
        return
    if _optimizer_params_for(name, ctx.deepspeed_version) is not None:
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
    """optimizer.params are passed to the optimizer as keyword arguments: a keyword it does not take fails with
    TypeError, and max_grad_norm is refused by the engine itself (gradient clipping is the top-level
    gradient_clipping key)."""
    opt = section(cfg, "optimizer")
    params = opt.get("params")
    if not isinstance(params, dict):
        return
    if "max_grad_norm" in params:
        raise RuleViolation("/optimizer/params/max_grad_norm",
                            f"optimizer.params.max_grad_norm={params['max_grad_norm']!r}: DeepSpeed's engine raises "
                            "ValueError ('max_grad_norm' is not supported as an optimizer parameter)",
                            f'remove it and set top-level "gradient_clipping": {params["max_grad_norm"]!r}')
    name = opt.get("type")
    if not isinstance(name, str):
        return
    allowed = _optimizer_params_for(name, ctx.deepspeed_version)
    if allowed is None:
        return
    unknown = [k for k in params if k not in allowed]
    if unknown:
        k = unknown[0]
        hint = did_you_mean(k, allowed)
        raise RuleViolation(f"/optimizer/params/{k}",
                            f"optimizer.params {', '.join(map(repr, unknown))} not accepted by {name}; the engine "
                            "passes params as keyword arguments and fails with TypeError",
                            f"did you mean {hint!r}?" if hint else f"accepted: {', '.join(sorted(allowed))}")


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
    and cycle_max_lr, WarmupDecayLR and WarmupCosineLR need total_num_steps). torch schedulers are not
    checked."""
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
