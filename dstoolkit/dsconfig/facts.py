"""DeepSpeed facts the validator needs at run time, as plain data (no pydantic import, so `dstoolkit validate`
starts fast). The pydantic models in ds_*.py import these; tests check the two agree.

Sources: deepspeed 0.19.8 runtime/zero/config.py (aliases), runtime/zero/stage_1_and_2.py vs stage3.py (which
keys each stage reads), runtime/precision_config.py (fp16 / bf16 keys), ops/* optimizer signatures,
runtime/lr_schedules.py (scheduler kwargs), torch 2.13 torch.optim / torch.optim.lr_scheduler class names.
"""
from __future__ import annotations

from typing import NamedTuple

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

# -- what runtime/engine.py _configure_basic_optimizer builds for each DeepSpeed optimizer type (DeepSpeed 0.19.8) --
# It passes optimizer.params to a constructor as keyword arguments, so the keys a type accepts depend on the class it
# builds, which depends on params.torch_adam and on whether the optimizer is offloaded (engine.py
# zero_use_cpu_optimizer: zero_optimization.offload_optimizer.device cpu / nvme, or the deprecated cpu_offload: true,
# which DeepSpeed's zero config turns into offload_optimizer cpu). Constructor signatures as installed:
# ops/adam/fused_adam.py FusedAdam, ops/adam/cpu_adam.py DeepSpeedCPUAdam, ops/lamb/fused_lamb.py FusedLamb,
# ops/lion/fused_lion.py FusedLion, ops/lion/cpu_lion.py DeepSpeedCPULion, ops/adagrad/cpu_adagrad.py
# DeepSpeedCPUAdagrad, torch 2.13 torch.optim.Adam / AdamW / Adagrad / SGD.
OFFLOAD_OPTIMIZER_DEVICES = frozenset({"cpu", "nvme"})
"""offload_optimizer.device values that make the engine build its CPU optimizers (engine.py zero_use_cpu_optimizer;
it does not look at the ZeRO stage)."""
ADAM_ENGINE_KEYS = frozenset({"torch_adam", "adam_w_mode", "fp32_optimizer_states"})
"""Keys engine.py pops before building Adam, AdamW or Muon's auxiliary Adam (_configure_basic_optimizer,
get_optimizer_configuration): they choose the class and its mode (the engine passes the mode and the CPU optimizer's
fp32_optimizer_states on itself), so no class refuses them. With torch_adam it pops foreach too and hands it to
torch."""
_TORCH_ADAMW = frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                          "differentiable", "fused"})
_TORCH_ADAM = _TORCH_ADAMW | {"decoupled_weight_decay"}
_TORCH_SGD = frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach",
                        "differentiable", "fused"})
_TORCH_ADAGRAD = frozenset({"lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach",
                            "maximize", "differentiable", "fused"})
MUON_KEYS = frozenset({"lr", "momentum", "weight_decay", "ns_method", "muon_lr", "betas", "eps", "adam_lr"})
"""What engine.py _muon_param_groups reads: _MUON_HALF_KEYS (lr, momentum, weight_decay, ns_method; muon_lr
overrides lr) for the Muon half, _ADAM_HALF_KEYS (lr, betas, eps, weight_decay; adam_lr overrides lr) for the Adam
half. Every other key is dropped without a word."""
MUON_FIXED = {"nesterov": True, "ns_steps": 5}
"""Muon's settings DeepSpeed never passes: runtime/zero/muon/original_muon.py muon_update's defaults, which
muon_optimizer.py and the ZeRO stage 1/2 Muon paths call without them, so setting them changes nothing."""


