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

This module is the loop; beside it: the options and the space loaded (`options`), the seeding (`seeding`), the
study on disk and its records (`records`), the report (`report`).
"""
from __future__ import annotations

import logging
import random
import warnings
from typing import Callable, Optional

from dstoolkit.runtime.bench.harness import progress_bar
from dstoolkit.tune.manifest import Manifest
from dstoolkit.tune.objective import TrialOutcome, direction, estimate_summary, run_estimate_trial, run_real_trial
from dstoolkit.tune.options import TuneOptions, TuneResult, _fingerprint, _load_space, check_options
from dstoolkit.tune.records import (FINGERPRINT_ATTR, REC_ATTR, STUDY_DB, STUDY_NAME, TRIALS_DIR, _close_interrupted,
                                    _known, _outcome_attrs, _rec, collect_result, prepare_out_dir)
from dstoolkit.tune.report import write_outputs as _write
from dstoolkit.tune.seeding import (MAX_SEED_TRIALS, default_seed_trials, estimator_ranking, one_per_layout,
                                    seed_band_size)
from dstoolkit.tune.space import PointCheck, TuneInputError, TunePoint

FULL_SCAN_MAX_POINTS = 2000  # spaces up to this size are checked point by point for the seed ranking
MAX_TRIALS_PER_BUDGET = 20  # cap on all trials (pruned and duplicates included) per unit of budget ...
MAX_TRIALS_FLOOR = 200  # ... and at least this many
FALLBACK_AFTER = 8  # proposals in a row that were pruned or already evaluated before an untried ranked point is queued
POOL_PER_BUDGET = 4  # estimator-ranked points kept as the fallback pool, per unit of budget (at least 20)

log = logging.getLogger("dstoolkit.tune")




def seed_plan(opts: TuneOptions, spec, space, world: int):
    """(checks of a full scan or None, every check made, the estimator-ranked pool, how many of its layouts seed the
    study): the seeds are `one_per_layout(pool, n_seed)`."""
    checks: Optional[dict[str, PointCheck]] = None
    if space.size <= FULL_SCAN_MAX_POINTS:
        checks = {p.key: space.check(p, world_size=world) for p in space.points()}
    pool_size = len(checks) if checks is not None else max(20, POOL_PER_BUDGET * opts.budget)
    check_cache: dict[str, PointCheck] = dict(checks or {})
    pool = estimator_ranking(space, opts.objective, checks, pool_size, world_size=world, cache=check_cache)
    if opts.seed_trials is not None:
        n_seed = opts.seed_trials
    else:  # the estimator's ties (within SEED_BAND_FRACTION of its best) are worth real trials first
        head = [check_cache[p.key] for p in one_per_layout(pool, MAX_SEED_TRIALS + 1)]  # layouts, not variants
        n_seed = default_seed_trials(opts.budget, seed_band_size(head, opts.objective, spec))
    return checks, check_cache, pool, n_seed


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
    # optional extra (dstoolkit[tune]): loaded only when a study runs
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
    checks, check_cache, pool, n_seed = seed_plan(opts, spec, space, world)
    n_startup = opts.startup_trials if opts.startup_trials is not None else n_seed + 2
    sampler = optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=n_startup, multivariate=True, group=True)
    storage = f"sqlite:///{(opts.out_dir / STUDY_DB).resolve()}"
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction=direction(opts.objective),
                                sampler=sampler, load_if_exists=True)
    Manifest(opts.out_dir).record([STUDY_DB], pinned=False)  # tune's own: --force may replace it
    if not resumed:
        study.set_user_attr(FINGERPRINT_ATTR, fp)
        study.set_user_attr("spec", str(opts.spec_path))
        study.set_user_attr("objective", opts.objective)
        study.set_user_attr("mode", opts.mode)
        study.set_user_attr("space", {k: [str(x) for x in v] for k, v in space.dimensions().items()})
        study.set_user_attr("space_size", size)
        seeds = one_per_layout(pool, n_seed)
        for p in seeds:
            study.enqueue_trial(space.params_of(p), user_attrs={"seeded_by": "estimator ranking"})
        study.set_user_attr("seeded", [p.label for p in seeds])
    else:
        started = study.user_attrs.get("seed")
        if started is not None and started != opts.seed:
            raise TuneInputError(
                f"--seed {opts.seed}: the study in {opts.out_dir} was started with --seed {started} and its trials "
                f"came from that seed; rerun with --seed {started} to resume it, or pass --force (or another --out) "
                f"for a new study with --seed {opts.seed}")
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
                work_dir = opts.out_dir / TRIALS_DIR / f"{trial.number:04d}"
                try:
                    out = run_real_trial(space, chk, work_dir, objective=opts.objective, ranks=world,
                                         steps=opts.steps, skip_steps=opts.skip_steps,
                                         timeout_s=opts.trial_timeout_s, launcher=opts.launcher, shrink=opts.shrink)
                finally:  # interrupted too: what the trial wrote is tune's (--force may delete it)
                    Manifest(opts.out_dir).record_tree(work_dir)
            _outcome_attrs(trial, out, point, counted=True)
            if out.status == "ok" and out.value is not None:
                study.tell(trial, out.value)
            else:
                study.tell(trial, state=TrialState.FAIL)
            update(1)
    result = collect_result(study, opts, resumed, stop_reason, size)
    if space.shrunk is not None and result.best is not None:
        result.notes.append(f"measured on the model shrunk (--shrink {opts.shrink}) at seq_len {spec.training.seq_len}; "
                            f"best_spec.yaml keeps the full model and the spec's seq_len {space.user_seq_len}")
    if write_outputs:
        result.files = _write(result, space, opts)
    return result


def _est(spec, chk: PointCheck) -> dict:
    return estimate_summary(spec, chk)


