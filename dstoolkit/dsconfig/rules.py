"""The DeepSpeed cross-field rules, each declared once with `rule` (code, title; the docstring explains it).
Layout arithmetic (data-parallel size, the batch triad, expert groups) is asked of `dstoolkit.layout`; the
optimizer and scheduler rules (DS209-DS212, DS230-DS231) live in ``rules_optim``, the value rules of the other
optimizers (DS233) in ``rules_optim_values``, the type rule of both sections (DS240) in ``rules_types``, what the
engine does with the optimizer section and class (DS245, DS236-DS237) in ``rules_optim_engine``, the scheduler
section and torch schedulers (DS238-DS239) in ``rules_sched_torch``, the schedules' values (DS234-DS235) in
``rules_sched``, the MoE / stage-option / parallelism rules (DS213-DS228) in ``rules_parallel``, what the engine and
the ZeRO optimizers refuse when built or at the first step (steps_per_print, gradient pre-division, ZeRO-1/2 bucket
alignment, ZenFlow: DS241-DS244) in ``rules_engine``, the facts they all read in ``rule_facts``. The
machinery (registry, `RuleViolation`, `RuleContext`, `run_rules`) is ``dstoolkit.dsconfig.registry``; its names are
re-exported here, and readers of the registry import it from here so that every rule is declared.

Declaration order is the order `DeepSpeedConfig` checks them (it reports the first error).
"""
from __future__ import annotations

from typing import Mapping, Optional

from dstoolkit.dsconfig.registry import (RULES, Rule, RuleContext, RuleViolation, as_int, enforce_all,  # noqa: F401
                                         rule, run_rules, section, zero_section, zero_stage)
from dstoolkit.dsconfig.facts import LAX_BOOL_STRINGS, canonical_dtype
from dstoolkit.dsconfig.rule_facts import _bf16_section, _dp_size, _enabled, _sp, dp_formula
from dstoolkit.layout.dims import LayoutError, hpz_partition, resolve_batch


# -- batch ------------------------------------------------------------------------------------------------
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
DS201_DP_FIX_LEAD = "if this config really runs at tp 1 pp 1, "
"""Where DS201's suggestion turns from 'pass the layout (--tp / --pp)' to the data-parallel fix: the trainer's
pre-flight (runtime/train/preflight.py) keeps only what follows it."""


