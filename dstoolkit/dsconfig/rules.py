"""The DeepSpeed cross-field rules, each declared once with `rule` (code, title; the docstring explains it).
Layout arithmetic (data-parallel size, the batch triad, expert groups) is asked of `dstoolkit.layout`; the
optimizer and scheduler rules live in ``rules_optim``. The machinery (registry, `RuleViolation`,
`RuleContext`, `run_rules`) is ``dstoolkit.dsconfig.registry``; its names are re-exported here, and readers
of the registry import it from here so that every rule is declared.

Declaration order is the order `DeepSpeedConfig` checks them (it reports the first error).
"""
from __future__ import annotations

from typing import Mapping, Optional

from dstoolkit.dsconfig.registry import (RULES, Rule, RuleContext, RuleViolation, as_int, enforce_all,  # noqa: F401
                                         rule, run_rules, section, zero_section, zero_stage)
from dstoolkit.layout.constraints import LayoutFacts, check_layout
from dstoolkit.layout.dims import LayoutError, data_parallel_size, resolve_batch


# -- helpers ----------------------------------------------------------------------------------------------
def _bf16_section(cfg: Mapping) -> tuple[str, dict]:
    if "bf16" in cfg:
        return "bf16", section(cfg, "bf16")
    return "bfloat16", section(cfg, "bfloat16")


def _enabled(sec: dict, ctx: RuleContext) -> bool:
    v = sec.get("enabled", False)
    if v == "auto":
        # 0.16 read `enabled` with get_scalar_param, so "auto" is truthy there; 0.19's pydantic drops it.
        return ctx.deepspeed_version.startswith("0.16") and ctx.mode == "strict"
    return v is True


def _sp(cfg: Mapping) -> int:
    return as_int(cfg.get("sequence_parallel_size")) or 1


def _dp_size(cfg: Mapping, ctx: RuleContext) -> Optional[int]:
    """dp = world / (tp * pp * sequence_parallel_size) (dstoolkit.layout); None when unknown or not whole."""
    if ctx.world_size is None:
        return None
    return data_parallel_size(ctx.world_size, ctx.tp, ctx.pp, _sp(cfg))


def _layout_facts(cfg: Mapping, ctx: RuleContext, **more) -> LayoutFacts:
    return LayoutFacts(world=ctx.world_size, gpus_per_node=ctx.gpus_per_node, tp=max(ctx.tp, 1),
                       pp=max(ctx.pp, 1), sp=max(_sp(cfg), 1), **more)


def _moe_facts(cfg: Mapping, ctx: RuleContext) -> tuple[Optional[int], Optional[int], Optional[int]]:
    moe = section(section(cfg, "dstoolkit"), "moe")
    n = ctx.num_experts if ctx.num_experts is not None else as_int(moe.get("num_experts"))
    ep = ctx.ep_size if ctx.ep_size is not None else as_int(moe.get("ep_size"))
    k = as_int(moe.get("top_k"))
    return n, ep, k


# -- batch ------------------------------------------------------------------------------------------------
_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


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
            n is not None and n <= 0 for n in (tb, mb, gas)):
        return  # wrong type / range is reported per key
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
    dp_text = (f"data-parallel size {dp} (world size {ctx.world_size}"
               + (f" / (tp {ctx.tp} x pp {ctx.pp})" if (ctx.tp, ctx.pp) != (1, 1) else "") + ")")
    if mb is not None and gas is not None:
        fix = (f'set "gradient_accumulation_steps": {tb // (mb * dp)}' if tb % (mb * dp) == 0 else
               f'set "train_batch_size": {mb * gas * dp}')
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


