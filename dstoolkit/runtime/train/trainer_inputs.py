"""The example trainer's command line (`python -m dstoolkit.runtime.train.trainer`): its flags, and the inputs
(DeepSpeed JSON, spec, shape, --shrink) read and checked before torch or deepspeed is imported. Every problem is
a `UsageError` (exit 2, the message names the flag, the value and the fix).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dstoolkit.common.paths import input_file_problem, same_file
from dstoolkit.runtime.train.fault_flags import (DEFAULT_KILL_RANK, World, fault_flags_problem, launched_world,
                                                 parse_blowups)
from dstoolkit.runtime.train.names import CLI
from dstoolkit.validate.folder import config_layout


TRAINER_DESCRIPTION = "Example DeepSpeed trainer: TinyTransformer on synthetic data, with every training helper wired in."
"""The --help description: the first line of the trainer module's docstring."""
DEFAULT_DIST_TIMEOUT_S = 600.0
"""Process-group timeout: DeepSpeed's own init default (10 min). Long enough for a rank to wait out a peer's
checkpoint write or first-use C++ op compile (cpu_adam: 46 s on a 2-core host); short enough that a dead link or frozen node
fails the job in minutes, not after torch's 30 min gloo default that `dist.new_group` groups get otherwise."""


class UsageError(Exception):
    """Bad input: exit code 2 with the message."""


def build_parser() -> argparse.ArgumentParser:
    # no abbreviations: `dstoolkit train -- --metrics X` would set --metrics-out behind cli.train.VERB_OWNED's back
    p = argparse.ArgumentParser(prog="dstoolkit.runtime.train.trainer", description=TRAINER_DESCRIPTION,
                                allow_abbrev=False)
    p.add_argument("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config", required=True,
                   help="DeepSpeed JSON (batch triad, ZeRO, precision, optimizer, monitors)")
    p.add_argument("--spec", required=True, help="spec YAML: model, training.seq_len, checkpoint policy, ramp")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to run (total, including resumed ones)")
    p.add_argument("--metrics-out", required=True, help="JSON-lines file rank 0 appends to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ep-size", type=int, default=None, help="expert-parallel degree (default: spec training.ep or 1)")
    p.add_argument("--shrink", default=None, metavar="auto|KEY=N,...",
                   help="train the spec's own transformers architecture (model.hf_config or inline HF fields), "
                        "shrunk to run here: 'auto', or sizes such as layers=4,hidden=64,heads=4,head_dim=16,"
                        "experts=8,vocab=512,window=16,seq_len=64 (dstoolkit.runtime.shrink). Without it the "
                        "trainer builds the project's TinyTransformer stand-in of the shape")
    p.add_argument("--checkpoint-dir", default=None, help="root for atomic DeepSpeed checkpoints")
    p.add_argument("--save-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint (if any)")
    p.add_argument("--dist-timeout-s", type=float, default=DEFAULT_DIST_TIMEOUT_S,
                   help="timeout of every process group, world and the ZeRO / expert groups DeepSpeed makes with "
                        "new_group (which otherwise get torch's default, 30 min on gloo): a collective stuck on a "
                        "dead peer or cut link fails after this long instead of hanging. Default 600 s, DeepSpeed's "
                        "own init default: room for a peer's checkpoint write or op compile, yet a dead link costs "
                        "minutes, not half an hour. Replaces DEEPSPEED_TIMEOUT")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint-backend", choices=["torch", "deepspeed"], default="torch",
                   help="recompute through torch.utils.checkpoint or deepspeed.checkpointing")
    p.add_argument("--monitor-every", type=int, default=5)
    p.add_argument("--monitor-dir", default=None, help="enable DeepSpeed's csv monitor (and tensorboard when installed) writing here")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s per rank for MFU (default: the peak the estimator uses - this machine's "
                        "cached GEMM peak on CPU, the hardware table's on GPU)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bar with ETA")
    p.add_argument("--data-delay-s", type=float, default=0.0, help="sleep per batch in the data iterator")
    p.add_argument("--data-delay-rank", type=int, default=None,
                   help="only this rank sleeps --data-delay-s (a slow loader on one rank; default: every rank)")
    p.add_argument("--link-probe-bytes", type=int, default=None,
                   help="cross-rank view: bytes each rank receives from the previous host per monitor window to time "
                        "the links (multi-host only; default dstoolkit.runtime.train.crossrank.PROBE_BYTES; 0: off)")
    g = p.add_argument_group("spike guard")
    g.add_argument("--spike-guard", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--spike-z", type=float, default=6.0)
    g.add_argument("--spike-window", type=int, default=20,
                   help="accepted micro-batch losses in the baseline each batch's loss is judged against (>= 5)")
    g.add_argument("--spike-action", choices=["none", "skip", "lr_scale", "rollback"], default="skip",
                   help="action for a loss spike; a NaN/Inf loss is rolled back with 'rollback' and skipped "
                        "otherwise (never trained on)")
    g.add_argument("--grad-spike-action", choices=["none", "lr_scale", "rollback"], default="lr_scale")
    g.add_argument("--escalate-after", type=int, default=2, help="consecutive skips that trigger a rollback")
    g.add_argument("--lr-scale", type=float, default=0.1)
    g.add_argument("--lr-scale-steps", type=int, default=10)
    g.add_argument("--max-rollbacks", type=int, default=5,
                   help="give up (exit 1) after this many rollbacks: the damage is not transient")
    f = p.add_argument_group("fault injection (tests and demos)")
    f.add_argument("--inject-poison", type=poison_arg, action="append", default=[], metavar="STEP[:MICRO]",
                   help="at this step, micro-batch MICRO of the step (0-based, default 0: the first; every rank) "
                        "gets random labels, once")
    f.add_argument("--inject-lr-blowup", action="append", default=[], metavar="STEP:FACTOR",
                   help="multiply the LR of one step by FACTOR (once)")
    f.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL one rank after this step")
    f.add_argument("--kill-rank", type=int, default=None,
                   help=f"the rank --kill-at-step kills (default {DEFAULT_KILL_RANK})")
    return p


def poison_arg(text: str) -> tuple[int, int]:
    """--inject-poison STEP[:MICRO] -> (step, micro): step >= 1, micro >= 0 (the micro-batch of the step)."""
    step, _, micro = text.partition(":")
    try:
        out = (int(step), int(micro) if micro else 0)
    except ValueError:
        out = None
    if out is None or out[0] < 1 or out[1] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected STEP[:MICRO], a step >= 1 and the 0-based micro-batch "
                                         "of that step, e.g. 14 or 5:2")
    return out


