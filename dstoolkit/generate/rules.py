"""Structural rules a candidate must satisfy before it is estimated (divisibility, what DeepSpeed refuses).

No torch import. Each rule is its own `_check_<rule>` returning a `RuleViolation` or None; `check_candidate`
runs them all. Messages name the fields and values involved, so a sweep can print them as drop reasons.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from dstoolkit.generate.candidates import MOE_STAGE3_REASON, Candidate
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


@dataclass(frozen=True)
class RuleViolation:
    """Why a candidate is impossible. `code` groups equal reasons in sweep output."""

    code: str
    message: str


def hpz_partition_size(spec: Spec, cand: Candidate) -> int:
    """ZeRO++ hpZ secondary partition: the data-parallel ranks of one node (gpus_per_node / tp, capped at dp)."""
    return max(1, min(spec.cluster.gpus_per_node // cand.tp, cand.dp(spec.cluster.world_size)))


def pipeline_first_stage_layers(num_layers: int, pp: int) -> Optional[int]:
    """Layers on stage 0 when L is not a multiple of pp: the other stages take ceil(L/pp) each.

    Returns None for an even split and 0 or less when no such split exists (Megatron's
    --decoder-first-pipeline-num-layers must be >= 1).
    """
    if num_layers % pp == 0:
        return None
    per_stage = -(-num_layers // pp)
    return num_layers - (pp - 1) * per_stage


def _check_model_parallel_divides_world(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    world = spec.cluster.world_size
    if world % (c.tp * c.pp):
        return RuleViolation("mp-world", f"tp*pp = {c.tp}*{c.pp} = {c.tp * c.pp} does not divide the world size "
                                         f"{world} (cluster.nodes*cluster.gpus_per_node)")
    return None


def _check_tp_inside_node(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    g = spec.cluster.gpus_per_node
    if c.tp > g or g % c.tp:
        return RuleViolation("tp-node", f"tp={c.tp} must divide cluster.gpus_per_node={g} "
                                        "(tensor parallelism stays inside a node)")
    return None


def _check_tp_divides_heads(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if shape.num_attention_heads % c.tp:
        return RuleViolation("tp-heads", f"tp={c.tp} does not divide num_attention_heads={shape.num_attention_heads}")
    if not shape.is_mla and shape.kv_heads % c.tp:
        return RuleViolation("tp-kv-heads", f"tp={c.tp} does not divide num_key_value_heads={shape.kv_heads} "
                                            "(Megatron --num-query-groups must be a multiple of tp)")
    return None


def _check_pp_layers(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    layers = shape.num_hidden_layers
    if c.pp > layers:
        return RuleViolation("pp-layers", f"pp={c.pp} exceeds num_hidden_layers={layers}")
    first = pipeline_first_stage_layers(layers, c.pp)
    if first is not None and first < 1:
        return RuleViolation("pp-layers", f"num_hidden_layers={layers} cannot be split over pp={c.pp} stages "
                                          "(stage 0 would get no layer)")
    return None


def _check_pp_zero_stage(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if c.pp > 1 and c.zero_stage >= 2:
        return RuleViolation("pp-zero", f"pp={c.pp} with zero_stage={c.zero_stage}: DeepSpeed's PipelineEngine "
                                        "refuses ZeRO-2/3 ('ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                                        "parallelism'); use zero_stage <= 1 with pp > 1")
    return None


def _check_expert_parallel(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if c.ep == 1:
        return None
    if not shape.is_moe:
        return RuleViolation("ep-dense", f"ep={c.ep} but the model has no experts (dense model)")
    if shape.num_experts % c.ep:
        return RuleViolation("ep-experts", f"ep={c.ep} does not divide the number of experts {shape.num_experts}")
    dp = c.dp(spec.cluster.world_size)
    if dp % c.ep:
        return RuleViolation("ep-dp", f"ep={c.ep} does not divide the data-parallel degree {dp} "
                                      "(DeepSpeed builds expert-parallel groups inside the data-parallel group)")
    return None


def _check_moe_stage3(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if shape.is_moe and c.zero_stage == 3:
        return RuleViolation("moe-zero3", MOE_STAGE3_REASON)
    return None


def _check_offload_stage(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if c.offload_param and c.zero_stage != 3:
        return RuleViolation("offload-stage", f"parameter offload needs zero_stage=3 (got {c.zero_stage})")
    if c.offload_optimizer and c.zero_stage == 0:
        return RuleViolation("offload-stage", "optimizer offload needs zero_stage >= 1 (got 0)")
    return None


def _check_zeropp(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if not c.zeropp:
        return None
    if c.zero_stage != 3:
        return RuleViolation("zeropp-stage", f"ZeRO++ needs zero_stage=3 (got {c.zero_stage})")
    if c.offload_optimizer or c.offload_param:
        return RuleViolation("zeropp-offload", "ZeRO++ is not combined with offload here (hpZ keeps a secondary "
                                               "weight copy in device memory, offload moves weights out of it)")
    gpu = spec.cluster.gpu
    if isinstance(gpu, str) and gpu.lower() == "cpu":
        return RuleViolation("zeropp-cpu", "ZeRO++ qwZ/qgZ need DeepSpeed's CUDA quantizer kernels; the CPU "
                                           "accelerator has no QuantizerBuilder (cluster.gpu='cpu')")
    dp = c.dp(spec.cluster.world_size)
    if dp % hpz_partition_size(spec, c):
        return RuleViolation("zeropp-hpz", f"hpZ partition {hpz_partition_size(spec, c)} does not divide dp={dp}")
    return None


def _check_sequence_parallel(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    if c.sequence_parallel and c.tp == 1:
        return RuleViolation("sp-tp", "sequence parallelism needs tp > 1 (training.sequence_parallel with tp=1)")
    return None


def _check_batch_divisible(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    world = spec.cluster.world_size
    if world % (c.tp * c.pp):
        return None  # reported by _check_model_parallel_divides_world
    dp = c.dp(world)
    g = spec.training.global_batch
    if g % (c.micro_batch * dp):
        return RuleViolation("batch", f"training.global_batch={g} is not a multiple of micro_batch*dp = "
                                      f"{c.micro_batch}*{dp} = {c.micro_batch * dp}")
    return None


def _check_batch_ramp(spec: Spec, shape: ModelShape, c: Candidate) -> Optional[RuleViolation]:
    ramp = spec.training.batch_ramp
    world = spec.cluster.world_size
    if ramp is None or world % (c.tp * c.pp):
        return None
    step = c.micro_batch * c.dp(world)
    g = spec.training.global_batch
    if ramp.start_batch % step:
        return RuleViolation("ramp", f"training.batch_ramp.start_batch={ramp.start_batch} is not a multiple of "
                                     f"micro_batch*dp = {step}")
    inc = ramp_increment(spec, c)
    if inc % step:
        return RuleViolation("ramp", f"training.batch_ramp.increment={inc} is not a multiple of micro_batch*dp = {step}")
    if ramp.start_batch > g or (g - ramp.start_batch) % inc:
        return RuleViolation("ramp", f"global_batch - start_batch = {g} - {ramp.start_batch} is not a non-negative "
                                     f"multiple of the increment {inc} (Megatron --rampup-batch-size)")
    return None


def ramp_increment(spec: Spec, c: Candidate) -> int:
    """The ramp's batch increment: the spec's, or micro_batch * dp (the finest step DeepSpeed can take)."""
    ramp = spec.training.batch_ramp
    if ramp is not None and ramp.increment:
        return ramp.increment
    return c.micro_batch * c.dp(spec.cluster.world_size)


RULES: tuple[Callable[[Spec, ModelShape, Candidate], Optional[RuleViolation]], ...] = (
    _check_model_parallel_divides_world, _check_tp_inside_node, _check_tp_divides_heads, _check_pp_layers,
    _check_pp_zero_stage, _check_moe_stage3, _check_expert_parallel, _check_offload_stage, _check_zeropp,
    _check_sequence_parallel, _check_batch_divisible, _check_batch_ramp,
)


def check_candidate(spec: Spec, shape: ModelShape, cand: Candidate) -> Optional[RuleViolation]:
    """The first rule the candidate breaks, or None when it is structurally valid."""
    for rule in RULES:
        v = rule(spec, shape, cand)
        if v is not None:
            return v
    return None
