"""The layout constraints on how the ranks are split (LY001-LY016): model-parallel degrees against the world, the
node, the heads, the layers and the experts, and the ZeRO / offload / ZeRO++ modes. Registered in
`dstoolkit.layout.registry`; asked through `dstoolkit.layout.constraints`. Pure Python.
"""
from __future__ import annotations

from typing import Optional

from dstoolkit.layout.dims import LayoutError, hpz_partition, stage_layers
from dstoolkit.layout.registry import LayoutFacts, Names, constraint, known


@constraint("LY001", "mp-world", "model-parallel degrees must divide the world size", ("tp", "pp", "sp", "world"),
            "Each model replica spans tp * pp * sp ranks; the rest is data parallelism, so the product must divide "
            "the number of ranks (Megatron-LM parallel_state.initialize_model_parallel; DeepSpeed groups.py).")
def _mp_divides_world(f: LayoutFacts, n: Names):
    if not known(f.world, f.tp, f.pp, f.sp) or f.dp is not None:
        return None
    sp = f" * {n('sp')}" if f.sp != 1 else ""
    sp_v = f" * {f.sp}" if f.sp != 1 else ""
    prod = f.tp * f.pp * f.sp
    # point at a degree that does not divide the world on its own, else at the last one above 1
    degrees = [(k, getattr(f, k)) for k in ("tp", "pp", "sp") if getattr(f, k) != 1]
    blame = next((k for k, v in degrees if f.world % v), degrees[-1][0] if degrees else "tp")
    return (f"{n('tp')} * {n('pp')}{sp} = {f.tp} * {f.pp}{sp_v} = {prod} does not divide the world size {f.world}",
            "pick degrees whose product divides the world size", blame)


@constraint("LY002", "tp-node", "a TP group fills part of one node or whole nodes", ("tp", "gpus_per_node"),
            "Megatron builds TP groups from consecutive ranks. With tp a divisor of the ranks per node each group "
            "stays on one node (NVLink); with tp a multiple of it each group spans whole nodes, legal and priced over "
            "the inter-node link (tp_across_nodes_note; Narayanan et al. 2021 §5.4.1 measure it slow). Any other "
            "tp splits a group unevenly across a node boundary.")
def _tp_inside_node(f: LayoutFacts, n: Names):
    if not known(f.tp, f.gpus_per_node) or tp_tiles_nodes(f.tp, f.gpus_per_node):
        return None
    return (f"{n('tp')}={f.tp} must divide {n('gpus_per_node')}={f.gpus_per_node} or be a multiple of it",
            "keep tensor parallelism inside a node, or span whole nodes")


def tp_tiles_nodes(tp: int, gpus_per_node: int) -> bool:
    """tp divides the ranks per node (groups inside a node) or is a multiple of it (groups of whole nodes)."""
    return gpus_per_node % tp == 0 or tp % gpus_per_node == 0


def tp_across_nodes_note(tp: int, gpus_per_node: int) -> Optional[str]:
    """The warning for a TP group wider than a node (allowed, priced over the inter-node link), or None."""
    if tp <= gpus_per_node or tp % gpus_per_node:
        return None
    return (f"warning: tp={tp} spans {tp // gpus_per_node} nodes of {gpus_per_node} GPUs: every layer's TP "
            "all-reduces cross the inter-node link (priced at the NICs' rate, estimate.collective_time.group_inter_node_busbw), "
            "usually much slower than NVLink (Narayanan et al. 2021 §5.4.1)")


@constraint("LY003", "tp-heads", "tp must divide the attention heads", ("tp", "num_heads"),
            "Attention heads are split over TP ranks column-wise; a rank cannot hold part of a head.")
def _tp_divides_heads(f: LayoutFacts, n: Names):
    if not known(f.tp, f.num_heads) or f.num_heads % f.tp == 0:
        return None
    return (f"{n('tp')}={f.tp} does not divide num_attention_heads={f.num_heads}",
            f"choose tp from the divisors of {f.num_heads}")


@constraint("LY004", "tp-kv-heads", "tp must divide the key/value heads", ("tp", "kv_heads"),
            "With grouped-query attention each TP rank holds whole KV groups: Megatron-LM asserts "
            "num_query_groups % tensor_model_parallel_size == 0. MLA (DeepSeek) has no KV heads to split.")
def _tp_divides_kv_heads(f: LayoutFacts, n: Names):
    if f.is_mla or not known(f.tp, f.kv_heads) or f.kv_heads % f.tp == 0:
        return None
    return (f"{n('tp')}={f.tp} does not divide num_key_value_heads={f.kv_heads}",
            f"choose tp from the divisors of {f.kv_heads} (Megatron --num-query-groups must be a multiple of tp)")


@constraint("LY005", "pp-layers", "every pipeline stage needs a layer", ("pp", "num_layers"),
            "Each framework splits any L >= pp blocks over pp stages (dims.stage_layers: Megatron-LM with "
            "--decoder-last/--decoder-first-pipeline-num-layers or a --pipeline-model-parallel-layout where pp "
            "does not divide L, DeepSpeed's PipelineModule uniformly); pp above the layer count leaves a stage "
            "empty.")
