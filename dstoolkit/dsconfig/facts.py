"""DeepSpeed facts the validator needs at run time, as plain data (no pydantic import, so `dstoolkit validate`
starts fast). The pydantic models in ds_*.py import these; tests check the two agree.

Sources: deepspeed 0.19.8 runtime/zero/config.py (aliases), runtime/zero/stage_1_and_2.py vs stage3.py (which
keys each stage reads), runtime/precision_config.py (fp16 / bf16 keys), ops/* optimizer signatures,
runtime/lr_schedules.py (scheduler kwargs), torch 2.13 torch.optim / torch.optim.lr_scheduler class names.
"""
from __future__ import annotations

# zero_optimization: stage3_* spelling (DeepSpeed's pydantic alias) -> field name.
ZERO_ALIASES: dict[str, str] = {
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_model_persistence_threshold": "model_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
    "stage3_max_reuse_distance": "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save": "gather_16bit_weights_on_model_save",
    "stage3_module_granularity_threshold": "module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params": "use_all_reduce_for_fetch_params",
    "stage3_allgather_sequential": "allgather_sequential",
}

# Keys that only act at stage 3 (their DeepSpeed docstrings say "Stage 3"/"ZeRO3"; read only by stage3.py).
STAGE3_ONLY_KEYS = frozenset({
    "prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold", "max_live_parameters",
    "max_reuse_distance", "gather_16bit_weights_on_model_save", "module_granularity_threshold",
    "use_all_reduce_for_fetch_params", "allgather_sequential", "sub_group_size", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "stage3_gather_fp16_weights_on_model_save",
    "leaf_module", "save_muon_momentum_buffer_in_memory", "log_trace_cache_warnings",
})
# Keys read only by the stage 1/2 optimizer (grep of deepspeed 0.19.8 runtime/zero/stage_1_and_2.py vs stage3.py).
STAGE12_ONLY_KEYS = frozenset({
    "use_multi_rank_bucket_allreduce", "round_robin_gradients", "ignore_unused_parameters", "parameter_alignment",
    "legacy_stage1",
})