class OptimizerBuild(NamedTuple):
    """One class the engine builds for an optimizer type, and the optimizer.params keys it takes."""

    cls: str
    """The class, as findings name it."""
    keywords: frozenset
    """The optimizer.params keys it takes (constructor keywords, plus the keys the engine pops first)."""
    when: str = ""
    """The condition that picks this class over the type's others ("" for the type's only one)."""
    drops_unknown: bool = False
    """True when the engine picks the keys it reads by name and ignores the rest (Muon) instead of passing them all
    to a constructor that raises TypeError."""
    requires: frozenset = frozenset()
    """Keys it fails without (mup's optimizers: KeyError 'lr')."""
    source: str = ""
    """Where the class is built or the behaviour is read (for the messages)."""
    zero_tested: bool = False
    """True when the class is in ZeRO's list of tested optimizers (deepspeed 0.19.8 runtime/zero/utils.py
    ZERO_SUPPORTED_OPTIMIZERS, compared by exact type): the engine refuses any other at ZeRO stage 1-3 unless
    zero_allow_untested_optimizer is set (rule DS236)."""
    amsgrad_raises: bool = False
    """True when it takes amsgrad but raises RuntimeError on amsgrad true (rule DS210): FusedAdam
    (ops/adam/fused_adam.py __init__: 'FusedAdam does not support the AMSGrad variant.') and DeepSpeedCPUAdam
    (ops/adam/cpu_adam.py add_param_group). FusedLamb does too; that is DS233's (rules_optim_values._lamb_extra)."""


_MUP = "mup/optim.py process_param_groups"
OPTIMIZER_BUILDS: dict[str, dict[str, OptimizerBuild]] = {
    # engine.py: torch_adam -> torch.optim.AdamW (Adam when type adam with adam_w_mode false); else offloaded ->
    # DeepSpeedCPUAdam, which the engine passes adamw_mode / fp32_optimizer_states itself; else FusedAdam
    **{t: {"device": OptimizerBuild("FusedAdam", frozenset({"lr", "bias_correction", "betas", "eps", "weight_decay",
                                                           "amsgrad", "set_grad_none"}) | ADAM_ENGINE_KEYS,
                                    "without optimizer offload or torch_adam", source="ops/adam/fused_adam.py",
                                    zero_tested=True, amsgrad_raises=True),
           "offload": OptimizerBuild("DeepSpeedCPUAdam", frozenset({"lr", "bias_correction", "betas", "eps",
                                                                   "weight_decay", "amsgrad"}) | ADAM_ENGINE_KEYS,
                                     "with the optimizer offloaded to cpu / nvme", source="ops/adam/cpu_adam.py",
                                     zero_tested=True, amsgrad_raises=True),
           "torch_adam": OptimizerBuild("torch.optim.AdamW", _TORCH_ADAMW | ADAM_ENGINE_KEYS, "with torch_adam true",
                                        source="torch/optim/adamw.py", zero_tested=True),
           "torch_adam_l2": OptimizerBuild("torch.optim.Adam", _TORCH_ADAM | ADAM_ENGINE_KEYS,
                                           "with torch_adam true and adam_w_mode false", source="torch/optim/adam.py",
                                           zero_tested=True)}
       for t in ("adam", "adamw")},
    "lamb": {"device": OptimizerBuild("FusedLamb", frozenset({"lr", "bias_correction", "betas", "eps",
                                                             "eps_inside_sqrt", "weight_decay", "max_grad_norm",
                                                             "max_coeff", "min_coeff", "amsgrad"}),
                                      source="ops/lamb/fused_lamb.py")},
    "lion": {"device": OptimizerBuild("FusedLion", frozenset({"lr", "betas", "weight_decay", "set_grad_none"}),
                                      "without optimizer offload", source="ops/lion/fused_lion.py", zero_tested=True),
             "offload": OptimizerBuild("DeepSpeedCPULion", frozenset({"lr", "betas", "weight_decay",
                                                                      "fp32_optimizer_states"}),
                                       "with the optimizer offloaded to cpu / nvme", source="ops/lion/cpu_lion.py",
                                       zero_tested=True)},
    "adagrad": {"device": OptimizerBuild("torch.optim.Adagrad", _TORCH_ADAGRAD, "without optimizer offload",
                                         source="torch/optim/adagrad.py", zero_tested=True),
                "offload": OptimizerBuild("DeepSpeedCPUAdagrad", frozenset({"lr", "eps", "weight_decay", "amsgrad",
                                                                            "fp32_optimizer_states"}),
                                          "with the optimizer offloaded to cpu / nvme",
                                          source="ops/adagrad/cpu_adagrad.py", zero_tested=True)},
    "muon": {"device": OptimizerBuild("MuonWithAuxAdam", MUON_KEYS | ADAM_ENGINE_KEYS, drops_unknown=True,
                                      source="runtime/engine.py _muon_param_groups", zero_tested=True),
             "torch_adam": OptimizerBuild("MuonWithAuxAdam", MUON_KEYS | ADAM_ENGINE_KEYS | {"foreach"},
                                          "with torch_adam true", drops_unknown=True,
                                          source="runtime/engine.py _muon_param_groups", zero_tested=True)},
    # mup (not a DeepSpeed dependency; read from microsoft/mup mup/optim.py): MuAdam / MuAdamW / MuSGD pass every
    # key on to torch.optim.Adam / AdamW / SGD, after process_param_groups reads kwargs['lr'] for each param group
    # that sets no lr of its own (the engine passes the model's parameters: one group without lr)
    "muadam": {"device": OptimizerBuild("mup's MuAdam (torch.optim.Adam)", _TORCH_ADAM, requires=frozenset({"lr"}),
                                        source=_MUP, zero_tested=True)},
    "muadamw": {"device": OptimizerBuild("mup's MuAdamW (torch.optim.AdamW)", _TORCH_ADAMW,
                                         requires=frozenset({"lr"}), source=_MUP, zero_tested=True)},
    "musgd": {"device": OptimizerBuild("mup's MuSGD (torch.optim.SGD)", _TORCH_SGD, requires=frozenset({"lr"}),
                                       source=_MUP)},
}
"""Lower-case DeepSpeed optimizer type -> {path: the class built}; paths: device (the default), offload, torch_adam,
torch_adam_l2 (`dstoolkit.dsconfig.rules_optim.optimizer_build` picks one as the engine does)."""
OPTIMIZER_PARAMS: dict[str, frozenset] = {t: frozenset().union(*(b.keywords for b in builds.values()))
                                          for t, builds in OPTIMIZER_BUILDS.items()}