@rule("DS202", "no batch size given")
def _check_batch_given(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu (runtime/config.py
    _set_batch_related_parameters asserts 'Either train_batch_size or train_micro_batch_size_per_gpu needs to
    be provided'). gradient_accumulation_steps alone is not enough."""
    if cfg.get(_BATCH_KEYS[0]) is None and cfg.get(_BATCH_KEYS[1]) is None:
        raise RuleViolation("", "neither train_batch_size nor train_micro_batch_size_per_gpu is set; "
                            "DeepSpeed refuses the config ('Either train_batch_size or train_micro_batch_size_per_gpu "
                            "needs to be provided')", 'add "train_micro_batch_size_per_gpu": 1 (or train_batch_size)')


@rule("DS201", "batch sizes disagree with the data-parallel size")
def _check_batch_triad(cfg: Mapping, ctx: RuleContext) -> None:
    """train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp, with
    dp = world / (tp * pp * sequence_parallel_size); DeepSpeed derives a missing one from the other two
    (runtime/config.py _set_batch_related_parameters, _batch_assertion). With --world-size the three are
    completed with `dstoolkit.layout.resolve_batch` and must agree; without it, train_batch_size must at least
    be a multiple of micro batch x accumulation. Skipped while any of them is "auto" (HF fills them; check
    again after `dstoolkit resolve`)."""
    raw = [cfg.get(n) for n in _BATCH_KEYS]
    if any(v == "auto" for v in raw):
        return  # HF fills these from its own arguments (see dstoolkit.dsconfig.auto); checked after `resolve`
    tb, mb, gas = (as_int(v) for v in raw)
    if tb is None and mb is None:
        return  # DS202
    if any(v is not None and n is None for v, n in zip(raw, (tb, mb, gas))) or any(
            n is not None and n <= 0 for n in (tb, mb, gas)) or (
            cfg.get("sequence_parallel_size") is not None and as_int(cfg.get("sequence_parallel_size")) is None):
        return  # wrong type / range is reported per key (DeepSpeed divides the world by sequence_parallel_size)
    dp = _dp_size(cfg, ctx)
    if dp is None:
        if tb is not None and mb is not None and gas is not None:
            try:  # dp unknown: some whole dp must exist, i.e. the triad completes with dp in the accumulation slot
                resolve_batch(tb, mb * gas, None, 1)
            except LayoutError:
                raise RuleViolation("/train_batch_size",
                                    f"train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu {mb} x "
                                    f"gradient_accumulation_steps {gas} = {mb * gas}, so no data-parallel size fits",
                                    "pass --world-size to get the exact fix") from None
        return
    try:
        resolve_batch(tb, mb, gas, dp)
        return
    except LayoutError:
        pass
    dp_text = f"data-parallel size {dp} ({dp_formula(ctx.world_size, ctx.tp, ctx.pp, _sp(cfg))})"
    if mb is not None and gas is not None:
        fix = (f'set "gradient_accumulation_steps": {tb // (mb * dp)}' if tb % (mb * dp) == 0 else
               f'set "train_batch_size": {mb * gas * dp}')
        implied = tb // (mb * gas) if tb % (mb * gas) == 0 else None
        world = ctx.world_size
        if implied and implied < dp and world % implied == 0 and (ctx.tp, ctx.pp) == (1, 1):
            # the triad holds at a smaller data-parallel size: most likely a model-parallel config checked
            # without its layout (a TP-8 config at tp 1 looks 8x short on batch)
            mp = world // (implied * max(_sp(cfg), 1))
            fix = (f"the batch sizes agree at data-parallel size {implied}, i.e. tp x pp = {mp}: pass the layout "
                   f"(--tp / --pp; `dstoolkit validate` on a generated folder reads it from layout.json); "
                   f"{DS201_DP_FIX_LEAD}{fix}")
        raise RuleViolation("/train_batch_size", f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
                            f"gradient_accumulation_steps {gas} x {dp_text} = {mb * gas * dp}", fix)
    if mb is not None:
        raise RuleViolation("/train_batch_size",
                            f"train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu {mb} x "
                            f"{dp_text} = {mb * dp}; DeepSpeed would derive gradient_accumulation_steps "
                            f"{tb // (mb * dp)} and fail", f'use a train_batch_size that is a multiple of {mb * dp}')
    if gas is not None:
        raise RuleViolation("/train_batch_size", f"train_batch_size {tb} is not a multiple of gradient_accumulation_steps "
                            f"{gas} x {dp_text} = {gas * dp}", f'use a train_batch_size that is a multiple of {gas * dp}')
    raise RuleViolation("/train_batch_size", f"train_batch_size {tb} is not a multiple of {dp_text}",
                        f'use a multiple of {dp}, or set train_micro_batch_size_per_gpu')


# -- precision --------------------------------------------------------------------------------------------
@rule("DS203", "fp16 and bf16 both enabled")
def _check_fp16_bf16_exclusive(cfg: Mapping, ctx: RuleContext) -> None:
    """fp16.enabled and bf16.enabled cannot both be true (DeepSpeed asserts in _initialize_params: 'bfloat16
    and fp16 modes cannot be simultaneously enabled'). Under DeepSpeed 0.16 in strict mode "auto" counts as
    enabled, because 0.16 read the flag raw."""
    bname, bf16 = _bf16_section(cfg)
    fp16 = section(cfg, "fp16")
    if _enabled(fp16, ctx) and _enabled(bf16, ctx):
        raise RuleViolation(f"/{bname}/enabled",
                            f"fp16.enabled={fp16.get('enabled')!r} and {bname}.enabled={bf16.get('enabled')!r}: "
                            "DeepSpeed refuses both ('bfloat16 and fp16 modes cannot be simultaneously enabled')",
                            "keep one: bf16 on Ampere or newer, fp16 otherwise")


@rule("DS220", "fp16 dynamic loss scaling with a non-positive window or floor")
def _check_fp16_dynamic_loss_scale(cfg: Mapping, ctx: RuleContext) -> None:
    """With dynamic loss scaling (fp16.enabled true, fp16.loss_scale 0) loss_scale_window and min_loss_scale
    must be > 0 (deepspeed 0.19 runtime/precision_config.py: the window is a modulus, min_loss_scale the
    floor of the scale)."""
    fp16 = section(cfg, "fp16")
    if fp16.get("enabled") is not True or fp16.get("loss_scale", 0) != 0:
        return
    for name in ("loss_scale_window", "min_loss_scale"):
        v = fp16.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
            raise RuleViolation(f"/fp16/{name}", f"fp16.{name}={v} must be > 0 when dynamic loss scaling "
                                "is on (fp16.enabled true, fp16.loss_scale 0); DeepSpeed refuses it",
                                f"use the default ({1000 if name == 'loss_scale_window' else 1})")


@rule("DS246", "fp16.auto_cast with fp16 off", severity="warning")
def _check_fp16_auto_cast_without_fp16(cfg: Mapping, ctx: RuleContext) -> None:
    """fp16.auto_cast acts whether or not fp16 is enabled: DeepSpeed 0.19.8 reads it on its own
    (runtime/engine.py fp16_auto_cast returns float16_config.auto_cast) and _forward_prologue casts every
    floating-point positional input of engine(...) to fp16 when it is true (_cast_inputs_half), so a bf16 or fp32
    model gets fp16 inputs: measured on a 1-rank gloo engine, engine(x) raises 'mat1 and mat2 must have the same
    dtype, but got Half and BFloat16' (or Half and Float); a model that casts its inputs back passes them through
    fp16's range (+-65504: larger values become inf). Keyword arguments are not cast, so HF Trainer
    (model(**inputs)) is spared. fp16.enabled "auto" is off in strict mode (DeepSpeed drops "auto") and, under HF,
    off unless it runs with --fp16 (InternVL's configs ship this and train with --bf16). A warning. Checked for
    0.19 only: 0.16's engine is not installed here to read."""
    fp16 = section(cfg, "fp16")
    if not ctx.deepspeed_version.startswith("0.19") or fp16.get("auto_cast") is not True:
        return
    enabled = fp16.get("enabled", False)
    if enabled is True or (isinstance(enabled, str) and LAX_BOOL_STRINGS.get(enabled.lower()) is True):
        return  # fp16 on ("true" too: DeepSpeed's pydantic reads it so)
    if enabled == "auto":
        state = '"auto", which is false unless HF runs with --fp16' if ctx.mode == "hf" else '"auto" (dropped: false)'
    else:
        state = str(enabled).lower() if isinstance(enabled, bool) else repr(enabled)
    raise RuleViolation("/fp16/auto_cast", f"fp16.auto_cast=true with fp16.enabled {state}: DeepSpeed acts on "
                        "auto_cast whatever fp16.enabled says, so every floating-point positional input to "
                        "engine(...) becomes fp16 while the model runs in bf16 / fp32 ('mat1 and mat2 must have the "
                        "same dtype', or values beyond +-65504 become inf); keyword inputs are not cast",
                        'delete "auto_cast" (or set it false) unless you train in fp16')


@rule("DS229", "gradient accumulation dtype other than the model's at ZeRO stage 0")
def _check_grad_accum_dtype_stage0(cfg: Mapping, ctx: RuleContext) -> None:
    """Without ZeRO (stage 0) DeepSpeed 0.19 accepts data_types.grad_accum_dtype only equal to the model dtype
    (fp32, or the enabled fp16 / bf16), compared as torch dtypes, so any DtypeEnum spelling of it ("float32",
    "torch.bfloat16") counts as that dtype: engine.py _do_optimizer_sanity_check raises NotImplementedError("unsupported
    mix of model_dtype=... and grad_accum_dtype=...") at initialize. bf16 with fp32 accumulation runs at stage 1
    (BF16_Optimizer), 2 or 3 (measured on 2 gloo ranks: stage 0 raises, stages 1-3 train). Checked for 0.19 only:
    0.16's engine is not installed here to read."""
    if not ctx.deepspeed_version.startswith("0.19") or zero_stage(cfg) != 0:
        return
    raw = section(cfg, "data_types").get("grad_accum_dtype")
    acc = canonical_dtype(raw)
    if acc is None:
        return  # not a dtype DeepSpeed's DtypeEnum knows: DS103
    bname, bf16 = _bf16_section(cfg)
    model = "bf16" if _enabled(bf16, ctx) else "fp16" if _enabled(section(cfg, "fp16"), ctx) else "fp32"
    if acc != model:
        raise RuleViolation("/data_types/grad_accum_dtype",
                            f"data_types.grad_accum_dtype={raw!r}{'' if raw == acc else f' ({acc})'} with a {model} "
                            f"model at ZeRO stage 0: DeepSpeed "
                            f"raises NotImplementedError ('unsupported mix of model_dtype and grad_accum_dtype')",
                            f'use "zero_optimization": {{"stage": 1}} (BF16_Optimizer for bf16 + fp32) or remove '
                            f"data_types.grad_accum_dtype")


# -- ZeRO -------------------------------------------------------------------------------------------------
@rule("DS204", "offload_param needs ZeRO stage 3", severity="warning")
def _check_offload_param_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """zero_optimization.offload_param (and the deprecated cpu_offload_param) only acts at ZeRO stage 3:
    runtime/zero/stage3.py is its only reader. At stages 0-2 DeepSpeed ignores it silently and the parameters
    stay on the GPU, so the memory the offload was meant to free is not freed. A warning (unlike offload_optimizer
    at stage 0, DS105, which builds a CPU optimizer for GPU parameters): DeepSpeed 0.19.8 starts and trains with it
    (measured with deepspeed.initialize on 2 gloo ranks at stages 0, 1 and 2; microsoft/DeepSpeed's own
    tests/hybrid_engine/hybrid_engine_config.json sets it at stage 0)."""
    z = zero_section(cfg)
    op = z.get("offload_param")
    stage = zero_stage(cfg)
    if isinstance(op, dict) and op.get("device", "none") not in ("none", None) and stage is not None and stage != 3:
        raise RuleViolation("/zero_optimization/offload_param",
                            f"offload_param.device={op.get('device')!r} needs ZeRO stage 3, but "
                            f"zero_optimization.stage={stage}; DeepSpeed starts but ignores it and keeps the parameters "
                            "on the GPU",
                            'set "stage": 3, or offload only the optimizer (offload_optimizer)')
    if z.get("cpu_offload_param") is True and stage is not None and stage != 3:
        raise RuleViolation("/zero_optimization/cpu_offload_param",
                            f"cpu_offload_param=true needs ZeRO stage 3, but zero_optimization.stage={stage}",
                            'set "stage": 3 and use offload_param {"device": "cpu"}')


def _nvme_sections(cfg: Mapping) -> list[tuple[str, dict]]:
    z = zero_section(cfg)
    return [(k, z[k]) for k in ("offload_param", "offload_optimizer")
            if isinstance(z.get(k), dict) and z[k].get("device") == "nvme"]


@rule("DS205", "NVMe offload needs nvme_path")
def _check_nvme_path(cfg: Mapping, ctx: RuleContext) -> None:
    """An offload section with device "nvme" needs nvme_path, the directory on the NVMe drive for the swap
    files; DeepSpeed fails at engine start without it."""
    for key, sec in _nvme_sections(cfg):
        if not sec.get("nvme_path"):
            raise RuleViolation(f"/zero_optimization/{key}/device",
                                f'zero_optimization.{key}.device="nvme" but {key}.nvme_path is not set',
                                f'add "nvme_path": "/local_nvme" to {key}')


@rule("DS206", "NVMe offload without an aio section", severity="warning")
def _check_nvme_aio(cfg: Mapping, ctx: RuleContext) -> None:
    """NVMe offload without an aio section runs with DeepSpeed's aio defaults (block_size 1 MiB, queue_depth
    8, intra_op_parallelism 1), which are rarely tuned for the drive. A warning: the job runs, slowly.
    Reported once the nvme_path rule (DS205) passes."""
    nvme = _nvme_sections(cfg)
    if nvme and "aio" not in cfg and all(sec.get("nvme_path") for _, sec in nvme):
        raise RuleViolation(f"/zero_optimization/{nvme[0][0]}/device",
                            f"NVMe offload ({', '.join(k for k, _ in nvme)}) without an aio section: DeepSpeed uses "
                            "block_size 1 MiB, queue_depth 8, intra_op_parallelism 1, which is rarely tuned for the drive",
                            'add "aio": {"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 4, '
                            '"single_submit": false, "overlap_events": true} and tune with ds_nvme_tune')


@rule("DS208", "ZeRO++ option needs ZeRO stage 3")
def _check_zeropp_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """ZeRO++ (qwZ zero_quantized_weights, qgZ zero_quantized_gradients, hpZ zero_hpz_partition_size > 1, and
    zero_quantized_nontrainable_weights) is implemented only in stage 3 (runtime/zero/stage3.py reads these
    keys). At stages 0-2 DeepSpeed ignores them."""
    z = zero_section(cfg)
    stage = zero_stage(cfg)
    if stage is None or stage == 3:
        return
    for key in ("zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights"):
        if z.get(key) is True:
            raise RuleViolation(f"/zero_optimization/{key}",
                                f"zero_optimization.{key}=true needs ZeRO stage 3 (ZeRO++), but stage={stage}; "
                                "DeepSpeed ignores it", 'set "stage": 3 or remove the key')
    hpz = as_int(z.get("zero_hpz_partition_size"))
    if hpz is not None and hpz > 1:
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size",
                            f"zero_optimization.zero_hpz_partition_size={hpz} needs ZeRO stage 3 (ZeRO++ hpZ), "
                            f"but stage={stage}; DeepSpeed ignores it", 'set "stage": 3 or remove the key')


def _hpz(cfg: Mapping) -> Optional[int]:
    hpz = as_int(zero_section(cfg).get("zero_hpz_partition_size"))
    return hpz if hpz is not None and hpz > 1 and zero_stage(cfg) == 3 else None


@rule("DS207", "zero_hpz_partition_size does not divide the world size")
def _check_hpz_divides_world(cfg: Mapping, ctx: RuleContext) -> None:
    """hpZ (ZeRO++) keeps a secondary copy of the parameters partitioned over groups of consecutive ranks.
    DeepSpeed 0.19.8 (utils/groups.py _create_zero_param_parallel_group) takes the group size as
    min(zero_hpz_partition_size, world size) and asserts that it divides the world size, so a value larger
    than the world size is clamped (rule DS221 warns), and a smaller one that does not divide the world size
    fails at engine start. Needs --world-size."""
    hpz = _hpz(cfg)
    if hpz is None or ctx.world_size is None:
        return
    eff = min(hpz, ctx.world_size)
    if ctx.world_size % eff:
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size",
                            f"zero_hpz_partition_size={hpz} does not divide world size {ctx.world_size}; DeepSpeed "
                            "asserts when it builds the hpZ groups (groups._create_zero_param_parallel_group)",
                            "use the number of GPUs per node")


