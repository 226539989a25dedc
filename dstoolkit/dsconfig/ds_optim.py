"""`optimizer` and `scheduler`, and the parameters each optimizer / scheduler type accepts.

DeepSpeed does not validate these sections when it reads the config; the engine later passes
``optimizer.params`` as keyword arguments to the optimizer (runtime/engine.py ``_configure_basic_optimizer``)
and ``scheduler.params`` to the scheduler, so an unknown key fails at engine start (TypeError), and
``max_grad_norm`` raises ValueError there. We check the same thing before launch.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from dstoolkit.dsconfig.base import Bool, DSModel

from dstoolkit.dsconfig.facts import (ONEBIT_OPTIMIZER_PARAMS, OPTIMIZER_PARAMS, SCHEDULER_PARAMS,  # noqa: F401
                                    SCHEDULER_REQUIRED, TORCH_OPTIMIZERS, TORCH_SCHEDULERS)


class OptimizerConfig(DSModel):
    """`optimizer`: the optimizer DeepSpeed builds. Type names are case-insensitive for DeepSpeed's own
    optimizers (Adam, AdamW, Lamb, Lion, Adagrad, Muon, MuAdam...), otherwise a torch.optim class name."""

    type: Optional[str] = None
    """Optimizer name, e.g. AdamW. Unknown names fail at engine start."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of that optimizer (lr, betas, eps, weight_decay...). HF fills "auto" for
    lr, betas, eps, weight_decay. Never max_grad_norm: use top-level gradient_clipping."""
    legacy_fusion: Bool = False
    """Legacy fused fp16 optimizer path."""


class SchedulerConfig(DSModel):
    """`scheduler`: DeepSpeed LR schedule (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)
    or a torch.optim.lr_scheduler class name."""

    type: Optional[str] = None
    """Scheduler name, case-sensitive."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of that scheduler. HF fills "auto" for warmup/total steps and lrs."""
