"""What the layout constraints read and how each is declared: `LayoutFacts`, the `Violation` a check reports,
and the registry (`constraint` registers a check under its code; `CONSTRAINTS` is the codes table). The rules
themselves are in `degree_rules` (how the ranks are split) and `step_rules` (how a step runs over them); ask them
through `dstoolkit.layout.constraints`. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Optional

from dstoolkit.layout.dims import data_parallel_size

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
    ulysses_impl: Optional[str] = None
    """What splits the heads of a Ulysses group (`ulysses_heads.ULYSSES_IMPLS`: megatron-core, megatron-deepspeed,
    alst; an engine's: `ulysses_heads.ulysses_impl`); None: unknown, DeepSpeed's DistributedAttention's own rule."""
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


def engine_choice(n: Names, engines: str) -> str:
    """The fix's way onto another engine for a rule that reads `framework`: ``framework: <engines>`` where
    training.framework decides the engine (the default), or what the caller names the pseudo-fact ``engine_choice``
    where a launcher target decides it instead (the spec's targets: "leave megatron-deepspeed out of targets"; the
    sweep's --target), since setting training.framework changes nothing there."""
    how = n("engine_choice")
    return f"framework: {engines}" if how == "engine_choice" else how


def megatron_lm_alone(n: Names) -> str:
    """How the caller runs a layout on Megatron-LM alone: the spec's ``targets: [megatron-lm]`` (or framework:
    megatron), or what the caller names the pseudo-fact ``megatron_lm_alone`` (the command line's --target)."""
    how = n("megatron_lm_alone")
    return "targets: [megatron-lm], or framework: megatron" if how == "megatron_lm_alone" else how


def known(*vals) -> bool:
    """Every fact given is known (not None): the constraints that need an unknown one stay quiet."""
    return all(v is not None for v in vals)


FACT_NAMES = tuple(f.name for f in fields(LayoutFacts))
