"""`dstoolkit train`: launch the example trainer (dstoolkit.runtime.train.trainer) on N local ranks.

    dstoolkit train --spec SPEC.yaml --config DS.json --steps 20 [--nproc|--world-size 2] [--launcher torchrun|deepspeed]
                    [--metrics-out PATH] [--dry-run] [--format table|json] [-- extra trainer flags]

It builds the same command the generated launch.sh uses, runs it, and summarises the metrics file.
Exit codes: 0 ok, 1 the run failed, 2 bad input, `options.exit_for_signal` of the signal when SIGINT / SIGTERM /
SIGHUP stopped it (EXIT_INTERRUPTED for Ctrl-C, EXIT_TERMINATED for SIGTERM; 0 when it came after the run had
finished). Torch/DeepSpeed are imported only by the launched ranks.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
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


def run_records(metrics_path: str, start: int = 0) -> tuple[list[dict], list[dict]]:
    """(step records, events) of a metrics file from byte `start` on (the lines one run appended). A last line cut
    off mid-write (a rank killed while writing) is left out."""
    steps, events = [], []
    with open(metrics_path, "rb") as fh:
        fh.seek(start)
        text = fh.read().decode("utf-8", errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1 and not text.endswith("\n"):
                break
            raise
        (events if "event" in d else steps).append(d)
    return steps, events


def summarize(metrics_path: str, start: int = 0) -> dict:
    """Steps, first/final loss, median step time and tokens/s, spike-guard events from a metrics file (from byte
    `start` on: the lines one run appended)."""
    steps, events = run_records(metrics_path, start)
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


FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What `run_forwarding_signals` passes on to the launcher's process group: Ctrl-C, kill / timeout / a scheduler's
SIGTERM, and a closed terminal's SIGHUP (the launcher runs out of the terminal's foreground group, where the kernel
would have sent it; not installed where it is ignored, e.g. under nohup)."""
POLL_S = 0.2  # how often the wait after the launcher looks at what is left
OWN_SESSION = (sys.executable, "-c", "import os, sys\nos.setsid()\ntry:\n    os.execvp(sys.argv[1], sys.argv[1:])\n"
               "except OSError as e:\n    sys.exit(f'cannot run {sys.argv[1]}: {e.strerror}')")
"""A prefix that starts a command as the leader of a session (so a process group) of its own, under its own pid
(setsid(2), then exec): as util-linux `setsid CMD`, with the interpreter running dstoolkit, on every POSIX host.
Kept a prefix so the launch stays one `subprocess.run(cmd, env=env)`."""


@dataclass(frozen=True)
class Stopped:
    """How a signal ended a launch (`run_forwarding_signals`)."""

    signum: int  # the first signal received
    killed: int  # processes SIGKILLed: still running after the grace (`run_forwarding_signals`) or at a second signal
    second_signal: bool  # a second signal came: what was left was killed at once
    grace_s: float


def _live(procs: Sequence[Any]) -> list[Any]:
    """The processes of `procs` still running (a zombie counts as gone; psutil checks pid reuse)."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def _group(pgid: int) -> list[Any]:
    """The live processes of process group `pgid` (those the launcher started in its group after a snapshot)."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except OSError:
            pass
    return _live(out)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return bool(_group(pgid))


def _kill(procs: Sequence[Any]) -> int:
    """SIGKILL `procs` (as psutil.Process) that are still running (`kill_procs`, as `kill_tree` does); how many."""
    # the helper `dstoolkit tune` / `bench` stop a trial with (tune/objective.py imports kill_tree from there)
    from dstoolkit.runtime.bench.usercmd import kill_procs

    live = _live(procs)
    kill_procs(live)
    return len(live)


