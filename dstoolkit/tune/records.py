"""A study on disk: the output folder (created, resumed, or refused when it holds another study), the SQLite
study's fingerprint, each trial's record in its user attributes, trials left RUNNING by an interrupt closed,
and the finished study read back as a `TuneResult`.
"""
from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any, Optional

from dstoolkit.tune.objective import TrialOutcome, direction
from dstoolkit.tune.options import TuneOptions, TuneResult
from dstoolkit.tune.space import TuneInputError, TunePoint, TuneSpace


STUDY_DB = "study.db"


STUDY_NAME = "dstoolkit-tune"


TRIALS_DIR = "trials"


OUTPUT_FILES = ("best_ds_config.json", "best_spec.yaml", "report.md", "report.json", "objective_vs_trial.png")


FINGERPRINT_ATTR = "dstoolkit_fingerprint"


def prepare_out_dir(out_dir: pathlib.Path, fingerprint: str, force: bool) -> bool:
    """Create or reuse the output folder. Returns True when an existing study is resumed. A file at or above
    ``out_dir`` was refused before (`options.check_out_dir`, from `check_options`).

    Raises:
        TuneInputError: the folder holds something else (or another study) and --force was not given.
    """
    db = out_dir / STUDY_DB
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
    # optional extra (dstoolkit[tune]): loaded only when a study runs
    import optuna

    try:
        s = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{db}")
    except Exception:  # not an optuna database, or no study of that name
        return None
    return s.user_attrs.get(FINGERPRINT_ATTR)


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
    # optional extra (dstoolkit[tune]): loaded only when a study runs
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
    # optional extra (dstoolkit[tune]): loaded only when a study runs
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
