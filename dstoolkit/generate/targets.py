"""What each launcher can run: the one place the sweep, `estimate --target` and `generate` ask. No torch import.

- ``deepspeed`` (the bundled trainer under DeepSpeed's engine) and ``megatron-deepspeed``: every layout of the
  sweep; MoE layers are DeepSpeed's own (``deepspeed.moe``), which DeepSpeed refuses at ZeRO-3.
- ``megatron-lm``: Megatron-Core's own TP/PP/EP/CP (the only target for ring context parallelism; Ulysses as
  Megatron-Core's all-to-all CP, `sequence_sharding_reason`); its MoE blocks are Megatron's, so ZeRO-3-like sharding of
  replicated experts is not refused by DeepSpeed's rule (dstoolkit.generate.megatron owns the rest); no parameter
  offload and no ZeRO++ (`ENGINE_ZERO_GAPS`): its files would run the layout without them, so those layouts and the
  zero3-offload / zero++ strategies get no megatron-lm files or figures.
- ``hf`` and ``accelerate`` (HF Trainer / Accelerate driving DeepSpeed): no pipeline engine (the model is not a
  ``PipelineModule``), no AutoEP (DeepSpeed 0.19.8 against transformers 5), no Megatron sequence parallelism;
  experts are plain modules, so ZeRO-3 is open to an HF MoE model (`hf_targets.hf_unavailable_reason`).

`target_refusal` is the one rule for whether a target can run a layout of a spec: `generate` writes no files for a
target it refuses, and the sweep (so `sweep`, `estimate SPEC` and `tune`) drops the layouts none of the asked targets
runs, so a model a Megatron target cannot build (`megatron_common.architecture_gaps` and the argument builders' other
refusals) gets "not estimated" for it, never figures.

Each target's layout is estimated under the engine its files run (`TARGET_ENGINE`: Megatron-LM is Megatron-Core, the
others DeepSpeed's engine), whatever `training.framework` says (`spec_for_targets`); `generate` resolves each strategy
once per `target_groups` group.
"""
from __future__ import annotations

from typing import Optional, Sequence

from dstoolkit.dsconfig.rule_facts import AUTOEP_TRANSFORMERS_NOTE
from dstoolkit.generate.candidate_grid import zero_modes
from dstoolkit.generate.candidates import Candidate, strategy_unavailable_reason
from dstoolkit.generate.hf_targets import HF_TARGETS, hf_unavailable_reason
from dstoolkit.generate.megatron_common import UnsupportedTarget
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.generate.sweep_result import SweepResult
from dstoolkit.layout.ulysses_heads import (IMPL_LAUNCHER, one_of, ulysses_degrees, ulysses_heads_fix,
                                           ulysses_heads_problem)
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.target_engines import ENGINE_NAMES, SEQUENCE_SHARDING_TARGETS, TARGET_ENGINE, engine_of

NATIVE_MOE_TARGETS = ("deepspeed", "megatron-deepspeed")
"""Targets whose MoE layers are DeepSpeed's own (deepspeed.moe), which DeepSpeed refuses at ZeRO-3; HF models
(hf, accelerate) and Megatron-LM run plain modules, and ZeRO-3 with replicated experts is open to them."""
KNOWN_TARGETS = ("deepspeed", "megatron-lm", "megatron-deepspeed", *HF_TARGETS)
"""Every launcher name `--target` accepts (held equal to dstoolkit.generate.core.TARGETS by the tests)."""


def is_hf(target: str) -> bool:
    """HF Trainer / Accelerate (the user's own HF script)."""
    return target in HF_TARGETS


def native_moe(targets: Sequence[str]) -> bool:
    """Whether the MoE layers are DeepSpeed's own for these targets (any of `NATIVE_MOE_TARGETS`)."""
    return any(t in NATIVE_MOE_TARGETS for t in targets)


def spec_for_targets(spec: Spec, targets: Sequence[str]) -> Spec:
    """The spec as `targets` run it: `training.framework` set to the engine all of them run (`TARGET_ENGINE`, so the
    estimate is that engine's: Megatron-LM's distributed optimizer, overlap defaults and pipeline split, or
    DeepSpeed's; Megatron's recompute_modules dropped under DeepSpeed's), and, for HF targets alone, the "auto" fields no HF launcher can use pinned: pp and ep swept as 1
    (the pipeline engine and AutoEP have no HF form), instead of enumerating layouts they would drop. Targets of
    both engines (or none) keep the spec's framework."""
    if not targets:
        return spec
    t = spec.training
    update: dict = {}
    engine = engine_of(targets)
    if engine is not None and t.framework != engine:
        update["framework"] = engine
        if engine != "megatron" and t.recompute_modules:
            update["recompute_modules"] = []  # Megatron's --recompute-modules: no DeepSpeed-engine launcher has them
    if all(is_hf(x) for x in targets):
        update.update({k: 1 for k in ("pp", "ep") if getattr(t, k) == "auto"})
    return spec.model_copy(update={"training": t.model_copy(update=update)}) if update else spec


