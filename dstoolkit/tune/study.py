"""The tuner: an optuna TPE study over a `TuneSpace`, seeded with the estimator's ranking, stored in SQLite.

Flow per trial (ask/tell, so nothing an objective raises can end the study):
  1. the sampler proposes a point (estimator-ranked points are enqueued first);
  2. a point already evaluated is answered from the study (no second run; not counted in the budget);
  3. the pre-run checks (rules, `validate_config`, memory estimate) prune it with a reason, or
  4. it is evaluated: a short real run (real mode), the estimate (estimate mode), or a caller-supplied
     lookup (the tune-vs-grid benchmark replays measured grid values); OOM / error / timeout are FAIL
     trials with the reason in the trial's user attributes.
The budget counts evaluated trials (real runs or estimates, failures included); pruned and duplicate
trials cost nothing and are not counted, but the total number of trials is capped.

The study lives in ``sqlite:///OUT/study.db``; rerunning the same command resumes it (a trial left RUNNING by
an interrupt is closed as FAIL "interrupted" and its point retried first).
"""
from __future__ import annotations

import hashlib
import json
import logging
import pathlib
import random
import shutil
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from dstoolkit.tune.objective import (DEFAULT_SKIP_STEPS, DEFAULT_STEPS, DEFAULT_TRIAL_TIMEOUT_S, MODES, OBJECTIVES,
                                      TrialOutcome, direction, run_estimate_trial, run_real_trial)
from dstoolkit.tune.space import DEFAULT_BUCKET_SCALES, PointCheck, TuneInputError, TunePoint, TuneSpace

STUDY_DB = "study.db"
STUDY_NAME = "dstoolkit-tune"
TRIALS_DIR = "trials"
OUTPUT_FILES = ("best_ds_config.json", "best_spec.yaml", "report.md", "report.json", "objective_vs_trial.png")
FULL_SCAN_MAX_POINTS = 2000  # spaces up to this size are checked point by point for the seed ranking
MAX_TRIALS_PER_BUDGET = 20  # cap on all trials (pruned and duplicates included) per unit of budget ...
MAX_TRIALS_FLOOR = 200  # ... and at least this many
FALLBACK_AFTER = 8  # proposals in a row that were pruned or already evaluated before an untried ranked point is queued
POOL_PER_BUDGET = 4  # estimator-ranked points kept as the fallback pool, per unit of budget (at least 20)
FINGERPRINT_ATTR = "dstoolkit_fingerprint"

log = logging.getLogger("dstoolkit.tune")


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


SEED_BAND_FRACTION = 0.05
"""Points estimated within this fraction of the best estimate are ties for the estimator: the calibrated
step-time model's measured error is about this size (MAPE 4.4-6.2%, benchmarks/results/step_time_fidelity_cpu_202611.md),
so only real trials can order them."""
MAX_SEED_TRIALS = 5


