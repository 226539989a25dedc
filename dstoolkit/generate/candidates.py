"""The unit a sweep ranks and a strategy resolves to: one fully specified parallel/ZeRO layout.

No torch import. A `Candidate` has no "auto" left in it: every degree, the micro-batch and the checkpoint
policy are numbers or named policies. `StrategyDef` is a named family of candidates (zero2-offload, zero1-ep,
...) that `dstoolkit generate` resolves to its best candidate with the sweep.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from dstoolkit.layout import ParallelDims
from dstoolkit.layout.degree_rules import MOE_STAGE3_REASON
from dstoolkit.spec.checkpoint import CheckpointPolicy


class Candidate(BaseModel):
    """One concrete layout: ZeRO stage, offload, ZeRO++, TP/PP/EP degrees, micro-batch and recompute policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    zero_stage: int = Field(ge=0, le=3)
    """DeepSpeed ZeRO stage 0-3."""
    offload_optimizer: bool = False
    """Optimizer states (and the fp32 master copy) live in host memory; the step runs on the CPU (ZeRO-Offload)."""
    offload_param: bool = False
    """Stage 3 only: the 16-bit parameters live in host memory too (ZeRO-Infinity, CPU tier)."""
    zeropp: bool = False
    """Stage 3 only: ZeRO++ qwZ (int8 weight all-gather), hpZ (intra-node secondary partition), qgZ (int4 grads)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree (inside a node)."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel degree."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree; divides the data-parallel degree (DeepSpeed MoE carves EP groups out of DP)."""
    micro_batch: int = Field(ge=1)
    """Sequences per rank per forward/backward."""
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    """Activation recompute policy."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (only meaningful with tp > 1)."""
    cp: int = Field(default=1, ge=1)
    """Megatron-Core context-parallel degree: the spec's training.cp (not swept)."""
    ulysses: int = Field(default=1, ge=1)
    """DeepSpeed-Ulysses sequence-parallel degree: the spec's training.ulysses (not swept)."""

    @property
    def sequence_shards(self) -> int:
        """Ranks one sequence is split over (cp or ulysses), taken out of the data-parallel ones."""
        return self.cp * self.ulysses

    def dp(self, world_size: int) -> int:
        """Data-parallel degree at this world size (`dstoolkit.layout.ParallelDims.dp`): the ranks that share a
        sequence are not data-parallel."""
        return ParallelDims(world=world_size, tp=self.tp, pp=self.pp, sp=self.sequence_shards).dp

    def grad_accum(self, world_size: int, global_batch: int) -> int:
        """Gradient-accumulation steps: global_batch / (micro_batch * dp)."""
        return global_batch // (self.micro_batch * self.dp(world_size))

    @property
    def checkpoint_label(self) -> str:
        c = self.checkpoint
        if c.kind == "every-k":
            return f"every-{c.every_k}"
        if c.kind == "ratio":
            return f"ratio-{c.ratio:g}"
        return c.kind

    @property
    def offload_label(self) -> str:
        if self.offload_param:
            return "opt+param"
        return "opt" if self.offload_optimizer else "none"

    @property
    def label(self) -> str:
        """Short, stable description used in tables and reasons."""
        z = "zero++" if self.zeropp else f"zero{self.zero_stage}"
        parts = [z]
        if self.offload_optimizer or self.offload_param:
            parts.append(f"offload={self.offload_label}")
        parts += [f"tp{self.tp}", f"pp{self.pp}"]
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        parts += [f"mb{self.micro_batch}", f"ckpt={self.checkpoint_label}"]
        if self.sequence_parallel:
            parts.append("sp")
        return " ".join(parts)


@dataclass(frozen=True)
class StrategyDef:
    """A named family of candidates that `dstoolkit generate` emits one folder for."""

    name: str
    zero_stage: int
    offload_optimizer: bool = False
    offload_param: bool = False
    zeropp: bool = False
    expert_parallel: bool = False
    """True: ep >= 2 (MoE only). False: ep = 1 (experts replicated on every data-parallel rank)."""
    description: str = ""

    def matches(self, cand: Candidate) -> bool:
        """Whether a candidate belongs to this family."""
        return (cand.zero_stage == self.zero_stage and cand.offload_optimizer == self.offload_optimizer
                and cand.offload_param == self.offload_param and cand.zeropp == self.zeropp
                and (cand.ep > 1) == self.expert_parallel)


# The catalog, in the order folders are listed. Names are what `--strategy` accepts.
STRATEGIES: dict[str, StrategyDef] = {s.name: s for s in (
    StrategyDef("zero0", 0, description="plain data parallel: every rank holds all model states"),
    StrategyDef("zero1", 1, description="optimizer states partitioned over data-parallel ranks"),
    StrategyDef("zero2", 2, description="optimizer states and gradients partitioned"),
    StrategyDef("zero2-offload", 2, offload_optimizer=True,
                description="ZeRO-2 with optimizer states and step on the CPU (ZeRO-Offload)"),
    StrategyDef("zero3", 3, description="parameters, gradients and optimizer states partitioned"),
    StrategyDef("zero3-offload", 3, offload_optimizer=True, offload_param=True,
                description="ZeRO-3 with optimizer states and parameters in host memory"),
    StrategyDef("zero++", 3, zeropp=True,
                description=("ZeRO-3 with qwZ int8 weight gathers, qgZ int4 gradients and, where the data-parallel "
                             "group spans nodes, hpZ intra-node partition")),
    StrategyDef("zero0-ep", 0, expert_parallel=True,
                description="plain data parallel with experts sharded over an expert-parallel group"),
    StrategyDef("zero1-ep", 1, expert_parallel=True,
                description="ZeRO-1 with experts sharded over an expert-parallel group"),
    StrategyDef("zero2-ep", 2, expert_parallel=True,
                description="ZeRO-2 with experts sharded over an expert-parallel group"),
)}

def strategy_unavailable_reason(strategy: StrategyDef, *, is_moe: bool, native_moe: bool = True) -> Optional[str]:
    """Why a strategy cannot exist for this model at all (independent of memory), or None. `native_moe`:
    the experts are DeepSpeed's own MoE layers (refused at ZeRO-3), not an HF model's plain modules."""
    if is_moe and native_moe and strategy.zero_stage == 3:
        return MOE_STAGE3_REASON
    if strategy.expert_parallel and not is_moe:
        return "expert parallelism needs an MoE model (this model has no experts)"
    return None