def load_spec_and_shape(path: str) -> tuple[Any, Any]:
    """(Spec, ModelShape) from a spec YAML, through the models package when it provides the readers."""
    from dstoolkit import spec as spec_mod

    p = Path(path)
    problem = input_file_problem(p)
    if problem:
        raise UsageError(f"--spec {path}: {problem}")
    spec = spec_mod.load_spec(p)
    try:
        from dstoolkit.models import resolve_model
    except ImportError:
        resolve_model = None
    if resolve_model is not None:
        shape = resolve_model(spec.model, p.parent)
    else:  # TODO(#3): inline-only fallback until dstoolkit.models.resolve_model lands
        from dstoolkit.models.shape import ModelShape

        extra = dict(spec.model.model_extra or {})
        if spec.model.preset or spec.model.hf_config:
            raise UsageError("spec model.preset / model.hf_config need dstoolkit.models.resolve_model")
        shape = ModelShape(**extra)
    return spec, shape


@dataclass
class Inputs:
    """What the command line names, read and checked before torch / deepspeed are imported."""

    ds_config: dict
    spec: Any
    shape: Any
    blowups: dict[int, float]
    shrunk: Any = None
    """`dstoolkit.runtime.shrink_run.ShrunkRun` with --shrink (then `shape` is the shrunk shape), else None."""
    notes: tuple[str, ...] = ()
    """What the user should know about inputs that were accepted (a metrics file cut off mid-record), each whole."""


def ep_size_of(args: argparse.Namespace, spec: Any, shape: Any, shrunk: Any = None) -> int:
    """The expert-parallel size the run builds its model at: --ep-size, else the ep the config's generated folder
    records for it (layout.json: a `*-ep` strategy's config run without --ep-size, as `dstoolkit train --config
    DIR/zero1-ep/ds_config.json` does, was built at ep 1), else the spec's training.ep; 1 without native MoE layers
    (a dense model, or --shrink: its experts are plain modules). `builders.build_model_for_run` builds at it; the
    resume pre-flight compares it (`resume_check.resume_refusal`)."""
    if shrunk is not None or not shape.is_moe:
        return 1
    if args.ep_size:
        return args.ep_size
    layout = config_layout(args.deepspeed_config) if getattr(args, "deepspeed_config", None) else None
    if layout is not None:
        return int(layout.ep or 1)
    return spec.training.ep if isinstance(spec.training.ep, int) else 1