def _pp_layers(f: LayoutFacts, n: Names):
    if not known(f.pp, f.num_layers):
        return None
    try:
        stage_layers(f.num_layers, f.pp)
    except LayoutError as exc:
        return exc.message.replace("pp=", f"{n('pp')}=", 1), exc.fix
    return None


@constraint("LY006", "pp-zero", "pipeline parallelism allows ZeRO stage 0-1 only", ("zero_stage", "pp", "framework"),
            "DeepSpeed's PipelineEngine raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' "
            "(deepspeed/runtime/pipe/engine.py): every engine but Megatron-Core (framework deepspeed or fsdp, or "
            "unknown). Megatron-Core (the megatron-lm target) has no such rule: it runs ZeRO stages 1 and 2 alike, as "
            "its distributed optimizer (--use-distributed-optimizer), which Megatron-LM's validate_args takes with any "
            "--pipeline-model-parallel-size (megatron/training/arguments.py sets no pipeline condition on it), so a "
            "stage-2 pipeline there is the stage-1 layout of the same degrees, ranked as that; stage 3 is "
            "Megatron-FSDP (--use-megatron-fsdp), whose v2 raises 'MFSDP v2 does not currently support: ... "
            "pipeline_model_parallel_size' (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py) and whose v1 with a "
            "pipeline dstoolkit neither checks nor estimates.")
def _pp_zero(f: LayoutFacts, n: Names):
    if not known(f.pp, f.zero_stage) or f.pp <= 1 or f.zero_stage < 2:
        return None
    if f.framework == "megatron" and f.zero_stage == 2:
        return (f"{n('zero_stage')}=2 with {n('pp')}={f.pp} under Megatron-Core: Megatron-LM runs ZeRO stages 1 and 2 "
                "alike, as its distributed optimizer (--use-distributed-optimizer, which its validate_args takes with "
                "any pipeline size), so this is the ZeRO-1 layout of the same degrees, ranked as that",
                "use ZeRO stage 1 (the same Megatron-LM run), or pp 1")
    if f.framework == "megatron":
        return (f"{n('zero_stage')}={f.zero_stage} with {n('pp')}={f.pp} under Megatron-Core: ZeRO-3 is Megatron-FSDP "
                "(--use-megatron-fsdp) there, whose v2 refuses pipeline_model_parallel_size > 1 "
                "(mcore_fsdp_adapter.py) and whose v1 with a pipeline dstoolkit neither checks nor estimates",
                "use ZeRO stage 1 (Megatron-LM's distributed optimizer, which runs with any pp), or pp 1")
    return (f"{n('zero_stage')}={f.zero_stage} is incompatible with {n('pp')}={f.pp}: DeepSpeed's pipeline engine "
            "raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'",
            "use ZeRO stage 1 with pipeline parallelism, or pp 1")


@constraint("LY007", "ep-dense", "expert parallelism needs experts", ("ep", "num_experts"),
            "ep > 1 shards experts over ranks; a dense model has none.")
def _ep_dense(f: LayoutFacts, n: Names):
    if not known(f.ep, f.num_experts) or f.ep == 1 or f.num_experts > 0:
        return None
    return f"{n('ep')}={f.ep} but the model has no experts (dense model)", "use ep 1"


@constraint("LY008", "ep-experts", "ep must divide the number of experts", ("ep", "num_experts"),
            "Each expert-parallel rank holds num_experts / ep whole experts.")
def _ep_divides_experts(f: LayoutFacts, n: Names):
    if not known(f.ep, f.num_experts) or f.num_experts == 0 or f.num_experts % f.ep == 0:
        return None
    return (f"{n('ep')}={f.ep} does not divide the number of experts {f.num_experts}",
            f"choose ep from the divisors of {f.num_experts}")


@constraint("LY009", "ep-dp", "ep must divide the data-parallel size", ("ep", "world", "tp", "pp", "sp"),
            "DeepSpeed builds expert-parallel groups inside the data-parallel group "
            "(deepspeed/utils/groups.py _create_expert_and_data_parallel); the ranks that share one sequence "
            "(context parallelism, Ulysses: sp) are not part of it, so dp = world / (tp * pp * sp).")
def _ep_divides_dp(f: LayoutFacts, n: Names):
    dp = f.dp
    if not known(f.ep, dp) or dp % f.ep == 0:
        return None
    sp = f" x {n('sp')} {f.sp}" if f.sp != 1 else ""
    return (f"{n('ep')}={f.ep} does not divide the data-parallel size {dp} "
            f"(world {f.world} / ({n('tp')} {f.tp} x {n('pp')} {f.pp}{sp}))",
            f"pick an ep that divides the data-parallel size {dp}")


