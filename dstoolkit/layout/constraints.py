"""The layout constraints, each declared once with a stable code, a title, the facts it reads, an explanation
and a check. Pure Python, imports only `dstoolkit.layout.dims`.

Callers build a `LayoutFacts` from what they know (a spec, a sweep candidate, a DeepSpeed JSON plus
--world-size, a `RunPlan`) and ask `check_layout`. Unknown facts are None and the constraints that need them
stay quiet. `names` maps fact names to the caller's field names, so a spec error says ``training.tp`` and a
sweep drop reason says ``tp``:

    facts = LayoutFacts(world=16, tp=4, pp=8)
    [v.code for v in check_layout(facts)]   # ['LY001']

`python -m dstoolkit.layout.constraints` prints the table (code, title, facts, explanation).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Mapping, Optional

from dstoolkit.layout.dims import LayoutError, data_parallel_size, ramp_increment, stage_layers


@dataclass(frozen=True)
class LayoutFacts:
    """What the constraints read. None: unknown to the caller (the constraints that need it are skipped)."""

    world: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tp: Optional[int] = 1
    pp: Optional[int] = 1
    ep: Optional[int] = 1
    sp: Optional[int] = 1
    """Ranks one sequence is split over, taken out of dp: DeepSpeed-Ulysses' sequence_parallel_size or Megatron's
    context-parallel size (`cp`, one of the two)."""
    cp: Optional[int] = 1
    """Of sp, the Megatron-Core context-parallel degree (1 when sp is DeepSpeed-Ulysses or 1)."""
    seq_len: Optional[int] = None
    """Tokens per sequence."""
    zero_stage: Optional[int] = None
    micro_batch: Optional[int] = None
    global_batch: Optional[int] = None
    num_heads: Optional[int] = None
    kv_heads: Optional[int] = None
    is_mla: bool = False
    """Multi-head latent attention (DeepSeek): KV heads are not split by tp."""
    num_layers: Optional[int] = None
    num_experts: Optional[int] = None
    """Routed experts; 0 for a dense model."""
    native_moe: bool = True
    """Experts are DeepSpeed's own `deepspeed.moe.layer.MoE` (refused at ZeRO-3), not plain PyTorch modules."""
    offload_optimizer: bool = False
    offload_param: bool = False
    zeropp: bool = False
    megatron_sp: bool = False
    """Megatron sequence parallelism (reuses the TP group)."""
    virtual_stages: Optional[int] = 1
    """Model chunks per pipeline rank (the interleaved schedule)."""
    framework: Optional[str] = None
    """The runtime that executes the model (deepspeed, megatron, fsdp)."""
    pipeline_schedule: Optional[str] = None
    """1f1b, interleaved, zero-bubble or dualpipe."""
    cpu: bool = False
    """Ranks are CPU processes (DeepSpeed's CPU accelerator)."""
    ramp_start: Optional[int] = None
    ramp_increment: Optional[int] = None
    ramp_kind: Optional[str] = None

    @property
    def dp(self) -> Optional[int]:
        if self.world is None or None in (self.tp, self.pp, self.sp):
            return None
        return data_parallel_size(self.world, self.tp, self.pp, self.sp)


@dataclass(frozen=True)
class Violation:
    """A broken constraint: `fields` are the facts involved (first = where to point)."""

    code: str
    name: str
    title: str
    message: str
    fix: str
    fields: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.message} ({self.fix})"


Names = Callable[[str], str]
Check = Callable[[LayoutFacts, Names], Optional[tuple]]
"""A check returns None, or (message, fix) or (message, fix, fact to point at)."""


@dataclass(frozen=True)
class Constraint:
    code: str
    name: str
    """Short stable label (sweep drop reasons group by it)."""
    title: str
    fields: tuple[str, ...]
    explanation: str
    check: Check


CONSTRAINTS: dict[str, Constraint] = {}