"""Lower-case DeepSpeed optimizer type -> every key one of its classes takes (which one applies: OPTIMIZER_BUILDS)."""
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
    "SGD": _TORCH_SGD,
    "Adam": _TORCH_ADAM,
    "AdamW": _TORCH_ADAMW,
    "Adadelta": frozenset({"lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize",
                           "differentiable"}),
    "Adafactor": frozenset({"lr", "beta2_decay", "d", "eps", "weight_decay", "foreach", "maximize"}),
    "Adagrad": _TORCH_ADAGRAD,
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


class TorchSchedulerArgs(NamedTuple):
    """A torch.optim.lr_scheduler constructor's keywords after the optimizer (torch 2.13 inspect.signature)."""

    keywords: tuple
    """Every keyword it takes, in signature order."""
    required: tuple = ()
    """The keywords without a default (TypeError 'missing ... required positional argument' when absent)."""
    objects: tuple = ()
    """Required parameters that take Python objects JSON cannot hold (a callable, scheduler instances)."""


# The torch.optim.lr_scheduler classes DeepSpeed 0.19.8 builds by name when scheduler.type is not one of its own
# (engine._scheduler_from_config: getattr(torch.optim.lr_scheduler, type)(self.optimizer, **params)), with their
# constructors' keywords. Transcribed from torch 2.13's signatures; tests/unit/test_s29c_rules_sched_torch.py
# derives the same table from inspect.signature and fails on any drift. _LRScheduler, torch's deprecated alias of
# LRScheduler, is left out.
TORCH_SCHEDULER_ARGS: dict[str, TorchSchedulerArgs] = {
    "LambdaLR": TorchSchedulerArgs(("lr_lambda", "last_epoch"), ("lr_lambda",), ("lr_lambda",)),
    "MultiplicativeLR": TorchSchedulerArgs(("lr_lambda", "last_epoch"), ("lr_lambda",), ("lr_lambda",)),
    "StepLR": TorchSchedulerArgs(("step_size", "gamma", "last_epoch"), ("step_size",)),
    "MultiStepLR": TorchSchedulerArgs(("milestones", "gamma", "last_epoch"), ("milestones",)),
    "ConstantLR": TorchSchedulerArgs(("factor", "total_iters", "last_epoch")),
    "LinearLR": TorchSchedulerArgs(("start_factor", "end_factor", "total_iters", "last_epoch")),
    "ExponentialLR": TorchSchedulerArgs(("gamma", "last_epoch"), ("gamma",)),
    "SequentialLR": TorchSchedulerArgs(("schedulers", "milestones", "last_epoch"), ("schedulers", "milestones"),
                                       ("schedulers",)),
    "CosineAnnealingLR": TorchSchedulerArgs(("T_max", "eta_min", "last_epoch"), ("T_max",)),
    # ChainedScheduler(schedulers, optimizer=None): the optimizer DeepSpeed passes first lands in `schedulers`
    "ChainedScheduler": TorchSchedulerArgs(("optimizer",), (), ("schedulers",)),
    "ReduceLROnPlateau": TorchSchedulerArgs(("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown",
                                             "min_lr", "eps")),
    "CyclicLR": TorchSchedulerArgs(("base_lr", "max_lr", "step_size_up", "step_size_down", "mode", "gamma",
                                    "scale_fn", "scale_mode", "cycle_momentum", "base_momentum", "max_momentum",
                                    "last_epoch"), ("base_lr", "max_lr")),
    "CosineAnnealingWarmRestarts": TorchSchedulerArgs(("T_0", "T_mult", "eta_min", "last_epoch"), ("T_0",)),
    "OneCycleLR": TorchSchedulerArgs(("max_lr", "total_steps", "epochs", "steps_per_epoch", "pct_start",
                                      "anneal_strategy", "cycle_momentum", "base_momentum", "max_momentum",
                                      "div_factor", "final_div_factor", "three_phase", "last_epoch"), ("max_lr",)),
    "PolynomialLR": TorchSchedulerArgs(("total_iters", "power", "last_epoch")),
    "LRScheduler": TorchSchedulerArgs(("last_epoch",)),
}
TORCH_SCHEDULERS = frozenset(TORCH_SCHEDULER_ARGS)
"""torch.optim.lr_scheduler class names DeepSpeed builds by name (rule DS239 checks them)."""