def read_inputs(args: argparse.Namespace, config_flag: str = "--deepspeed_config",
                world: Optional[World] = None) -> Inputs:
    """Check the flags and read the DeepSpeed JSON and the spec; every problem is a UsageError (exit 2).
    `config_flag`: how the caller's command line names the DeepSpeed config (`dstoolkit train`: --config); `world`:
    the ranks to launch (`dstoolkit train`: --nproc), else the launch's (`fault_flags.launched_world`)."""
    if args.steps <= 0:
        raise UsageError(f"--steps={args.steps} must be > 0")
    if args.save_every < 0:
        raise UsageError(f"--save-every={args.save_every} must be >= 0")
    if not args.checkpoint_dir:  # one rule with Guard (names.Names.missing_dir)
        asked = ([f"--save-every {args.save_every}"] if args.save_every else []) + (
            ["--resume"] if args.resume else []) + (["--spike-action rollback"] if args.spike_action == "rollback" else [])
        problem = CLI.missing_dir(asked)
        if problem:
            raise UsageError(problem)
    cfg_path = Path(args.deepspeed_config)
    problem = input_file_problem(cfg_path)
    if problem:
        raise UsageError(f"--deepspeed_config {cfg_path}: {problem}")
    try:
        ds_config = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise UsageError(f"--deepspeed_config {cfg_path}: not valid JSON ({e})") from None
    try:
        spec, shape = load_spec_and_shape(args.spec)
    except ValueError as e:  # pydantic ValidationError included: names the field
        raise UsageError(f"--spec {args.spec}: {e}") from None
    check_helper_flags(args)
    notes = check_output_paths(args, config_flag)
    if not (args.dist_timeout_s > 0 and math.isfinite(args.dist_timeout_s)):
        raise UsageError(f"--dist-timeout-s={args.dist_timeout_s} must be a positive number of seconds, e.g. 600")
    shrunk = read_shrink(args, spec)
    if shrunk is not None:
        shape = shrunk.shape
    problem = fault_flags_problem(args, world=world or launched_world(), ds_config=ds_config, spec=spec,
                                  config_flag=config_flag)  # after --shrink: a batch ramp counts its seq_len
    if problem:
        raise UsageError(problem)
    blowups = parse_blowups(args.inject_lr_blowup)
    return Inputs(ds_config=ds_config, spec=spec, shape=shape, blowups=blowups, shrunk=shrunk, notes=notes)


HELPER_FLAGS = {"window": "--spike-window", "z_threshold": "--spike-z", "escalate_after": "--escalate-after",
                "lr_scale": "--lr-scale", "lr_scale_steps": "--lr-scale-steps", "max_rollbacks": "--max-rollbacks",
                "keep": "--keep-checkpoints", "monitor_every": "--monitor-every"}
"""The trainer flag of each spike-guard / rollback / checkpoint / monitor setting the helpers check."""


def check_helper_flags(args: argparse.Namespace) -> None:
    """The spike-guard, rollback, checkpoint and monitor flags, checked by the helpers' own rules
    (`SpikeGuardConfig`, `Rollback`, `ckpt.check_keep`, `Monitor.check_every`) before any rank starts; a
    UsageError names the flag, the value and what it must be."""
    from dstoolkit.runtime.train.ckpt import check_keep
    from dstoolkit.runtime.train.monitor import Monitor
    from dstoolkit.runtime.train.spike import Rollback, SettingError, SpikeGuard, SpikeGuardConfig

    try:
        guard = SpikeGuard(SpikeGuardConfig(window=args.spike_window, z_threshold=args.spike_z,
                                            escalate_after=args.escalate_after, lr_scale=args.lr_scale,
                                            lr_scale_steps=args.lr_scale_steps))
        Rollback(guard, max_rollbacks=args.max_rollbacks)
        check_keep(args.keep_checkpoints)
        Monitor.check_every(args.monitor_every)
    except SettingError as e:
        raise UsageError(f"{HELPER_FLAGS.get(e.name, e.name)}={e.value} {e.need}") from None


OUTPUT_FOLDER_FLAGS = (("--checkpoint-dir", "checkpoint_dir"), ("--monitor-dir", "monitor_dir"))
"""The trainer's output folders (flag, argparse dest), checked by `check_output_paths`."""