def constraint(code: str, name: str, title: str, fields_: tuple[str, ...], explanation: str) -> Callable[[Check], Check]:
    """Register `check` under `code` (declared once; the registry is the codes table)."""

    def deco(fn: Check) -> Check:
        if code in CONSTRAINTS:
            raise RuntimeError(f"layout constraint {code} declared twice")
        CONSTRAINTS[code] = Constraint(code, name, title, fields_, explanation, fn)
        return fn

    return deco


def _known(*vals) -> bool:
    return all(v is not None for v in vals)


@constraint("LY001", "mp-world", "model-parallel degrees must divide the world size", ("tp", "pp", "sp", "world"),
            "Each model replica spans tp * pp * sp ranks; the rest is data parallelism, so the product must divide "
            "the number of ranks (Megatron-LM parallel_state.initialize_model_parallel; DeepSpeed groups.py).")
def _mp_divides_world(f: LayoutFacts, n: Names):
    if not _known(f.world, f.tp, f.pp, f.sp) or f.dp is not None:
        return None
    sp = f" * {n('sp')}" if f.sp != 1 else ""
    sp_v = f" * {f.sp}" if f.sp != 1 else ""
    prod = f.tp * f.pp * f.sp
    return (f"{n('tp')} * {n('pp')}{sp} = {f.tp} * {f.pp}{sp_v} = {prod} does not divide the world size {f.world}",
            "pick degrees whose product divides the world size")


@constraint("LY002", "tp-node", "a TP group fills part of one node or whole nodes", ("tp", "gpus_per_node"),
            "Megatron builds TP groups from consecutive ranks. With tp a divisor of the ranks per node each group "
            "stays on one node (NVLink); with tp a multiple of it each group spans whole nodes, legal and priced over "
            "the inter-node link (tp_across_nodes_note; Narayanan et al. 2021 §5.4.1 measure it slow). Any other "
            "tp splits a group unevenly across a node boundary.")
def _tp_inside_node(f: LayoutFacts, n: Names):
    if not _known(f.tp, f.gpus_per_node) or tp_tiles_nodes(f.tp, f.gpus_per_node):
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
    if not _known(f.tp, f.num_heads) or f.num_heads % f.tp == 0:
        return None
    return (f"{n('tp')}={f.tp} does not divide num_attention_heads={f.num_heads}",
            f"choose tp from the divisors of {f.num_heads}")


@constraint("LY004", "tp-kv-heads", "tp must divide the key/value heads", ("tp", "kv_heads"),
            "With grouped-query attention each TP rank holds whole KV groups: Megatron-LM asserts "
            "num_query_groups % tensor_model_parallel_size == 0. MLA (DeepSeek) has no KV heads to split.")
def _tp_divides_kv_heads(f: LayoutFacts, n: Names):
    if f.is_mla or not _known(f.tp, f.kv_heads) or f.kv_heads % f.tp == 0:
        return None
    return (f"{n('tp')}={f.tp} does not divide num_key_value_heads={f.kv_heads}",
            f"choose tp from the divisors of {f.kv_heads} (Megatron --num-query-groups must be a multiple of tp)")


@constraint("LY005", "pp-layers", "every pipeline stage needs a layer", ("pp", "num_layers"),
            "Each framework splits any L >= pp blocks over pp stages (dims.stage_layers: Megatron-LM with "
            "--decoder-last/--decoder-first-pipeline-num-layers or a --pipeline-model-parallel-layout where pp "
            "does not divide L, DeepSpeed's PipelineModule uniformly); pp above the layer count leaves a stage "
            "empty.")
def _pp_layers(f: LayoutFacts, n: Names):
    if not _known(f.pp, f.num_layers):
        return None
    try:
        stage_layers(f.num_layers, f.pp)
    except LayoutError as exc:
        return exc.message.replace("pp=", f"{n('pp')}=", 1), exc.fix
    return None


@constraint("LY006", "pp-zero", "pipeline parallelism allows ZeRO stage 0-1 only", ("zero_stage", "pp"),
            "DeepSpeed's PipelineEngine raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' "
            "(deepspeed/runtime/pipe/engine.py).")