# -- the JSON type each optimizer / scheduler parameter needs (rule DS240) --------------------------------------
# DeepSpeed passes optimizer.params and scheduler.params on unchanged (no pydantic model types them), so a string,
# null or a short list reaches Python arithmetic and raises TypeError / IndexError / ValueError. Kinds:
NUMBER, NUMBERS, FLOATABLE, PAIR, PAIR_NONE_FIRST, BOOL = ("number", "numbers", "floatable", "pair",
                                                           "pair-none-first", "bool")
"""number: an int or float; numbers: a number or a per-param-group list of them (DeepSpeed's _format_param);
floatable: anything float() takes, numeric strings included; pair: a list of exactly two numbers (unpacked
`a, b = value`); pair-none-first: a pair whose first item may be null (torch.optim.Adafactor's eps); bool: a JSON
boolean (a string is tested for truth, so "false" is true). A kind ending in "?" also takes null (the default
applies)."""
OPTIMIZER_PARAM_KINDS: dict[str, str] = {
    **dict.fromkeys(("lr", "eps", "weight_decay", "momentum", "dampening", "alpha", "lr_decay",
                     "initial_accumulator_value", "rho", "beta2_decay", "d", "lambd", "t0", "max_coeff", "min_coeff",
                     "momentum_decay", "muon_lr", "adam_lr", "tolerance_grad", "tolerance_change", "max_iter",
                     "history_size", "ns_steps"), NUMBER),
    "max_eval": NUMBER + "?",
    **dict.fromkeys(("betas", "etas", "step_sizes"), PAIR),
    **dict.fromkeys(("amsgrad", "maximize", "capturable", "differentiable", "nesterov", "centered", "bias_correction",
                     "set_grad_none", "eps_inside_sqrt", "adam_w_mode", "torch_adam", "fp32_optimizer_states",
                     "decoupled_weight_decay", "foreach", "fused"), BOOL),
}
"""optimizer.params key -> kind, the same for every optimizer that takes the key (torch 2.13 and DeepSpeed 0.19.8
constructors; foreach / fused default to None, which bool accepts)."""
OPTIMIZER_PARAM_KIND_OVERRIDES: dict[str, dict[str, str]] = {"Adafactor": {"eps": PAIR_NONE_FIRST}}
"""optimizer.type (exact case) -> the keys whose kind differs for it (torch.optim.Adafactor eps=(None, 1e-3))."""
_WARMUP_KINDS = {"warmup_min_lr": NUMBERS, "warmup_max_lr": NUMBERS + "?", "last_batch_iteration": NUMBER}
SCHEDULER_PARAM_KINDS: dict[str, dict[str, str]] = {
    "LRRangeTest": {"lr_range_test_min_lr": NUMBERS, "lr_range_test_step_rate": NUMBER,
                    "lr_range_test_staircase": BOOL, "last_batch_iteration": NUMBER},
    "OneCycle": {"cycle_min_lr": NUMBERS, "cycle_max_lr": NUMBERS, "decay_lr_rate": NUMBER,
                 "cycle_first_step_size": FLOATABLE, "cycle_second_step_size": FLOATABLE + "?",
                 "cycle_first_stair_count": NUMBER, "cycle_second_stair_count": NUMBER + "?",
                 "decay_step_size": NUMBER, "cycle_momentum": BOOL, "cycle_min_mom": NUMBERS,
                 "cycle_max_mom": NUMBERS, "decay_mom_rate": NUMBER, "last_batch_iteration": NUMBER},
    "WarmupLR": _WARMUP_KINDS,
    "WarmupDecayLR": {**_WARMUP_KINDS, "total_num_steps": NUMBER},
    "WarmupCosineLR": {"total_num_steps": NUMBER, "warmup_min_ratio": NUMBER, "cos_min_ratio": NUMBER,
                       "last_batch_iteration": NUMBER},
}
"""DeepSpeed schedule -> scheduler.params key -> kind (deepspeed 0.19.8 runtime/lr_schedules.py: what each
constructor and step does with the value). warmup_num_steps and lr_range_test_step_size (DeepSpeed's own integer
check, rule DS234) and warmup_type (rule DS235) are checked elsewhere. WarmupLR's warmup_max_lr may be null (the
optimizer's lr); OneCycle float()s its step sizes, so "2000" is taken."""

