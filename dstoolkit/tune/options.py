"""What `dstoolkit tune` takes (`TuneOptions`), checked (`check_options`, exit 2 naming the flag), and what a study
produced (`TuneResult`); the spec and its `TuneSpace` loaded for a study (shrunk for real trials with --shrink;
real mode refused where this machine cannot run the spec's ranks); the study's fingerprint.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Optional

from dstoolkit.common.atomic import check_output_folder
from dstoolkit.hardware.calibration import calibration_for_spec
from dstoolkit.models import resolve_spec_model
from dstoolkit.runtime.shrink_run import prepare_shrunk_run
from dstoolkit.runtime.shrink_sizes import ShrinkError, parse_shrink
from dstoolkit.spec import load_spec
from dstoolkit.tune.objective import DEFAULT_SKIP_STEPS, DEFAULT_STEPS, DEFAULT_TRIAL_TIMEOUT_S, MODES, OBJECTIVES
from dstoolkit.tune.seeding import MAX_SEED_TRIALS
from dstoolkit.tune.space import DEFAULT_BUCKET_SCALES, TuneInputError, TuneSpace

MAX_SAMPLER_SEED = 2**32 - 1  # numpy's RandomState (optuna's TPE sampler) takes seeds 0 .. 2**32 - 1


@dataclass
class TuneOptions:
    """Everything `dstoolkit tune` takes."""

    spec_path: pathlib.Path
    out_dir: pathlib.Path
    budget: int
    objective: str = "throughput"
    mode: str = "real"
    seed: int = 0
    force: bool = False
    seed_trials: Optional[int] = None
    """Top estimated points enqueued first (None: `default_seed_trials`: a third of the budget, more when the
    estimator ties several points, 1 to 5)."""
    startup_trials: Optional[int] = None
    """Trials (seeded ones included) before TPE models the history (None: seed_trials + 2)."""
    bucket_scales: tuple[float, ...] = DEFAULT_BUCKET_SCALES
    tune_overlap: Optional[bool] = None
    steps: int = DEFAULT_STEPS
    skip_steps: int = DEFAULT_SKIP_STEPS
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    launcher: str = "torchrun"
    progress: bool = True
    shrink: Optional[str] = None
    """Real mode: train the spec's own transformers architecture shrunk (a `--shrink` value of the trainer:
    'auto' or sizes, `dstoolkit.runtime.shrink`); the space, its pruning and estimates are the shrunk model's."""


@dataclass
class TuneResult:
    """What a finished (or budget-exhausted) study produced."""

    out_dir: pathlib.Path
    resumed: bool
    trials: list[dict[str, Any]]
    best: Optional[dict[str, Any]]
    evaluated: int
    stop_reason: str
    space_size: int
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Lines for stdout and report.md beside the best trial (the memory headroom, a shrunk run)."""


def _fingerprint(spec_text: str, opts: TuneOptions) -> str:
    # Budget and seed are not part of it: rerunning with a larger budget continues the same study.
    data = {"spec": spec_text, "objective": opts.objective, "mode": opts.mode,
            "buckets": list(opts.bucket_scales), "overlap": opts.tune_overlap, "steps": opts.steps,
            "skip": opts.skip_steps, "launcher": opts.launcher}
    if opts.shrink:
        data["shrink"] = opts.shrink
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def check_options(opts: TuneOptions) -> None:
    """Refuse bad options with a message naming the flag (exit 2 in the CLI)."""
    if opts.budget < 1:
        raise TuneInputError(f"--budget {opts.budget}: need at least 1 trial")
    if opts.objective not in OBJECTIVES:
        raise TuneInputError(f"--objective {opts.objective!r}: choose one of {', '.join(OBJECTIVES)}")
    if opts.mode not in MODES:
        raise TuneInputError(f"--mode {opts.mode!r}: choose one of {', '.join(MODES)}")
    if opts.skip_steps < 0:
        raise TuneInputError(f"--skip-steps {opts.skip_steps}: must be >= 0 (warm-up steps left out of the timing)")
    if opts.steps < 1:
        raise TuneInputError(f"--steps {opts.steps}: must be >= 1 optimizer step per trial")
    if opts.steps <= opts.skip_steps:
        raise TuneInputError(f"--steps {opts.steps} must exceed --skip-steps {opts.skip_steps} (those are not timed)")
    if not opts.trial_timeout_s > 0:  # NaN included
        raise TuneInputError(f"--trial-timeout {opts.trial_timeout_s}: must be > 0 seconds")
    if opts.seed_trials is not None and not 1 <= opts.seed_trials <= MAX_SEED_TRIALS:
        raise TuneInputError(f"--seed-trials {opts.seed_trials}: choose 1 to {MAX_SEED_TRIALS} estimator-ranked "
                             "points to try first (or leave it out for the default)")
    if not 0 <= opts.seed <= MAX_SAMPLER_SEED:
        raise TuneInputError(f"--seed {opts.seed}: must be an integer from 0 to {MAX_SAMPLER_SEED} (the sampler's "
                             "seed range)")
    check_out_dir(opts.out_dir)


def check_out_dir(out_dir: pathlib.Path) -> None:
    """--out must be a folder, or a path where one can be made: not a file, under no path part that is a file, not a
    link to nothing, writable (`check_output_folder`, the one wording for each). Asked first (`check_options`), before
    the spec is loaded; what the folder holds (another study, other files) is `records.prepare_out_dir`'s."""
    out_dir = pathlib.Path(out_dir)
    check_output_folder(out_dir, name=f"--out {out_dir}")
    if out_dir.exists() and not out_dir.is_dir():
        raise TuneInputError(f"--out {out_dir}: is a file, not a folder; give the study's folder (a new one, or the "
                             "--out of the study to resume)")