@rule("DS221", "zero_hpz_partition_size clamped to the world size or spanning nodes", severity="warning")
def _check_hpz_clamped_or_cross_node(cfg: Mapping, ctx: RuleContext) -> None:
    """A zero_hpz_partition_size larger than the world size is not an error: DeepSpeed 0.19.8 clamps the hpZ
    group to the world size (groups.py: min(group_size, world_size); measured: hpZ 8 on 2 gloo ranks builds a
    group of 2 and trains). The secondary partition is then the whole world: on one node that saves no
    inter-node traffic, and DeepSpeed still keeps it as a second copy of the primary one. Separately, the point of hpZ is to keep the secondary partition inside one node, and DeepSpeed builds
    its groups from consecutive global ranks (utils/groups.py _create_zero_param_parallel_group: ranks
    i * size .. (i + 1) * size - 1): on more than one node (world size > --gpus-per-node), a group size that does
    not divide --gpus-per-node, the whole world included, makes the groups span nodes (DeepSpeed does not check
    it; it runs, with the backward all-gather crossing the inter-node link). The fix suggested is the value
    generate writes (layout.dims.hpz_partition: the node's data-parallel ranks, or 1, hpZ off, where the
    data-parallel group fits in one node)."""
    hpz = _hpz(cfg)
    if hpz is None:
        return
    world, per_node = ctx.world_size, ctx.gpus_per_node
    eff = min(hpz, world) if world is not None else hpz
    clamp = (f"zero_hpz_partition_size={hpz} is larger than the world size {world}; DeepSpeed clamps the hpZ "
             f"group to {world} ranks") if world is not None and hpz > world else None
    if per_node is not None and per_node % eff and (world is None or world > per_node):
        dp = _dp_size(cfg, ctx)
        fix = hpz_partition(per_node, world, max(ctx.tp, 1), dp) if world is not None and dp is not None else per_node
        what = f'use "zero_hpz_partition_size": {fix}' + (" (hpZ off: the data-parallel group fits in one node)"
                                                           if fix == 1 else "")
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size",
                            (f"{clamp}, which" if clamp else f"zero_hpz_partition_size={hpz}") + f" does not divide "
                            f"--gpus-per-node {per_node}; the secondary partition groups ({eff} consecutive ranks) "
                            "span nodes (DeepSpeed runs it, without hpZ's benefit)", what)
    if clamp:
        one_node = per_node is not None and world <= per_node
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size", clamp,
                            f'"zero_hpz_partition_size": {world} says what runs' + (
                                "; on one node hpZ saves no inter-node traffic, and 1 (off) saves its second copy"
                                if one_node else "; fine on one node (pass --gpus-per-node to check the nodes)"))


