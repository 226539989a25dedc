"""`dstoolkit sweep`: rank ZeRO stage x offload x ZeRO++ x TP x PP x EP x micro-batch x recompute for a spec.

    dstoolkit sweep SPEC.yaml [--top K] [--target T ...] [--format table|json] [--show-dropped]

Candidates that break a rule or do not fit are dropped, each with its reason; the rest are ranked by
estimated step time and the winner is explained. A model that fits nowhere gets the memory it needs per GPU
and what would make it fit, and exit code 1. `--target` (repeatable; default: the spec's `targets`, else every
layout) keeps only the layouts that launcher runs (dstoolkit.generate.targets: HF Trainer / Accelerate have no
pipeline engine and no AutoEP, and run ZeRO-3 on an HF MoE model); with several, the best per target is printed.
Each ranking is estimated under the engine its targets' files run (megatron-lm: Megatron-Core; the others: DeepSpeed's
engine; no target: training.framework), and targets of several engine groups (`generate.targets.target_groups`, as
`generate` resolves them: deepspeed / megatron-deepspeed, megatron-lm, hf / accelerate) get one ranking per group, each
headed by its targets and engine; `--format json` lists them under "groups" (with one group, its ranking is also at the
top level). Exit codes: 0 ranked (in at least one group), 1 fits nowhere, 2 bad input.
"""
from __future__ import annotations

import json

from dstoolkit.cli.estimate import training_plan_from_args
from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_OK, InputError, add_format_flag, add_model_class_flag,
                                   add_target_flag, add_training_plan_flags, exit_map, targets_of)
from dstoolkit.cli.spec_kind import deepspeed_config_problem
from dstoolkit.cli.spec_override import load_spec_and_shape_with

GiB = 2**30


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="rank parallel/ZeRO layouts for a spec by estimated step time",
                              description=__doc__.splitlines()[0])
    p.add_argument("spec", metavar="SPEC.yaml", help="model + cluster + training spec ('auto' fields are swept)")
    p.add_argument("--top", type=int, default=3, metavar="K", help="how many ranked layouts to show (default 3)")
    add_model_class_flag(p, spec=True)
    add_format_flag(p)
    p.add_argument("--show-dropped", action="store_true", help="list every dropped candidate with its reason")
    add_target_flag(p)
    add_training_plan_flags(p)  # --tokens: time and cost to train per ranked layout
    p.set_defaults(run=run)


RAMP_ESTIMATES = 9
"""--tokens in the ranking: step times estimated at this many ramp batches per layout, interpolated between."""


def _training_plans(args, spec, shape, ranked, targets=()) -> list:
    """--tokens: the `TrainingPlan` of each ranked layout (None entries without --tokens), with the batch ramp
    `targets`' files train with (`costing.batch_ramp_of_targets`: none for HF Trainer / Accelerate)."""
    if args.tokens is None and args.gpu_hour_price is None:
        return [None] * len(ranked)
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.costing import batch_ramp_of_targets
    from dstoolkit.generate.planner import plan_for

    ramp = batch_ramp_of_targets(spec, targets)
    return [training_plan_from_args(args, plan_for(spec, shape, r.candidate), ramp, RAMP_ESTIMATES) for r in ranked]


PEAK_ONLY_MARK = "*"
"""Marks a ranked layout whose peak fits but whose sum of parts does not (generate.costing.only_peak_fits)."""


def _peak_only(r, spec) -> bool:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.costing import only_peak_fits

    return only_peak_fits(r.estimate, spec.cluster.gpu_spec)


def _ranked_json(r, spec) -> dict:
    e = r.estimate
    return {"label": r.candidate.label, "layout": r.candidate.model_dump(mode="json"),
            "memory_per_rank_bytes": e.memory_per_rank_bytes, "sum_of_parts_bytes": e.sum_of_parts_bytes,
            "only_peak_fits": _peak_only(r, spec), "memory_breakdown_bytes": e.memory_breakdown_bytes,
            "host_memory_per_rank_bytes": e.host_memory_per_rank_bytes, "step_time_s": e.step_time_s,
            "mfu": e.mfu, "reason": r.reason,
            "findings": [{"severity": f.severity, "code": f.code, "pointer": f.pointer, "message": f.message}
                         for f in r.findings]}


