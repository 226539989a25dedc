"""`dstoolkit tune`: Bayesian search (optuna TPE) for the fastest (or leanest) DeepSpeed config that fits.

    dstoolkit tune SPEC.yaml --budget N --out DIR [--objective throughput|memory] [--mode real|estimate]
                   [--seed S] [--force] [--format table|json] [-- COMMAND...]

With `-- COMMAND...` (real mode) each trial runs the user's own launch instead of the example trainer, e.g.
`-- torchrun --nproc_per_node 2 train.py --deepspeed {config} --per_device_train_batch_size {micro_batch}`.
Placeholders filled per trial: {config} (the trial's DeepSpeed JSON), {hf_config} (HF Trainer form, batch /
precision / optimizer values "auto"), {accelerate_config} (`accelerate launch --config_file` YAML),
{micro_batch}, {grad_accum}, {global_batch}, {precision}, {precision_flag}, {max_steps}, {world_size}, {port},
{out}. Nothing else in the command is changed. Metrics come from a DeepSpeed engine hook installed through a
sitecustomize on PYTHONPATH (dstoolkit/runtime/bench/metrics_hook.py); the run stops after --steps optimizer steps.

Candidates are pruned by the structural rules, `validate_config` and the memory estimate before anything
runs (pruned trials keep their reason); the estimator's top-ranked points are tried first. Real mode runs
each trial as a short real run of the example trainer on the spec's ranks; estimate mode uses the
estimates alone. The study is stored in DIR/study.db: rerunning the same command resumes it.
Outputs in DIR: best_ds_config.json, best_spec.yaml, report.md, report.json, objective_vs_trial.png; DIR/.dstoolkit-tune
lists what tune wrote, and --force (or a resume) deletes or overwrites only those files, unchanged.
"""
from __future__ import annotations

import json
import math
import signal
import sys
import tempfile
from pathlib import Path

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, InputError,
                                   add_force_flag, add_format_flag, add_model_class_flag, add_out_flag, exit_map)
from dstoolkit.cli.spec_kind import deepspeed_config_problem
from dstoolkit.cli.spec_override import spec_file_with
from dstoolkit.common.atomic import atomic_write_text


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tune", help="Bayesian search over the generated config space (real runs or estimates)",
                              description=__doc__.splitlines()[0], epilog=EXIT_CODES)
    p.add_argument("spec", metavar="SPEC.yaml", help="a training spec")
    p.add_argument("--budget", type=int, required=True,
                   help="trials to evaluate (real runs or estimates; pruned and repeated points are free)")
    add_out_flag(p, required=True, metavar="DIR", help="output folder (holds the study database)")
    p.add_argument("--objective", choices=("throughput", "memory"), default="throughput",
                   help="maximise tokens/s (default) or minimise memory per rank")
    p.add_argument("--mode", choices=("real", "estimate"), default="real",
                   help="real: short real runs on this machine (default); estimate: estimates only")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    add_force_flag(p, help="replace a different study / write into a non-empty folder (only files tune wrote are "
                           "ever deleted or overwritten)")
    p.add_argument("--seed-trials", type=int, default=None,
                   help="estimator-ranked points tried first, 1-5 (default: about budget/3, raised to the points "
                        "estimated within 5%% of the best, up to budget/2)")
    p.add_argument("--bucket-scales", default="0.25,1",
                   help="comma-separated multipliers tried on the generated bucket sizes (default 0.25,1)")
    p.add_argument("--steps", type=int, default=None, help="real mode: optimizer steps per trial (default 6)")
    p.add_argument("--skip-steps", type=int, default=None, help="real mode: warm-up steps not timed (default 2)")
    p.add_argument("--trial-timeout", type=float, default=None, help="real mode: seconds per trial (default 300)")
    p.add_argument("--launcher", choices=("torchrun", "deepspeed"), default="torchrun",
                   help="real mode: how ranks are started (default torchrun; deepspeed is slower to start)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.add_argument("--shrink", default=None, metavar="auto|KEY=N,...",
                   help="real mode: trials train the spec's own transformers architecture shrunk to fit this "
                        "machine's ranks (dstoolkit.runtime.shrink); the space and its estimates are the shrunk model's")
    add_model_class_flag(p, spec=True)
    add_format_flag(p)
    accept_command(p)
    p.set_defaults(run=run)