def engine_note(spec: Spec, targets: Sequence[str]) -> Optional[str]:
    """One line for summaries and the CLI when a target's engine is not `training.framework`: its layout and figures
    are its engine's (`spec_for_targets`), not the framework's."""
    other = [t for t in dict.fromkeys(targets) if TARGET_ENGINE[t] != spec.training.framework]
    if not other:
        return None
    runs = "; ".join(f"{t} runs {ENGINE_NAMES[TARGET_ENGINE[t]]}" for t in other)
    return (f"{runs}: each target's layout and figures are estimated under the engine its files run, not under "
            f"training.framework={spec.training.framework!r} (which decides only where no target does: sweep and "
            "estimate without --target)")


def target_groups(targets: Sequence[str]) -> list[list[str]]:
    """The requested targets in the groups `generate` resolves each strategy for on its own, so a layout one launcher
    cannot run never removes another's files and each is ranked by its own engine's estimate: DeepSpeed's engine with
    its native MoE (deepspeed, megatron-deepspeed; first: its layout is the folder's ds_config.json), Megatron-LM
    (Megatron-Core), then HF Trainer / Accelerate (DeepSpeed's engine, no pipeline engine, no AutoEP, ZeRO-3 open to
    MoE). Empty groups are left out; each keeps the requested order."""
    keys = (lambda t: not is_hf(t) and TARGET_ENGINE[t] == "deepspeed",
            lambda t: not is_hf(t) and TARGET_ENGINE[t] != "deepspeed", is_hf)
    return [g for g in ([t for t in dict.fromkeys(targets) if key(t)] for key in keys) if g]


TARGET_ULYSSES = {launcher: impl for impl, launcher in IMPL_LAUNCHER.items()}
"""The implementation each sequence-splitting launcher runs Ulysses with (`layout.ulysses_heads`): megatron-lm
Megatron-Core's all-to-all context parallelism, megatron-deepspeed DeepSpeed's DistributedAttention."""


def _ulysses_heads_reason(target: str, ulysses: int, tp: int, shape: Optional[ModelShape]) -> Optional[str]:
    """Why `target`'s Ulysses implementation cannot split the model's heads over `ulysses` ranks (LY020's rule for
    that implementation, `layout.ulysses_heads`), with the way out, or None."""
    if shape is None or shape.is_mla or target not in TARGET_ULYSSES:
        return None
    impl, heads = TARGET_ULYSSES[target], (shape.num_attention_heads, shape.kv_heads, tp)
    why = ulysses_heads_problem(impl, ulysses, *heads, name="training.ulysses")
    if why is None:
        return None
    return f"{why}; {ulysses_heads_fix(impl, *heads, name='training.ulysses', ulysses=ulysses)}"


def sequence_sharding_reason(target: str, cand: Candidate, shape: Optional[ModelShape] = None) -> Optional[str]:
    """Why `target` cannot split the candidate's sequences (its cp or ulysses), or None: a launcher that does not
    split them that way (its advice names only the launchers whose Ulysses takes the model's heads), or a Ulysses
    degree the heads do not split into under the launcher's implementation (rule LY020, `layout.ulysses_heads`:
    Megatron-LM's all-to-all context parallelism needs each TP rank's query and key/value heads divisible by it;
    Megatron-DeepSpeed the attention heads divisible by it, and its DistributedAttention at least as many key/value
    heads on each TP rank)."""
    for field, degree in (("cp", cand.cp), ("ulysses", cand.ulysses)):
        able = SEQUENCE_SHARDING_TARGETS[field]
        if degree > 1 and target not in able:
            head = f"training.{field}={degree}: {target} does not split sequences that way"
            if field == "ulysses":
                taking = tuple(t for t in able if _ulysses_heads_reason(t, degree, cand.tp, shape) is None)
                if not taking:
                    heads = (shape.num_attention_heads, shape.kv_heads, cand.tp)
                    degrees = "; ".join(f"--target {t} takes training.ulysses "
                                        f"{one_of(ulysses_degrees(TARGET_ULYSSES[t], *heads)) or 'none'}" for t in able)
                    return (f"{head}, and no launcher that does takes {degree} for these heads "
                            f"({shape.num_attention_heads} attention, {shape.kv_heads} key/value, tp {cand.tp}): "
                            f"{degrees}; or context parallelism (cp) with --target megatron-lm")
                able = taking
            return f"{head}; generate with --target {' / '.join(able)}"
    if cand.ulysses > 1:
        return _ulysses_heads_reason(target, cand.ulysses, cand.tp, shape)
    return None