def _undecided_ranked(res, spec, shape, group) -> list:
    """Every ranked layout the undecided count looks at: how many lie within the step-time model's error of the best is
    a property of the estimates, not of --top. `res.ranked` stops at --top; when its last row is still within the
    error and more layouts fit, the sweep is ranked again without the cut (not validated: only the step times count). Only the layouts on
    #1's side of the memory headroom count: the headroom, not the estimate, ranks the others below."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.timeline import is_cpu_device
    from dstoolkit.generate.sweep import run_sweep
    from dstoolkit.generate.undecided import undecided

    def same_side(rows):
        return [r for r in rows if r.estimate.within_headroom == rows[0].estimate.within_headroom] if rows else []

    ranked = same_side(list(res.ranked))
    if not ranked or len(ranked) < len(res.ranked) or res.all_ranked_count <= len(ranked):
        return ranked
    u = undecided([r.estimate.step_time_s for r in ranked], is_cpu_device(spec.cluster.gpu_spec))
    if len(ranked) - 1 not in u.positions:
        return ranked
    # only the step times count: not validated (review s32 #14: validating every fitting layout cost hundreds of
    # validate_config runs per group)
    return same_side(list(run_sweep(spec, shape, top=res.all_ranked_count, targets=group, advise=False,
                                    validate=False).ranked))


def _undecided_lines(ranked, spec, spec_path: str, shown: int) -> list[str]:
    """generate.undecided: the ranked layouts within the step-time model's measured error of the best."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.timeline import is_cpu_device
    from dstoolkit.generate.undecided import undecided_lines

    return undecided_lines([r.candidate.label for r in ranked], [r.estimate.step_time_s for r in ranked],
                           is_cpu_device(spec.cluster.gpu_spec), spec_path, shown=shown)


def _undecided_json(ranked, spec, spec_path: str) -> dict:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.timeline import is_cpu_device
    from dstoolkit.generate.undecided import split_measurable, tune_command, undecided

    u = undecided([r.estimate.step_time_s for r in ranked], is_cpu_device(spec.cluster.gpu_spec))
    ok, other = split_measurable([r.candidate.label for r in ranked], u.positions)
    return {"positions": [i + 1 for i in u.positions], "labels": [ranked[i].candidate.label for i in u.positions],
            "error": u.error, "error_source": u.source, "decided": u.decided,
            # tune --mode real runs data-parallel layouts only: the command measures those, the others are named
            "tune_positions": [i + 1 for i in ok], "not_measurable_by_tune": [ranked[i].candidate.label for i in other],
            "tune_command": None if u.decided or not ok else tune_command(spec_path, len(ok))}


def _groups(spec, targets) -> list[tuple]:
    """(targets of the group, the spec as they run it) per engine group (`targets.target_groups`, as generate resolves
    each strategy): the ranking of one group is estimated under its own engine; no target: one group, the spec as it
    is (training.framework)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.targets import spec_for_targets, target_groups

    if not targets:
        return [((), spec)]
    return [(tuple(g), spec_for_targets(spec, g)) for g in target_groups(targets)]


def _group_doc(res, group, engine_spec, plans, spec_path: str, model_name: str, shape) -> dict:
    """One group's ranking for --format json."""
    nowhere = None
    if res.fits_nowhere is not None:
        nowhere = {"needed_per_gpu_bytes": res.fits_nowhere.needed_per_gpu_bytes,
                   "device_memory_bytes": res.fits_nowhere.device_memory_bytes,
                   "least_memory_layout": res.fits_nowhere.least_memory_label,
                   "host_needed_per_node_bytes": res.fits_nowhere.host_needed_per_node_bytes,  # None: the GPU limits
                   "host_capacity_bytes": res.fits_nowhere.host_capacity_bytes or None,
                   "suggestions": res.fits_nowhere.suggestions,
                   "message": res.fits_nowhere.message(engine_spec, engine_spec.cluster.gpu_spec, model_name)}
    return {
        "targets": list(group), "engine": engine_spec.training.framework,
        "estimator": res.estimator, "considered": res.considered, "fitting": res.all_ranked_count,
        "ranked": [{**_ranked_json(r, engine_spec), **({"training_plan": tp.to_json()} if tp is not None else {})}
                   for r, tp in zip(res.ranked, plans)], "winner_reason": res.winner_reason,
        "dropped_by_code": res.dropped_by_code,
        "dropped": [{"label": d.candidate.label, "code": d.code, "reason": d.reason} for d in res.dropped],
        "fits_nowhere": nowhere, "undecided": _undecided_json(_undecided_ranked(res, engine_spec, shape, group), engine_spec, spec_path),
    }


