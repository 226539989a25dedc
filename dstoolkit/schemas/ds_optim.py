"""`optimizer` and `scheduler`, and the parameters each optimizer / scheduler type accepts.

DeepSpeed does not validate these sections when it reads the config; the engine later passes
``optimizer.params`` as keyword arguments to the optimizer (runtime/engine.py ``_configure_basic_optimizer``)
and ``scheduler.params`` to the scheduler, so an unknown key fails at engine start (TypeError), and
``max_grad_norm`` raises ValueError there. We check the same thing before launch.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from dstoolkit.schemas.base import Bool, DSModel

# Keyword arguments per DeepSpeed optimizer (lower-case type name), from the installed 0.19.8 signatures:
# ops/adam/fused_adam.py FusedAdam, ops/adam/cpu_adam.py DeepSpeedCPUAdam, ops/lamb/fused_lamb.py FusedLamb,
# ops/lion/fused_lion.py FusedLion, ops/adagrad/cpu_adagrad.py, torch.optim.Adagrad; plus the keys the engine
# pops before the call (torch_adam, adam_w_mode, fp32_optimizer_states, foreach).
_ADAM = {"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "set_grad_none",
         "torch_adam", "adam_w_mode", "fp32_optimizer_states", "foreach", "fused", "capturable", "maximize",
         "differentiable"}
OPTIMIZER_PARAMS: dict[str, set[str]] = {
    "adam": _ADAM,
    "adamw": _ADAM,
    "lamb": {"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay", "max_grad_norm",
             "max_coeff", "min_coeff", "amsgrad"},
    "lion": {"lr", "betas", "weight_decay", "set_grad_none"},
    "adagrad": {"lr", "eps", "weight_decay", "amsgrad", "fp32_optimizer_states", "lr_decay",
                "initial_accumulator_value", "foreach", "maximize", "differentiable", "fused"},
    "muon": {"lr", "momentum", "weight_decay", "ns_method", "betas", "eps", "adam_w_mode", "torch_adam",
             "fp32_optimizer_states", "muon_lr", "adam_lr", "nesterov", "ns_steps"},
    # mup optimizers take torch's Adam/AdamW/SGD kwargs
    "muadam": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "muadamw": {"lr", "betas", "eps", "weight_decay", "amsgrad"},
    "musgd": {"lr", "momentum", "dampening", "weight_decay", "nesterov"},
}
# 1-bit optimizers: present in 0.16 (runtime/fp16/onebit/), removed from 0.19 (not in DEEPSPEED_OPTIMIZERS;
# the engine's fallback getattr(torch.optim, name) then fails).
ONEBIT_OPTIMIZER_PARAMS: dict[str, set[str]] = {
    "onebitadam": {"lr", "freeze_step", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                   "max_grad_norm", "amsgrad", "cuda_aware", "comm_backend_name"},
    "zerooneadam": {"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay", "max_grad_norm",
                    "var_freeze_step", "var_update_scaler", "local_step_scaler", "local_step_clipper", "amsgrad",
                    "cuda_aware", "comm_backend_name"},
    "onebitlamb": {"lr", "freeze_step", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                   "max_grad_norm", "max_coeff", "min_coeff", "amsgrad", "cuda_aware", "comm_backend_name",
                   "coeff_beta", "factor_max", "factor_min", "factor_threshold"},
}
# Optimizers in torch.optim (torch 2.13) that DeepSpeed falls back to by exact class name.
TORCH_OPTIMIZERS: dict[str, set[str]] = {
    "SGD": {"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable",
            "fused"},
    "Adam": _ADAM - {"set_grad_none", "torch_adam", "adam_w_mode", "fp32_optimizer_states", "bias_correction"},
    "AdamW": _ADAM - {"set_grad_none", "torch_adam", "adam_w_mode", "fp32_optimizer_states", "bias_correction"},
    "Adadelta": {"lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize", "differentiable"},
    "Adafactor": {"lr", "beta2_decay", "d", "eps", "weight_decay", "foreach", "maximize"},
    "Adagrad": {"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach", "maximize",
                "differentiable", "fused"},
    "Adamax": {"lr", "betas", "eps", "weight_decay", "foreach", "maximize", "differentiable", "capturable"},
    "ASGD": {"lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize", "differentiable", "capturable"},
    "LBFGS": {"lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size",
              "line_search_fn"},
    "NAdam": {"lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "foreach",
              "maximize", "capturable", "differentiable"},
    "RAdam": {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "maximize",
              "capturable", "differentiable"},
    "RMSprop": {"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach", "maximize",
                "differentiable"},
    "Rprop": {"lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"},
    "SparseAdam": {"lr", "betas", "eps", "maximize"},
    "Muon": {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
             "adjust_lr_fn"},
}

# Scheduler kwargs, from deepspeed/runtime/lr_schedules.py (0.16 and 0.19 agree).
SCHEDULER_PARAMS: dict[str, set[str]] = {
    "LRRangeTest": {"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                    "lr_range_test_staircase", "last_batch_iteration"},
    "OneCycle": {"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size", "cycle_second_step_size",
                 "cycle_first_stair_count", "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
                 "cycle_min_mom", "cycle_max_mom", "decay_mom_rate", "last_batch_iteration"},
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
    "WarmupDecayLR": {"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                      "last_batch_iteration"},
    "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type",
                       "last_batch_iteration"},
}
SCHEDULER_REQUIRED: dict[str, set[str]] = {"OneCycle": {"cycle_min_lr", "cycle_max_lr"},
                                           "WarmupDecayLR": {"total_num_steps"},
                                           "WarmupCosineLR": {"total_num_steps"}}
# torch.optim.lr_scheduler classes DeepSpeed falls back to (engine._scheduler_from_config); params not checked.
TORCH_SCHEDULERS = frozenset({
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
    "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
    "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", "LRScheduler",
})


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
