"""The layout constraints on how a step runs over the ranks (LY017-LY024): the global batch and its ramp in whole
micro batches over dp, the sequence split over the ranks that share it (context parallelism, DeepSpeed-Ulysses,
Megatron sequence parallelism), virtual pipeline stages and the schedule the framework runs. Registered in
`dstoolkit.layout.registry`; asked through `dstoolkit.layout.constraints`. Pure Python.
"""
from __future__ import annotations

from dstoolkit.layout.dims import ramp_increment
from dstoolkit.layout.registry import LayoutFacts, Names, constraint, engine_choice, known, megatron_lm_alone
from dstoolkit.layout.ulysses_heads import ulysses_heads_fix, ulysses_heads_problem


@constraint("LY017", "batch", "global batch must be a multiple of micro batch x dp", ("global_batch", "micro_batch", "world"),
            "DeepSpeed: train_batch_size = micro_batch * gradient_accumulation_steps * dp "
            "(deepspeed/runtime/config.py _batch_assertion), dp without the ranks that share a sequence (config.py: "
            "world size / sequence_parallel_size, or the mpu's data-parallel size); Megatron-LM the same with dp = "
            "world / (tp * pp * cp).")
def _batch_divisible(f: LayoutFacts, n: Names):
    dp = f.dp
    if not known(f.global_batch, dp):
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
            ("seq_len", "cp", "sp", "tp", "megatron_sp", "framework"),
            "Megatron-Core context parallelism cuts each sequence into 2 * cp equal chunks and gives every rank two "
            "(causal load balance; megatron/training/arguments.py asserts 'seq-length should be a multiple of 2 * "
            "context-parallel-size' for every context-parallel size > 1, whatever --cp-comm-type). "
            "DeepSpeed-Ulysses gives each of its ranks seq / ulysses tokens (deepspeed/sequence/layer.py "
            "DistributedAttention) where DeepSpeed's engine runs it (framework deepspeed: Megatron-DeepSpeed's "
            "--ds-sequence-parallel-size); Megatron-Core (framework megatron: the megatron-lm target) runs the Ulysses "
            "degree as all-to-all context parallelism (--context-parallel-size N --cp-comm-type a2a), so the same "
            "2 * N rule holds there (unknown framework: seq / ulysses only). Megatron sequence parallelism scatters a "
            "rank's sequence over the TP ranks (megatron/core/tensor_parallel/mappings.py _split_along_first_dim: "
            "'First dimension of the tensor should be divisible by tensor parallel size').")
def _seq_shards(f: LayoutFacts, n: Names):
    if not known(f.seq_len, f.sp, f.cp):
        return None
    if f.cp > 1 and f.seq_len % (2 * f.cp):
        return (f"{n('seq_len')}={f.seq_len} does not split into 2 x {n('cp')} = {2 * f.cp} equal chunks: Megatron-Core's "
                "context parallelism gives each rank two of them", f"use a seq_len divisible by {2 * f.cp}", "seq_len")
    ulysses = f.sp // f.cp
    if ulysses > 1 and f.framework == "megatron" and f.seq_len % (2 * ulysses):
        return (f"{n('seq_len')}={f.seq_len} does not split into 2 x {n('sp')} = {2 * ulysses} equal chunks: "
                f"Megatron-Core runs Ulysses as all-to-all context parallelism (--context-parallel-size {ulysses} "
                "--cp-comm-type a2a), and Megatron-LM asserts 'seq-length should be a multiple of 2 * "
                f"context-parallel-size' for it as for any context parallelism ({n('framework')}: megatron)",
                f"use a seq_len divisible by {2 * ulysses}, or {engine_choice(n, 'deepspeed')}: DeepSpeed-Ulysses "
                f"(Megatron-DeepSpeed) needs only a multiple of {ulysses}", "seq_len")
    if ulysses > 1 and f.seq_len % ulysses:
        return (f"{n('seq_len')}={f.seq_len} does not split over {n('sp')}={ulysses} DeepSpeed-Ulysses ranks",
                f"use a seq_len divisible by {ulysses}", "seq_len")
    local = f.seq_len // f.sp
    if f.megatron_sp and known(f.tp) and f.tp > 1 and local % f.tp:
        per = f" ({f.seq_len} / {f.sp} per sequence shard)" if f.sp > 1 else ""
        return (f"{n('seq_len')}={f.seq_len}: {local} tokens{per} do not split over {n('tp')}={f.tp} with Megatron "
                f"sequence parallelism ({n('megatron_sp')})",
                f"use a seq_len divisible by {f.sp * f.tp}, or turn sequence parallelism off", "seq_len")
    return None


@constraint("LY020", "ulysses-heads", "the heads must split over the Ulysses ranks as its implementation splits them",
            ("sp", "cp", "kv_heads", "num_heads", "tp", "is_mla", "ulysses_impl"),
            "Ulysses' all-to-all hands each of its ranks a share of the attention heads, and each implementation "
            "refuses its own counts (layout.ulysses_heads; the caller names it, ulysses_impl: the sweep and the "
            "estimate the one their engine runs, ulysses_heads.FRAMEWORK_ULYSSES): Megatron-LM (Megatron-Core) runs the "
            "degree as all-to-all context parallelism, whose Transformer Engine attention needs the query and the "
            "key/value heads of each TP rank divisible by it; Megatron-DeepSpeed (under DeepSpeed's engine the one "
            "launcher that splits sequences) asserts num_attention_heads % ds_sequence_parallel_size == 0 "
            "(megatron/model/transformer.py) and its DeepSpeed DistributedAttention asserts 'Number of key-value heads "
            "must be at least the sequence parallel size', splitting an indivisible count unevenly "
            "(deepspeed/sequence/layer.py); DeepSpeed's UlyssesSPAttentionHF (ALST, HF models) needs the attention "
            "heads divisible by the degree and the key/value heads divisible by it or dividing it (it replicates them: "
            "deepspeed/runtime/sequence_parallel/ulysses_sp.py). Unknown implementation: DistributedAttention's rule.")