MOE_STAGE3 = ("DeepSpeed refuses its native MoE at ZeRO stage 3 (engine.py: 'Native DeepSpeed MoE is not supported "
              "with ZeRO Stage 3')")
MOE_STAGE3_REASON = MOE_STAGE3 + ", so no stage-3 strategy is generated for an MoE model"


@constraint("LY010", "moe-zero3", "native DeepSpeed MoE at ZeRO stage 3", ("zero_stage", "num_experts"),
            "DeepSpeed 0.19.8 raises 'Native DeepSpeed MoE is not supported with ZeRO Stage 3' at engine start "
            "for deepspeed.moe layers (measured). Plain PyTorch MoE modules (HF models) are not affected.")
def _moe_stage3(f: LayoutFacts, n: Names):
    if not f.native_moe or not known(f.zero_stage, f.num_experts) or f.num_experts == 0 or f.zero_stage != 3:
        return None
    return MOE_STAGE3, (f"set {n('zero_stage')} to 1 or 2, or run the experts as plain PyTorch modules "
                        "(training.framework megatron / fsdp, or an HF target)")


@constraint("LY011", "offload-stage", "offload needs the right ZeRO stage", ("offload_param", "offload_optimizer", "zero_stage"),
            "offload_optimizer lives in zero_optimization (stage 1-3); offload_param is read by stage 3 only "
            "(deepspeed/runtime/zero/stage3.py).")
def _offload_stage(f: LayoutFacts, n: Names):
    if f.zero_stage is None:
        return None
    if f.offload_param and f.zero_stage != 3:
        return (f"parameter offload needs {n('zero_stage')}=3 (got {f.zero_stage})",
                "use ZeRO stage 3, or offload the optimizer only", "offload_param")
    if f.offload_optimizer and f.zero_stage == 0:
        return (f"{n('offload_optimizer')}=True needs ZeRO stage 1-3 ({n('zero_stage')}=0)",
                "use ZeRO stage 1, 2 or 3, or no offload", "offload_optimizer")
    return None


@constraint("LY012", "zeropp-stage", "ZeRO++ needs ZeRO stage 3", ("zeropp", "zero_stage"),
            "qwZ, hpZ and qgZ are implemented in stage 3 only (ZeRO++ paper §3; deepspeed/runtime/zero/stage3.py).")
def _zeropp_stage(f: LayoutFacts, n: Names):
    if not f.zeropp or f.zero_stage is None or f.zero_stage == 3:
        return None
    return f"{n('zeropp')}=True needs ZeRO stage 3 ({n('zero_stage')}={f.zero_stage})", "use ZeRO stage 3, or no ZeRO++"


@constraint("LY013", "zeropp-offload", "ZeRO++ is not combined with offload", ("zeropp", "offload_optimizer", "offload_param"),
            "hpZ keeps a secondary weight copy in device memory; offload moves weights out of it.")
def _zeropp_offload(f: LayoutFacts, n: Names):
    if f.zeropp and (f.offload_optimizer or f.offload_param):
        return "ZeRO++ is not combined with offload here", "drop offload or ZeRO++"
    return None


@constraint("LY014", "zeropp-cpu", "ZeRO++ needs CUDA quantizer kernels", ("zeropp", "cpu"),
            "qwZ/qgZ call DeepSpeed's QuantizerBuilder, which the CPU accelerator does not have.")
def _zeropp_cpu(f: LayoutFacts, n: Names):
    if f.zeropp and f.cpu:
        where = n("cpu")
        return ("ZeRO++ qwZ/qgZ need DeepSpeed's CUDA quantizer kernels; the CPU accelerator has no "
                f"QuantizerBuilder{'' if where == 'cpu' else f' ({where} cpu)'}", "use ZeRO-3 without ZeRO++ on CPU")
    return None


@constraint("LY015", "zeropp-hpz", "hpZ partition must divide dp", ("zeropp", "gpus_per_node", "tp"),
            "The hpZ secondary partition (gpus_per_node / tp ranks where the data-parallel group spans nodes, "
            "layout.dims.hpz_partition) must tile the data-parallel group.")
def _zeropp_hpz(f: LayoutFacts, n: Names):
    dp = f.dp
    if not f.zeropp or not known(dp, f.tp):
        return None
    hpz = hpz_partition(f.gpus_per_node, f.world, f.tp, dp)
    if dp % hpz:
        return f"hpZ partition {hpz} does not divide dp={dp}", "choose tp so gpus_per_node / tp divides dp"
    return None


@constraint("LY016", "sp-tp", "Megatron sequence parallelism needs tp > 1", ("megatron_sp", "tp"),
            "Megatron sequence parallelism splits the norm/dropout activations over the TP group; with tp = 1 "
            "there is nothing to split.")
def _megatron_sp(f: LayoutFacts, n: Names):
    if f.megatron_sp and f.tp == 1:
        return (f"sequence parallelism needs tp > 1 ({n('megatron_sp')} with {n('tp')}=1)",
                "set tp > 1, or turn sequence parallelism off")
    return None
