"""Which sweep candidates are structurally possible: the layout constraints of `dstoolkit.layout`, asked for
one (spec, model shape, candidate). No torch import, and no layout arithmetic of its own.

`check_candidate` returns the first constraint a candidate breaks as a `RuleViolation` whose `code` is the
constraint's short name (mp-world, pp-zero, ...): sweep summaries group drop reasons by it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from dstoolkit.generate.candidates import Candidate
from dstoolkit.hardware.table import lookup_gpu_name
from dstoolkit.layout import LayoutFacts, ParallelDims, first_violation
from dstoolkit.layout import ramp_increment as _ramp_increment
from dstoolkit.layout.ulysses_heads import ulysses_impl
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.layout_facts import sequence_shards
from dstoolkit.spec.target_engines import ENGINE_NAMES, engine_of

__all__ = ["RuleViolation", "candidate_facts", "check_candidate", "dims_for", "hpz_partition_size",
           "ramp_increment"]

SWEEP_ORDER = ("LY001", "LY002", "LY003", "LY004", "LY005", "LY006", "LY010", "LY007", "LY008", "LY009",
               "LY011", "LY012", "LY013", "LY014", "LY015", "LY016", "LY017", "LY018", "LY023", "LY019", "LY020",
               "LY021", "LY022", "LY024")
"""The order the sweep reports constraints in (the first broken one names the drop reason): the refusal of
native MoE at ZeRO-3 comes before the expert-parallel divisibility rules, as it always has."""

CANDIDATE_NAMES = {"global_batch": "training.global_batch", "ramp_start": "training.batch_ramp.start_batch",
                   "ramp_increment": "training.batch_ramp.increment", "gpus_per_node": "cluster.gpus_per_node",
                   "megatron_sp": "training.sequence_parallel", "seq_len": "training.seq_len", "cp": "training.cp",
                   "virtual_stages": "training.virtual_stages", "framework": "training.framework",
                   "pipeline_schedule": "training.pipeline_schedule", "cpu": "cluster.gpu"}
"""How candidate facts are named in drop reasons (degrees by their candidate names, the rest by spec path)."""


@dataclass(frozen=True)
class RuleViolation:
    """Why a candidate is impossible. `code` groups equal reasons in sweep output."""

    code: str
    message: str


def candidate_names(spec: Spec, targets: Sequence[str] = ()) -> dict[str, str]:
    """CANDIDATE_NAMES for this spec: the node the layout rules read is cluster.nvlink_domain_gpus where it is set;
    the sequence shards (sp) are training.ulysses or training.cp (`sequence_shards`); the framework is the engine of
    `targets` where they decide it (`targets.spec_for_targets`), and a fix's way onto another engine is another
    --target there, not training.framework."""
    names = {**CANDIDATE_NAMES, "sp": ".".join(("training",) + sequence_shards(spec.training)[1])}
    if spec.cluster.nvlink_domain_gpus is not None:
        names["gpus_per_node"] = "cluster.nvlink_domain_gpus"
    engine = engine_of(targets)
    if engine is not None:
        names["framework"] = f"the engine of --target {' / '.join(targets)}"
        # a rule's way onto another engine (layout.registry.engine_choice): the targets pin it, not the framework
        names["engine_choice"] = (f"another --target ({' / '.join(targets)} run{'s' if len(targets) == 1 else ''} "
                                  f"{ENGINE_NAMES[engine]})")
        names["megatron_lm_alone"] = "--target megatron-lm alone"
    return names


def dims_for(spec: Spec, cand: Candidate) -> ParallelDims:
    """The candidate's parallel dimensions on the spec's cluster (a node: the NVLink domain)."""
    return ParallelDims(world=spec.cluster.world_size, tp=cand.tp, pp=cand.pp, ep=cand.ep, sp=cand.sequence_shards,
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
        megatron_sp=cand.sequence_parallel, sp=cand.sequence_shards, cp=cand.cp, seq_len=spec.training.seq_len,
        virtual_stages=spec.training.virtual_stages, framework=spec.training.framework,
        ulysses_impl=ulysses_impl(spec.training.framework),  # the targets' engine (spec_for_targets): LY020's rule
        pipeline_schedule=spec.training.pipeline_schedule,
        cpu=isinstance(gpu, str) and lookup_gpu_name(gpu) == "cpu",
        ramp_start=ramp.start_batch if ramp else None, ramp_increment=ramp.increment if ramp else None,
        ramp_kind=ramp.kind if ramp else None, native_moe=native_moe,
    )


def check_candidate(spec: Spec, shape: ModelShape, cand: Candidate, native_moe: bool = True,
                    targets: Sequence[str] = ()) -> Optional[RuleViolation]:
    """The first layout constraint the candidate breaks (in `SWEEP_ORDER`), or None when it is possible. `targets`:
    the launchers the spec was pinned for (`targets.spec_for_targets`), which name its framework in messages."""
    v = first_violation(candidate_facts(spec, shape, cand, native_moe), SWEEP_ORDER, candidate_names(spec, targets))
    return None if v is None else RuleViolation(v.name, str(v))  # the problem and its fix