def _load_space(opts: TuneOptions) -> tuple[Any, TuneSpace, str]:
    spec = load_spec(opts.spec_path)  # SpecError (a ValueError) names the YAML line, or a missing file / folder
    user_seq_len = spec.training.seq_len
    if opts.mode == "real" and opts.shrink:
        _check_ranks(spec, shrink=True)  # before the shrink: its message names the cluster to set
    shrunk = _shrunk_run(opts, spec)
    shape = shrunk.shape if shrunk is not None else resolve_spec_model(spec)
    calibration_for_spec(spec)  # an unusable cluster.calibration file: SpecError before any trial
    space = TuneSpace.from_spec(spec, shape, bucket_scales=opts.bucket_scales, tune_overlap=opts.tune_overlap,
                                data_parallel_only=opts.mode == "real", expert_parallel=shrunk is None)
    space.shrunk = shrunk
    space.user_seq_len = user_seq_len
    if opts.mode == "real":
        _check_real_mode_possible(spec)
    return spec, space, opts.spec_path.read_text(encoding="utf-8")


def _shrunk_run(opts: TuneOptions, spec):
    """The spec's model shrunk for real trials (`dstoolkit.runtime.shrink_run.prepare_shrunk_run`), with the spec's
    seq_len capped to the shrink's; None without --shrink."""
    if not opts.shrink:
        return None

    if opts.mode != "real":
        raise TuneInputError("--shrink is for real mode (it changes what the trials train); drop it, or use "
                             "--mode real")
    try:
        sizes = parse_shrink(opts.shrink)
        run = prepare_shrunk_run(spec, spec.base_dir, sizes)
    except ShrinkError as exc:
        raise TuneInputError(f"--shrink (spec {opts.spec_path}): {exc}") from None
    opts.shrink = sizes.to_arg()  # the trials get exactly these sizes
    spec.training.seq_len = run.seq_len
    return run


def _local_ranks() -> tuple[bool, int]:
    """(CUDA available, ranks this machine can run: its GPUs, else its CPU cores)."""
    try:
        # optional extra (dstoolkit[train]): torch only where a real trial needs it
        import torch

        cuda = torch.cuda.is_available()
        return cuda, (torch.cuda.device_count() if cuda else (os.cpu_count() or 1))
    except ImportError:  # pragma: no cover - torch is a dependency
        return False, os.cpu_count() or 1


def _check_ranks(spec, shrink: bool) -> None:
    """Real mode launches every rank of the spec on this machine (--shrink trials too, unlike `bench train --shrink`,
    which fits the batch to its --world-size): refuse a cluster this machine cannot run. One check; only the advice
    differs: with --shrink (checked before the shrink), the cluster to set; else --mode estimate."""
    world = spec.cluster.world_size
    cuda, local = _local_ranks()
    if spec.cluster.nodes <= 1 and world <= local:
        return
    stem = (f"cluster: {spec.cluster.nodes} node(s) x {spec.cluster.gpus_per_node} = {world} ranks, but real mode "
            f"launches every rank on this machine ({local} {'GPUs' if cuda else 'CPU cores'}); ")
    if shrink:
        n = min(2, local)
        raise TuneInputError(f"--shrink: {stem}with --shrink, set cluster to nodes: 1, gpus_per_node: {n}, gpu: "
                             f"{'the local GPU' if cuda else 'cpu'} (and a training.global_batch that {n} divides)")
    raise TuneInputError(f"{stem}use --mode estimate for clusters you cannot reach")


def _check_real_mode_possible(spec) -> None:
    """Real mode launches the spec's world size on this machine: refuse what this machine cannot run."""
    _check_ranks(spec, shrink=False)
    cuda, _ = _local_ranks()
    is_cpu = isinstance(spec.cluster.gpu, str) and spec.cluster.gpu.lower() == "cpu"
    if not cuda and not is_cpu:
        raise TuneInputError(
            f"cluster.gpu={spec.cluster.gpu!r} but this machine has no CUDA device; real mode needs the hardware "
            "the spec names (use --mode estimate, or cluster.gpu: cpu for a CPU run)")