# -- ZeRO -------------------------------------------------------------------------------------------------
@rule("DS204", "offload_param needs ZeRO stage 3", severity="warning")
def _check_offload_param_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """zero_optimization.offload_param (and the deprecated cpu_offload_param) only acts at ZeRO stage 3:
    runtime/zero/stage3.py is its only reader. At stages 0-2 DeepSpeed ignores it silently and the parameters
    stay on the GPU, so the memory the offload was meant to free is not freed. A warning, like
    offload_optimizer at stage 0 (DS105): DeepSpeed 0.19.8 starts and trains with it (measured with
    deepspeed.initialize on 2 gloo ranks at stages 0, 1 and 2; microsoft/DeepSpeed's own
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
    group of 2 and trains). The secondary partition is then the whole world, which is what a single node
    wants. Separately, the point of hpZ is to keep the secondary partition inside one node: a size that does
    not divide --gpus-per-node makes the groups span nodes (DeepSpeed does not check it; it runs, with the
    backward all-gather crossing the inter-node link)."""
    hpz = _hpz(cfg)
    if hpz is None:
        return
    if ctx.world_size is not None and hpz > ctx.world_size:
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size",
                            f"zero_hpz_partition_size={hpz} is larger than the world size {ctx.world_size}; DeepSpeed "
                            f"clamps the hpZ group to {ctx.world_size} ranks",
                            f'fine on one node; "zero_hpz_partition_size": {ctx.world_size} says what runs')
    eff = min(hpz, ctx.world_size) if ctx.world_size is not None else hpz
    if ctx.gpus_per_node is not None and ctx.gpus_per_node % eff and eff != ctx.world_size:
        raise RuleViolation("/zero_optimization/zero_hpz_partition_size",
                            f"zero_hpz_partition_size={hpz} does not divide --gpus-per-node {ctx.gpus_per_node}; the "
                            "secondary partition groups span nodes (DeepSpeed runs it, without hpZ's benefit)",
                            f'use "zero_hpz_partition_size": {ctx.gpus_per_node}')


# The optimizer and scheduler rules (DS209-DS212) are declared in rules_optim; importing it here keeps the
# registry in DeepSpeedConfig's check order (optimizer rules between the ZeRO and the MoE rules).
from dstoolkit.dsconfig import rules_optim  # noqa: E402,F401
from dstoolkit.dsconfig.rules_optim import known_optimizers  # noqa: E402,F401  (re-export)


# -- MoE --------------------------------------------------------------------------------------------------
@rule("DS213", "expert parallel size does not divide world size / experts")
def _check_moe_layout(cfg: Mapping, ctx: RuleContext) -> None:
    """Experts are sharded over ep_size ranks, so ep_size divides num_experts (layout constraint LY008), and
    expert groups are carved out of the data-parallel group (deepspeed/utils/groups.py), so ep_size divides
    the data-parallel size (LY009); top_k is at most num_experts. The MoE facts come from --num-experts /
    --ep-size or the config's dstoolkit.moe section."""
    n, ep, k = _moe_facts(cfg, ctx)
    if n is None or ep is None or ep <= 0 or n <= 0:
        return
    ptr = "/dstoolkit/moe/ep_size" if "dstoolkit" in cfg else ""
    for v in check_layout(_layout_facts(cfg, ctx, ep=ep, num_experts=n), ("LY008", "LY009"), {"ep": "ep_size"}):
        raise RuleViolation(ptr, v.message, f"use an ep_size that divides {n}" if v.code == "LY008" else v.fix)
    if k is not None and k > n:
        raise RuleViolation("/dstoolkit/moe/top_k", f"top_k {k} exceeds num_experts {n}", f"use top_k <= {n}")


@rule("DS214", "native DeepSpeed MoE at ZeRO stage 3")
def _check_moe_not_stage3(cfg: Mapping, ctx: RuleContext) -> None:
    """Native DeepSpeed MoE (deepspeed.moe.layer.MoE) is refused at ZeRO stage 3: the engine raises 'Native
    DeepSpeed MoE is not supported with ZeRO Stage 3' at start (measured on 0.19.8; layout constraint LY010)."""
    n, _, _ = _moe_facts(cfg, ctx)
    if n is None or not check_layout(LayoutFacts(zero_stage=zero_stage(cfg), num_experts=n), ("LY010",)):
        return
    raise RuleViolation("/zero_optimization/stage",
                        f"MoE with {n} experts at zero_optimization.stage=3: DeepSpeed raises 'Native DeepSpeed "
                        "MoE is not supported with ZeRO Stage 3' at engine start", 'use "stage": 2 (or 1) for MoE')


