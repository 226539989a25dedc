"""`generate`: spec -> one folder per strategy, with the files of each requested target (`TARGETS`), all in
memory; `write_generated` writes them atomically.

Every folder has summary.md, and the DeepSpeed JSON when deepspeed / megatron-deepspeed run its layout (or megatron-lm
does and neither was asked for); each group of `targets.target_groups` resolves a strategy under its own engine. The
`deepspeed` target adds launch.sh (the deepspeed launcher / torchrun on the bundled trainer), hostfile and
slurm.sbatch; `megatron-lm` and `megatron-deepspeed` add that project's argument file and launch script
(dstoolkit.generate.megatron); `hf` and `accelerate` add an HF-style DeepSpeed JSON ("auto" where the Trainer fills
it), training_args.json and the torchrun / accelerate launch lines for the user's own HF script
(dstoolkit.generate.hf_targets).

No torch import. Each strategy's free fields ("auto" TP/PP/EP/micro-batch/recompute) are resolved by the
sweep restricted to that strategy; the chosen JSON must have no error finding from `validate_config`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence, Union

import yaml

from dstoolkit.generate.candidates import STRATEGIES, StrategyDef, strategy_unavailable_reason
from dstoolkit.generate.ds_json import build_ds_config, is_cpu_cluster
from dstoolkit.generate.launch import render_hostfile, render_launch_sh, render_sbatch
from dstoolkit.generate.hf_targets import HF_TARGETS, hf_targets_for
from dstoolkit.generate.io import cpu_precision_warnings
from dstoolkit.generate.megatron import TARGETS as MEGATRON_TARGETS
from dstoolkit.generate.megatron import megatron_target_files
from dstoolkit.generate.megatron_lm import CPU_REASON as MEGATRON_LM_CPU_REASON
from dstoolkit.generate.result import GenerateResult, SkippedStrategy, StrategyOutput
from dstoolkit.generate.summary import render_index, render_strategy_summary
from dstoolkit.generate.targets import NATIVE_MOE_TARGETS, is_hf  # noqa: F401  (NATIVE_MOE_TARGETS: re-exported)
from dstoolkit.generate.targets import native_moe as target_native_moe
from dstoolkit.generate.targets import miss_reason as _miss_reason
from dstoolkit.generate.targets import (reason_without_target, refused_everywhere, strategy_unavailable_for,
                                        target_groups, target_refusal)
from dstoolkit.generate.sweep import error_findings, run_sweep
from dstoolkit.generate.sweep_result import Ranked, SweepResult
from dstoolkit.generate.writer import write_tree_atomic
from dstoolkit.validate.folder import LAYOUT_FILE
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.target_engines import TARGET_ENGINE

TARGETS = ("deepspeed", *MEGATRON_TARGETS, *HF_TARGETS)
"""What `generate --target` accepts; `deepspeed` is the default."""
SPEC_COPY = "spec.yaml"
HF_CONFIG_COPY = "model_config.json"


class GenerateError(ValueError):
    """A usage problem with the request (unknown or impossible strategy); exit code 2."""


def default_strategy_names(spec: Spec, shape: ModelShape,
                           native_moe: bool = True) -> tuple[list[str], list[SkippedStrategy]]:
    """Strategies `generate` emits without --strategy, and the ones it leaves out (with why).

    A fixed `training.zero_stage` keeps only that stage; `offload: false` drops the offload strategies and
    `zeropp: false` drops zero++; for an MoE model a fixed `ep` keeps only the ep=1 (ep: 1) or only the
    expert-parallel (ep > 1) variants.
    """
    t = spec.training
    names, skipped = [], []
    for name, s in STRATEGIES.items():
        why = strategy_unavailable_reason(s, is_moe=shape.is_moe, native_moe=native_moe)
        if why is None and t.zero_stage != "auto" and s.zero_stage != t.zero_stage:
            why = f"training.zero_stage={t.zero_stage}"
        if why is None and (s.offload_optimizer or s.offload_param) and not t.offload:
            why = "training.offload is false"
        if why is None and s.zeropp and not t.zeropp:
            why = "training.zeropp is false"
        if why is None and s.zero_stage == 0 and t.grad_accum_dtype:
            why = f"training.grad_accum_dtype={t.grad_accum_dtype}: DeepSpeed refuses it without ZeRO (rule DS229)"
        if why is None and shape.is_moe and t.ep != "auto":
            if s.expert_parallel and int(t.ep) == 1:
                why = "training.ep=1 (experts replicated): no expert-parallel variant"
            if not s.expert_parallel and int(t.ep) > 1:
                why = f"training.ep={t.ep}: only the expert-parallel variants"
        if why is None:
            names.append(name)
        else:
            skipped.append(SkippedStrategy(name, why))
    return names, skipped


def _spec_copy(spec: Spec) -> tuple[dict[str, str], str]:
    """The spec as written into the output folder (and a copy of its hf_config, made relative)."""
    data = spec.model_dump(mode="json", exclude_unset=True, by_alias=True)
    files: dict[str, str] = {}
    if spec.model.hf_config:
        src = Path(spec.model.hf_config).expanduser()
        if not src.is_absolute():
            src = spec.base_dir / src
        files[HF_CONFIG_COPY] = src.read_text(encoding="utf-8")
        data["model"] = {**data["model"], "hf_config": HF_CONFIG_COPY}
    src_name = spec.source_path.name if spec.source_path is not None else "<python>"
    header = (f"# Copy of the spec this folder was generated from ({json.dumps(src_name)}) by dstoolkit generate.\n"
              "# launch.sh passes it to the trainer (--spec).\n")
    text = header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=False)
    files[SPEC_COPY] = text
    return files, src_name


def _layout_json(spec: Spec, shape: ModelShape, picks, folder: dict) -> str:
    """LAYOUT_FILE: the layout each config file of the folder was generated for (`dstoolkit validate DIR` reads it).

    `picks`: (the group as resolved, the targets of it that kept their files, the pick) per resolved group, first
    group first. ds_config.json is built from the first group's layout (`generate`), whatever its targets kept;
    ds_config_hf.json and accelerate_config.yaml from the HF group's. Which group a file belongs to is read from the
    group as resolved, never from the targets that kept files: a group whose every target was refused keeps none,
    and `all(...)` over no targets would claim the HF files for it (s33 finding 6)."""
    files: dict = {}
    for i, (group, kept, pick) in enumerate(picks):
        c = pick.candidate
        per = {"tp": c.tp, "pp": c.pp, "ep": c.ep, "label": c.label, "targets": list(kept),
               "num_experts": shape.num_experts if shape.is_moe and target_native_moe(group) else None}
        hf_group = all(is_hf(t) for t in group)
        names = ["ds_config_hf.json", "accelerate_config.yaml"] if hf_group else ["ds_config.json"] if i == 0 else []
        files.update({n: per for n in names if n in folder})
    doc = {"world_size": spec.cluster.world_size, "gpus_per_node": spec.cluster.gpus_per_node,
           "nodes": spec.cluster.nodes, "files": files}
    return json.dumps(doc, indent=2) + "\n"


def _writes_ds_config(chosen_targets: Sequence[str], groups: Sequence[Sequence[str]]) -> bool:
    """Whether the folder gets ds_config.json for `chosen_targets`' layout: a non-HF group's, and the DeepSpeed engine's
    unless DeepSpeed-engine targets were asked for and none runs this strategy."""
    if all(is_hf(t) for t in chosen_targets):
        return False
    native_asked = any(not is_hf(t) and TARGET_ENGINE[t] == "deepspeed" for g in groups for t in g)
    return TARGET_ENGINE[chosen_targets[0]] == "deepspeed" or not native_asked


def _resolve(spec: Spec, shape: ModelShape, strat: StrategyDef,
             targets: Sequence[str]) -> tuple[Optional[Ranked], SweepResult]:
    res = run_sweep(spec, shape, top=3, strategy=strat, validate=True, advise=True, targets=tuple(targets))
    return res.winner, res


def generate(spec: Spec, shape: ModelShape, strategies: Optional[Sequence[str]] = None,
             targets: Sequence[str] = ("deepspeed",), out_dir: Optional[Path] = None,
             pretrain_script: Union[None, str, dict[str, str]] = None) -> GenerateResult:
    """Build every file of an output folder in memory.

    Args:
        spec: The loaded spec.
        shape: Its resolved model shape.
        strategies: Strategy names to emit (None: `default_strategy_names`).
        targets: The launchers to write files for (`TARGETS`).
        out_dir: Where the folder will be written; Megatron-DeepSpeed's --deepspeed_config names the JSON
            there by absolute path. None: relative to the strategy folder.
        pretrain_script: Megatron targets: path of pretrain_gpt.py (one for all, or target -> path).

    Returns:
        A `GenerateResult`; `files` is empty of strategy folders when none could be generated.

    Raises:
        GenerateError: An unknown strategy name, or one that cannot exist for this model (MoE at stage 3).
    """
    unknown_targets = [t for t in targets if t not in TARGETS]
    if unknown_targets:
        raise GenerateError(f"unknown target {unknown_targets[0]!r}; known: {', '.join(TARGETS)}")
    targets = list(dict.fromkeys(targets))
    # Each group resolves each strategy on its own, under the engine its files run (target_groups: DeepSpeed's
    # engine, Megatron-Core, HF Trainer / Accelerate), so a layout one launcher cannot run never removes another's
    # files and each target's layout and figures are its engine's.
    groups = target_groups(targets)
    if strategies:
        unknown = [s for s in strategies if s not in STRATEGIES]
        if unknown:
            raise GenerateError(f"unknown strategy {unknown[0]!r}; known: {', '.join(STRATEGIES)}")
        names, skipped = list(dict.fromkeys(strategies)), []
        for n in names:
            whys = [strategy_unavailable_for(g, STRATEGIES[n], is_moe=shape.is_moe) for g in groups]
            if all(whys):
                raise GenerateError(f"strategy {n!r} cannot be generated for {shape.name}: {whys[0]}")
    else:
        names, skipped = [], []
        per_group = [default_strategy_names(spec, shape, target_native_moe(g)) for g in groups]
        for name in STRATEGIES:
            if any(name in ns for ns, _ in per_group):
                names.append(name)
            else:
                found = [(g, s) for g, (_, sk) in zip(groups, per_group) for s in sk if s.name == name]
                reasons = list(dict.fromkeys(s.reason for _, s in found))
                if len(reasons) == 1:
                    skipped.append(found[0][1])
                elif reasons:
                    skipped.append(SkippedStrategy(name, "; ".join(f"{', '.join(g)}: {s.reason}" for g, s in found)))
    files, _ = _spec_copy(spec)
    result = GenerateResult(spec_name=spec.name, files=files, skipped=skipped)
    for name in names:
        strat = STRATEGIES[name]
        picks: list[tuple[list[str], Ranked, SweepResult]] = []
        out_skipped: dict[str, str] = {}
        misses: list[SweepResult] = []
        for g in groups:
            why = strategy_unavailable_for(g, strat, is_moe=shape.is_moe)
            if not why and is_cpu_cluster(spec) and set(g) == {"megatron-lm"}:
                why = MEGATRON_LM_CPU_REASON  # no sweep for a launcher that cannot run here (megatron_lm_args refuses too)
            if why:
                out_skipped.update({t: why for t in g})
                continue
            chosen, sweep = _resolve(spec, shape, strat, g)
            if chosen is None:
                out_skipped.update({t: _miss_reason(t, sweep, shape, spec) for t in g})
                if not all(refused_everywhere(t, sweep, spec, shape) for t in g):
                    misses.append(sweep)  # a layout was tried and failed (not a model the targets cannot build)
                continue
            # the group's layout runs on at least one of its targets (sweep: unavailable_for_all); the others
            # get no files for it, each with its own reason (a ulysses layout: megatron files, no deepspeed ones; a
            # model Megatron-DeepSpeed cannot build): target_refusal, the rule estimate and sweep ask too
            runnable = []
            for t in g:
                why = target_refusal(t, spec, shape, chosen.candidate)
                if why:
                    out_skipped[t] = why
                else:
                    runnable.append(t)
            if runnable:
                picks.append((runnable, chosen, sweep))
        if not picks:
            if not misses:
                result.skipped.append(SkippedStrategy(name, "; ".join(f"{t}: {reason_without_target(t, w)}"
                                                                      for t, w in out_skipped.items())))
                continue
            sweep = misses[0]
            nowhere = sweep.fits_nowhere.message(spec, spec.cluster.gpu_spec, shape.name) if sweep.fits_nowhere else None
            codes = ", ".join(f"{k}: {v}" for k, v in sweep.dropped_by_code.items())
            reason = "no layout of this strategy fits" if sweep.fits_nowhere else "no valid layout"
            # the first drop names the fix where nothing was structurally possible (fits_nowhere prints its own)
            first = (f"; e.g. {sweep.dropped[0].candidate.label}: {sweep.dropped[0].reason}"
                     if sweep.dropped and not sweep.fits_nowhere else "")
            result.skipped.append(SkippedStrategy(
                name, f"{reason} ({sweep.considered} tried; dropped by {codes}{first})", fits_nowhere=nowhere,
                fits_nowhere_bytes=sweep.fits_nowhere.needed_per_gpu_bytes if sweep.fits_nowhere else None))
            continue
        # the first group's layout is the folder's (target_groups: DeepSpeed's engine first, whose ds_config.json it is)
        chosen_targets, chosen, sweep = picks[0][0], picks[0][1], picks[0][2]
        cand = chosen.candidate
        cfg = build_ds_config(spec, shape, cand)
        findings = list(chosen.findings)
        if error_findings(findings):  # run_sweep already dropped these; keep the invariant explicit
            raise RuntimeError(f"internal: {name} config has error findings: {error_findings(findings)}")
        findings += cpu_precision_warnings(spec)  # the spec's own warnings (validate SPEC.yaml says the same)
        # ds_config.json is the DeepSpeed engine's JSON: written for the layout deepspeed / megatron-deepspeed run (the
        # first group), and for Megatron-LM's when no DeepSpeed-engine target was asked for; not where they were asked
        # and cannot run this strategy (ZeRO-3 of a native MoE model for megatron-lm / hf: DeepSpeed would refuse it).
        # HF targets read ds_config_hf.json.
        folder = {}
        if _writes_ds_config(chosen_targets, groups):
            folder["ds_config.json"] = json.dumps(cfg, indent=2) + "\n"
        out = StrategyOutput(name=name, strategy=strat, chosen=chosen, sweep=sweep, ds_config=cfg,
                             findings=findings, files={}, chosen_targets=list(chosen_targets))
        out.targets_skipped.update(out_skipped)
        for g, pick, _ in picks:
            c = pick.candidate
            out.per_target.update({t: pick for t in g})
            if "deepspeed" in g:
                folder.update({
                    "launch.sh": render_launch_sh(spec, c, strategy=name, is_moe=shape.is_moe),
                    "hostfile": render_hostfile(spec),
                    "slurm.sbatch": render_sbatch(spec, strategy=name),
                })
            megatron = [t for t in g if t in MEGATRON_TARGETS]
            if megatron:
                extra = megatron_target_files(None if out_dir is None else Path(out_dir) / name, spec, shape, c,
                                              megatron, strategy=name, pretrain_script=pretrain_script)
                folder.update(extra.files)
                out.targets_skipped.update(extra.skipped)
            hf = [t for t in g if is_hf(t)]
            if hf:
                extra = hf_targets_for(spec, shape, c, hf, strategy=name,
                                       folder=None if out_dir is None else Path(out_dir) / name)
                folder.update(extra.files)
                out.targets_skipped.update(extra.skipped)
        # a target whose files could not be written (megatron / hf refusals above) is no target of this folder: it
        # stays out of per_target (the table, --format json, layout.json) and keeps its reason in targets_skipped
        for t in out.targets_skipped:
            out.per_target.pop(t, None)
        kept = [(g, [t for t in g if t not in out.targets_skipped], pick) for g, pick, _ in picks]
        folder[LAYOUT_FILE] = _layout_json(spec, shape, kept, folder)
        out.files = folder
        folder["summary.md"] = render_strategy_summary(spec, shape, out)
        result.generated.append(out)
        for rel, text in folder.items():
            result.files[f"{name}/{rel}"] = text
    result.files["summary.md"] = render_index(spec, shape, result)
    return result


def write_generated(result: GenerateResult, out_dir: Path, *, force: bool = False) -> None:
    """Write a `GenerateResult` to `out_dir` atomically (see `dstoolkit.generate.writer`)."""
    write_tree_atomic(Path(out_dir), result.files, force=force)
