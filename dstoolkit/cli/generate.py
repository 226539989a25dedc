"""`dstoolkit generate`: per strategy, a DeepSpeed JSON, a summary and the files of each target's launcher.

    dstoolkit generate SPEC.yaml --out DIR [--strategy NAME ...] [--target T ...] [--pretrain-script PATH]
                       [--force] [--format text|json]

Targets (repeatable, default deepspeed): deepspeed (launch.sh, hostfile, slurm.sbatch), megatron-lm
(megatron_lm_args.txt + launch_megatron_lm.sh), megatron-deepspeed (megatron_deepspeed_args.txt +
launch_megatron_deepspeed.sh), hf (ds_config_hf.json with "auto" where HF Trainer fills it, training_args.json,
launch_hf.sh), accelerate (adds accelerate_config.yaml, launch_accelerate.sh). Writes DIR/<strategy>/..., DIR/spec.yaml and DIR/summary.md atomically; an
existing DIR is refused without --force. Each target's layout and figures are estimated under the engine its files
run (megatron-lm: Megatron-Core; the others: DeepSpeed's engine), whatever training.framework says.
Exit codes: 0 written, 1 nothing fits or no requested target got files (nothing written, an existing DIR left as it
was), 2 bad input, existing output or an output under a file (-o f.json/sub: checked first, nothing
written).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dstoolkit.cli.estimate import training_plan_from_args
from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_OK, InputError, add_force_flag, add_format_flag,
                                   add_model_class_flag, add_out_flag, add_training_plan_flags, exit_map)
from dstoolkit.cli.spec_kind import deepspeed_config_problem
from dstoolkit.cli.spec_override import load_spec_and_shape_with
from dstoolkit.common.atomic import check_output_parents

# The strategy names, spelled out so that building the parser imports nothing (dstoolkit validate must start
# fast); tests/unit/test_generate_cli.py checks this equals dstoolkit.generate.candidates.STRATEGIES.
STRATEGY_NAMES = ("zero0", "zero1", "zero2", "zero2-offload", "zero3", "zero3-offload", "zero++", "zero0-ep",
                  "zero1-ep", "zero2-ep")
TARGET_NAMES = ("deepspeed", "megatron-lm", "megatron-deepspeed", "hf", "accelerate")
"""Spelled out for the same reason; the test holds it equal to dstoolkit.generate.core.TARGETS."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate DeepSpeed / Megatron / launch files from a spec",
                              description=__doc__.splitlines()[0])
    p.add_argument("spec", metavar="SPEC.yaml", help="model + cluster + training spec")
    add_out_flag(p, required=True, metavar="DIR", help="output folder (created atomically)")
    p.add_argument("--strategy", action="append", default=None, metavar="NAME",
                   help=f"only these strategies (repeatable): {', '.join(STRATEGY_NAMES)}")
    p.add_argument("--target", action="append", default=None, choices=TARGET_NAMES, metavar="TARGET",
                   help=f"launcher(s) to write files for (repeatable; default deepspeed): {', '.join(TARGET_NAMES)}")
    p.add_argument("--pretrain-script", default=None, metavar="PATH",
                   help="Megatron targets: path of that project's pretrain_gpt.py written into their launch scripts "
                        "as PRETRAIN's default (default: Megatron-LM/pretrain_gpt.py or Megatron-DeepSpeed/pretrain_gpt.py, "
                        "relative to where the script is launched); PRETRAIN=... overrides it when launching, and the "
                        "script stops before starting ranks when it is not a file")
    add_force_flag(p, help="replace DIR if an earlier `dstoolkit generate` wrote it")
    add_model_class_flag(p, spec=True)
    add_format_flag(p)
    add_training_plan_flags(p)  # --tokens: each strategy's summary gets the time and cost to train
    p.set_defaults(run=run)