ENGINE_ZERO_GAPS: dict[str, dict[str, tuple[str, str]]] = {
    "megatron": {
        "offload_param": ("Megatron-LM has no parameter offload (its one offload flag is --optimizer-cpu-offload, "
                          "megatron/training/arguments.py at d98e8a64; Megatron-FSDP keeps the parameter shards on "
                          "the GPU): its files would offload the optimizer alone",
                          "zero2-offload offloads the optimizer; `dstoolkit sweep SPEC --target megatron-lm` with "
                          "training.offload: true estimates ZeRO-3 with the optimizer offloaded (zero3 offload=opt)"),
        "zeropp": ("Megatron-LM has no ZeRO++ (Megatron-FSDP has no qwZ / qgZ quantized collectives nor hpZ secondary partition): its "
                   "files would be plain ZeRO-3's (megatron_lm.uses_megatron_fsdp)",
                   "the zero3 strategy's megatron-lm files are those files"),
    },
}
"""The ZeRO features (`Candidate` / `StrategyDef` field -> (why, the way out)) each engine's launcher files cannot
turn on. Megatron-LM's argument builder gives a layout with them the files of the layout without them
(megatron_lm._distributed_lm reads only zero_stage and offload_optimizer), so figures with them would describe what
those files do not run, and zero++ files would repeat zero3's. Megatron-DeepSpeed is not here: its --deepspeed_config
JSON carries offload_param and the ZeRO++ keys to DeepSpeed's own engine (pretrain_gpt.py builds the model under
deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config), which reads offload_param, zero_hpz_partition_size and
zero_quantized_weights: runtime/zero/partition_parameters.py Init.__init__)."""


def zero_feature_gaps(engine: Optional[str], layout) -> list[tuple[str, str]]:
    """The ZeRO features of `layout` (a `Candidate` or a `StrategyDef`) that `engine`'s files cannot turn on
    (`ENGINE_ZERO_GAPS`), each as (why, the way out); empty when they run all of them."""
    return [gap for name, gap in ENGINE_ZERO_GAPS.get(engine or "", {}).items() if getattr(layout, name)]


def zero_gaps_reason(target: str, layout) -> Optional[str]:
    """Why `target`'s files cannot run `layout` (a `Candidate` or a `StrategyDef`: `zero_feature_gaps` of its
    engine), with the way out, or None."""
    gaps = zero_feature_gaps(TARGET_ENGINE[target], layout)
    if not gaps:
        return None
    return "; ".join([why for why, _ in gaps] + [way for _, way in gaps])


def zero_gaps_note(spec: Spec, targets: Sequence[str]) -> Optional[str]:
    """One line when the spec leaves open ZeRO features (training.offload's parameter offload, training.zeropp:
    `candidate_grid.zero_modes`) that the files of `targets` (one engine) cannot turn on: their layouts are dropped
    for these targets (`target_unavailable_reason`), so the figures are for layouts without them."""
    engine = engine_of(targets) if targets else None
    layouts = (Candidate(zero_stage=z, offload_optimizer=o, offload_param=p, zeropp=q, micro_batch=1)
               for z, o, p, q in zero_modes(spec, None))
    gaps = list(dict.fromkeys(why for c in layouts for why, _ in zero_feature_gaps(engine, c)))
    if not gaps:
        return None
    return f"--target {' / '.join(targets)}: {'; '.join(gaps)}: the layouts with them are not estimated for it"


def target_unavailable_reason(target: str, cand: Candidate, shape: ModelShape) -> Optional[str]:
    """Why `target` cannot run this layout, or None: sequence sharding only where the launcher has it
    (`sequence_sharding_reason`); the ZeRO features its files cannot turn on (`zero_gaps_reason`: Megatron-LM's
    parameter offload and ZeRO++); HF: `hf_unavailable_reason`; otherwise every layout."""
    why = sequence_sharding_reason(target, cand, shape) or zero_gaps_reason(target, cand)
    if why is None and is_hf(target):
        why = hf_unavailable_reason(cand, shape)
    return why


