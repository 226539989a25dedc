"""`dstoolkit train`: launch the example trainer (dstoolkit.runtime.train.trainer) on N local ranks.

    dstoolkit train --spec SPEC.yaml --config DS.json --steps 20 [--nproc|--world-size 2] [--launcher torchrun|deepspeed]
                    [--metrics-out PATH] [--dry-run] [--format table|json] [-- extra trainer flags]

It builds the same command the generated launch.sh uses, runs it, and summarises the metrics file.
Exit codes: 0 ok, 1 the run failed, 2 bad input. Torch/DeepSpeed are imported only by the launched ranks.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_INPUT, EXIT_OK, InputError, add_format_flag, add_world_flags,
                                   error_message, exit_for_signal, exit_map)
from dstoolkit.common.paths import input_file_problem


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="run the example DeepSpeed trainer (batch ramp, spike guard, monitor)")
    p.add_argument("--spec", required=True, help="spec YAML (model, training)")
    p.add_argument("--config", required=True, help="DeepSpeed JSON")
    p.add_argument("--steps", type=int, required=True)
    add_world_flags(p, gpus_per_node=False, default=2, aliases=("--nproc",),
                    world_help="local ranks (default 2); --world-size (validate / estimate / bench's word) and --nproc "
                               "(torchrun's) are one flag")
    p.add_argument("--launcher", choices=["torchrun", "deepspeed"], default="torchrun")
    p.add_argument("--metrics-out", default="train_metrics.jsonl")
    p.add_argument("--dry-run", action="store_true", help="print the launch command only")
    add_format_flag(p)
    p.add_argument("extra", nargs="*", help="flags passed to the trainer after `--` (e.g. -- --save-every 5)")
    p.set_defaults(run=run)


def launch_command(args) -> list[str]:
    """The launcher command line (a list, never a shell string)."""
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.train.launch import launch_command as _cmd

    return _cmd(trainer_args(args), nproc=args.world_size, launcher=args.launcher)


VERB_OWNED = {"deepspeed_config": "--config", "spec": "--spec", "steps": "--steps", "metrics_out": "--metrics-out"}
"""The trainer's settings `trainer_args` fills from this verb's own flags (the trainer parser's dest -> the verb's
flag). Given again after `--` the rank takes the last value while the verb checks, summarises and reads the first (a
run that wrote its metrics elsewhere ended 'the run wrote no metrics', exit 1)."""


def trainer_args(args) -> list[str]:
    """The example trainer's own command line for these flags."""
    return ["--deepspeed_config", args.config, "--spec", args.spec, "--steps", str(args.steps),
            "--metrics-out", args.metrics_out, *args.extra]


def verb_owned_problem(extra: list[str]) -> Optional[str]:
    """A flag after `--` that this verb sets itself (VERB_OWNED, by the trainer parser's own option strings), or
    None."""
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.train.trainer_inputs import build_parser

    owned = {opt: VERB_OWNED[a.dest] for a in build_parser()._actions if a.dest in VERB_OWNED
             for opt in a.option_strings}
    for item in extra:
        flag = item.split("=", 1)[0]
        if flag in owned:
            own = owned[flag]
            return (f"{item} after `--`: dstoolkit train sets the trainer's {flag} from its own {own} (and reads the "
                    f"run from it); give it before `--`: dstoolkit train {own} VALUE ...")
    return None


