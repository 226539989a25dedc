"""What DeepSpeed's engine and its ZeRO optimizers refuse when they are built or take their first step (DS241-DS244):
the progress-report interval, the gradient pre-division and pre-scaling the reduce-scatter path does not implement,
the all-gather bucket alignment of ZeRO-1/2 and ZenFlow's selection and update intervals. Read from deepspeed
0.19.8 (runtime/engine.py, runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/zenflow/) and measured on
a 1-rank gloo CPU engine (deepspeed.initialize on a torch.nn.Linear, a few steps), the ZeRO-1 / ZeRO-3 cases also on
2 ranks. Declared with `dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules`` imports this module (import
that, never this module alone).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from dstoolkit.dsconfig.facts import canonical_dtype
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, as_int, rule, section, zero_section, zero_stage
from dstoolkit.dsconfig.rule_facts import _bf16_section, _enabled


def _number(v: Any) -> Optional[float]:
    """A JSON number as a float; None for anything else (bools included)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# -- the engine's step -------------------------------------------------------------------------------------
@rule("DS241", "steps_per_print is 0 or negative")
def _check_steps_per_print(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed takes steps_per_print raw (runtime/config.py get_steps_per_print: no bound; default None, never
    print) and reports progress when `(global_steps + 1) % steps_per_print == 0` (runtime/engine.py
    _take_model_step; the pipeline engine and utils/timer.py ThroughputTimer take the same modulus). 0 raises
    ZeroDivisionError ('integer modulo by zero') at the first engine.step(): an error, the same in DeepSpeed 0.16
    (its engine has the same line). A negative N runs and prints every |N| steps (Python's modulus), so -1 prints
    every step, not never: a warning. Measured: 0 fails at the first step, -3 trains, null trains."""
    v = cfg.get("steps_per_print")
    n = as_int(v)
    if n is None or n > 0:
        return
    if n == 0:
        raise RuleViolation("/steps_per_print", f"steps_per_print={v!r}: DeepSpeed takes the step count modulo it and "
                            "raises ZeroDivisionError ('integer modulo by zero') at the first engine.step() "
                            "(runtime/engine.py _take_model_step)",
                            'use a positive interval (e.g. "steps_per_print": 100), or remove the key to never print')
    raise RuleViolation("/steps_per_print", f"steps_per_print={v!r}: DeepSpeed prints progress every {-n} step(s) "
                        "(it tests (step + 1) % steps_per_print == 0), not never",
                        f'write "steps_per_print": {-n}, or remove the key to never print', severity="warning")


# -- gradient averaging ------------------------------------------------------------------------------------
def _gradient_average(cfg: Mapping) -> bool:
    """engine.py: gradient_average = gradient_allreduce_op == 'mean' (the default; any case)."""
    op = cfg.get("gradient_allreduce_op", "mean")
    return not isinstance(op, str) or op.lower() == "mean"


@rule("DS242", "gradient_predivide_factor or prescale_gradients the gradient reduction refuses")
def _check_gradient_predivide(cfg: Mapping, ctx: RuleContext) -> None:
    """Two things break the data-parallel gradient reduction.

    At ZeRO stage 2 and 3 with zero_optimization.reduce_scatter true (the default), the ZeRO optimizer asserts at
    deepspeed.initialize that gradient_predivide_factor == 1.0 ('gradient_predivide_factor != 1.0 is not yet
    supported with ZeRO-2 with reduce scatter enabled') and that prescale_gradients is false ('pre-scale gradients
    is not yet supported with ZeRO-2 ...'): runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__ (only
    when gradient_allreduce_op is "mean"; "sum" skips both) and runtime/zero/stage3.py
    DeepSpeedZeroOptimizer_Stage3.__init__ (always). Stage 1 reduces through the same reduce-scatter path without
    the factor and does not assert; with reduce_scatter false stages 1-3 all-reduce and take the factor.

    Where the factor is used, 0 divides by zero: runtime/engine.py allreduce_bucket (stage 0) and
    stage_1_and_2.py gradient_reduction_w_predivide (stages 1-2 with reduce_scatter false) compute 1.0 / factor and
    raise ZeroDivisionError at the first step, unless prescale_gradients is true or gradient_allreduce_op is "sum"
    (then the factor is not read); stage 3 with reduce_scatter false divides the gradient buffer by 0 and multiplies
    it by 0 after the all-reduce (stage3.py __avg_scatter_contiguous_grads): it starts, but the global gradient norm
    is inf and the updates are not the averaged gradient's (measured on 2 ranks). Any other factor, negative ones
    included, gives the same average (measured: 2.0 and -1.0 train at stages 0 and 1, and at stages 2 and 3 with
    reduce_scatter false)."""
    stage = zero_stage(cfg)
    if stage is None:
        return
    gpf = _number(cfg.get("gradient_predivide_factor", 1.0))
    prescale = cfg.get("prescale_gradients") is True
    reduce_scatter = zero_section(cfg).get("reduce_scatter", True) is not False
    average = _gradient_average(cfg)
    if stage >= 2 and reduce_scatter and (stage == 3 or average):
        where = f"ZeRO-{stage} with reduce scatter enabled"
        fix = ('remove it (1.0), or set "reduce_scatter": false in zero_optimization to reduce with all-reduce, '
               "which takes it")
        if gpf is not None and gpf != 1.0:
            raise RuleViolation("/gradient_predivide_factor",
                                f"gradient_predivide_factor={cfg.get('gradient_predivide_factor')!r} at "
                                f"zero_optimization.stage={stage} with reduce_scatter true: DeepSpeed asserts at "
                                f"engine start ('gradient_predivide_factor != 1.0 is not yet supported with {where}')",
                                fix)
        if prescale:
            raise RuleViolation("/prescale_gradients",
                                f"prescale_gradients=true at zero_optimization.stage={stage} with reduce_scatter "
                                f"true: DeepSpeed asserts at engine start ('pre-scale gradients is not yet supported "
                                f"with {where}')", fix.replace("remove it (1.0)", "remove it (false)"))
        return
    if gpf != 0 or prescale or not average or (stage == 1 and reduce_scatter):
        return
    outcome = ("divides the gradients by it: the global gradient norm is inf and the updates are wrong"
               if stage == 3 else
               "computes 1.0 / gradient_predivide_factor and raises ZeroDivisionError at the first step")
    raise RuleViolation("/gradient_predivide_factor",
                        f"gradient_predivide_factor={cfg.get('gradient_predivide_factor')!r} at "
                        f"zero_optimization.stage={stage}" + (" with reduce_scatter false" if stage else "") +
                        f": DeepSpeed {outcome}",
                        "remove it (1.0 divides after the all-reduce only), or use a positive factor such as the "
                        "data-parallel size")


# -- ZeRO-1/2 buckets ---------------------------------------------------------------------------------------
NCCL_START_ALIGNMENT_FACTOR = 2
"""runtime/zero/stage_1_and_2.py: nccl_start_alignment_factor = 2 ('4-byte alignment/sizeof(fp16) = 2')."""


def _zero12_optimizer(cfg: Mapping, ctx: RuleContext, stage: Optional[int]) -> bool:
    """Whether DeepSpeed builds DeepSpeedZeroOptimizer (ZeRO-1/2) for this config. engine.py
    _do_optimizer_sanity_check picks BF16_Optimizer instead at stage 1 for a bf16 model with fp32 gradient
    accumulation (data_types.grad_accum_dtype "fp32") unless the optimizer is offloaded to the CPU."""
    if stage not in (1, 2):
        return False
    _, bf16 = _bf16_section(cfg)
    offload = zero_section(cfg).get("offload_optimizer")
    cpu_offload = isinstance(offload, dict) and offload.get("device") == "cpu"
    acc = canonical_dtype(section(cfg, "data_types").get("grad_accum_dtype"))  # "float32" too (DtypeEnum)
    return not (stage == 1 and _enabled(bf16, ctx) and acc == "fp32" and not cpu_offload)


@rule("DS243", "allgather_bucket_size not a multiple of 2 at ZeRO stage 1 or 2")
def _check_allgather_alignment(cfg: Mapping, ctx: RuleContext) -> None:
    """The ZeRO-1/2 optimizer aligns its all-gather buffers to 4 bytes (two fp16 elements) and asserts
    'allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2' at deepspeed.initialize
    (runtime/zero/stage_1_and_2.py DeepSpeedZeroOptimizer.__init__). Stage 0 (BF16_Optimizer reads the size
    without the check), stage 3 (it does not read the size) and stage 1 with bf16 and fp32 gradient accumulation
    (BF16_Optimizer) take an odd size (measured). reduce_bucket_size has no such check (an odd size trains at stages 1
    and 2); 0 passes the assert."""
    z = zero_section(cfg)
    size = as_int(z.get("allgather_bucket_size"))
    stage = zero_stage(cfg)
    if size is None or size % NCCL_START_ALIGNMENT_FACTOR == 0 or not _zero12_optimizer(cfg, ctx, stage):
        return
    raise RuleViolation("/zero_optimization/allgather_bucket_size",
                        f"allgather_bucket_size={z.get('allgather_bucket_size')!r} at zero_optimization.stage={stage}: "
                        "DeepSpeed asserts at engine start ('allgather_bucket_size must be a multiple of "
                        f"nccl_start_alignment_factor, {NCCL_START_ALIGNMENT_FACTOR}')",
                        f'use an even size, e.g. "allgather_bucket_size": {size + 1}')


# -- ZenFlow ----------------------------------------------------------------------------------------------------
def _zenflow_problem(zf: dict, z: dict, stage: int) -> Optional[tuple[str, str, str]]:
    """(pointer under zenflow, what DeepSpeed does, the fix) for the first refusal DeepSpeed meets, or None."""
    strategy = zf.get("select_strategy", "auto")
    select, update = zf.get("select_interval", "auto"), zf.get("update_interval", "auto")
    sel, upd, spe = as_int(select), as_int(update), as_int(zf.get("steps_per_epoch"))
    if strategy == "auto" and sel is not None:
        return ("select_interval", f"select_interval={select!r} with select_strategy \"auto\" (the default): DeepSpeed "
                "raises Warning('If use auto select strategy, select_interval will be set to 1 and select_strategy "
                "will be set to epoch, thus select_interval would be overwritten.') at engine start",
                'add "select_strategy": "step" (or "epoch") to keep the interval, or remove select_interval')
    if strategy in ("step", "epoch") and select == "auto":
        where = "is not set" if "select_interval" not in zf else 'is "auto"'
        return ("select_interval", f"select_strategy {strategy!r} but select_interval {where}: DeepSpeed raises "
                "ValueError(\"If don't use auto select strategy, select_interval must be a number.\") at engine start",
                f'add "select_interval": N ({"steps" if strategy == "step" else "epochs"} between re-selections), '
                'or use "select_strategy": "auto"')
    if upd is not None and strategy in ("auto", "epoch", "step"):
        # epoch / auto: the ZeRO optimizer multiplies by steps_per_epoch when the config sets it (no dataloader)
        eff = sel if strategy == "step" else (None if spe is None else (1 if strategy == "auto" else sel) * spe)
        if eff is not None and eff != 0 and eff < upd:
            shown = (f"select_interval {sel}" if strategy == "step" else
                     f"select_interval {'1 (auto)' if strategy == 'auto' else sel} x steps_per_epoch {spe} = {eff}")
            return ("select_interval", f"{shown} < update_interval {upd}: DeepSpeed raises ValueError('Select interval "
                    "must be greater or equal to update interval') at engine start",
                    f"use a select_interval of at least {upd}" if strategy == "step" else
                    f"use update_interval <= {eff}, or remove steps_per_epoch (DeepSpeed sets it from the dataloader)")
    if stage == 0:
        return ("", "zenflow at zero_optimization.stage=0: DeepSpeed starts, and the first step raises "
                "AttributeError (ZenFlow's update boundary and gradient reduction live in the ZeRO optimizer)",
                'use "stage": 2 (or 1) with "offload_optimizer": {"device": "cpu"}, or remove zenflow')
    overlap = z.get("overlap_comm")
    if zf.get("offload") is True and not (overlap is True or (overlap is None and stage == 3)):
        shown = "false" if overlap is False else f"unset (false at stage {stage})"
        return ("offload", f"zenflow.offload=true with overlap_comm={shown}: DeepSpeed asserts 'offload selective "
                "optimizer should be used with overlap_comm' at engine start",
                'set "overlap_comm": true in zero_optimization, or remove zenflow.offload')
    oo = z.get("offload_optimizer")
    if stage in (1, 2) and not (isinstance(oo, dict) and oo.get("device") not in (None, "none")):
        return ("", f"zenflow at zero_optimization.stage={stage} without offload_optimizer: DeepSpeed raises "
                "ValueError('Zenflow must be used with cpu offload') at engine start",
                'add "offload_optimizer": {"device": "cpu"} to zero_optimization, or remove zenflow')
    return None


@rule("DS244", "ZenFlow settings DeepSpeed refuses")
def _check_zenflow(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed 0.19.8 checks zero_optimization.zenflow when the engine is built (runtime/zenflow/engine.py
    configure_zenflow) and again in the ZeRO optimizer (runtime/zenflow/zenflow_stage_1_and_2.py
    ZenFlowZeroOptimizer._configure_zenflow, runtime/zenflow/engine_stage3.py configure_zenflow). It refuses:
    an integer select_interval with select_strategy "auto", the default (it raises Warning(...), an exception);
    select_strategy "step" or "epoch" without an integer select_interval (ValueError); a select interval below an
    integer update_interval (ValueError 'Select interval must be greater or equal to update interval'): for "step"
    select_interval itself, for "epoch" and "auto" select_interval (1 for "auto") x steps_per_epoch when the config
    sets steps_per_epoch (with a training dataloader passed to deepspeed.initialize DeepSpeed replaces it by the
    dataloader's length; without one it is what the optimizer multiplies by); zenflow.offload without overlap_comm
    (assert; overlap_comm defaults to false at stages 1-2, true at 3); at stages 1-2 no optimizer offload
    (ValueError 'Zenflow must be used with cpu offload'). At stage 0 the engine starts and the first step raises
    AttributeError (ZenFlowCPUAdam / FusedAdam has no zenflow_need_update or reduce_gradients). A select_interval of 0
    skips the interval check. Measured on a 1-rank gloo engine at stage 2 (stage 1 and 3 for the interval checks,
    which run before the stage-3 optimizer needs CUDA). configure_zenflow's other refusal, torch older than 2.1, is
    not a config matter. The field bounds (topk_ratio in (0, 1), update_interval >= 1) are on the model. DeepSpeed
    0.16 has no ZenFlow (no runtime/zenflow/ in v0.16.5): its DeepSpeedZeroConfig forbids unknown keys
    (runtime/config_utils.py DeepSpeedConfigModel extra="forbid"), so under 0.16 the section itself is refused."""
    z = zero_section(cfg)
    zf = z.get("zenflow")
    stage = zero_stage(cfg)
    if "zenflow" in z and ctx.deepspeed_version.startswith("0.16"):
        raise RuleViolation("/zero_optimization/zenflow", "zero_optimization.zenflow: DeepSpeed 0.16 has no ZenFlow, "
                            "and its zero_optimization section forbids unknown keys (DeepSpeedZeroConfig refuses the "
                            "config)", "remove zenflow, or run a DeepSpeed release that has it (0.19)")
    if not isinstance(zf, dict) or stage is None:
        return
    found = _zenflow_problem(zf, z, stage)
    if found is not None:
        key, message, fix = found
        raise RuleViolation("/zero_optimization/zenflow" + (f"/{key}" if key else ""), message, fix)
