"""`generate`: spec -> one folder per strategy, with the files of each requested target (`TARGETS`), all in
memory; `write_generated` writes them atomically.

Every folder has the DeepSpeed JSON and summary.md; the `deepspeed` target adds launch.sh (the deepspeed
launcher / torchrun on the bundled trainer), hostfile and slurm.sbatch; `megatron-lm` and `megatron-deepspeed`
add that project's argument file and launch script (dstoolkit.generate.megatron); `hf` and `accelerate` add
an HF-style DeepSpeed JSON ("auto" where the Trainer fills it), training_args.json and the torchrun /
accelerate launch lines for the user's own HF script (dstoolkit.generate.hf_targets).

No torch import. Each strategy's free fields ("auto" TP/PP/EP/micro-batch/recompute) are resolved by the
sweep restricted to that strategy; the chosen JSON must have no error finding from `validate_config`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

import yaml

from dstoolkit.generate.candidates import STRATEGIES, StrategyDef, strategy_unavailable_reason
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.generate.launch import render_hostfile, render_launch_sh, render_sbatch
from dstoolkit.generate.hf_targets import HF_TARGETS, hf_targets_for
from dstoolkit.generate.megatron import TARGETS as MEGATRON_TARGETS
from dstoolkit.generate.megatron import megatron_target_files
from dstoolkit.generate.summary import render_index, render_strategy_summary
from dstoolkit.generate.sweep import Ranked, SweepResult, error_findings, run_sweep
from dstoolkit.generate.writer import write_tree_atomic
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

TARGETS = ("deepspeed", *MEGATRON_TARGETS, *HF_TARGETS)
"""What `generate --target` accepts; `deepspeed` is the default."""
SPEC_COPY = "spec.yaml"
HF_CONFIG_COPY = "model_config.json"


class GenerateError(ValueError):
    """A usage problem with the request (unknown or impossible strategy); exit code 2."""


@dataclass
class StrategyOutput:
    """One generated folder."""

    name: str
    strategy: StrategyDef
    chosen: Ranked
    sweep: SweepResult
    ds_config: dict
    findings: list
    files: dict[str, str]
    targets_skipped: dict[str, str] = field(default_factory=dict)
    """Requested targets that cannot express this model or layout, with the reason."""


@dataclass
class SkippedStrategy:
    """A strategy that was considered and not generated, with the reason."""

    name: str
    reason: str
    fits_nowhere: Optional[str] = None


@dataclass
class GenerateResult:
    """All files of the output folder (relative path -> text), plus what was generated and skipped."""

    spec_name: str
    files: dict[str, str]
    generated: list[StrategyOutput] = field(default_factory=list)
    skipped: list[SkippedStrategy] = field(default_factory=list)


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


def _hf_only(spec: Spec) -> Spec:
    """HF Trainer / Accelerate run neither the pipeline engine nor (with DeepSpeed 0.19.8) AutoEP: when only
    those targets are asked for, "auto" pp and ep sweep as 1 instead of choosing layouts they cannot launch."""
    t = spec.training
    update = {k: 1 for k in ("pp", "ep") if getattr(t, k) == "auto"}
    return spec.model_copy(update={"training": t.model_copy(update=update)}) if update else spec


NATIVE_MOE_TARGETS = ("deepspeed", "megatron-deepspeed")
"""Targets whose MoE layers are DeepSpeed's own (deepspeed.moe), which DeepSpeed refuses at ZeRO-3; HF models
(hf, accelerate) and Megatron-LM run plain modules, and ZeRO-3 with replicated experts is open to them."""


def _resolve(spec: Spec, shape: ModelShape, strat: StrategyDef,
             native_moe: bool = True) -> tuple[Optional[Ranked], SweepResult]:
    res = run_sweep(spec, shape, top=3, strategy=strat, validate=True, advise=True, native_moe=native_moe)
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
    native_moe = any(t in NATIVE_MOE_TARGETS for t in targets)
    if all(t in HF_TARGETS for t in targets):
        spec = _hf_only(spec)
    if strategies:
        unknown = [s for s in strategies if s not in STRATEGIES]
        if unknown:
            raise GenerateError(f"unknown strategy {unknown[0]!r}; known: {', '.join(STRATEGIES)}")
        names, skipped = list(dict.fromkeys(strategies)), []
        for n in names:
            why = strategy_unavailable_reason(STRATEGIES[n], is_moe=shape.is_moe, native_moe=native_moe)
            if why:
                raise GenerateError(f"strategy {n!r} cannot be generated for {shape.name}: {why}")
    else:
        names, skipped = default_strategy_names(spec, shape, native_moe)
    files, _ = _spec_copy(spec)
    result = GenerateResult(spec_name=spec.name, files=files, skipped=skipped)
    for name in names:
        strat = STRATEGIES[name]
        chosen, sweep = _resolve(spec, shape, strat, native_moe)
        if chosen is None:
            nowhere = sweep.fits_nowhere.message(spec, spec.cluster.gpu_spec, shape.name) if sweep.fits_nowhere else None
            codes = ", ".join(f"{k}: {v}" for k, v in sweep.dropped_by_code.items())
            reason = "no layout of this strategy fits" if sweep.fits_nowhere else "no valid layout"
            result.skipped.append(SkippedStrategy(name, f"{reason} ({sweep.considered} tried; dropped by {codes})",
                                                  fits_nowhere=nowhere))
            continue
        cand = chosen.candidate
        cfg = build_ds_config(spec, shape, cand)
        findings = list(chosen.findings)
        if error_findings(findings):  # run_sweep already dropped these; keep the invariant explicit
            raise RuntimeError(f"internal: {name} config has error findings: {error_findings(findings)}")
        folder = {"ds_config.json": json.dumps(cfg, indent=2) + "\n"}
        if "deepspeed" in targets:
            folder.update({
                "launch.sh": render_launch_sh(spec, cand, strategy=name, is_moe=shape.is_moe),
                "hostfile": render_hostfile(spec),
                "slurm.sbatch": render_sbatch(spec, strategy=name),
            })
        out = StrategyOutput(name=name, strategy=strat, chosen=chosen, sweep=sweep, ds_config=cfg,
                             findings=findings, files={})
        megatron = [t for t in targets if t in MEGATRON_TARGETS]
        if megatron:
            extra = megatron_target_files(None if out_dir is None else Path(out_dir) / name, spec, shape, cand,
                                          megatron, strategy=name, pretrain_script=pretrain_script)
            folder.update(extra.files)
            out.targets_skipped.update(extra.skipped)
        hf = [t for t in targets if t in HF_TARGETS]
        if hf:
            extra = hf_targets_for(spec, shape, cand, hf)
            folder.update(extra.files)
            out.targets_skipped.update(extra.skipped)
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