def summarize(metrics_path: str, start: int = 0) -> dict:
    """Steps, first/final loss, median step time and tokens/s, spike-guard events from a metrics file (from byte
    `start` on: the lines one run appended)."""
    steps, events = [], []
    with open(metrics_path, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode("utf-8", errors="replace")
    for line in text.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        (events if "event" in d else steps).append(d)
    times = sorted(s["step_time_s"] for s in steps)
    tps = sorted(s["tokens_per_s"] for s in steps)
    done = [e for e in events if e["event"] == "done"]
    return {
        "steps": len(steps),
        "first_loss": steps[0]["loss"] if steps else None,
        "final_loss": done[-1]["final_loss"] if done else (steps[-1]["loss"] if steps else None),
        "median_step_time_s": times[len(times) // 2] if times else None,
        "median_tokens_per_s": tps[len(tps) // 2] if tps else None,
        "spikes": sum(e["event"] == "spike" for e in events),
        "rollbacks": sum(e["event"] == "rollback" for e in events),
        "completed": bool(done),
    }


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What `run_forwarding_signals` passes on to the launcher: Ctrl-C and kill / timeout / a scheduler's SIGTERM."""


def run_forwarding_signals(cmd: Sequence[str], env: dict, *,
                           grace_s: Optional[float] = None) -> tuple[int, Optional[int]]:
    """Run a launcher to completion, passing SIGINT / SIGTERM on to it and leaving no process behind.

    A signal for this process (`kill`, `timeout`, a scheduler that signals the main PID only, Ctrl-C) is sent to
    the launcher; torchrun and the deepspeed launcher pass it to the ranks (each in its own session under torchrun:
    torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py `_popen`) and wait for them.
    The launcher stays in this process group, where a terminal's Ctrl-C reaches it directly too; a second signal
    to it only shortens its wait, and whatever was under it when the signal came and outlives it by `grace_s`
    (default: `REAP_GRACE_S`, the generated launch scripts' value) is
    killed (`kill_tree`, as `dstoolkit tune` and `dstoolkit bench` stop a trial); /dev/shm buffers of killed ranks
    are removed. A second signal kills the launcher's tree at once. Outside the main thread (where no handler can
    be installed) the launcher simply runs.

    Returns:
        (the launcher's exit code, the first signal received or None).
    """
    # the helper `dstoolkit tune` / `bench` stop a trial with (tune/objective.py imports it from there)
    from dstoolkit.runtime.bench.usercmd import kill_tree

    if grace_s is None:
        # start-up time: `dstoolkit --help` imports every verb module; dstoolkit.generate loads when the verb runs.
        # How long processes under the launcher may outlive it after a forwarded signal: one value for `dstoolkit
        # train` and the generated launch scripts, declared with the shell rule (generate/shell.py)
        from dstoolkit.generate.shell import REAP_GRACE_S

        grace_s = REAP_GRACE_S

    got: list[int] = []
    tree: dict[int, Any] = {}  # psutil processes under this one when the signal came: none may outlive the run

    def forward(signum: int, frame: Any) -> None:
        import psutil

        try:
            launchers = psutil.Process().children()
        except psutil.Error:
            launchers = []
        if got:  # a second signal: stop waiting
            for child in launchers:
                kill_tree(child.pid)
        for child in launchers:
            try:
                tree.update({p.pid: p for p in [child, *child.children(recursive=True)]})
                if not got:
                    os.kill(child.pid, signum)
            except (psutil.Error, ProcessLookupError, PermissionError):
                pass
        got.append(signum)

    main = threading.current_thread() is threading.main_thread()
    prev = {s: signal.signal(s, forward) for s in FORWARDED_SIGNALS} if main else {}
    try:
        rc = subprocess.run(list(cmd), env=env).returncode
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)
    if got:
        import psutil

        from dstoolkit.runtime.train.shm import remove_orphaned_buffers

        _, alive = psutil.wait_procs(list(tree.values()), timeout=grace_s)
        for p in alive:
            kill_tree(p.pid)
        remove_orphaned_buffers()
    return rc, (got[0] if got else None)


def interrupted_line(signum: int, extra: list[str]) -> str:
    """What `dstoolkit train` says when a signal stopped the run."""
    name = signal.Signals(signum).name
    resume = ("; rerun with `-- --resume` (and the same --checkpoint-dir) to continue from its last checkpoint"
              if "--checkpoint-dir" in extra or any(e.startswith("--checkpoint-dir=") for e in extra) else "")
    return f"interrupted by {name}: the launcher and its ranks were stopped{resume}"


@exit_map("train")
def run(args) -> int:
    for flag, path in (("--spec", args.spec), ("--config", args.config)):
        problem = input_file_problem(path)
        if problem:
            raise InputError(f"{flag} {path}: {problem}")
    if args.steps <= 0:  # --nproc / --world-size: positive_int
        raise InputError(f"--steps={args.steps} must be > 0")
    owned = verb_owned_problem(args.extra)
    if owned:
        raise InputError(owned)
    if Path(args.config).suffix.lower() in (".yaml", ".yml") and Path(args.spec).suffix.lower() == ".json":
        raise InputError(f"--config {args.config} is YAML and --spec {args.spec} is JSON: swapped? --spec takes the "
                         "spec YAML, --config the DeepSpeed JSON")
    cmd = launch_command(args)
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.train.preflight import UsageError, check_launch
    from dstoolkit.runtime.train.trainer_inputs import PREFLIGHT_DONE_ENV

    try:  # what every rank would refuse (a swapped --spec / --config, a config for another --nproc, a --metrics-out
        # file that is an input or not metrics): once, here, and before --dry-run prints it
        inputs = check_launch(trainer_args(args), args.world_size, config_flag="--config",
                              nproc_flag=args.world_size_flag or "--nproc")  # the spelling typed
    except UsageError as exc:
        raise InputError(str(exc)) from None
    for note in inputs.notes:
        print(f"dstoolkit train: note: {note}", file=sys.stderr)
    if args.dry_run:
        print(shlex.join(cmd))
        return EXIT_OK
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.train.launch import launch_env

    metrics = Path(args.metrics_out)
    start = metrics.stat().st_size if metrics.is_file() else 0  # the trainer appends: summarise this run's lines only
    # SIGINT / SIGTERM go to the launcher, which stops the ranks; this command waits for them (never orphans them)
    env = {**launch_env(args.world_size, args.launcher), PREFLIGHT_DONE_ENV: "1"}  # the ranks skip what was checked here
    rc, got = run_forwarding_signals(cmd, env)
    if got is not None:
        print(error_message("train", interrupted_line(got, args.extra)), file=sys.stderr)
        return exit_for_signal(got)  # EXIT_INTERRUPTED for SIGINT, EXIT_TERMINATED for SIGTERM
    if not metrics.is_file() or metrics.stat().st_size <= start:
        print(error_message("train", f"the run wrote no metrics (exit {rc})"), file=sys.stderr)
        return EXIT_INPUT if rc == EXIT_INPUT else EXIT_FINDINGS
    summary = summarize(args.metrics_out, start)
    summary["exit_code"] = rc
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            print(f"{k:>20}: {v}")
    if rc == 0:
        return EXIT_OK
    return EXIT_INPUT if rc == EXIT_INPUT else EXIT_FINDINGS  # the trainer's own exit 2 is bad input