def default_seed_trials(budget: int, band_size: int = 1) -> int:
    """Trials taken from the estimator's ranking before TPE: about a third of the budget (1 to 5), raised to
    the number of points the estimator cannot tell apart from its best (`band_size`, see SEED_BAND_FRACTION),
    at most half the budget (rounded up) and at most 5."""
    base = max(1, min(MAX_SEED_TRIALS, round(budget / 3)))
    return max(base, min(band_size, -(-budget // 2), MAX_SEED_TRIALS))


def estimate_band_size(values: list[float], objective: str) -> int:
    """How many of the estimated objective values (any order) lie within SEED_BAND_FRACTION of the best one
    (higher is better for throughput, lower for memory)."""
    if not values:
        return 0
    if direction(objective) == "maximize":
        best = max(values)
        return sum(1 for v in values if v >= best * (1 - SEED_BAND_FRACTION))
    best = min(values)
    return sum(1 for v in values if v <= best * (1 + SEED_BAND_FRACTION))


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
    if opts.steps <= opts.skip_steps:
        raise TuneInputError(f"--steps {opts.steps} must exceed --skip-steps {opts.skip_steps} (those are not timed)")
    if opts.trial_timeout_s <= 0:
        raise TuneInputError(f"--trial-timeout {opts.trial_timeout_s}: must be > 0 seconds")
    if opts.seed_trials is not None and opts.seed_trials < 0:
        raise TuneInputError(f"--seed-trials {opts.seed_trials}: must be >= 0")


def _load_space(opts: TuneOptions) -> tuple[Any, TuneSpace, str]:
    from dstoolkit.hardware.calibration import calibration_for_spec
    from dstoolkit.models import resolve_spec_model
    from dstoolkit.spec import load_spec

    if not opts.spec_path.is_file():
        raise TuneInputError(f"{opts.spec_path}: no such spec file")
    spec = load_spec(opts.spec_path)  # SpecError (a ValueError) names the YAML line
    shrunk = _shrunk_run(opts, spec)
    shape = shrunk.shape if shrunk is not None else resolve_spec_model(spec)
    calibration_for_spec(spec)  # an unusable cluster.calibration file: SpecError before any trial
    space = TuneSpace.from_spec(spec, shape, bucket_scales=opts.bucket_scales, tune_overlap=opts.tune_overlap,
                                data_parallel_only=opts.mode == "real", expert_parallel=shrunk is None)
    space.shrunk = shrunk
    if opts.mode == "real":
        _check_real_mode_possible(spec)
    return spec, space, opts.spec_path.read_text(encoding="utf-8")


def _shrunk_run(opts: TuneOptions, spec):
    """The spec's model shrunk for real trials (`dstoolkit.runtime.shrink.prepare_shrunk_run`), with the spec's
    seq_len capped to the shrink's; None without --shrink."""
    if not opts.shrink:
        return None
    from dstoolkit.runtime.shrink import ShrinkError, parse_shrink, prepare_shrunk_run

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


def _check_real_mode_possible(spec) -> None:
    """Real mode launches the spec's world size on this machine: refuse what this machine cannot run."""
    import os

    world = spec.cluster.world_size
    try:
        import torch

        cuda = torch.cuda.is_available()
        local = torch.cuda.device_count() if cuda else (os.cpu_count() or 1)
    except ImportError:  # pragma: no cover - torch is a dependency
        cuda, local = False, os.cpu_count() or 1
    if spec.cluster.nodes > 1 or world > local:
        raise TuneInputError(
            f"cluster: {spec.cluster.nodes} node(s) x {spec.cluster.gpus_per_node} = {world} ranks, but real mode "
            f"launches every rank on this machine ({local} {'GPUs' if cuda else 'CPU cores'}); "
            "use --mode estimate for clusters you cannot reach")
    is_cpu = isinstance(spec.cluster.gpu, str) and spec.cluster.gpu.lower() == "cpu"
    if not cuda and not is_cpu:
        raise TuneInputError(
            f"cluster.gpu={spec.cluster.gpu!r} but this machine has no CUDA device; real mode needs the hardware "
            "the spec names (use --mode estimate, or cluster.gpu: cpu for a CPU run)")


def prepare_out_dir(out_dir: pathlib.Path, fingerprint: str, force: bool) -> bool:
    """Create or reuse the output folder. Returns True when an existing study is resumed.

    Raises:
        TuneInputError: the folder holds something else (or another study) and --force was not given.
    """
    db = out_dir / STUDY_DB
    if out_dir.exists() and not out_dir.is_dir():
        raise TuneInputError(f"--out {out_dir}: exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if force:
            db.unlink(missing_ok=True)
            for name in OUTPUT_FILES:
                (out_dir / name).unlink(missing_ok=True)
            shutil.rmtree(out_dir / TRIALS_DIR, ignore_errors=True)
            return False
        if not db.is_file():
            raise TuneInputError(f"--out {out_dir}: folder is not empty and holds no study ({STUDY_DB}); choose an "
                                 "empty folder or pass --force to write into it")
        other = _stored_fingerprint(db)
        if other != fingerprint:
            raise TuneInputError(
                f"--out {out_dir}: holds a study of a different spec/objective/mode/space (fingerprint {other}, this "
                f"run {fingerprint}); pass --force to replace it, or choose another --out")
        return True
    out_dir.mkdir(parents=True, exist_ok=True)
    return False


def _stored_fingerprint(db: pathlib.Path) -> Optional[str]:
    import optuna

    try:
        s = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{db}")
    except Exception:  # not an optuna database, or no study of that name
        return None
    return s.user_attrs.get(FINGERPRINT_ATTR)


# ----------------------------------------------------------------------------------------------------------
# seeding
# ----------------------------------------------------------------------------------------------------------

def _rank_key(objective: str, check: PointCheck, spec) -> float:
    from dstoolkit.tune.space import estimated_tokens_per_s

    est = check.estimate
    return -estimated_tokens_per_s(spec, est) if objective == "throughput" else float(est.memory_per_rank_bytes)


def estimator_ranking(space: TuneSpace, objective: str, checks: Optional[dict[str, PointCheck]], top: int,
                      world_size: Optional[int] = None,
                      cache: Optional[dict[str, PointCheck]] = None) -> list[TunePoint]:
    """Up to `top` runnable points, best estimate first (for the objective).

    With a full scan (`checks`), every runnable point is ranked; otherwise the sweep's ranking
    (`run_sweep`, default knobs) is used, each point re-checked with this space's checks (stored in `cache`
    when given, so the caller does not check them again).
    """
    if top <= 0:
        return []
    if checks is not None:
        ok = [c for c in checks.values() if not c.pruned]
        ok.sort(key=lambda c: (_rank_key(objective, c, space.spec), c.point.label))
        return [c.point for c in ok[:top]]
    from dstoolkit.generate import run_sweep

    res = run_sweep(space.spec, space.shape, top=max(top * 2, 8), validate=False, advise=False)
    dims = space.dimensions()
    ranked = list(res.ranked)
    if objective == "memory":
        ranked.sort(key=lambda r: r.estimate.memory_per_rank_bytes)
    cands: list[TunePoint] = []
    for r in ranked:
        c = r.candidate
        if c.tp not in dims["tp"] or c.pp not in dims["pp"] or c.micro_batch not in dims["micro_batch"]:
            continue
        if c.zero_stage == 0:
            cands.append(TunePoint(candidate=c))
            continue
        overlap = None if dims["overlap_comm"] == [None] else True
        scales = sorted(dims["bucket_scale"], key=lambda x: (x != 1.0, x))
        for scale in scales:  # the generated default bucket first, then the other scales
            cands.append(TunePoint(candidate=c, overlap_comm=overlap, bucket_scale=scale))
        if overlap is not None:
            cands.append(TunePoint(candidate=c, overlap_comm=False, bucket_scale=1.0 if 1.0 in dims["bucket_scale"]
                                   else dims["bucket_scale"][0]))
    out: list[TunePoint] = []
    seen: set[str] = set()
    for p in cands:
        if p.key in seen:
            continue
        seen.add(p.key)
        chk = space.check(p, world_size=world_size)
        if cache is not None:
            cache[p.key] = chk
        if not chk.pruned:
            out.append(p)
        if len(out) >= top:
            break
    return out


# ----------------------------------------------------------------------------------------------------------
# the study
# ----------------------------------------------------------------------------------------------------------

REC_ATTR = "rec"  # one user attribute per trial holds our record (each attribute write is one SQLite commit)


def _rec(t) -> dict[str, Any]:
    """A trial's record: its user attributes with our record merged in (seeded_by comes from enqueue_trial)."""
    ua = dict(t.user_attrs)
    rec = ua.pop(REC_ATTR, {}) or {}
    return {**ua, **rec}


def _outcome_attrs(trial, outcome: TrialOutcome, point: TunePoint, counted: bool,
                   duplicate_of: Optional[int] = None, reason: Optional[str] = None) -> None:
    rec: dict[str, Any] = {"label": point.label, "point": point.model_dump(mode="json"), "status": outcome.status,
                           "reason": reason if reason is not None else outcome.reason, "code": outcome.code,
                           "counted": counted, "wall_s": round(outcome.wall_s, 3)}
    if outcome.estimate:
        rec["estimate"] = outcome.estimate
    if outcome.measured:
        rec["measured"] = outcome.measured
    if duplicate_of is not None:
        rec["duplicate_of"] = duplicate_of
    trial.set_user_attr(REC_ATTR, rec)


def _known(study) -> dict[str, Any]:
    """point key -> the first finished trial that evaluated or pruned it (interrupted ones excluded)."""
    from optuna.trial import TrialState

    out: dict[str, Any] = {}
    for t in study.get_trials(deepcopy=False):
        r = _rec(t)
        if t.state == TrialState.RUNNING or r.get("status") == "interrupted":
            continue
        p = r.get("point")
        if p is None or r.get("duplicate_of") is not None:
            continue
        key = json.dumps(p, sort_keys=True)
        out.setdefault(key, t)
    return out


def _close_interrupted(study, space: TuneSpace) -> int:
    """Trials left RUNNING by an interrupt: close them as FAIL "interrupted" and enqueue their point again."""
    from optuna.trial import TrialState

    n = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        rec = {**(t.user_attrs.get(REC_ATTR) or {}), "status": "interrupted", "counted": False, "code": "interrupted",
               "reason": "the study was interrupted during this trial (closed on resume; its point is retried)"}
        # optuna has no public API to annotate another process's RUNNING trial: go through its storage.
        study._storage.set_trial_user_attr(t._trial_id, REC_ATTR, rec)
        study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        if t.params:
            study.enqueue_trial(dict(t.params), skip_if_exists=False)
        n += 1
    return n


def run_study(opts: TuneOptions, *, lookup: Optional[Callable[[TunePoint, PointCheck], TrialOutcome]] = None,
              ranks: Optional[int] = None, write_outputs: bool = True) -> TuneResult:
    """Run (or resume) a tuning study.

    Args:
        opts: The options (see `TuneOptions`).
        lookup: Evaluate a runnable point without running it (the benchmark's replay of measured grid
            values); None: real runs (mode real) or estimates (mode estimate).
        ranks: Ranks per real trial (default: the spec's world size).
        write_outputs: Write best config, report and plot into the output folder.

    Returns:
        A `TuneResult`.

    Raises:
        TuneInputError: bad options, an unusable output folder, or a spec the mode cannot run.
    """
    import optuna
    from optuna.trial import TrialState

    check_options(opts)
    spec, space, spec_text = _load_space(opts)
    fp = _fingerprint(spec_text, opts)
    resumed = prepare_out_dir(opts.out_dir, fp, opts.force)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    world = ranks or spec.cluster.world_size
    size = space.size
    checks: Optional[dict[str, PointCheck]] = None
    if size <= FULL_SCAN_MAX_POINTS:
        checks = {p.key: space.check(p, world_size=world) for p in space.points()}
    pool_size = len(checks) if checks is not None else max(20, POOL_PER_BUDGET * opts.budget)
    check_cache: dict[str, PointCheck] = dict(checks or {})
    pool = estimator_ranking(space, opts.objective, checks, pool_size, world_size=world, cache=check_cache)
    if opts.seed_trials is not None:
        n_seed = opts.seed_trials
    else:  # the estimator's ties (within SEED_BAND_FRACTION of its best) are worth real trials first
        head = [check_cache[p.key] for p in pool[:MAX_SEED_TRIALS + 1]]
        values = [abs(_rank_key(opts.objective, c, spec)) for c in head]
        n_seed = default_seed_trials(opts.budget, estimate_band_size(values, opts.objective))
    n_startup = opts.startup_trials if opts.startup_trials is not None else n_seed + 2
    sampler = optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=n_startup, multivariate=True, group=True)
    storage = f"sqlite:///{(opts.out_dir / STUDY_DB).resolve()}"
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction=direction(opts.objective),
                                sampler=sampler, load_if_exists=True)
    if not resumed:
        study.set_user_attr(FINGERPRINT_ATTR, fp)
        study.set_user_attr("spec", str(opts.spec_path))
        study.set_user_attr("objective", opts.objective)
        study.set_user_attr("mode", opts.mode)
        study.set_user_attr("space", {k: [str(x) for x in v] for k, v in space.dimensions().items()})
        study.set_user_attr("space_size", size)
        seeds = pool[:n_seed]
        for p in seeds:
            study.enqueue_trial(space.params_of(p), user_attrs={"seeded_by": "estimator ranking"})
        study.set_user_attr("seeded", [p.label for p in seeds])
    else:
        closed = _close_interrupted(study, space)
        if closed:
            log.warning("resumed: %d interrupted trial(s) closed as FAIL and queued again", closed)
    study.set_user_attr("seed", opts.seed)
    study.set_user_attr("budget", opts.budget)
    runnable = None if checks is None else {k for k, c in checks.items() if not c.pruned}
    rng = random.Random(opts.seed)

    def counted() -> int:
        return sum(1 for t in study.get_trials(deepcopy=False) if _rec(t).get("counted"))

    max_trials = max(MAX_TRIALS_FLOOR, MAX_TRIALS_PER_BUDGET * opts.budget)
    stop_reason = "budget reached"
    idle_run = 0  # proposals in a row that were pruned or already evaluated

    def fallback(known: dict) -> None:
        """Queue an untried point from the estimator-ranked pool (seeded random pick) after FALLBACK_AFTER
        proposals in a row that evaluated nothing: TPE in a mostly-pruned space keeps proposing pruned points."""
        nonlocal idle_run
        if idle_run < FALLBACK_AFTER:
            return
        idle_run = 0
        untried = [p for p in pool if p.key not in known]
        if untried:
            pick = rng.choice(untried)
            study.enqueue_trial(space.params_of(pick), user_attrs={
                "seeded_by": f"{FALLBACK_AFTER} proposals in a row pruned or repeated: untried estimator-ranked point"})
    from dstoolkit.runtime.bench.harness import progress_bar

    with progress_bar(max(0, opts.budget - counted()), f"tune ({opts.mode})", enabled=opts.progress) as update:
        while True:
            n_counted = counted()
            if n_counted >= opts.budget:
                stop_reason = f"budget reached ({n_counted} evaluated trials)"
                break
            if len(study.trials) >= max_trials:
                stop_reason = f"trial cap reached ({max_trials} trials incl. pruned and duplicates)"
                break
            known = _known(study)
            if runnable is not None and runnable <= set(known):
                stop_reason = f"space exhausted: all {len(runnable)} runnable points evaluated"
                break
            trial = study.ask()
            point = space.suggest(trial)
            # Known even if this trial is interrupted.
            trial.set_user_attr(REC_ATTR, {"label": point.label, "point": point.model_dump(mode="json"),
                                           "status": "running"})
            key = point.key
            prev = known.get(key)
            if prev is not None:
                idle_run += 1
                _outcome_attrs(trial, TrialOutcome(status="duplicate", code="duplicate"), point, counted=False,
                               duplicate_of=prev.number,
                               reason=f"same point as trial #{prev.number} ({_rec(prev).get('status')}); answered "
                                      "from the study, not run again")
                if prev.state == TrialState.COMPLETE:
                    study.tell(trial, prev.value)
                elif prev.state == TrialState.PRUNED:
                    study.tell(trial, state=TrialState.PRUNED)
                else:
                    study.tell(trial, state=TrialState.FAIL)
                fallback(known)
                continue
            chk = check_cache.get(key) or space.check(point, world_size=world)
            check_cache[key] = chk
            if chk.pruned:
                out = TrialOutcome(status="pruned", reason=chk.pruned_reason or "", code=chk.pruned_code or "",
                                   estimate=_est(spec, chk))
                _outcome_attrs(trial, out, point, counted=False)
                study.tell(trial, state=TrialState.PRUNED)
                idle_run += 1
                fallback(known)
                continue
            idle_run = 0
            if lookup is not None:
                out = lookup(point, chk)
            elif opts.mode == "estimate":
                out = run_estimate_trial(space, chk, opts.objective)
            else:
                out = run_real_trial(space, chk, opts.out_dir / TRIALS_DIR / f"{trial.number:04d}",
                                     objective=opts.objective, ranks=world, steps=opts.steps,
                                     skip_steps=opts.skip_steps, timeout_s=opts.trial_timeout_s,
                                     launcher=opts.launcher, shrink=opts.shrink)
            _outcome_attrs(trial, out, point, counted=True)
            if out.status == "ok" and out.value is not None:
                study.tell(trial, out.value)
            else:
                study.tell(trial, state=TrialState.FAIL)
            update(1)
    result = collect_result(study, opts, resumed, stop_reason, size)
    if write_outputs:
        from dstoolkit.tune.report import write_outputs as _write

        result.files = _write(result, space, opts)
    return result


def _est(spec, chk: PointCheck) -> dict:
    from dstoolkit.tune.objective import estimate_summary

    return estimate_summary(spec, chk)


def trial_record(t) -> dict[str, Any]:
    """One trial as a plain dict (the report's row)."""
    ua = _rec(t)
    return {"number": t.number, "state": t.state.name, "value": t.value if t.values else None,
            "status": ua.get("status"), "label": ua.get("label"), "reason": ua.get("reason", ""),
            "code": ua.get("code", ""), "counted": bool(ua.get("counted")), "seeded_by": ua.get("seeded_by"),
            "duplicate_of": ua.get("duplicate_of"), "params": dict(t.params), "point": ua.get("point"),
            "estimate": ua.get("estimate"), "measured": ua.get("measured"), "wall_s": ua.get("wall_s")}


def collect_result(study, opts: TuneOptions, resumed: bool, stop_reason: str, size: int) -> TuneResult:
    rows = [trial_record(t) for t in study.get_trials(deepcopy=False)]
    ok = [r for r in rows if r["state"] == "COMPLETE" and r["duplicate_of"] is None]
    best = None
    if ok:
        pick = max if direction(opts.objective) == "maximize" else min
        best = pick(ok, key=lambda r: (r["value"], -r["number"]) if pick is max else (r["value"], r["number"]))
    return TuneResult(out_dir=opts.out_dir, resumed=resumed, trials=rows, best=best,
                      evaluated=sum(1 for r in rows if r["counted"]), stop_reason=stop_reason, space_size=size)