_MEGATRON_ARGS = {
    "megatron-lm": megatron_lm_args,
    # the bare name: the path is only written into the words, never read (`megatron_deepspeed_args`)
    "megatron-deepspeed": lambda spec, shape, cand: megatron_deepspeed_args(spec, shape, cand,
                                                                            ds_config_path="ds_config.json"),
}


def target_refusal(target: str, spec: Spec, shape: ModelShape, cand: Candidate) -> Optional[str]:
    """Why `target` cannot run this layout of this spec (`generate` writes no files for it, with this reason), or
    None.

    The layout rules of `target_unavailable_reason`, then, for a Megatron target, what its argument builder
    (`megatron_lm_args` / `megatron_deepspeed_args`) refuses with `UnsupportedTarget`: the architecture it cannot
    build (`megatron_common.architecture_gaps`: a parallel attention + MLP block, ALiBi, a post-norm block, ...), a
    rope scaling or window it has no flag for, or a layout it cannot run. The builder is asked, never a copy of
    its conditions, so generate, the sweep and estimate refuse the same targets for the same reasons.

    Args:
        spec: The spec as the user wrote it (the builders read it as `generate` passes it, not the engine's copy).
    """
    why = target_unavailable_reason(target, cand, shape)
    if why is None and target in _MEGATRON_ARGS:
        try:
            _MEGATRON_ARGS[target](spec, shape, cand)
        except UnsupportedTarget as exc:
            why = str(exc)
    return why


def reason_without_target(target: str, why: str) -> str:
    """A refusal without the 'X: ' some builders' messages start with, for a line that names the target itself
    (estimate and sweep's `--target X: not estimated: <reason>`, docs/generate-and-targets.md)."""
    return why.removeprefix(f"{target}: ")


def refused_everywhere(target: str, sweep: SweepResult, spec: Spec, shape: ModelShape) -> Optional[str]:
    """`target`'s own reason when a sweep of its group ranked nothing because no layout was one it runs (every drop
    code "target"): the model, not a layout, is what it cannot run; else None (a layout it runs was dropped for
    another reason: memory, a structural rule)."""
    if sweep.ranked or not sweep.dropped or any(d.code != "target" for d in sweep.dropped):
        return None
    return target_refusal(target, spec, shape, sweep.dropped[0].candidate)


def miss_reason(target: str, sweep: SweepResult, shape: ModelShape, spec: Spec) -> str:
    """Why `target` got no layout from a sweep of its group: its own reason where every layout was one it cannot run
    (`refused_everywhere`: a ulysses layout for deepspeed names the launchers that split sequences; a model Megatron
    cannot build names what it lacks), else the sweep's counts and first drop."""
    why = refused_everywhere(target, sweep, spec, shape)
    if why:
        return why
    reason = "no layout of this strategy fits" if sweep.fits_nowhere else "no valid layout"
    codes = ", ".join(f"{k}: {v}" for k, v in sweep.dropped_by_code.items())
    first = f"; e.g. {sweep.dropped[0].candidate.label}: {sweep.dropped[0].reason}" if sweep.dropped else ""
    return f"{reason} for {target} ({sweep.considered} tried; dropped by {codes}{first})"


def unavailable_for_all(targets: Sequence[str], spec: Spec, shape: ModelShape, cand: Candidate) -> Optional[str]:
    """A reason when none of `targets` can run the layout (`target_refusal`; the first target's reason, named), else
    None. Stops at the first target that runs it."""
    first = None
    for t in targets:
        why = target_refusal(t, spec, shape, cand)
        if why is None:
            return None
        first = first or f"{t}: {why}"
    return first


def strategy_unavailable_for(targets: Sequence[str], strategy, *, is_moe: bool) -> Optional[str]:
    """Why a strategy family cannot exist for these targets (one group: all HF or none), or None:
    `candidates.strategy_unavailable_reason`, for HF targets no expert-parallel family (AutoEP), and the ZeRO
    features the group's engine cannot turn on (`zero_gaps_reason`: Megatron-LM has no zero3-offload, whose
    parameter offload it lacks, and no zero++, whose files would be zero3's)."""

    why = strategy_unavailable_reason(strategy, is_moe=is_moe, native_moe=native_moe(targets))
    if why is None and strategy.expert_parallel and targets and all(is_hf(t) for t in targets):
        why = f"expert parallelism (AutoEP) has no HF form: {AUTOEP_TRANSFORMERS_NOTE}"
    if why is None and targets and engine_of(targets) is not None:  # one engine per group (target_groups)
        why = zero_gaps_reason(targets[0], strategy)
    return why