@exit_map("sweep")
def run(args) -> int:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.sweep import run_sweep
    from dstoolkit.spec.target_engines import ENGINE_NAMES

    if args.top < 1:
        raise InputError(f"--top must be >= 1 (got {args.top})")
    # SpecLoadError: printed as it is, exit 2 (exit_map). --target values are the run's targets for the spec's engine
    # rules (spec.load_spec(targets=)), with or without --model-class
    problem = deepspeed_config_problem(args.spec, "sweep")
    if problem:
        raise InputError(problem)  # before the spec loader's "required field is missing" + one "unknown key" per key
    spec, shape = load_spec_and_shape_with(args.spec, args.model_class, args.target or ())
    targets = targets_of(args, spec)
    # targets of several engine groups (deepspeed + megatron-lm; DeepSpeed's native MoE + HF): one ranking per group,
    # each under the engine its files run, as generate resolves them; one combined ranking would be estimated under
    # training.framework for every row
    sweeps = []
    for group, engine_spec in _groups(spec, targets):
        res = run_sweep(spec, shape, top=args.top, targets=group)
        sweeps.append((group, engine_spec, res, _training_plans(args, engine_spec, shape, res.ranked, group)))
    per_target = {t: run_sweep(spec, shape, top=1, targets=(t,), advise=False)
                  for t in targets} if len(targets) > 1 else {}
    # generate's rule (targets.target_refusal): a target that runs no layout of the spec (a model it cannot build) is
    # not estimated, with its reason, and left out of the rankings
    not_estimated = _not_estimated(spec, shape, sweeps, per_target)
    per_target = {t: res.winner for t, res in per_target.items() if t not in not_estimated}
    gpu = spec.cluster.gpu_spec
    ranked_any = any(res.ranked for _, _, res, _ in sweeps)
    if args.format == "json":
        groups = [{**_group_doc(res, g, es, plans, args.spec, shape.name, shape),
                   "not_estimated": {t: why for t, why in not_estimated.items() if t in g}}
                  for g, es, res, plans in sweeps]
        doc = {"spec": spec.name, "model": shape.name, "world_size": spec.cluster.world_size, "gpu": gpu.name,
               # one group: its ranking at the top level too, as before groups existed
               **({k: v for k, v in groups[0].items() if k != "targets"} if len(groups) == 1 else {}),
               "targets": list(targets), "groups": groups,
               "best_per_target": {t: (None if r is None else _ranked_json(r, _spec_of(sweeps, t)))
                                   for t, r in per_target.items()},
               "not_estimated": not_estimated}
        print(json.dumps(doc, indent=2))
        return EXIT_OK if ranked_any else EXIT_FINDINGS
    head = f"{spec.name}: {shape.name} on {spec.cluster.describe(gpu.name)}"
    several = len(sweeps) > 1
    if several:
        print(f"{head}; targets {', '.join(targets)}: one ranking per engine group, each estimated under the engine "
              "its files run")
    nowhere = []
    for group, engine_spec, res, plans in sweeps:
        counts = (f"{res.considered} candidates, {res.all_ranked_count} fit, {len(res.dropped)} dropped "
                  f"(estimates: {res.estimator})")
        engine = ENGINE_NAMES[engine_spec.training.framework]
        refused = [t for t in group if t in not_estimated]
        if group and len(refused) == len(group):  # no target of the group runs the model: no ranking to show
            lead = "\n== " if several else f"{head}: --target "
            print("\n".join(f"{lead}{t}: not estimated: {not_estimated[t]}" for t in refused))
            continue
        if several:
            print()
            print(f"== {', '.join(group)}: estimated under {engine}; {counts}")
        else:
            print(f"{head}; {counts}" + (f"; estimated under {engine}, the engine of {', '.join(group)}"
                                         if group else ""))
        for t in refused:
            print(f"   --target {t}: not estimated (not in this ranking): {not_estimated[t]}")
        _print_ranking(args, engine_spec, res, plans, shape, group)
        if several:
            nowhere.append(_print_dropped(args, engine_spec, res, shape.name))
    if targets:
        print()
        print(f"Targets: {', '.join(targets)} (layouts none of them runs are dropped as 'target')")
    for t in targets if len(targets) > 1 else ():
        r = per_target.get(t)
        print(f"  best for {t}: " + (f"not estimated: {not_estimated[t]}" if t in not_estimated else
                                     "nothing fits" if r is None else
                                     f"{r.candidate.label}, {r.estimate.step_time_s:.4g} s/step, "
                                     f"{r.estimate.memory_per_rank_bytes / GiB:.1f} GiB/rank"))
    none_runs = bool(targets) and set(targets) <= set(not_estimated)
    if not several and not none_runs:
        nowhere.append(_print_dropped(args, sweeps[0][1], sweeps[0][2], shape.name))
    if not ranked_any:
        if none_runs:
            print(f"\nno requested target runs this spec (generate writes no files for them either): ask one that "
                  "does" + (", e.g. --target deepspeed" if "deepspeed" not in targets else ""))
        elif not any(nowhere):
            print("\nno candidate passed validation (see the dropped reasons above)")
        return EXIT_FINDINGS
    return EXIT_OK