PREFLIGHT_DONE_ENV = "DSTOOLKIT_TRAIN_PREFLIGHT_DONE"
"""Set ("1") by `dstoolkit train` in its ranks' environment: its pre-flight (`preflight.check_launch`) checked the
--metrics-out file already, so no rank reads it again (`checks_metrics_file`)."""


def launched_as_rank0() -> bool:
    """This process is global rank 0 of its launch, or was started without a launcher (RANK unset)."""
    return os.environ.get("RANK", "0") == "0"


def checks_metrics_file() -> bool:
    """This process checks what --metrics-out holds (`metrics_out_check`): once per launch in `dstoolkit train`'s
    pre-flight, or else on every rank of a direct launch (a torchrun / deepspeed launch of the trainer itself), so a
    rank on another node refuses too instead of going on to wait for a rank 0 that stopped; the check reads at most
    64 KiB from each end of the file (results_jsonl.read_ends), and the refusal is said once (`say_usage_error`)."""
    return not os.environ.get(PREFLIGHT_DONE_ENV)


def check_output_paths(args: argparse.Namespace, config_flag: str = "--deepspeed_config") -> tuple[str, ...]:
    """--metrics-out (a file rank 0 appends to) and the output folders (--checkpoint-dir, --monitor-dir) must be
    writable paths, checked before any rank starts (`dstoolkit.common.atomic`'s wording): no part above them may be a
    file, the metrics path may not be a folder and an output folder may not be a file. Otherwise each rank failed
    late with a bare OS error (FileExistsError, NotADirectoryError, IsADirectoryError) and `dstoolkit train` with
    exit 1. A UsageError names the flag, the value and the fix (`config_flag`: the caller's name for the DeepSpeed
    config). Returns the notes on an accepted --metrics-out (`metrics_out_check`; where `checks_metrics_file`)."""
    from dstoolkit.common.atomic import check_output_parents, check_output_path

    metrics = args.metrics_out
    try:
        if not str(metrics).strip():
            raise UsageError(f"--metrics-out {metrics!r}: empty; give the path of the JSON-lines file to append to, "
                             "e.g. train_metrics.jsonl")
        check_output_path(metrics, name=f"--metrics-out {metrics}")
        if Path(metrics).is_dir():  # a link to a folder: appended to, not replaced, so refused as well
            raise UsageError(f"--metrics-out {metrics}: is a link to a folder, not a file; give the path of the "
                             "JSON-lines file to append to (a file inside it, or a new name)")
        found = metrics_out_check(metrics, {config_flag: args.deepspeed_config, "--spec": args.spec}) \
            if checks_metrics_file() else None
        if found is not None and found.problem:
            raise UsageError(found.problem)
        if launched_as_rank0():  # one rank probes (see the output folders below)
            probe_folder_creation(Path(metrics).parent, f"--metrics-out {metrics}")
        for flag, dest in OUTPUT_FOLDER_FLAGS:
            folder = getattr(args, dest, None)
            if not folder:
                continue
            check_output_parents(folder, name=f"{flag} {folder}")
            if _is_non_folder(Path(folder)):
                raise UsageError(f"{flag} {folder}: is a file, not a folder; give a new or existing folder to write "
                                 "into (or move the file away)")
            if launched_as_rank0():  # one rank probes: another's probe removes what it made meanwhile
                probe_folder_creation(Path(folder), f"{flag} {folder}")
    except OSError as e:  # FileInPathError, OutputIsFolderError: their text names the flag, the part and the fix
        raise UsageError(str(e)) from None
    return (found.note,) if found is not None and found.note else ()


def is_metrics_record(rec: Any) -> bool:
    """A line the example trainer writes to --metrics-out (`run_state.MetricsWriter`, from `trainer.py`): an event
    (``{"event": "model" | "spike" | "checkpoint" | ... | "done", ...}``) or a step (``{"step", "loss",
    "step_time_s", "tokens_per_s", ...}``, what `dstoolkit train`'s summary reads); a bench record is not one."""
    return (isinstance(rec, dict) and "bench" not in rec
            and (isinstance(rec.get("event"), str) or "step_time_s" in rec))


METRICS_RECORD_OPENINGS = ('{"event": ', '{"step": ')
"""How every line the trainer writes to --metrics-out starts: `run_state.MetricsWriter` writes `json.dumps` of a dict
whose first key is "event" or "step" (trainer.py and guard.py build them so). A file whose only line is cut off
inside or after one of these is a run killed while writing its first record (`metrics_out_check`)."""


