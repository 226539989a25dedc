"""Which engine runs each launcher target's files, and which targets split a sequence over ranks: the facts the spec's
layout check (a spec's `targets`), the sweep and `dstoolkit generate` read. `dstoolkit.generate.targets` asks them
from here (the spec sits below generate in the import order). Pure Python.
"""
from __future__ import annotations

from typing import Optional, Sequence

TARGET_ENGINE: dict[str, str] = {"deepspeed": "deepspeed", "megatron-lm": "megatron", "megatron-deepspeed": "deepspeed",
                                 "hf": "deepspeed", "accelerate": "deepspeed"}
"""The runtime (a `training.framework` value) each target's files run, so the one its estimate is computed for: the
bundled trainer (launch.sh), Megatron-DeepSpeed (--deepspeed, the DeepSpeed JSON) and HF Trainer / Accelerate drive
DeepSpeed's engine (ZeRO, its overlap_comm defaults, the PipelineEngine's uniform stage split); Megatron-LM runs
Megatron-Core's own (distributed optimizer or Megatron-FSDP, --overlap-grad-reduce, its pipeline split, Ulysses as
all-to-all context parallelism). `training.framework` decides the engine only where no target does (sweep and
estimate without --target, or with targets of both engines)."""

ENGINE_NAMES = {"deepspeed": "DeepSpeed's engine", "megatron": "Megatron-Core", "fsdp": "PyTorch FSDP"}
"""How messages and summaries name each engine."""

SEQUENCE_SHARDING_TARGETS = {"cp": ("megatron-lm",), "ulysses": ("megatron-deepspeed", "megatron-lm")}
"""Which launchers split a sequence over ranks: Megatron-Core context parallelism (Megatron-LM
--context-parallel-size) and DeepSpeed-Ulysses (Megatron-DeepSpeed --ds-sequence-parallel-size; Megatron-LM as
--context-parallel-size N --cp-comm-type a2a, Megatron-Core's TransformerConfig.cp_comm_type "a2a": "Like DeepSpeed
Ulysses, scatter attention heads across the CP group, and gather to get full sequence of QKV"). The bundled trainer
and the HF / Accelerate scripts shard no sequence; Megatron-DeepSpeed has no ring context parallelism."""


def engine_of(targets: Sequence[str]) -> Optional[str]:
    """The one engine every target of `targets` runs (`TARGET_ENGINE`), or None (no target, or both engines)."""
    engines = {TARGET_ENGINE[t] for t in targets}
    return engines.pop() if len(engines) == 1 else None


ENGINE_RULE_TARGETS: dict[str, tuple[str, ...]] = {
    "LY006": ("deepspeed", "megatron-deepspeed", "megatron-lm"),
    "LY019": tuple(dict.fromkeys(SEQUENCE_SHARDING_TARGETS["ulysses"] + SEQUENCE_SHARDING_TARGETS["cp"])),
    "LY022": ("deepspeed", "megatron-deepspeed", "megatron-lm"),
    "LY023": SEQUENCE_SHARDING_TARGETS["ulysses"],
    "LY024": SEQUENCE_SHARDING_TARGETS["cp"],
}
"""The layout rules that read the engine (`LayoutFacts.framework`), each with the launchers that run what it is about:
LY006 ZeRO beside a pipeline (the launchers with a pipeline: DeepSpeed's PipelineEngine refuses ZeRO-2/3 there;
Megatron-Core runs ZeRO-2 as the distributed optimizer of ZeRO-1), LY019 the sequence split (the launchers that shard a sequence: Megatron-LM's a2a context parallelism needs 2 x ulysses
to divide seq_len, DeepSpeed-Ulysses ulysses), LY022 the pipeline schedule (the launchers with a pipeline: DeepSpeed's
PipelineEngine for the bundled trainer and Megatron-DeepSpeed, Megatron-Core for Megatron-LM; HF Trainer / Accelerate
have none), LY023 Ulysses beside Megatron sequence parallelism and LY024 context parallelism (`SEQUENCE_SHARDING_TARGETS`).
A spec checks each under the engine of each of its targets listed here (`rule_engines`); a target not listed does not
run what the rule is about, and `generate` gives it no files for such a layout, with the reason."""


def rule_engines(code: str, targets: Sequence[str], framework: str) -> dict[str, str]:
    """Target -> engine for each of `targets` that runs what the engine-reading layout rule `code` is about
    (`ENGINE_RULE_TARGETS`); with no target, {"training.framework": framework}: the engine the spec would run under."""
    if not targets:
        return {"training.framework": framework}
    return {t: TARGET_ENGINE[t] for t in dict.fromkeys(targets) if t in ENGINE_RULE_TARGETS[code]}
