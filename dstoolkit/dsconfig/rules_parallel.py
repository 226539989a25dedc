"""The DeepSpeed rules DeepSpeedConfig checks after the optimizer and scheduler (DS213-DS228): MoE layout, the
options that need a given ZeRO stage, parallel sizes, and DeepSpeed's own parallelism (AutoTP, Ulysses sequence
parallelism, AutoEP). Declared with `dstoolkit.dsconfig.registry.rule`; ``dstoolkit.dsconfig.rules`` imports this
module after ``rules_optim`` so that the registry keeps DeepSpeedConfig's check order: import ``rules``, never
this module alone.
"""
from __future__ import annotations

from typing import Mapping, Optional

from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, as_int, rule, section, zero_section, zero_stage
from dstoolkit.dsconfig.rule_facts import (AUTOEP_TRANSFORMERS_NOTE, HF_ZERO3_AUTOTP_NOTE, _bf16_section,
                                          _layout_facts, _moe_facts)
from dstoolkit.layout.constraints import LayoutFacts, check_layout
from dstoolkit.layout.ulysses_heads import one_of, ulysses_degrees, ulysses_heads_problem

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
    DeepSpeed MoE is not supported with ZeRO Stage 3' at start (measured on 0.19.8; layout constraint LY010). The
    engine looks for `deepspeed.moe.layer.MoE` (and AutoEP) modules only (deepspeed 0.19.8 runtime/engine.py, the
    named_modules scan before that assert): under --mode hf the config is launched by HF Trainer / Accelerate, whose
    MoE models (transformers Mixtral, Qwen-MoE, DeepSeek) hold their experts as plain nn.Modules, so no native MoE
    (LayoutFacts.native_moe False) and stage 3 is allowed."""
    n, _, _ = _moe_facts(cfg, ctx)
    facts = LayoutFacts(zero_stage=zero_stage(cfg), num_experts=n, native_moe=ctx.mode != "hf")
    if n is None or not check_layout(facts, ("LY010",)):
        return
    raise RuleViolation("/zero_optimization/stage",
                        f"MoE with {n} experts at zero_optimization.stage=3: DeepSpeed raises 'Native DeepSpeed "
                        "MoE is not supported with ZeRO Stage 3' at engine start", 'use "stage": 2 (or 1) for MoE')


@rule("DS232", "ZeRO stage 2/3 with pipeline parallelism")
def _check_zero_with_pipeline(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed's PipelineEngine raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' (layout
    constraint LY006). The pipeline degree comes from --pp (or a generated folder's layout.json)."""
    facts = LayoutFacts(zero_stage=zero_stage(cfg), pp=max(ctx.pp, 1))
    for v in check_layout(facts, ("LY006",), {"zero_stage": "zero_optimization.stage", "pp": "--pp"}):
        raise RuleViolation("/zero_optimization/stage", v.message, v.fix)


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


@rule("DS247", "AutoTP at ZeRO stage 3 under HF Trainer / Accelerate")
def _check_hf_autotp_stage3(cfg: Mapping, ctx: RuleContext) -> None:
    """An HF Trainer / Accelerate config (--mode hf) with tensor_parallel.autotp_size > 1 at ZeRO stage 3: DeepSpeed
    runs it (DS225), but transformers' ZeRO-3 loader refuses AutoTP (`HF_ZERO3_AUTOTP_NOTE`), so from_pretrained
    fails before the first step. Strict mode (your own deepspeed.initialize) is not affected."""
    tp = _autotp(cfg)
    if tp is None or ctx.mode != "hf" or zero_stage(cfg) != 3:
        return
    raise RuleViolation("/tensor_parallel/autotp_size",
                        f"tensor_parallel.autotp_size={tp} at zero_optimization.stage=3 under HF Trainer / "
                        f"Accelerate: {HF_ZERO3_AUTOTP_NOTE}",
                        'drop the "tensor_parallel" section (ZeRO-3 already shards the weights), or use ZeRO stage '
                        "0-2 with AutoTP")