# -- more stage rules -------------------------------------------------------------------------------------
@rule("DS215", "partial optimizer offload needs ZeRO stage 3")
def _check_partial_offload_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """offload_optimizer.ratio < 1 (partial offload: part of the optimizer step stays on the GPU) is only
    implemented for stage 3 (runtime/zero/config.py asserts)."""
    oo = zero_section(cfg).get("offload_optimizer")
    if not isinstance(oo, dict):
        return
    ratio = oo.get("ratio")
    stage = zero_stage(cfg)
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio < 1.0 and stage is not None and stage != 3:
        raise RuleViolation("/zero_optimization/offload_optimizer/ratio",
                            f"offload_optimizer.ratio={ratio} (partial offload) needs ZeRO stage 3, stage={stage}",
                            'set "stage": 3 or "ratio": 1.0')


@rule("DS216", "master-weight / optimizer-state precision option needs ZeRO stage 1-3")
def _check_master_weights_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """fp16_master_weights_and_grads, bf16_master_weights_and_grads and bf16_optimizer_states need ZeRO stage
    1-3, and bf16_optimizer_states needs bf16_master_weights_and_grads (runtime/config.py _do_error_check
    asserts both)."""
    stage = zero_stage(cfg)
    fp16 = section(cfg, "fp16")
    bname, bf16 = _bf16_section(cfg)
    if bf16.get("bf16_optimizer_states") is True and bf16.get("bf16_master_weights_and_grads") is not True:
        raise RuleViolation(f"/{bname}/bf16_optimizer_states",
                            "bf16_optimizer_states=true requires bf16_master_weights_and_grads=true",
                            'add "bf16_master_weights_and_grads": true')
    for ptr, sec, key in (("/fp16", fp16, "fp16_master_weights_and_grads"),
                          (f"/{bname}", bf16, "bf16_master_weights_and_grads"),
                          (f"/{bname}", bf16, "bf16_optimizer_states")):
        if sec.get(key) is True and stage == 0:
            raise RuleViolation(f"{ptr}/{key}", f"{key}=true needs ZeRO stage 1, 2 or 3, but stage=0; "
                                "DeepSpeed asserts at config time", 'set "zero_optimization": {"stage": 1} or remove it')


@rule("DS217", "compute_grad_norm=false needs ZeRO stage 1 or 2")
def _check_compute_grad_norm_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """zero_optimization.compute_grad_norm=false is accepted only at stages 1-2 (runtime/zero/config.py
    compute_grad_norm_valid)."""
    z = zero_section(cfg)
    stage = zero_stage(cfg)
    if z.get("compute_grad_norm") is False and stage not in (1, 2, None):
        raise RuleViolation("/zero_optimization/compute_grad_norm",
                            f"compute_grad_norm=false needs ZeRO stage 1 or 2, stage={stage}", "remove the key")


@rule("DS218", "gradient_allreduce_op 'sum' at ZeRO stage 3")
def _check_allreduce_sum_stage3(cfg: Mapping, ctx: RuleContext) -> None:
    """gradient_allreduce_op 'sum' is refused at ZeRO stage 3 (runtime/config.py _do_error_check); stage 3
    reduce-scatters averaged gradients."""
    op = cfg.get("gradient_allreduce_op")
    if isinstance(op, str) and op.lower() == "sum" and zero_stage(cfg) == 3:
        raise RuleViolation("/gradient_allreduce_op",
                            "gradient_allreduce_op='sum' is not supported with ZeRO stage 3", 'use "mean"')


# -- parallel sizes ---------------------------------------------------------------------------------------
@rule("DS219", "parallel sizes do not divide world size")
def _check_parallel_sizes(cfg: Mapping, ctx: RuleContext) -> None:
    """The world size must be a multiple of tp * pp * sequence_parallel_size, so that a whole data-parallel
    size exists (layout constraint LY001). Needs --world-size; tp and pp come from --tp / --pp."""
    if ctx.world_size is None:
        return
    names = {"sp": "sequence_parallel_size"}
    for v in check_layout(_layout_facts(cfg, ctx), ("LY001",), names):
        raise RuleViolation("", f"{v.message}, so there is no whole data-parallel size", "choose tp, pp and "
                            "sequence_parallel_size whose product divides the number of GPUs")