def accept_command(parser) -> None:
    """Everything after the first `--` on the command line becomes `args.command` (the user's launch, kept
    verbatim); argparse alone would mix it into the positionals. Used by `tune` and `bench train`."""
    orig = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        cmd: list[str] = []
        if "--" in args:
            i = args.index("--")
            args, cmd = args[:i], args[i + 1:]
        ns, extra = orig(args, namespace)
        ns.command = cmd
        return ns, extra

    parser.parse_known_args = parse_known_args
    parser.set_defaults(command=[])


def command_lookup(opts, command: list[str], force: bool):
    """The study's evaluator for a user command: each runnable point becomes OUT/trials/cmd-NNNN/ and one run
    of `command` (dstoolkit.tune.objective.run_command_trial). The command is kept in OUT/command.json; a
    different command on a resumed study is refused unless --force. Both are listed in OUT's manifest
    (dstoolkit.tune.manifest) once written, so --force may replace them later."""
    # dstoolkit[tune] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.tune.manifest import Manifest
    from dstoolkit.tune.objective import run_command_trial
    from dstoolkit.tune.options import _load_space
    # dstoolkit[tune] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.tune.records import COMMAND_FILE, TRIALS_DIR

    state: dict = {}
    cmd_file = opts.out_dir / COMMAND_FILE
    if cmd_file.is_file() and not force:
        old = json.loads(cmd_file.read_text())
        if old != command:
            raise InputError(f"{opts.out_dir} holds a study of another command ({' '.join(old)}); use another "
                             "--out or --force")

    def lookup(point, chk):
        if "space" not in state:
            _, state["space"], _ = _load_space(opts)
            atomic_write_text(cmd_file, json.dumps(command) + "\n")
            Manifest(opts.out_dir).record([COMMAND_FILE])
        trials = opts.out_dir / TRIALS_DIR
        n = len(list(trials.glob("cmd-*"))) if trials.is_dir() else 0
        work_dir = trials / f"cmd-{n:04d}"
        try:
            return run_command_trial(state["space"], chk, work_dir, command, objective=opts.objective,
                                     ranks=state["space"].spec.cluster.world_size, steps=opts.steps,
                                     skip_steps=opts.skip_steps, timeout_s=opts.trial_timeout_s)
        finally:  # interrupted too: what the trial wrote is tune's (--force may delete it)
            Manifest(opts.out_dir).record_tree(work_dir)
    return lookup