# fp16-only keys (dynamic loss scaling); bf16 needs no loss scaling (bf16 has fp32's exponent range).
FP16_ONLY_KEYS = frozenset({"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                            "consecutive_hysteresis", "min_loss_scale", "auto_cast", "fp16_master_weights_and_grads"})
BF16_ONLY_KEYS = frozenset({"immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                            "bf16_optimizer_states"})

# Keyword arguments per DeepSpeed optimizer (lower-case type name), from the installed 0.19.8 signatures:
# ops/adam/fused_adam.py FusedAdam, ops/adam/cpu_adam.py DeepSpeedCPUAdam, ops/lamb/fused_lamb.py FusedLamb,
# ops/lion/fused_lion.py FusedLion, ops/adagrad/cpu_adagrad.py, torch.optim.Adagrad; plus the keys the engine
# pops before the call (torch_adam, adam_w_mode, fp32_optimizer_states, foreach) and torch AdamW's kwargs
# (used when torch_adam is true).
_ADAM = frozenset({"lr", "bias_correction", "betas", "eps", "weight_decay", "amsgrad", "set_grad_none",
                   "torch_adam", "adam_w_mode", "fp32_optimizer_states", "foreach", "fused", "capturable", "maximize",
                   "differentiable"})
_TORCH_ADAM = frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable",
                         "differentiable", "fused"})
OPTIMIZER_PARAMS: dict[str, frozenset] = {
    "adam": _ADAM,
    "adamw": _ADAM,
    "lamb": frozenset({"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay", "max_grad_norm",
                       "max_coeff", "min_coeff", "amsgrad"}),
    "lion": frozenset({"lr", "betas", "weight_decay", "set_grad_none"}),
    "adagrad": frozenset({"lr", "eps", "weight_decay", "amsgrad", "fp32_optimizer_states", "lr_decay",
                          "initial_accumulator_value", "foreach", "maximize", "differentiable", "fused"}),
    "muon": frozenset({"lr", "momentum", "weight_decay", "ns_method", "betas", "eps", "adam_w_mode", "torch_adam",
                       "fp32_optimizer_states", "muon_lr", "adam_lr", "nesterov", "ns_steps"}),
    # mup optimizers take torch's Adam/AdamW/SGD kwargs
    "muadam": frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad"}),
    "muadamw": frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad"}),
    "musgd": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
}
# 1-bit optimizers: present in 0.16 (runtime/fp16/onebit/), removed from 0.19 (not in DEEPSPEED_OPTIMIZERS;
# the engine's fallback getattr(torch.optim, name) then fails).
ONEBIT_OPTIMIZER_PARAMS: dict[str, frozenset] = {
    "onebitadam": frozenset({"lr", "freeze_step", "bias_correction", "betas", "eps", "eps_inside_sqrt",
                             "weight_decay", "max_grad_norm", "amsgrad", "cuda_aware", "comm_backend_name"}),
    "zerooneadam": frozenset({"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                              "max_grad_norm", "var_freeze_step", "var_update_scaler", "local_step_scaler",
                              "local_step_clipper", "amsgrad", "cuda_aware", "comm_backend_name"}),
    "onebitlamb": frozenset({"lr", "freeze_step", "bias_correction", "betas", "eps", "eps_inside_sqrt",
                             "weight_decay", "max_grad_norm", "max_coeff", "min_coeff", "amsgrad", "cuda_aware",
                             "comm_backend_name", "coeff_beta", "factor_max", "factor_min", "factor_threshold"}),
}
# Optimizers in torch.optim (torch 2.13) that DeepSpeed falls back to by exact class name.
TORCH_OPTIMIZERS: dict[str, frozenset] = {
    "SGD": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
                      "differentiable", "fused"}),
    "Adam": _TORCH_ADAM,
    "AdamW": _TORCH_ADAM,
    "Adadelta": frozenset({"lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize",
                           "differentiable"}),
    "Adafactor": frozenset({"lr", "beta2_decay", "d", "eps", "weight_decay", "foreach", "maximize"}),
    "Adagrad": frozenset({"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach",
                          "maximize", "differentiable", "fused"}),
    "Adamax": frozenset({"lr", "betas", "eps", "weight_decay", "foreach", "maximize", "differentiable",
                         "capturable"}),
    "ASGD": frozenset({"lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize", "differentiable",
                       "capturable"}),
    "LBFGS": frozenset({"lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size",
                        "line_search_fn"}),
    "NAdam": frozenset({"lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "foreach",
                        "maximize", "capturable", "differentiable"}),
    "RAdam": frozenset({"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "maximize",
                        "capturable", "differentiable"}),
    "RMSprop": frozenset({"lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach",
                          "maximize", "differentiable"}),
    "Rprop": frozenset({"lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"}),
    "SparseAdam": frozenset({"lr", "betas", "eps", "maximize"}),
    "Muon": frozenset({"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                       "adjust_lr_fn"}),
}

# Scheduler kwargs, from deepspeed/runtime/lr_schedules.py (0.16 and 0.19 agree).
SCHEDULER_PARAMS: dict[str, frozenset] = {
    "LRRangeTest": frozenset({"lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                              "lr_range_test_staircase", "last_batch_iteration"}),
    "OneCycle": frozenset({"cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                           "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
                           "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
                           "last_batch_iteration"}),
    "WarmupLR": frozenset({"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                           "last_batch_iteration"}),
    "WarmupDecayLR": frozenset({"total_num_steps", "warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                "warmup_type", "last_batch_iteration"}),
    "WarmupCosineLR": frozenset({"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                 "warmup_type", "last_batch_iteration"}),
}
SCHEDULER_REQUIRED: dict[str, frozenset] = {"OneCycle": frozenset({"cycle_min_lr", "cycle_max_lr"}),
                                            "WarmupDecayLR": frozenset({"total_num_steps"}),
                                            "WarmupCosineLR": frozenset({"total_num_steps"})}
# torch.optim.lr_scheduler classes DeepSpeed falls back to (engine._scheduler_from_config); params not checked.
TORCH_SCHEDULERS = frozenset({
    "LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR", "ExponentialLR",
    "SequentialLR", "CosineAnnealingLR", "ChainedScheduler", "ReduceLROnPlateau", "CyclicLR",
    "CosineAnnealingWarmRestarts", "OneCycleLR", "PolynomialLR", "LRScheduler",
})

# Offload sub-section keys (runtime/zero/offload_config.py), for "belongs in offload_*" findings.
OFFLOAD_KEYS = frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory",
                          "pipeline_read", "pipeline_write", "fast_init", "ratio", "super_offload",
                          "cpuadam_cores_perc"})


def canonical_zero_key(key: str) -> str:
    """Field name for a zero_optimization key (``stage3_max_live_parameters`` -> ``max_live_parameters``)."""
    return ZERO_ALIASES.get(key, key)