@rule("DS226", "sequence_parallel_size does not divide the world size or the heads")
def _check_sequence_parallel(cfg: Mapping, ctx: RuleContext) -> None:
    """Ulysses sequence parallelism all-to-alls the sequence shards into head shards, so sequence_parallel_size must
    divide the world size (DeepSpeedConfig divides the world by it for the batch arithmetic, runtime/config.py) and
    the attention heads. A DeepSpeed JSON's degree runs under one of two implementations, each with its own head
    rule (`dstoolkit.layout.ulysses_heads`): DeepSpeed's UlyssesSPAttentionHF (ALST, HF models;
    runtime/sequence_parallel/ulysses_sp.py raises 'Attention head count ... is not divisible by SP size' and, for
    the key/value heads, '... is not divisible by SP size ... or vice versa'), or Megatron-DeepSpeed's
    DistributedAttention (megatron/model/transformer.py asserts num_attention_heads % sp == 0;
    deepspeed/sequence/layer.py asserts a key/value head per rank of each TP rank). The attention-head rule is
    shared (error); the key/value rule, asked when the caller gives num_kv_heads, is an error when both
    implementations refuse, or in hf mode (HF Trainer / Accelerate: ALST) when ALST does, else a warning naming the
    one that refuses. The all-to-all itself runs on gloo CPU ranks (measured: DistributedAttention, 2 ranks).
    sequence_parallel_size in the JSON only changes the batch arithmetic: the script turns Ulysses on itself
    (UlyssesSPAttentionHF.register_with_transformers and mpu=... for HF models), which dstoolkit does not
    generate."""
    sp = as_int(cfg.get("sequence_parallel_size"))
    if sp is None or sp <= 1:
        return
    ptr = "/sequence_parallel_size"
    if ctx.world_size is not None and (ctx.world_size % sp or sp > ctx.world_size):
        raise RuleViolation(ptr, f"sequence_parallel_size={sp} does not divide world size {ctx.world_size}",
                            "use a divisor of the world size")
    if ctx.num_heads is not None and ctx.num_heads % sp:
        raise RuleViolation(ptr, f"sequence_parallel_size={sp} does not divide num_attention_heads={ctx.num_heads}; "
                                 "Ulysses scatters whole heads", f"choose a divisor of {ctx.num_heads}")
    if ctx.num_kv_heads is None:
        return
    kw = dict(name="sequence_parallel_size", tp_name="tp")
    alst = ulysses_heads_problem("alst", sp, ctx.num_heads, ctx.num_kv_heads, 1, **kw)
    mds = ulysses_heads_problem("megatron-deepspeed", sp, ctx.num_heads, ctx.num_kv_heads, max(ctx.tp, 1), **kw)
    if alst is None and (mds is None or ctx.mode == "hf"):
        return
    if alst is not None and (mds is not None or ctx.mode == "hf"):
        ok = ulysses_degrees("alst", ctx.num_heads, ctx.num_kv_heads, 1, ctx.world_size)
        raise RuleViolation(ptr, "; ".join(m for m in (alst, mds) if m),
                            f"use sequence_parallel_size {one_of(ok)} (UlyssesSPAttentionHF takes them"
                            f"{'' if ctx.world_size is None else f' and they divide world size {ctx.world_size}'})"
                            if ok else "use sequence_parallel_size 1: no degree above 1 splits these heads"
                            + ("" if ctx.world_size is None else f" and divides world size {ctx.world_size}"))
    refuses, takes = ((alst, "Megatron-DeepSpeed's DistributedAttention") if alst is not None
                      else (mds, "DeepSpeed's UlyssesSPAttentionHF (ALST, HF models)"))
    raise RuleViolation(ptr, f"{refuses}; {takes} takes it",
                        f"run it under {takes}, or choose another sequence_parallel_size", severity="warning")


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