def _scales(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--bucket-scales {text!r}: expected comma-separated numbers, e.g. 0.25,1") from None
    if not vals or any(not (v > 0 and math.isfinite(v)) for v in vals):  # nan, inf: refused here, naming the flag
        raise ValueError(f"--bucket-scales {text!r}: expected positive numbers, e.g. 0.25,1")
    return vals


EXIT_CODES = ("exit codes: 0 a best config was written; 1 no trial succeeded (every one pruned or failed); 2 bad input "
              f"(a flag, the spec, the output folder); {EXIT_INTERRUPTED} interrupted by Ctrl-C, {EXIT_TERMINATED} by "
              "SIGTERM (the study stays resumable)")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C but answered with EXIT_TERMINATED (as `dstoolkit train` does)."""


def _raise_interrupt(signum, frame):
    raise _Terminated(f"signal {signum}")


@exit_map("tune")  # TuneInputError, SpecError (YAML line), model resolution, bad --bucket-scales: exit 2
def run(args) -> int:
    # dstoolkit[tune] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.tune.objective import DEFAULT_SKIP_STEPS, DEFAULT_STEPS, DEFAULT_TRIAL_TIMEOUT_S
    from dstoolkit.tune.options import TuneOptions
    # dstoolkit[tune] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.tune.study import run_study

    # SIGTERM (Slurm, kill) is handled like Ctrl-C: the running trial's ranks are killed, the study stays
    # resumable. Only the main thread may install handlers (tests call main() from other threads sometimes).
    import threading

    main_thread = threading.current_thread() is threading.main_thread()
    # --model-class: the tuner reads the spec file itself, so it gets a copy with model.model_class set
    # (same file name and text for every rerun: the study resumes)
    problem = deepspeed_config_problem(args.spec, "tune")
    if problem:
        raise InputError(problem)  # before the spec loader's "required field is missing" + one "unknown key" per key
    tmp = tempfile.TemporaryDirectory(prefix="dstoolkit-tune-spec-") if args.model_class else None
    spec_path = spec_file_with(args.spec, args.model_class, Path(tmp.name)) if tmp else Path(args.spec)
    prev = signal.signal(signal.SIGTERM, _raise_interrupt) if main_thread else None
    try:
        opts = TuneOptions(
            spec_path=spec_path, out_dir=Path(args.out), budget=args.budget, objective=args.objective,
            mode=args.mode, seed=args.seed, force=args.force, seed_trials=args.seed_trials,
            bucket_scales=_scales(args.bucket_scales),
            steps=args.steps if args.steps is not None else DEFAULT_STEPS,
            skip_steps=args.skip_steps if args.skip_steps is not None else DEFAULT_SKIP_STEPS,
            trial_timeout_s=args.trial_timeout if args.trial_timeout is not None else DEFAULT_TRIAL_TIMEOUT_S,
            launcher=args.launcher, progress=args.progress, shrink=args.shrink)
        command = list(getattr(args, "command", None) or [])
        if command and args.mode != "real":
            raise InputError("a command after `--` is run by real mode only; drop it or use --mode real")
        res = run_study(opts, lookup=command_lookup(opts, command, args.force) if command else None)
    except KeyboardInterrupt as exc:
        print(f"dstoolkit tune: interrupted; rerun the same command to resume the study in {args.out}",
              file=sys.stderr)
        return EXIT_TERMINATED if isinstance(exc, _Terminated) else EXIT_INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, prev)
        if tmp is not None:
            tmp.cleanup()
    counts: dict[str, int] = {}
    for r in res.trials:
        counts[r.get("status") or r["state"].lower()] = counts.get(r.get("status") or r["state"].lower(), 0) + 1
    if args.format == "json":
        print(json.dumps({"out_dir": str(res.out_dir), "resumed": res.resumed, "evaluated": res.evaluated,
                          "stop_reason": res.stop_reason, "space_size": res.space_size, "status_counts": counts,
                          "best": res.best, "notes": res.notes, "files": res.files}, indent=1, default=str))
    else:
        unit = "tok/s" if args.objective == "throughput" else "bytes per rank"
        print(f"# dstoolkit tune {args.spec}: {args.mode} mode, objective {args.objective}, seed {args.seed}"
              + (" (resumed)" if res.resumed else ""))
        print(f"# {res.evaluated} evaluated of budget {args.budget}; {len(res.trials)} trials "
              f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); space {res.space_size} points; "
              f"stopped: {res.stop_reason}")
        for r in res.trials:
            v = f"{r['value']:,.0f} {unit}" if r["state"] == "COMPLETE" and r["value"] is not None else "-"
            note = r.get("reason") or ""
            print(f"  #{r['number']:<3} {(r.get('status') or r['state'].lower()):<10} {r.get('label') or '-':<52} "
                  f"{v:>22}  {note[:110]}")
        if res.best:
            print(f"best: trial #{res.best['number']} {res.best['label']}: {res.best['value']:,.0f} {unit}")
            for note in res.notes:  # the memory headroom, a shrunk run
                print(f"  {note}")
        else:
            print("best: none (every trial was pruned or failed; see report.md)")
        print(f"wrote {', '.join(res.files)} in {res.out_dir}")
    return EXIT_OK if res.best is not None else EXIT_FINDINGS