# -- DeepSpeed's own parallelism: AutoTP, Ulysses, AutoEP -------------------------------------------------
@rule("DS222", "ZeRO stage written as a string", severity="warning")
def _check_stage_string(cfg: Mapping, ctx: RuleContext) -> None:
    """zero_optimization.stage given as a string ("1") is converted by DeepSpeed 0.19.8's lax pydantic
    (runtime/zero/config.py ``stage: ZeroStageEnum``; measured: ``"stage": "1"`` builds
    DeepSpeedZeroOptimizer and trains on 2 gloo ranks). A warning, because other readers of the same file do not
    convert it: accelerate's HfDeepSpeedConfig (accelerate/utils/deepspeed.py ``is_zero3``: ``self._stage ==
    3``, which HF Trainer's ``is_deepspeed_zero3_enabled`` uses) does not see ``"3"`` as ZeRO-3, so zero.Init
    and the ZeRO-3 save/load paths are skipped. Shell templates that keep the quotes around a substituted
    number produce it."""
    z = cfg.get("zero_optimization") if isinstance(cfg, Mapping) else None
    raw = z.get("stage") if isinstance(z, dict) else None
    if isinstance(raw, str) and raw in ("0", "1", "2", "3"):
        raise RuleViolation("/zero_optimization/stage",
                            f'zero_optimization.stage is the string "{raw}"; DeepSpeed converts it to {raw}, but HF '
                            "Trainer/Accelerate test the stage as a number" + (" and will not treat this as ZeRO-3"
                                                                              if raw == "3" else ""),
                            f'write "stage": {raw}')


def _autotp(cfg: Mapping) -> Optional[int]:
    tp = as_int(section(cfg, "tensor_parallel").get("autotp_size"))
    return tp if tp is not None and tp > 1 else None


@rule("DS223", "tensor_parallel.autotp_size does not divide the world size")
def _check_autotp_world(cfg: Mapping, ctx: RuleContext) -> None:
    """AutoTP training builds a (data_parallel, tensor_parallel) device mesh of world / autotp_size by
    autotp_size ranks (deepspeed 0.19.8 utils/groups.py _init_tp_mesh_device, called from the engine when
    tensor_parallel.autotp_size > 1), so autotp_size must divide the world size (and the world / pp stage
    size, module_inject/auto_ep_folding.py); autotp_size larger than the world leaves no whole data-parallel
    group. Needs --world-size. The tp of --tp (Megatron) and autotp_size are two different mechanisms: both > 1
    is refused too."""
    tp = _autotp(cfg)
    if tp is None:
        return
    if ctx.tp > 1:
        raise RuleViolation("/tensor_parallel/autotp_size",
                            f"tensor_parallel.autotp_size={tp} together with --tp {ctx.tp}: AutoTP and Megatron tensor "
                            "parallelism are two ways to shard the same layers", "use one of them")
    if ctx.world_size is None:
        return
    for v in check_layout(LayoutFacts(world=ctx.world_size, tp=tp, pp=max(ctx.pp, 1), sp=1), ("LY001",),
                          {"tp": "tensor_parallel.autotp_size"}):
        raise RuleViolation("/tensor_parallel/autotp_size",
                            f"{v.message}; DeepSpeed cannot build the AutoTP device mesh",
                            "use an autotp_size that divides the world size "
                            f"({', '.join(str(d) for d in range(2, ctx.world_size + 1) if ctx.world_size % d == 0)})")


@rule("DS224", "AutoTP size does not divide the attention heads")
def _check_autotp_heads(cfg: Mapping, ctx: RuleContext) -> None:
    """AutoTP shards attention column-wise by head: the tensor-parallel size must divide the attention head
    count (DeepSpeed's AutoTP training tutorial, Limitations; layout constraint LY003). Where autotp_size
    exceeds the key/value head count, the engine only logs that the extra ranks hold no attention shard
    (engine._configure_tensor_parallel); that part is a warning. Needs the model's heads (num_heads /
    num_kv_heads in the rule context)."""
    tp = _autotp(cfg)
    if tp is None or ctx.num_heads is None:
        return
    for v in check_layout(LayoutFacts(tp=tp, num_heads=ctx.num_heads), ("LY003",),
                          {"tp": "tensor_parallel.autotp_size"}):
        raise RuleViolation("/tensor_parallel/autotp_size", v.message, v.fix)
    if ctx.num_kv_heads is not None and tp > ctx.num_kv_heads:
        raise RuleViolation("/tensor_parallel/autotp_size",
                            f"tensor_parallel.autotp_size={tp} exceeds num_key_value_heads={ctx.num_kv_heads}: ranks "
                            "beyond the KV head count hold no attention shard (DeepSpeed warns; attention does not "
                            "scale past it)", f"use autotp_size <= {ctx.num_kv_heads}", severity="warning")