# Offload sub-section keys (runtime/zero/offload_config.py), for "belongs in offload_*" findings.
OFFLOAD_KEYS = frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory",
                          "pipeline_read", "pipeline_write", "fast_init", "ratio", "super_offload",
                          "cpuadam_cores_perc"})


def canonical_zero_key(key: str) -> str:
    """Field name for a zero_optimization key (``stage3_max_live_parameters`` -> ``max_live_parameters``)."""
    return ZERO_ALIASES.get(key, key)


NULL_REFUSED_TOP_LEVEL = frozenset({
    "activation_checkpointing", "autotuning", "bfloat16", "checkpoint", "comet", "comms_logger", "compile",
    "csv_monitor", "data_efficiency", "data_types", "flops_profiler", "fp16", "hybrid_engine", "optimizer", "pipeline",
    "scheduler", "sequence_parallel_size", "tensor_parallel", "tensorboard", "timers", "torch_autocast", "wandb",
    "wall_clock_breakdown", "weight_quantization", "zero_optimization"})
"""Top-level keys whose explicit JSON null DeepSpeed 0.19.8's own config parser (runtime/config.py DeepSpeedConfig)
fails on, measured one key at a time: it reads the key as present and calls ``Model(**None)``, ``None.get`` /
``.keys`` / ``.items``, ``None | bool`` or pydantic's model check on it (TypeError / AttributeError /
ValidationError). The DeepSpeedConfig model makes these non-nullable; bf16, aio, expert_parallel, the batch sizes,
steps_per_print, log_level and the other Optional keys take null as unset, as DeepSpeed does."""


