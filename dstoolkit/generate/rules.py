"""Which sweep candidates are structurally possible: the layout constraints of `dstoolkit.layout`, asked for
one (spec, model shape, candidate). No torch import, and no layout arithmetic of its own.

`check_candidate` returns the first constraint a candidate breaks as a `RuleViolation` whose `code` is the
constraint's short name (mp-world, pp-zero, ...): sweep summaries group drop reasons by it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.hardware.table import lookup_gpu_name
from dstoolkit.layout import LayoutFacts, ParallelDims, first_violation
from dstoolkit.layout import ramp_increment as _ramp_increment
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.layout_facts import sequence_shards

__all__ = ["RuleViolation", "candidate_facts", "check_candidate", "dims_for", "hpz_partition_size",
           "ramp_increment"]

SWEEP_ORDER = ("LY001", "LY002", "LY003", "LY004", "LY005", "LY006", "LY010", "LY007", "LY008", "LY009",
               "LY011", "LY012", "LY013", "LY014", "LY015", "LY016", "LY017", "LY018")
"""The order the sweep reports constraints in (the first broken one names the drop reason): the refusal of
native MoE at ZeRO-3 comes before the expert-parallel divisibility rules, as it always has."""

CANDIDATE_NAMES = {"global_batch": "training.global_batch", "ramp_start": "training.batch_ramp.start_batch",
                   "ramp_increment": "training.batch_ramp.increment", "gpus_per_node": "cluster.gpus_per_node",
                   "megatron_sp": "training.sequence_parallel"}
"""How candidate facts are named in drop reasons (degrees by their candidate names, the rest by spec path)."""


@dataclass(frozen=True)
class RuleViolation:
    """Why a candidate is impossible. `code` groups equal reasons in sweep output."""

    code: str
    message: str


def candidate_names(spec: Spec) -> dict[str, str]:
    """CANDIDATE_NAMES for this spec: the node the layout rules read is cluster.nvlink_domain_gpus where it is set."""
    if spec.cluster.nvlink_domain_gpus is None:
        return CANDIDATE_NAMES
    return {**CANDIDATE_NAMES, "gpus_per_node": "cluster.nvlink_domain_gpus"}


def dims_for(spec: Spec, cand: Candidate) -> ParallelDims:
    """The candidate's parallel dimensions on the spec's cluster (a node: the NVLink domain)."""
    return ParallelDims(world=spec.cluster.world_size, tp=cand.tp, pp=cand.pp, ep=cand.ep,
                        gpus_per_node=spec.cluster.nvlink_domain)


def hpz_partition_size(spec: Spec, cand: Candidate) -> int:
    """ZeRO++ hpZ secondary partition for the candidate (`ParallelDims.hpz_partition_size`)."""
    return dims_for(spec, cand).hpz_partition_size()


def ramp_increment(spec: Spec, cand: Candidate) -> int:
    """The ramp's batch increment: the spec's, or micro_batch * dp."""
    ramp = spec.training.batch_ramp
    return _ramp_increment(ramp.increment if ramp else None, cand.micro_batch, dims_for(spec, cand).dp)


def candidate_facts(spec: Spec, shape: ModelShape, cand: Candidate, native_moe: bool = True) -> LayoutFacts:
    """Everything the layout constraints read, for one candidate. `native_moe`: the experts run as DeepSpeed's
    own MoE layer (the bundled trainer, Megatron-DeepSpeed), which DeepSpeed refuses at ZeRO-3; False for HF
    models, whose experts are plain PyTorch modules."""
    gpu = spec.cluster.gpu
    ramp = spec.training.batch_ramp
    return LayoutFacts(
        world=spec.cluster.world_size, gpus_per_node=spec.cluster.nvlink_domain,
        tp=cand.tp, pp=cand.pp, ep=cand.ep, zero_stage=cand.zero_stage, micro_batch=cand.micro_batch,
        global_batch=spec.training.global_batch, num_heads=shape.num_attention_heads, kv_heads=shape.kv_heads,
        is_mla=shape.is_mla, num_layers=shape.num_hidden_layers, num_experts=shape.num_experts if shape.is_moe else 0,
        offload_optimizer=cand.offload_optimizer, offload_param=cand.offload_param, zeropp=cand.zeropp,
        megatron_sp=cand.sequence_parallel,
        cpu=isinstance(gpu, str) and lookup_gpu_name(gpu) == "cpu",
        ramp_start=ramp.start_batch if ramp else None, ramp_increment=ramp.increment if ramp else None,
        ramp_kind=ramp.kind if ramp else None, native_moe=native_moe,
    )


def check_candidate(spec: Spec, shape: ModelShape, cand: Candidate, native_moe: bool = True) -> Optional[RuleViolation]:
    """The first layout constraint the candidate breaks (in `SWEEP_ORDER`), or None when it is possible."""
    facts = candidate_facts(spec, shape, cand, native_moe)
    names = candidate_names(spec)
    shards, sp_path = sequence_shards(spec.training)
    if shards > 1:
        # The ranks that share a sequence come out of dp (RunPlan.dims): tp * pp * sp must divide the world and ep
        # the dp left; the batch rule keeps dp = world / (tp * pp), as the generated DeepSpeed JSON counts it.
        sharded = first_violation(replace(facts, sp=shards), ("LY001", "LY009"),
                                  {**names, "sp": ".".join(("training",) + sp_path)})
        v = first_violation(facts, SWEEP_ORDER, names)
        if sharded is not None and (v is None or SWEEP_ORDER.index(sharded.code) <= SWEEP_ORDER.index(v.code)):
            v = sharded
    else:
        v = first_violation(facts, SWEEP_ORDER, names)
    return None if v is None else RuleViolation(v.name, v.message)