def metrics_out_check(metrics: str, inputs: dict[str, str]) -> Any:
    """May the run append its metrics to `metrics` (--metrics-out)? A `results_jsonl.AppendCheck`: its problem, the
    whole message naming the flag and the fix, or None; its note, what to know about a file accepted. `inputs`:
    {flag: path} of the command's input files, as the caller's command line names them.
    Refused: the same file as an input (after links, or a hard link: `same_file`), whatever it holds; an existing
    file that is not JSON Lines of the trainer's metrics (`results_jsonl.jsonl_append_check`, the rule `bench
    --out` applies to its records): a config, a spec, notes. Rank 0 appends (`MetricsWriter`), so either would be
    spoilt, and `dstoolkit train`'s summary covers only the lines this run appended. A new or empty file, or an
    earlier run's metrics (a resume; a last line cut off by a killed run is tolerated; a file whose only line is a
    first record cut off, `METRICS_RECORD_OPENINGS`, with a note), is accepted. Reads at most 128 KiB of it."""
    from dstoolkit.runtime.bench.results_jsonl import AppendCheck, jsonl_append_check

    if not str(metrics).strip() or Path(metrics).is_dir():
        return AppendCheck()  # `check_output_paths` says what is wrong with the path itself
    folder = Path(metrics).parent
    other = folder / "train_metrics.jsonl"
    if other.exists() or same_file(other, metrics):
        other = folder / f"{Path(metrics).stem}_metrics.jsonl"
    for flag, path in inputs.items():
        if path and same_file(metrics, path):
            return AppendCheck(f"--metrics-out {metrics}: is the same file as {flag} {path}, an input of this run; "
                               f"the run appends its metrics there and would spoil it; nothing was written: give "
                               f"another file, e.g. --metrics-out {other}")
    found = jsonl_append_check(metrics, is_metrics_record, "dstoolkit train metrics record",
                               'no "event" or "step_time_s" field', cut_openings=METRICS_RECORD_OPENINGS)
    if found.problem:
        return AppendCheck(f"--metrics-out {metrics}: {found.problem}; nothing was written: give a new file to append "
                           f"the metrics to (or the metrics file of an earlier run), e.g. --metrics-out {other}")
    return AppendCheck(note=f"--metrics-out {metrics}: {found.note}" if found.note else None)


def _is_non_folder(path: Path) -> bool:
    """`path` exists and is not a folder, from one stat: exists() then is_dir() saw rank 0's probe folder vanish
    between the two calls on rank 1 and called it a file (a fresh-clone CI run refused `--checkpoint-dir checkpoints`
    in an empty folder)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def probe_folder_creation(folder: Path, name: str) -> None:
    """Create `folder` (and what is missing above it) the way the ranks will, then remove what this created: a
    folder that cannot be made (/proc/x, a read-only place) is a UsageError naming `name` (flag and value) here,
    before any rank starts, not a FileNotFoundError traceback per rank."""
    missing = []
    p = folder.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    if not missing:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{name}: cannot create the folder {missing[-1]} ({e.strerror or e}); give a path where "
                         "you can create folders") from None
    finally:
        for made in missing:  # deepest first; only empty folders this probe made
            try:
                made.rmdir()
            except OSError:
                break


def read_shrink(args: argparse.Namespace, spec: Any) -> Any:
    """--shrink: the spec's model shrunk (`dstoolkit.runtime.shrink_run.prepare_shrunk_run`) and the spec's
    seq_len capped to the shrink's; None without the flag. Every problem is a UsageError naming the field."""
    from dstoolkit.runtime.shrink_run import prepare_shrunk_run
    from dstoolkit.runtime.shrink_sizes import ShrinkError, parse_shrink

    try:
        sizes = parse_shrink(args.shrink)
        if sizes is None:
            return None
        run = prepare_shrunk_run(spec, spec.base_dir, sizes)
    except ShrinkError as e:
        raise UsageError(f"--shrink (spec {args.spec}): {e}") from None
    if args.ep_size is not None and args.ep_size > 1:
        raise UsageError(f"--ep-size={args.ep_size} with --shrink: the transformers model's experts are plain "
                         "modules (no DeepSpeed expert groups); run with --ep-size 1 (experts data-parallel)")
    if run.seq_len < spec.training.seq_len:
        spec.training.seq_len = run.seq_len  # a short sequence: the shrunk run takes seconds, not minutes
    return run