FLOAT_DTYPE_SPELLINGS: dict[str, tuple[str, ...]] = {
    "fp32": ("fp32", "float32", "torch.float32", "float"),
    "fp16": ("fp16", "float16", "torch.float16", "half"),
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
}
"""Canonical name -> every spelling deepspeed 0.19.8's DtypeEnum (runtime/config.py) maps to that torch dtype, exact
case; the engine resolves data_types.grad_accum_dtype / param_dtype / buffer_dtype through it (engine.py
get_data_types, _mixed_precision_dtypes), so "float32" and "torch.bfloat16" are as good as "fp32" and "bf16".
(DtypeEnum's int8 is no floating-point training dtype and is not listed.)"""


def canonical_dtype(value: object) -> "str | None":
    """The canonical name (fp32 / fp16 / bf16) of a DtypeEnum spelling, or None for anything else."""
    if isinstance(value, str):
        for name, spellings in FLOAT_DTYPE_SPELLINGS.items():
            if value in spellings:
                return name
    return None


FLOAT_INT_LIMIT = 2.0**63
"""An integral float reads as an integer only below this magnitude: pydantic (DeepSpeed's config models) refuses
larger ones ('exceeded maximum size', int_parsing_size), -2**63 included."""
FLOAT_INT_TOO_BIG = ("a float this large (|value| >= 2**63, about 9.2e18) is no int64: DeepSpeed's pydantic "
                     "sections refuse it (int_parsing_size), and no count or size needs it")


LAX_BOOL_SECTIONS = frozenset({"zero_optimization", "fp16", "bf16", "bfloat16", "tensorboard", "wandb", "csv_monitor",
                               "comet", "comms_logger", "compile", "hybrid_engine"})
"""Top-level sections DeepSpeed 0.19.8 reads through its pydantic models (DeepSpeedConfigModel: runtime/zero/config.py
DeepSpeedZeroConfig and its offload / zenflow / leaf_module sub-models, runtime/precision_config.py, monitor/config.py,
comm/config.py, compile/config.py, runtime/config.py HybridEngineConfig), whose lax bool fields convert a quoted
boolean: measured with DeepSpeedConfig, "false" in fp16.enabled, offload_optimizer.pin_memory, overlap_comm,
tensorboard / wandb / comms_logger / hybrid_engine enabled or compile.deepcompile reads as False. Elsewhere
DeepSpeed reads the raw value (get_scalar_param): "false" in wall_clock_breakdown raises TypeError, in
prescale_gradients or activation_checkpointing it stays a truthy string."""
LAX_BOOL_STRINGS: dict[str, bool] = {**dict.fromkeys(("true", "1", "on", "t", "y", "yes"), True),
                                     **dict.fromkeys(("false", "0", "off", "f", "n", "no"), False)}
"""The strings pydantic's lax bool reads as a boolean, compared lower-cased and unstripped (pydantic-core bool
parsing: "TRUE" and "1" read as True, " true" is refused)."""