def _not_estimated(spec, shape, sweeps, per_target) -> dict[str, str]:
    """{target: reason} for each requested target that runs no layout of the spec (`targets.refused_everywhere` on
    its own sweep, else on its group's when it is the group's only target)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.targets import reason_without_target, refused_everywhere

    out = {}
    for group, _, res, _ in sweeps:
        for t in group:
            own = per_target.get(t, res if len(group) == 1 else None)
            if own is not None and (why := refused_everywhere(t, own, spec, shape)):
                out[t] = reason_without_target(t, why)
    return out


def _spec_of(sweeps, target):
    """The spec as `target`'s group runs it (its engine)."""
    return next(es for g, es, _, _ in sweeps if target in g)


def _print_ranking(args, spec, res, plans, shape, group) -> None:
    """One group's ranked layouts, its winner and the ties within the step-time model's error."""
    if not res.ranked:
        return
    print()
    print(f"{'#':>2}  {'layout':<46} {'mem/rank':>10} {'step':>10} {'MFU':>6}  why")
    peak_only = [_peak_only(r, spec) for r in res.ranked]
    for i, r in enumerate(res.ranked, start=1):
        e = r.estimate
        mark = PEAK_ONLY_MARK if peak_only[i - 1] else " "
        print(f"{i:>2}  {r.candidate.label:<46} {e.memory_per_rank_bytes / GiB:>6.1f} GiB{mark}{e.step_time_s:>8.4g} s "
              f"{e.mfu * 100:>5.1f}%  {r.reason}")
        if plans[i - 1] is not None:
            # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
            from dstoolkit.estimate.training_plan import human_tokens

            tp = plans[i - 1]
            print(f"    to train {human_tokens(tp.tokens_requested)} tokens: {tp.steps:,} steps, {tp.wall_days:,.1f} days, "
                  f"{tp.gpu_hours:,.0f} GPU-hours" + (f", cost {tp.cost:,.0f}" if tp.cost is not None else "")
                  + f" (ramp {tp.ramp_steps:,} steps)")
    if any(peak_only):
        # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
        from dstoolkit.generate.costing import peak_only_caution

        worst = max((r for r, p in zip(res.ranked, peak_only) if p), key=lambda r: r.estimate.sum_of_parts_bytes)
        print(f"{PEAK_ONLY_MARK} {peak_only_caution(worst.estimate)}")
    print()
    print(f"Why #1: {res.winner_reason}")
    # ties within the model's measured error (issue 24), over every fitting layout, not only the --top shown
    for line in _undecided_lines(_undecided_ranked(res, spec, shape, group), spec, args.spec, len(res.ranked)):
        print(line)


def _print_dropped(args, spec, res, model_name: str):
    """One group's dropped candidates by reason, then its fits-nowhere message; returns that message or None."""
    print()
    print("Dropped:")
    examples: dict[str, str] = {}
    for d in res.dropped:
        examples.setdefault(d.code, f"{d.candidate.label}: {d.reason}")
    for code, n in res.dropped_by_code.items():
        print(f"  {n:>6} x {code:<14} e.g. {examples[code]}")
    if args.show_dropped:
        print()
        for d in res.dropped:
            print(f"  dropped {d.candidate.label}: [{d.code}] {d.reason}")
    nowhere = res.fits_nowhere.message(spec, spec.cluster.gpu_spec, model_name) if res.fits_nowhere else None
    if nowhere:
        print()
        print(nowhere)
    return nowhere