def _ulysses_heads(f: LayoutFacts, n: Names):
    if not known(f.sp, f.cp, f.kv_heads, f.tp) or f.is_mla:
        return None
    ulysses = f.sp // f.cp
    impl = f.ulysses_impl
    why = ulysses_heads_problem(impl, ulysses, f.num_heads, f.kv_heads, f.tp, name=n("sp"), tp_name=n("tp"))
    if why is None:
        return None
    room = f.world // (f.tp * f.pp) if known(f.world, f.pp) and f.world % (f.tp * f.pp) == 0 else None
    return why, ulysses_heads_fix(impl, f.num_heads, f.kv_heads, f.tp, name=n("sp"), ulysses=ulysses, room=room)


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
    if not known(v) or v <= 1:
        return None
    if known(f.pp) and f.pp <= 1:
        return (f"{n('virtual_stages')}={v} with {n('pp')}={f.pp}: the interleaved schedule splits each pipeline "
                "rank's layers into chunks, and there is no pipeline", "set pp > 1, or remove virtual_stages",
                "virtual_stages")
    if known(f.pp, f.num_layers) and f.pp * v > f.num_layers + 2:
        return (f"{n('pp')} x {n('virtual_stages')} = {f.pp} x {v} = {f.pp * v} model chunks for {f.num_layers} "
                "blocks, the embedding and the output layer: some chunk would run nothing",
                f"use pp x virtual_stages <= {f.num_layers + 2}", "virtual_stages")
    return None


@constraint("LY022", "pp-schedule", "DeepSpeed's pipeline engine runs 1F1B only",
            ("pipeline_schedule", "framework", "pp"),
            "DeepSpeed's PipelineEngine executes one schedule, TrainSchedule (1F1B: deepspeed/runtime/pipe/"
            "schedule.py); interleaved stages are Megatron-LM's (--num-virtual-stages-per-pipeline-rank) and "
            "torchtitan's, zero-bubble and DualPipe come from their own code bases. A spec with targets is checked "
            "under the engine of each target that runs a pipeline (deepspeed, megatron-deepspeed: DeepSpeed's; "
            "megatron-lm: Megatron-Core), not under training.framework.")
def _pp_schedule(f: LayoutFacts, n: Names):
    if f.framework != "deepspeed" or f.pipeline_schedule in (None, "1f1b") or not known(f.pp) or f.pp <= 1:
        return None
    return (f"{n('pipeline_schedule')}={f.pipeline_schedule!r} with {n('framework')}='deepspeed' and {n('pp')}="
            f"{f.pp}: DeepSpeed's pipeline engine runs 1F1B only",
            f"set pipeline_schedule: 1f1b, or {engine_choice(n, 'megatron / fsdp')}", "pipeline_schedule")


@constraint("LY023", "ulysses-megatron-sp", "DeepSpeed-Ulysses and Megatron sequence parallelism do not combine",
            ("sp", "cp", "megatron_sp", "framework"),
            "Megatron-DeepSpeed raises 'sequence_parallel_size > 1 enables DeepSpeed's sequence parallel, which is "
            "not compatible with Megatron-LM's sequence parallel' (megatron/initialize.py) when "
            "--ds-sequence-parallel-size > 1 meets --sequence-parallel: the refusal holds wherever DeepSpeed's engine "
            "runs the Ulysses degree (framework deepspeed: Megatron-DeepSpeed, DeepSpeed's sequence_parallel_size). "
            "Megatron-Core (framework megatron; the megatron-lm target) runs it as all-to-all context parallelism "
            "(--context-parallel-size N --cp-comm-type a2a), which Megatron-LM takes with --sequence-parallel: its "
            "validate_args and TransformerConfig assert nothing between cp_comm_type and sequence_parallel.")
def _ulysses_megatron_sp(f: LayoutFacts, n: Names):
    if not known(f.sp, f.cp) or f.sp // f.cp <= 1 or not f.megatron_sp or f.framework == "megatron":
        return None
    under = f" ({n('framework')}: {f.framework})" if f.framework is not None else ""
    return (f"{n('sp')}={f.sp // f.cp} with {n('megatron_sp')}: DeepSpeed-Ulysses and Megatron sequence parallelism "
            f"do not combine{under}",
            "turn sequence_parallel off, use cp in place of ulysses, or run it on Megatron-LM alone "
            f"({megatron_lm_alone(n)}), whose all-to-all context parallelism takes --sequence-parallel", "megatron_sp")


@constraint("LY024", "cp-framework", "context parallelism needs a framework that has it", ("cp", "framework"),
            "Context parallelism (ring attention over cp ranks) is Megatron-LM's (--context-parallel-size) and "
            "torchtitan's (torch.distributed.tensor.experimental.context_parallel); DeepSpeed 0.19.8 has none: its "
            "sequence parallelism is DeepSpeed-Ulysses (sequence_parallel_size; training.ulysses). A spec with targets "
            "is checked under the engine of each target that runs context parallelism (megatron-lm: Megatron-Core), "
            "not under training.framework; the other launchers get no files for a cp layout, with the reason.")
def _cp_framework(f: LayoutFacts, n: Names):
    if f.framework != "deepspeed" or not known(f.cp) or f.cp <= 1:
        return None
    return (f"{n('cp')}={f.cp} with {n('framework')}='deepspeed': DeepSpeed has no context parallelism (ring "
            "attention)", f"use ulysses: {f.cp} (DeepSpeed-Ulysses), or {engine_choice(n, 'megatron / fsdp')}", "cp")
