"""The spec's layout facts: what a training section fixes, handed to the layout constraint registry
(dstoolkit.layout.constraints), with each fact's place in the spec so errors point at its YAML line."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from dstoolkit.layout import LayoutFacts, first_violation
from dstoolkit.spec.errors import Loc, SpecFieldError
from dstoolkit.spec.target_engines import ENGINE_RULE_TARGETS, rule_engines

SPEC_FACT_PATHS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",), "pp": ("pp",), "ep": ("ep",), "zero_stage": ("zero_stage",), "micro_batch": ("micro_batch",),
    "global_batch": ("global_batch",), "offload_optimizer": ("offload",), "offload_param": ("offload",),
    "zeropp": ("zeropp",), "megatron_sp": ("sequence_parallel",), "ramp_start": ("batch_ramp", "start_batch"),
    "ramp_increment": ("batch_ramp", "increment"), "seq_len": ("seq_len",), "cp": ("cp",),
    "virtual_stages": ("virtual_stages",), "framework": ("framework",), "pipeline_schedule": ("pipeline_schedule",),
}
"""Where each layout fact lives under `training:` (errors point there)."""


def _int_or_none(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def sequence_shards(t: Any) -> tuple[int, tuple[str, ...]]:
    """The ranks one sequence is split over (the layout's `sp`: cp x ulysses, at most one of them > 1) and the
    field that sets it."""
    cp, ulysses = getattr(t, "cp", 1), getattr(t, "ulysses", 1)
    return cp * ulysses, ("ulysses",) if ulysses > 1 else ("cp",)


def training_facts(t: Any) -> LayoutFacts:
    """The layout facts a training section fixes ("auto" is unknown: None)."""
    ramp = t.batch_ramp
    return LayoutFacts(
        tp=_int_or_none(t.tp), pp=_int_or_none(t.pp), ep=_int_or_none(t.ep), zero_stage=_int_or_none(t.zero_stage),
        sp=sequence_shards(t)[0], cp=t.cp, seq_len=t.seq_len, megatron_sp=t.sequence_parallel,
        micro_batch=_int_or_none(t.micro_batch), global_batch=t.global_batch, offload_optimizer=t.offload,
        zeropp=t.zeropp, ramp_start=ramp.start_batch if ramp else None,
        ramp_increment=ramp.increment if ramp else None, ramp_kind=ramp.kind if ramp else None,
        virtual_stages=t.virtual_stages, framework=t.framework, pipeline_schedule=t.pipeline_schedule)


def raise_layout(facts: LayoutFacts, codes: tuple[str, ...], prefix: Loc, training: Any,
                 names: Optional[dict[str, str]] = None) -> None:
    """Raise the first violated layout constraint as a `SpecFieldError` at the field it points to (the facts' sp is
    the `training` section's cp or ulysses: `sequence_shards`). `names`: facts named otherwise than by their path."""
    paths = {**SPEC_FACT_PATHS, "sp": sequence_shards(training)[1]}
    names = {**{k: ".".join(("training",) + v) for k, v in paths.items()}, **(names or {})}
    v = first_violation(facts, codes, names)
    if v is None:
        return
    loc = next((paths[f] for f in v.fields if f in paths), ())
    raise SpecFieldError(prefix + loc, v.message, v.fix, code=v.code)


TRAINING_CODES = ("LY012", "LY011", "LY018", "LY019", "LY021")
"""The layout rules the training section settles alone (`raise_training_layout`); LY019 there only in its
engine-free part (the engine-reading rules, `ENGINE_RULE_TARGETS`, are the spec's: `raise_spec_layout`; LY006 is
only that: its reason is the engine's, and an unknown engine is DeepSpeed's for it, as in a DeepSpeed config's own
check, DS232)."""


def raise_training_layout(t: Any) -> None:
    """The layout constraints that need no cluster facts and no engine: `TRAINING_CODES` with the framework unknown,
    so a rule that reads it asks only what every engine requires (which engine runs a rule is the targets' to say,
    `raise_spec_layout`).

    Raises:
        SpecFieldError: the first violated constraint, at the field under `training` it points to.
    """
    raise_layout(dataclasses.replace(training_facts(t), framework=None), TRAINING_CODES, prefix=(), training=t)


def raise_spec_layout(spec: Any, *, from_command_line: bool = False) -> None:
    """The layout constraints that need more than the training section: the world size (LY001, LY017, LY009; the
    ranks that share a sequence, cp or ulysses, come out of the data-parallel ones, as RunPlan.dims and DeepSpeed's
    and Megatron's batch arithmetic count them) and the engine (LY019, LY022, LY023, LY024: `ENGINE_RULE_TARGETS`).
    Each engine-reading rule is asked under the engine of each target that runs what it is about (`rule_engines`:
    megatron-lm under Megatron-Core, megatron-deepspeed and deepspeed under DeepSpeed's engine), or under
    training.framework where the spec names no target, and its message names that target and its fix the way off it
    (`from_command_line`: the targets came from the command line, so a fix drops a --target, not a targets: entry).

    Raises:
        SpecFieldError: the first violated constraint, at the field it points to.
    """
    t = spec.training
    facts = dataclasses.replace(training_facts(t), world=spec.world_size, gpus_per_node=spec.cluster.nvlink_domain)
    raise_layout(facts, ("LY001", "LY017", "LY009"), prefix=("training",), training=t)
    for code in ENGINE_RULE_TARGETS:
        for who, engine in rule_engines(code, spec.targets, t.framework).items():
            names = None if who == "training.framework" else {
                "framework": f"target {who}'s engine",
                "engine_choice": f"drop --target {who}" if from_command_line else f"leave {who} out of targets",
                **({"megatron_lm_alone": "--target megatron-lm alone"} if from_command_line else {})}
            raise_layout(dataclasses.replace(facts, framework=engine), (code,), prefix=("training",), training=t,
                         names=names)