@rule("DS225", "AutoTP combined with a ZeRO stage or feature DeepSpeed 0.16 refuses")
def _check_autotp_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """AutoTP training (tensor_parallel.autotp_size > 1) runs with ZeRO stages 0, 1 and 2 in both modelled
    releases. ZeRO stage 3 is refused by DeepSpeed 0.16's AutoTP training (its tutorial lists 'ZeRO Stage 3
    not supported'); 0.19.8 partitions AutoTP shards over the data-parallel group at stage 3
    (engine._resolve_zero3_param_placement; measured on 2 gloo ranks: a tiny HF Llama trains at stages 0-3
    with autotp_size 2). Pipeline parallelism (--pp > 1) with AutoTP is not supported by either."""
    tp = _autotp(cfg)
    if tp is None:
        return
    if zero_stage(cfg) == 3 and ctx.deepspeed_version.startswith("0.16"):
        raise RuleViolation("/zero_optimization/stage",
                            f"tensor_parallel.autotp_size={tp} at ZeRO stage 3: DeepSpeed 0.16 AutoTP training supports "
                            "ZeRO stages 0-2 only", 'use "stage": 2 (or target DeepSpeed 0.19)')
    if ctx.pp > 1:
        raise RuleViolation("/tensor_parallel/autotp_size",
                            f"tensor_parallel.autotp_size={tp} with --pp {ctx.pp}: AutoTP is not combined with the "
                            "pipeline engine", "drop one of them")


@rule("DS226", "sequence_parallel_size does not divide the world size or the heads")
def _check_sequence_parallel(cfg: Mapping, ctx: RuleContext) -> None:
    """Ulysses sequence parallelism all-to-alls the sequence shards into head shards, so
    sequence_parallel_size must divide the world size (DeepSpeedConfig divides the world by it for the batch
    arithmetic, runtime/config.py) and the attention heads (UlyssesSPAttentionHF raises 'Attention head count
    ... is not divisible by SP size', runtime/sequence_parallel/ulysses_sp.py; sequence/layer.py asserts the
    same). The all-to-all itself runs on gloo CPU ranks (measured: DistributedAttention, 2 ranks). sequence_parallel_size in the JSON only changes the batch arithmetic: the
    script turns Ulysses on itself (UlyssesSPAttentionHF.register_with_transformers and mpu=... for HF
    models), which dstoolkit does not generate."""
    sp = as_int(cfg.get("sequence_parallel_size"))
    if sp is None or sp <= 1:
        return
    if ctx.world_size is not None and (ctx.world_size % sp or sp > ctx.world_size):
        raise RuleViolation("/sequence_parallel_size",
                            f"sequence_parallel_size={sp} does not divide world size {ctx.world_size}",
                            "use a divisor of the world size")
    if ctx.num_heads is not None and ctx.num_heads % sp:
        raise RuleViolation("/sequence_parallel_size",
                            f"sequence_parallel_size={sp} does not divide num_attention_heads={ctx.num_heads}; Ulysses "
                            "scatters whole heads", f"choose a divisor of {ctx.num_heads}")