def _pp_zero(f: LayoutFacts, n: Names):
    if not _known(f.pp, f.zero_stage) or f.pp <= 1 or f.zero_stage < 2:
        return None
    return (f"{n('zero_stage')}={f.zero_stage} is incompatible with {n('pp')}={f.pp}: DeepSpeed's pipeline engine "
            "raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism'",
            "use ZeRO stage 1 with pipeline parallelism, or pp 1")


@constraint("LY007", "ep-dense", "expert parallelism needs experts", ("ep", "num_experts"),
            "ep > 1 shards experts over ranks; a dense model has none.")
def _ep_dense(f: LayoutFacts, n: Names):
    if not _known(f.ep, f.num_experts) or f.ep == 1 or f.num_experts > 0:
        return None
    return f"{n('ep')}={f.ep} but the model has no experts (dense model)", "use ep 1"


@constraint("LY008", "ep-experts", "ep must divide the number of experts", ("ep", "num_experts"),
            "Each expert-parallel rank holds num_experts / ep whole experts.")
def _ep_divides_experts(f: LayoutFacts, n: Names):
    if not _known(f.ep, f.num_experts) or f.num_experts == 0 or f.num_experts % f.ep == 0:
        return None
    return (f"{n('ep')}={f.ep} does not divide the number of experts {f.num_experts}",
            f"choose ep from the divisors of {f.num_experts}")


@constraint("LY009", "ep-dp", "ep must divide the data-parallel size", ("ep", "world", "tp", "pp", "sp"),
            "DeepSpeed builds expert-parallel groups inside the data-parallel group "
            "(deepspeed/utils/groups.py _create_expert_and_data_parallel); the ranks that share one sequence "
            "(context parallelism, Ulysses: sp) are not part of it, so dp = world / (tp * pp * sp).")
def _ep_divides_dp(f: LayoutFacts, n: Names):
    dp = f.dp
    if not _known(f.ep, dp) or dp % f.ep == 0:
        return None
    sp = f" x {n('sp')} {f.sp}" if f.sp != 1 else ""
    return (f"{n('ep')}={f.ep} does not divide the data-parallel size {dp} "
            f"(world {f.world} / ({n('tp')} {f.tp} x {n('pp')} {f.pp}{sp}))",
            f"pick an ep that divides the data-parallel size {dp}")


MOE_STAGE3_REASON = (
    "DeepSpeed refuses native MoE at ZeRO stage 3 (engine.py: 'Native DeepSpeed MoE is not supported with "
    "ZeRO Stage 3'), so no stage-3 strategy is generated for an MoE model")


@constraint("LY010", "moe-zero3", "native DeepSpeed MoE at ZeRO stage 3", ("zero_stage", "num_experts"),
            "DeepSpeed 0.19.8 raises 'Native DeepSpeed MoE is not supported with ZeRO Stage 3' at engine start "
            "for deepspeed.moe layers (measured). Plain PyTorch MoE modules (HF models) are not affected.")
def _moe_stage3(f: LayoutFacts, n: Names):
    if not f.native_moe or not _known(f.zero_stage, f.num_experts) or f.num_experts == 0 or f.zero_stage != 3:
        return None
    return MOE_STAGE3_REASON, "use ZeRO stage 1 or 2 for native DeepSpeed MoE"


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
        return ("ZeRO++ qwZ/qgZ need DeepSpeed's CUDA quantizer kernels; the CPU accelerator has no "
                "QuantizerBuilder (cluster.gpu='cpu')", "use ZeRO-3 without ZeRO++ on CPU")
    return None


@constraint("LY015", "zeropp-hpz", "hpZ partition must divide dp", ("zeropp", "gpus_per_node", "tp"),
            "The hpZ secondary partition (gpus_per_node / tp ranks, capped at dp) must tile the data-parallel group.")