def _add_training_plans(args, spec, shape, result) -> dict:
    """--tokens: {strategy: TrainingPlan}, and a "Time and cost to train" section in each strategy's summary.md."""
    if args.tokens is None and args.gpu_hour_price is None:
        return {}
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.training_plan import render_training_plan
    from dstoolkit.generate.costing import batch_ramp_of_targets
    from dstoolkit.generate.planner import plan_for
    from dstoolkit.generate.targets import spec_for_targets

    plans = {}
    for o in result.generated:
        engine_spec = spec_for_targets(spec, o.chosen_targets)  # the engine the summary's figures are for
        tp = training_plan_from_args(args, plan_for(engine_spec, shape, o.chosen.candidate, o.ds_config),
                                     batch_ramp_of_targets(spec, o.chosen_targets))  # HF: no ramp
        plans[o.name] = tp
        key = f"{o.name}/summary.md"
        if key in result.files:
            result.files[key] = (result.files[key].rstrip("\n") + "\n\n## Time and cost to train\n\n"
                                 + "\n".join(f"- {line.strip()}" for line in render_training_plan(tp))
                                 + f"\n- {files_length_note(spec, tp)}\n")
    return plans


def files_length_note(spec, tp) -> str:
    """What the written files train, beside a --tokens plan: `generate` writes the spec's run length
    (training.train_steps: Megatron --train-iters, HF max_steps, the LR schedule; launch.sh's STEPS defaults to a
    smoke run), never the plan's, and says so with the spec change that trains the plan."""
    from dstoolkit.estimate.training_plan import human_tokens
    from dstoolkit.generate.launch import DEFAULT_STEPS

    n = spec.training.train_steps
    now = (f"training.train_steps={n} steps" if n else
           f"a {DEFAULT_STEPS}-step smoke run (training.train_steps is unset)")
    return (f"the generated files train {now}, not this plan: to train {human_tokens(tp.tokens_requested)} tokens set "
            f"training.train_steps: {tp.steps} in the spec and regenerate (Megatron --train-iters, HF max_steps and the "
            f"LR schedule follow it), and run launch.sh with STEPS={tp.steps}")