def run_forwarding_signals(cmd: Sequence[str], env: dict, *,
                           grace_s: Optional[float] = None) -> tuple[int, Optional[Stopped]]:
    """Run a launcher to completion, passing SIGINT / SIGTERM / SIGHUP on to everything it started, leaving no
    process behind.

    The launcher runs in a session (so a process group) of its own, as launch.sh runs it (generate/shell.py
    `run_forwarding_signals_lines`). A signal for this process (`kill`, `timeout`, a scheduler that signals the main
    PID only, Ctrl-C) goes to that whole group: the launcher and every process it started there. That is needed for
    the deepspeed launcher: on one node its runner has no handler (deepspeed/launcher/runner.py `main` installs
    `sigkill_handler` only `if args.launcher == PDSH_LAUNCHER and multi_node_exec`) and dies without telling its
    child `deepspeed.launcher.launch`, whose ranks would train on; in the group the ranks and launch.py (which then
    stops its ranks too: launch.py `sigkill_handler` -> `terminate_process_tree`) get the signal themselves.
    torchrun's ranks are in sessions of their own (torch/distributed/elastic/multiprocessing/subprocess_handler/
    subprocess_handler.py `_popen`): torchrun passes the signal on to them and waits for them.
    Whatever was under the launcher at the signal or is left in its group gets `grace_s` (default: `REAP_GRACE_S`,
    the generated launch scripts' value) after the launcher ends; then it is SIGKILLed. A second signal kills the
    launcher and all of it at once. /dev/shm buffers of killed ranks are removed. Outside the main thread (where
    no handler can be installed) the launcher simply runs, in this process group.

    Returns:
        (the launcher's exit code, how a signal stopped it or None when none came).
    """
    if grace_s is None:
        # start-up time: `dstoolkit --help` imports every verb module; dstoolkit.generate loads when the verb runs.
        # How long processes under the launcher may outlive it after a forwarded signal: one value for `dstoolkit
        # train` and the generated launch scripts, declared with the shell rule (generate/shell.py)
        from dstoolkit.generate.shell import REAP_GRACE_S

        grace_s = REAP_GRACE_S

    got: list[int] = []
    groups: list[int] = []  # the launcher's process group (its pid: it leads a session of its own)
    tree: dict[int, Any] = {}  # psutil processes under the launcher when the signal came: none may outlive the run
    killed: list[int] = []

    def snapshot() -> list[int]:
        """Note every process under this one in `tree`; the launchers' pids."""
        import psutil

        try:
            launchers = psutil.Process().children()
        except psutil.Error:
            return []
        for launcher in launchers:
            try:
                tree.update({p.pid: p for p in [launcher, *launcher.children(recursive=True)]})
            except psutil.Error:
                pass
        return [launcher.pid for launcher in launchers]

    def kill_all() -> None:
        snapshot()
        left = {p.pid: p for g in groups for p in _group(g)}
        left.update(tree)  # tree's psutil objects know each process's start time (pid reuse)
        killed.append(_kill(list(left.values())))

    def forward(signum: int, frame: Any) -> None:
        got.append(signum)
        if len(got) > 1:  # a second signal: stop waiting
            kill_all()
            return
        for pid in snapshot():
            groups.append(pid)
            try:
                os.killpg(pid, signum)
            except (ProcessLookupError, PermissionError):  # not yet in its own session (signalled as it starts)
                try:
                    os.kill(pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    main = threading.current_thread() is threading.main_thread()
    wanted = [s for s in FORWARDED_SIGNALS if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN]
    prev = {s: signal.signal(s, forward) for s in wanted} if main else {}
    try:
        rc = subprocess.run([*OWN_SESSION, *cmd] if main else list(cmd), env=env).returncode
        deadline = time.monotonic() + grace_s  # what was under the launcher: `grace_s` after it
        while got and not killed and (_live(list(tree.values())) or any(_group_alive(g) for g in groups)):
            if time.monotonic() >= deadline:
                kill_all()
            time.sleep(POLL_S)
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)
    if not got:
        return rc, None
    from dstoolkit.runtime.train.shm import remove_orphaned_buffers

    remove_orphaned_buffers()
    return rc, Stopped(got[0], killed=sum(killed), second_signal=len(got) > 1, grace_s=grace_s)


def interrupted_line(signum: int, extra: list[str], stopped: Optional[Stopped] = None) -> str:
    """What `dstoolkit train` says when a signal stopped the run before it finished: the signal and how the launch
    ended (`stopped`; None: every process stopped on the signal)."""
    name = signal.Signals(signum).name
    if stopped is not None and stopped.killed and stopped.second_signal:
        how = f"a second signal killed (SIGKILL) the {stopped.killed} process(es) of the launch still running"
    elif stopped is not None and stopped.killed:
        how = (f"{stopped.killed} process(es) of the launch were still running after the {stopped.grace_s:g} s grace "
               "and were killed (SIGKILL)")
    else:
        how = "the launcher and its ranks were stopped"
    resume = ("; rerun with `-- --resume` (and the same --checkpoint-dir) to continue from its last checkpoint"
              if "--checkpoint-dir" in extra or any(e.startswith("--checkpoint-dir=") for e in extra) else "")
    return f"interrupted by {name}: {how}{resume}"


def finished_note(stopped: Stopped, steps: int) -> str:
    """What `dstoolkit train` says when the signal came after the run had finished (its "done" record written:
    trainer.py writes it after the final checkpoint and the lock release)."""
    return (f"{signal.Signals(stopped.signum).name} came after the run had finished (its 'done' record: step {steps}); "
            "its metrics and checkpoints are complete")


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
    # SIGINT / SIGTERM go to the launcher's process group, which stops the ranks; this command waits for them
    env = {**launch_env(args.world_size, args.launcher), PREFLIGHT_DONE_ENV: "1"}  # the ranks skip what was checked here
    rc, stopped = run_forwarding_signals(cmd, env)
    wrote = metrics.is_file() and metrics.stat().st_size > start
    if stopped is not None:
        events = run_records(args.metrics_out, start)[1] if wrote else []
        done = [e for e in events if e["event"] == "done"]
        if not done:
            line = interrupted_line(stopped.signum, args.extra, stopped)
            print(error_message("train", line), file=sys.stderr)
            return exit_for_signal(stopped.signum)  # EXIT_INTERRUPTED, EXIT_TERMINATED, or SIGHUP's
        # the signal came as the run ended: say so, summarise it and exit 0 whatever the stopped launcher returned
        print(f"dstoolkit train: note: {finished_note(stopped, done[-1]['steps'])}", file=sys.stderr)
    if not wrote:
        print(error_message("train", f"the run wrote no metrics (exit {rc})"), file=sys.stderr)
        return EXIT_INPUT if rc == EXIT_INPUT else EXIT_FINDINGS
    summary = summarize(args.metrics_out, start)
    summary["exit_code"] = rc
    if args.format == "json":
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            print(f"{k:>20}: {v}")
    if rc == 0 or stopped is not None:
        return EXIT_OK
    return EXIT_INPUT if rc == EXIT_INPUT else EXIT_FINDINGS  # the trainer's own exit 2 is bad input