def _zeropp_hpz(f: LayoutFacts, n: Names):
    dp = f.dp
    if not f.zeropp or not _known(dp, f.tp):
        return None
    hpz = max(1, min((f.gpus_per_node or f.world) // f.tp, dp))
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


@constraint("LY017", "batch", "global batch must be a multiple of micro batch x dp", ("global_batch", "micro_batch", "world"),
            "DeepSpeed: train_batch_size = micro_batch * gradient_accumulation_steps * dp "
            "(deepspeed/runtime/config.py _batch_assertion), dp without the ranks that share a sequence (config.py: "
            "world size / sequence_parallel_size, or the mpu's data-parallel size); Megatron-LM the same with dp = "
            "world / (tp * pp * cp).")
def _batch_divisible(f: LayoutFacts, n: Names):
    dp = f.dp
    if not _known(f.global_batch, dp):
        return None
    sp = f"*{n('sp')}" if f.sp != 1 else ""
    where = f"(dp = world {f.world} / ({n('tp')}*{n('pp')}{sp}))"
    if f.micro_batch is not None:
        step = f.micro_batch * dp
        if f.global_batch % step:
            return (f"{n('global_batch')}={f.global_batch} is not a multiple of {n('micro_batch')} * dp = "
                    f"{f.micro_batch} * {dp} = {step} {where}",
                    f"use a global batch multiple of {step}, or micro_batch: auto")
    elif f.global_batch % dp:
        return (f"{n('global_batch')}={f.global_batch} is not a multiple of the data-parallel size {dp} {where}",
                f"use a global batch multiple of {dp}")
    return None


@constraint("LY018", "ramp", "batch ramp must step in whole micro batches", ("ramp_start", "ramp_increment", "global_batch"),
            "Every ramp batch must be a multiple of micro_batch * dp, and global - start a multiple of the increment "
            "(Megatron-LM RampupBatchsizeNumMicroBatches asserts both).")
def _ramp(f: LayoutFacts, n: Names):
    if f.ramp_start is None or f.global_batch is None:
        return None
    if f.ramp_start > f.global_batch:
        return (f"{n('ramp_start')}={f.ramp_start} exceeds {n('global_batch')}={f.global_batch}",
                "the ramp grows the batch up to global_batch: lower start_batch", "ramp_start")
    dp = f.dp
    if f.micro_batch is None or dp is None:
        if (f.ramp_kind == "megatron" and f.ramp_increment
                and (f.global_batch - f.ramp_start) % f.ramp_increment):
            return (f"{n('global_batch')} - {n('ramp_start')} = {f.global_batch - f.ramp_start} is not a multiple "
                    f"of {n('ramp_increment')}={f.ramp_increment}",
                    "pick an increment that divides the difference (Megatron requires it)", "ramp_increment")
        return None
    step = f.micro_batch * dp
    if f.ramp_start % step:
        return (f"{n('ramp_start')}={f.ramp_start} is not a multiple of micro_batch*dp = {step}",
                f"use a start batch multiple of {step}")
    inc = ramp_increment(f.ramp_increment, f.micro_batch, dp)
    if inc % step:
        return (f"{n('ramp_increment')}={inc} is not a multiple of micro_batch*dp = {step}", f"use a multiple of {step}",
                "ramp_increment")
    if (f.global_batch - f.ramp_start) % inc:
        return (f"global_batch - start_batch = {f.global_batch} - {f.ramp_start} is not a multiple of the "
                f"increment {inc} (Megatron --rampup-batch-size)", "pick an increment that divides the difference")
    return None


@constraint("LY019", "seq-shards", "the sequence must split evenly over the ranks that share it",
            ("seq_len", "cp", "sp", "tp", "megatron_sp"),
            "Megatron-Core context parallelism cuts each sequence into 2 * cp equal chunks and gives every rank two "
            "(causal load balance; megatron/training/arguments.py asserts 'seq-length should be a multiple of 2 * "
            "context-parallel-size'); "
            "DeepSpeed-Ulysses gives each of its ranks seq / ulysses tokens (deepspeed/sequence/layer.py "
            "DistributedAttention); Megatron sequence parallelism scatters a rank's sequence over the TP ranks "
            "(megatron/core/tensor_parallel/mappings.py _split_along_first_dim: 'First dimension of the tensor "
            "should be divisible by tensor parallel size').")
def _seq_shards(f: LayoutFacts, n: Names):
    if not _known(f.seq_len, f.sp, f.cp):
        return None
    if f.cp > 1 and f.seq_len % (2 * f.cp):
        return (f"{n('seq_len')}={f.seq_len} does not split into 2 x {n('cp')} = {2 * f.cp} equal chunks: Megatron-Core's "
                "context parallelism gives each rank two of them", f"use a seq_len divisible by {2 * f.cp}", "seq_len")
    ulysses = f.sp // f.cp
    if ulysses > 1 and f.seq_len % ulysses:
        return (f"{n('seq_len')}={f.seq_len} does not split over {n('sp')}={ulysses} DeepSpeed-Ulysses ranks",
                f"use a seq_len divisible by {ulysses}", "seq_len")
    local = f.seq_len // f.sp
    if f.megatron_sp and _known(f.tp) and f.tp > 1 and local % f.tp:
        per = f" ({f.seq_len} / {f.sp} per sequence shard)" if f.sp > 1 else ""
        return (f"{n('seq_len')}={f.seq_len}: {local} tokens{per} do not split over {n('tp')}={f.tp} with Megatron "
                f"sequence parallelism ({n('megatron_sp')})",
                f"use a seq_len divisible by {f.sp * f.tp}, or turn sequence parallelism off", "seq_len")
    return None


@constraint("LY020", "ulysses-heads", "every DeepSpeed-Ulysses rank needs a key/value head",
            ("sp", "cp", "kv_heads", "tp", "is_mla"),
            "Ulysses' all-to-all hands each of its ranks a share of the attention heads of the TP rank; DeepSpeed "
            "asserts 'Number of key-value heads must be at least the sequence parallel size' and splits an "
            "indivisible count unevenly (deepspeed/sequence/layer.py _resolve_kv_heads, uneven_heads_all2all).")
def _ulysses_heads(f: LayoutFacts, n: Names):
    if not _known(f.sp, f.cp, f.kv_heads, f.tp) or f.is_mla:
        return None
    ulysses = f.sp // f.cp
    kv = f.kv_heads // f.tp if f.kv_heads >= f.tp else 1
    if ulysses > 1 and kv < ulysses:
        return (f"{n('sp')}={ulysses} exceeds the {kv} key/value heads on each TP rank ({f.kv_heads} / {n('tp')} "
                f"{f.tp}): DeepSpeed-Ulysses would leave a rank without a head",
                f"use ulysses <= {kv}, or context parallelism (cp) for longer sequences")
    return None


@constraint("LY021", "vpp", "virtual pipeline stages need a pipeline and something to run each",
            ("virtual_stages", "pp", "num_layers"),
            "The interleaved schedule runs virtual_stages model chunks on each of pp > 1 pipeline ranks "
            "(Megatron-LM megatron/training/arguments.py: 'When interleaved schedule is used, pipeline-model-parallel "
            "size should be greater than 1'); each of the pp * virtual_stages chunks holds a block, or the "
            "embedding or the output layer alone (Megatron-Core --account-for-embedding-in-pipeline-split / "
            "--account-for-loss-in-pipeline-split, E and L in --pipeline-model-parallel-layout), so there are at "
            "most blocks + 2 chunks.")
def _vpp(f: LayoutFacts, n: Names):
    v = f.virtual_stages
    if not _known(v) or v <= 1:
        return None
    if _known(f.pp) and f.pp <= 1:
        return (f"{n('virtual_stages')}={v} with {n('pp')}={f.pp}: the interleaved schedule splits each pipeline "
                "rank's layers into chunks, and there is no pipeline", "set pp > 1, or remove virtual_stages",
                "virtual_stages")
    if _known(f.pp, f.num_layers) and f.pp * v > f.num_layers + 2:
        return (f"{n('pp')} x {n('virtual_stages')} = {f.pp} x {v} = {f.pp * v} model chunks for {f.num_layers} "
                "blocks, the embedding and the output layer: some chunk would run nothing",
                f"use pp x virtual_stages <= {f.num_layers + 2}", "virtual_stages")
    return None


@constraint("LY022", "pp-schedule", "DeepSpeed's pipeline engine runs 1F1B only",
            ("pipeline_schedule", "framework", "pp"),
            "DeepSpeed's PipelineEngine executes one schedule, TrainSchedule (1F1B: deepspeed/runtime/pipe/"
            "schedule.py); interleaved stages are Megatron-LM's (--num-virtual-stages-per-pipeline-rank) and "
            "torchtitan's, zero-bubble and DualPipe come from their own code bases.")
def _pp_schedule(f: LayoutFacts, n: Names):
    if f.framework != "deepspeed" or f.pipeline_schedule in (None, "1f1b") or not _known(f.pp) or f.pp <= 1:
        return None
    return (f"{n('pipeline_schedule')}={f.pipeline_schedule!r} with {n('framework')}='deepspeed' and {n('pp')}="
            f"{f.pp}: DeepSpeed's pipeline engine runs 1F1B only",
            "set pipeline_schedule: 1f1b, or framework: megatron / fsdp", "pipeline_schedule")



@constraint("LY023", "ulysses-megatron-sp", "DeepSpeed-Ulysses and Megatron sequence parallelism do not combine",
            ("sp", "cp", "megatron_sp"),
            "Megatron-DeepSpeed raises 'sequence_parallel_size > 1 enables DeepSpeed's sequence parallel, which is "
            "not compatible with Megatron-LM's sequence parallel' (megatron/initialize.py) when "
            "--ds-sequence-parallel-size > 1 meets --sequence-parallel.")
def _ulysses_megatron_sp(f: LayoutFacts, n: Names):
    if not _known(f.sp, f.cp) or f.sp // f.cp <= 1 or not f.megatron_sp:
        return None
    return (f"{n('sp')}={f.sp // f.cp} with {n('megatron_sp')}: DeepSpeed-Ulysses and Megatron sequence parallelism "
            "do not combine", "turn sequence_parallel off, or use cp (Megatron-LM) in place of ulysses", "megatron_sp")

def check_layout(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
                 names: Optional[Mapping[str, str]] = None) -> list[Violation]:
    """Every violated constraint: all of them in code order, or those in `codes` in that order."""
    names = dict(names or {})

    def n(field: str) -> str:
        return names.get(field, field)

    out: list[Violation] = []
    order = list(CONSTRAINTS) if codes is None else [c for c in codes if c in CONSTRAINTS]
    for code in order:
        c = CONSTRAINTS[code]
        hit = c.check(facts, n)
        if hit is not None:
            # A check may name the fact to point at as a third element; it goes first in `fields`.
            pointed = (hit[2],) + tuple(f for f in c.fields if f != hit[2]) if len(hit) > 2 else c.fields
            out.append(Violation(code, c.name, c.title, hit[0], hit[1], pointed))
    return out


def first_violation(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
                    names: Optional[Mapping[str, str]] = None) -> Optional[Violation]:
    """The first violated constraint, or None."""
    found = check_layout(facts, codes, names)
    return found[0] if found else None


def require(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
            names: Optional[Mapping[str, str]] = None) -> None:
    """Raise `LayoutError` for the first violated constraint."""
    v = first_violation(facts, codes, names)
    if v is not None:
        raise LayoutError(v.code, v.message, v.fix)


def explain(code: str) -> str:
    """A constraint's code, title, facts and explanation, for `--explain` and the docs."""
    c = CONSTRAINTS.get(code.upper())
    if c is None:
        raise KeyError(f"no layout constraint {code!r} (known: {', '.join(CONSTRAINTS)})")
    return f"{c.code} ({c.name}): {c.title}\nreads: {', '.join(c.fields)}\n\n{c.explanation}"


FACT_NAMES = tuple(f.name for f in fields(LayoutFacts))


if __name__ == "__main__":  # pragma: no cover - documentation helper
    for c in CONSTRAINTS.values():
        print(f"{c.code}  {c.name:15} {c.title}  [{', '.join(c.fields)}]")