# The optimizer and scheduler rules (DS209-DS212, and the value rules DS230-DS231) are declared in rules_optim;
# importing it here keeps the registry in DeepSpeedConfig's check order (optimizer rules between the ZeRO and
# the MoE rules).
from dstoolkit.dsconfig import rules_optim  # noqa: E402,F401
from dstoolkit.dsconfig.rules_optim import known_optimizers  # noqa: E402,F401  (re-export)
# DS233 (every other optimizer's values), DS240 (values of the wrong type), DS236-DS237 (what the engine does with
# the optimizer class), then DS238-DS239 (building the scheduler section, torch schedulers) and DS234-DS235 (the LR
# schedule's values), after the rules above: DeepSpeed builds the optimizer before the scheduler
# (runtime/engine.py _configure_optimizer, _configure_lr_scheduler).
from dstoolkit.dsconfig import rules_optim_values, rules_types, rules_optim_engine  # noqa: E402,F401
from dstoolkit.dsconfig import rules_sched_torch, rules_sched  # noqa: E402,F401

# DS213-DS228 (MoE, stage-dependent options, parallel sizes, AutoTP, Ulysses, AutoEP) come after the optimizer
# rules in DeepSpeedConfig's check order.
from dstoolkit.dsconfig import rules_parallel  # noqa: E402,F401
# DS241-DS244 (the engine's step, the ZeRO optimizers' constructors, ZenFlow) last: DeepSpeed meets them when it
# builds the ZeRO optimizer (runtime/engine.py _configure_zero_optimizer) or at the first step.
from dstoolkit.dsconfig import rules_engine  # noqa: E402,F401