@rule("DS227", "AutoEP layout or ZeRO-3 combination DeepSpeed refuses")
def _check_autoep(cfg: Mapping, ctx: RuleContext) -> None:
    """AutoEP (expert_parallel.enabled) carves expert groups of autoep_size x expert_tensor_parallel_size ranks
    out of each world / pp stage (module_inject/auto_ep_folding.py build_folding_spec raises when the product
    does not divide it). At ZeRO stage 3 the 0.19.8 engine (_validate_zero3_moe_compatibility) refuses AutoEP
    with sequence_parallel_size > 1, zero_quantized_gradients, zero_hpz_partition_size > 1 and
    expert_tensor_parallel_size > 1."""
    ep = section(cfg, "expert_parallel")
    if ep.get("enabled") is not True:
        return
    size = as_int(ep.get("autoep_size", 1)) or 1
    etp = as_int(ep.get("expert_tensor_parallel_size", 1)) or 1
    if ctx.world_size is not None:
        stage_size = ctx.world_size // max(ctx.pp, 1) if ctx.world_size % max(ctx.pp, 1) == 0 else None
        if stage_size is not None and stage_size % (size * etp):
            raise RuleViolation("/expert_parallel/autoep_size",
                                f"expert_parallel.autoep_size {size} x expert_tensor_parallel_size {etp} = {size * etp} "
                                f"does not divide the stage size {stage_size}; DeepSpeed raises in build_folding_spec",
                                "use an autoep_size that divides the world size")
    if zero_stage(cfg) != 3:
        return
    z = zero_section(cfg)
    bad = [(f"/sequence_parallel_size", "sequence parallelism") if (as_int(cfg.get("sequence_parallel_size")) or 1) > 1
           else None,
           ("/zero_optimization/zero_quantized_gradients", "zero_quantized_gradients")
           if z.get("zero_quantized_gradients") is True else None,
           ("/zero_optimization/zero_hpz_partition_size", "hpZ secondary groups")
           if (as_int(z.get("zero_hpz_partition_size")) or 1) > 1 else None,
           ("/expert_parallel/expert_tensor_parallel_size", "expert_tensor_parallel_size > 1") if etp > 1 else None]
    for item in bad:
        if item is not None:
            raise RuleViolation(item[0], f"AutoEP at ZeRO stage 3 does not support {item[1]} (DeepSpeed 0.19.8 asserts "
                                "at engine start)", "drop it, or use ZeRO stage 1/2")


AUTOEP_TRANSFORMERS_NOTE = (
    "DeepSpeed 0.19.8 AutoEP runs with no released transformers measured here: under transformers 5.x "
    "deepspeed.initialize raises TypeError (_CanRecordRegistry.get() takes 2 positional arguments but 3 were given: "
    "module_inject/auto_ep_presets/base.py calls the output-capturing registry as get(key, default), transformers 5 "
    "made it a dict subclass with get(model)); under transformers 4.57.1 that registry is a plain dict, but the "
    "presets expect transformers 5's fused 3-D experts (gate_up_proj) and fail on 4.x's ModuleList experts "
    "(ValueError: Could not infer hidden_size/ffn_hidden_size from experts module with storage=module_list)")
"""Why AutoEP is not generated: shared by the validator (DS228) and the generator's notes."""


@rule("DS228", "AutoEP does not start with DeepSpeed 0.19.8 and released transformers", severity="warning")
def _check_autoep_transformers(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed 0.19.8's AutoEP (expert_parallel.enabled) fails at engine start for an HF MoE model with both
    transformers lines (measured on 2 gloo ranks, tiny Qwen3-MoE, autoep_size 2, ZeRO-2):

    - transformers 5.24.0: ``TypeError: _CanRecordRegistry.get() takes 2 positional arguments but 3 were
      given``. module_inject/auto_ep_presets/base.py reads transformers' output-capturing registry with
      ``registry.get(key, default)``; transformers 5 made ``_CAN_RECORD_REGISTRY`` a dict subclass whose
      ``get(model)`` takes one argument.
    - transformers 4.57.1: that registry is a plain dict, but every 0.19.8 preset (mixtral, qwen3_moe,
      deepseek_v2/v3) expects transformers 5's fused 3-D expert weights (``gate_up_proj``), and 4.x builds a
      ModuleList of experts: ``ValueError: ... Could not infer hidden_size/ffn_hidden_size from experts
      module with storage=module_list``.

    A warning because the config itself is what DeepSpeed documents. What trains instead: ZeRO-3 with the
    experts replicated (deepspeed.utils.set_z3_leaf_modules on the MoE block class), or ZeRO-1/2."""
    if section(cfg, "expert_parallel").get("enabled") is True and ctx.deepspeed_version.startswith("0.19"):
        raise RuleViolation("/expert_parallel/enabled", AUTOEP_TRANSFORMERS_NOTE,
                            "train the HF MoE model at ZeRO-3 with deepspeed.utils.set_z3_leaf_modules on its MoE "
                            "block (experts replicated), or at ZeRO-1/2, until DeepSpeed fixes AutoEP")