@exit_map("generate")
def run(args) -> int:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.core import generate, write_generated
    from dstoolkit.generate.launch import DEFAULT_STEPS
    from dstoolkit.generate.summary import other_targets, run_hints, shared_targets
    from dstoolkit.generate.targets import engine_note
    from dstoolkit.generate.writer import check_target

    # SpecLoadError (printed as it is), OutputExistsError, GenerateError: exit 2 through exit_map
    out = Path(args.out)
    # refuse early, before any work: a file in the path (-o f.json/sub: atomic's one wording, not mkdir's "File
    # exists"), then an existing folder
    check_output_parents(out, name=f"-o {args.out}")
    check_target(out, force=args.force)
    # SpecLoadError: printed as it is, exit 2 (exit_map). --target values are the run's targets for the spec's engine
    # rules (spec.load_spec(targets=)), with or without --model-class
    problem = deepspeed_config_problem(args.spec, "generate")
    if problem:
        raise InputError(problem)  # before the spec loader's "required field is missing" + one "unknown key" per key
    spec, shape = load_spec_and_shape_with(args.spec, args.model_class, args.target or ())
    requested = list(dict.fromkeys(args.target or spec.targets or ("deepspeed",)))
    result = generate(spec, shape, strategies=args.strategy, targets=requested,
                      out_dir=out.resolve(), pretrain_script=args.pretrain_script)
    if not result.generated:
        print(f"dstoolkit generate: no configuration written for {spec.name}:", file=sys.stderr)
        for s in result.skipped:
            print(f"  {s.name}: {s.reason}", file=sys.stderr)
        # the strategy closest to fitting (its least memory-hungry layout needs the least), not the first one tried
        near = min((s for s in result.skipped if s.fits_nowhere), key=lambda s: s.fits_nowhere_bytes or 0, default=None)
        if near is not None:
            print(f"closest to fitting: strategy {near.name}: {near.fits_nowhere}", file=sys.stderr)
        return EXIT_FINDINGS
    if not any(t in o.per_target and t not in o.targets_skipped for t in requested for o in result.generated):
        # nothing here would launch: refuse before writing, as when nothing fits (an existing DIR stays as it was)
        print(f"dstoolkit generate: no configuration written for {spec.name}: no strategy has files for "
              f"{' / '.join(requested)}:", file=sys.stderr)
        for line in no_files_lines(result, requested):
            print(f"  {line}", file=sys.stderr)
        return EXIT_FINDINGS
    plans = _add_training_plans(args, spec, shape, result)  # before writing: bad --tokens writes nothing
    try:
        write_generated(result, out, force=args.force)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror or exc}") from None
    if args.format == "json":
        doc = {
            "spec": spec.name, "out": str(out),
            "generated": [{"strategy": o.name, "layout": o.chosen.candidate.model_dump(mode="json"),
                           "label": o.chosen.candidate.label,
                           "memory_per_rank_bytes": o.chosen.estimate.memory_per_rank_bytes,
                           "host_memory_per_rank_bytes": o.chosen.estimate.host_memory_per_rank_bytes,
                           "step_time_s": o.chosen.estimate.step_time_s, "mfu": o.chosen.estimate.mfu,
                           "targets": shared_targets(o), "per_target": _per_target_json(o),
                           "files": sorted(o.files), "no_files": dict(o.targets_skipped),
                           **({"training_plan": plans[o.name].to_json(),
                               "files_train_steps": spec.training.train_steps or DEFAULT_STEPS,
                               "training_plan_note": files_length_note(spec, plans[o.name])} if o.name in plans else {})}
                          for o in result.generated],
            "skipped": [{"strategy": s.name, "reason": s.reason} for s in result.skipped],
        }
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    print(f"{spec.name}: wrote {len(result.generated)} strategies to {out}")
    w = max(len(o.name) for o in result.generated)
    for o in result.generated:
        e = o.chosen.estimate
        # each target's figures are its engine's: the line names the targets it is for where another differs
        others = other_targets(o)
        for_ = f"  {', '.join(shared_targets(o))}" if others else ""
        print(f"  {o.name:<{w}}  {o.chosen.candidate.label:<44} {e.memory_per_rank_bytes / 2**30:8.2f} GiB/rank "
              f"{e.step_time_s:10.4g} s/step{for_}")
        for r in {id(x): x for x in others.values()}.values():
            ts = ", ".join(t for t, x in others.items() if x is r)
            print(f"  {'':<{w}}  {r.candidate.label:<44} {r.estimate.memory_per_rank_bytes / 2**30:8.2f} GiB/rank "
                  f"{r.estimate.step_time_s:10.4g} s/step  {ts}")
        if o.name in plans:
            tp = plans[o.name]
            print(f"  {'':<{w}}  to train: {tp.steps:,} steps, {tp.wall_days:,.1f} days, {tp.gpu_hours:,.0f} GPU-hours"
                  + (f", cost {tp.cost:,.0f}" if tp.cost is not None else ""))
            print(f"  {'':<{w}}  note: {files_length_note(spec, tp)}")
    for s in result.skipped:
        print(f"  not generated: {s.name}: {s.reason}")
    for o in result.generated:
        for target, why in o.targets_skipped.items():
            print(f"  {o.name}: no {target} files: {why}")
    for line in warning_lines(result):
        print(line)
    # only the targets that got files: a skipped one's engine decides nothing here
    note = engine_note(spec, [t for t in requested if any(t in o.per_target for o in result.generated)])
    if note:
        print(f"note: {note}")
    print(f"details: {out / 'summary.md'}")
    for hint in run_hints(result, str(out)):
        print(f"run {hint}")
    return EXIT_OK


def warning_lines(result) -> list[str]:
    """One line per warning `validate_config` found in the written configs (each strategy's summary.md lists them):
    the strategies it holds for, the code, the pointer, the message and the fix; the same warning once."""
    seen: dict[tuple, list[str]] = {}
    for o in result.generated:
        for f in o.findings:
            if str(f.severity).lower() == "warning":
                seen.setdefault((f.code, f.pointer, f.message, f.suggestion), []).append(o.name)
    return [f"warning[{code}] ({', '.join(names)}) {pointer}: {message}" + (f" ({fix})" if fix else "")
            for (code, pointer, message, fix), names in seen.items()]


def _per_target_json(o) -> dict:
    """target -> the layout and figures of its files (its own engine's), for --format json."""
    from dstoolkit.spec.target_engines import TARGET_ENGINE

    return {t: {"label": r.candidate.label, "engine": TARGET_ENGINE[t],
                "memory_per_rank_bytes": r.estimate.memory_per_rank_bytes, "step_time_s": r.estimate.step_time_s,
                "mfu": r.estimate.mfu} for t, r in o.per_target.items()}


def no_files_lines(result, requested) -> list[str]:
    """Why each requested target got no files, one line per target and strategy folder (as the written run prints
    them), then the strategies not generated."""
    lines = [f"{o.name}: no {t} files: {o.targets_skipped.get(t, 'no layout of this strategy for it')}"
             for t in requested for o in result.generated]
    return lines + [f"not generated: {s.name}: {s.reason}" for s in result.skipped]
