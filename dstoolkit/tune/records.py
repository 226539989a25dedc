"""A study on disk: the output folder (created, resumed, or refused when it holds another study, or files tune
did not write that --force or a resume would delete or overwrite: `manifest`), the SQLite study's fingerprint, each
trial's record in its user attributes, trials left RUNNING by an interrupt closed, and the finished study read back
as a `TuneResult`.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Optional

from dstoolkit.tune.manifest import Manifest, files_under, name_files
from dstoolkit.tune.objective import TrialOutcome, direction
from dstoolkit.tune.options import TuneOptions, TuneResult
from dstoolkit.tune.space import TuneInputError, TunePoint, TuneSpace


STUDY_DB = "study.db"


STUDY_NAME = "dstoolkit-tune"


TRIALS_DIR = "trials"


OUTPUT_FILES = ("best_ds_config.json", "best_spec.yaml", "report.md", "report.json", "objective_vs_trial.png")


COMMAND_FILE = "command.json"
"""The user's command of a `tune ... -- COMMAND` study (cli/tune.py writes it)."""


SQLITE_COMPANIONS = ("-journal", "-wal", "-shm")
"""Files SQLite keeps beside the database (a hot journal after a crash): they go with it."""


REWRITTEN = (*OUTPUT_FILES, COMMAND_FILE)
"""The files a resumed study writes again."""


FINGERPRINT_ATTR = "dstoolkit_fingerprint"


def prepare_out_dir(out_dir: pathlib.Path, fingerprint: str, force: bool) -> bool:
    """Create or reuse the output folder. Returns True when an existing study is resumed. A file at or above
    ``out_dir`` was refused before (`options.check_out_dir`, from `check_options`).

    With --force a new study replaces tune's own files (`replaced_files`: the database, the outputs, the command file,
    trials/), and only those; a resumed study rewrites the outputs. Either is refused, naming the files, while one
    of the files it would delete or overwrite was not written by tune or was edited since (`manifest`).

    Raises:
        TuneInputError: the folder holds something else (or another study) and --force was not given, or files
            --force or the resume would delete or overwrite that tune did not write.
    """
    db = out_dir / STUDY_DB
    if out_dir.is_dir() and any(out_dir.iterdir()):
        manifest = Manifest(out_dir)
        if force:
            legacy = not manifest.exists and db.is_file() and _stored_fingerprint(db) is not None
            rels = replaced_files(out_dir)
            lost = [rel for rel in rels if not _owned(manifest, rel, legacy)]
            if lost:
                raise TuneInputError(
                    f"--out {out_dir}: --force would delete or overwrite {len(lost)} file(s) dstoolkit tune did not "
                    f"write (or that were edited since it wrote them): {name_files(lost)}; move them out of the "
                    "folder, or choose another --out (--force replaces only tune's own files)")
            _remove(out_dir, rels)
            manifest.path.unlink(missing_ok=True)  # the new study lists what it writes (a new manifest)
            return False
        if not db.is_file():
            raise TuneInputError(f"--out {out_dir}: folder is not empty and holds no study ({STUDY_DB}); choose an "
                                 "empty folder or pass --force to write into it")
        other = _stored_fingerprint(db)
        if other != fingerprint:
            raise TuneInputError(
                f"--out {out_dir}: holds a study of a different spec/objective/mode/space (fingerprint {other}, this "
                f"run {fingerprint}); pass --force to replace it, or choose another --out")
        legacy = not manifest.exists
        edited = [rel for rel in REWRITTEN if os.path.lexists(out_dir / rel) and not _owned(manifest, rel, legacy)]
        if edited:
            one = len(edited) == 1
            raise TuneInputError(
                f"--out {out_dir}: {name_files(edited)} {'was' if one else 'were'} not written by dstoolkit tune or "
                f"{'was' if one else 'were'} edited since, and resuming the study would overwrite "
                f"{'it' if one else 'them'}: move {'it' if one else 'them'} out of the folder, then rerun")
        if legacy:  # written before tune kept a manifest: its database is tune's (the fingerprint matched)
            manifest.record([STUDY_DB], pinned=False)
        return True
    out_dir.mkdir(parents=True, exist_ok=True)
    return False


def replaced_files(out_dir: pathlib.Path) -> list[str]:
    """The existing files (relative POSIX paths) a new study started with --force deletes or overwrites: the
    database and SQLite's files beside it, the outputs, the command file, and everything under trials/."""
    names = [STUDY_DB, *(STUDY_DB + c for c in SQLITE_COMPANIONS), *REWRITTEN]
    rels = [n for n in names if os.path.lexists(out_dir / n)]
    trials = out_dir / TRIALS_DIR
    if os.path.lexists(trials) and (trials.is_symlink() or not trials.is_dir()):
        rels.append(TRIALS_DIR)
    rels += [p.relative_to(out_dir).as_posix() for p in files_under(trials)]
    return rels


def _owned(manifest: Manifest, rel: str, legacy: bool) -> bool:
    """`rel` was written by tune and is unchanged since. SQLite's files beside the database go with it. A folder
    without a manifest (`legacy`: written by an older dstoolkit, holding its study) owns the names tune always
    rewrote, not trials/ (what is in there cannot be told apart from the user's)."""
    if rel.startswith(STUDY_DB + "-") and rel[len(STUDY_DB):] in SQLITE_COMPANIONS:
        rel = STUDY_DB
    if manifest.exists:
        return manifest.owns(rel)
    return legacy and rel in (STUDY_DB, *REWRITTEN)


def _remove(out_dir: pathlib.Path, rels: list[str]) -> None:
    """Delete `rels` (tune's own files, checked by the caller), then the folders under `out_dir` they leave empty."""
    parents: set[pathlib.Path] = set()
    for rel in rels:
        path = out_dir / rel
        path.unlink(missing_ok=True)
        parents.update(p for p in path.parents if out_dir in p.parents)
    for folder in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only when empty: a folder of the user's stays
        except OSError:
            pass


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


def within_headroom(row: dict[str, Any]) -> bool:
    """The trial's estimate leaves the spec's memory headroom (cluster.memory_headroom_fraction), by the sweep's rule
    (`CandidateEstimate.within_headroom`); a record without the field (an older study) counts as leaving it."""
    return bool((row.get("estimate") or {}).get("within_headroom", True))


def collect_result(study, opts: TuneOptions, resumed: bool, stop_reason: str, size: int) -> TuneResult:
    """The study read back. The best trial is picked among those that leave the memory headroom, as `sweep` ranks
    them first; only when none does is it picked among the rest (and a note says so). A trial whose record has no
    `within_headroom` (an older study, a trial with no estimate) counts as leaving it. Under --shrink there is no
    headroom pick (the estimates are the shrunk model's)."""
    rows = [trial_record(t) for t in study.get_trials(deepcopy=False)]
    ok = [r for r in rows if r["state"] == "COMPLETE" and r["duplicate_of"] is None]
    best = None
    pick = max if direction(opts.objective) == "maximize" else min

    def best_of(rs):
        return pick(rs, key=lambda r: (r["value"], -r["number"]) if pick is max else (r["value"], r["number"]))

    # --shrink: the estimates describe the shrunk model the trials train, not the layout best_spec.yaml writes for
    # the spec's own model, so they cannot say whether that layout leaves the headroom: no headroom pick
    judge = not opts.shrink
    if ok:
        best = best_of([r for r in ok if within_headroom(r)] or ok) if judge else best_of(ok)
    result = TuneResult(out_dir=opts.out_dir, resumed=resumed, trials=rows, best=best,
                        evaluated=sum(1 for r in rows if r["counted"]), stop_reason=stop_reason, space_size=size)
    if best is not None and judge:
        result.notes += headroom_notes(best, best_of(ok), opts)
    return result


def headroom_notes(best: dict[str, Any], best_any: dict[str, Any], opts: TuneOptions) -> list[str]:
    """What the memory headroom decided, for stdout and report.md: a better trial passed over, or a best that cannot
    leave the headroom (no evaluated trial does)."""
    e = best.get("estimate") or {}
    if not e.get("device_memory_bytes"):
        return []
    gib = 2**30
    pct = 100 * e["headroom_bytes"] / e["device_memory_bytes"]
    if not within_headroom(best):
        return [f"caution: {e['memory_per_rank_bytes'] / gib:.1f} GiB of {e['device_memory_bytes'] / gib:.1f} GiB per "
                f"rank is outside the {pct:.0f}% memory headroom (cluster.memory_headroom_fraction); no evaluated "
                "trial leaves it"]
    if best_any is not best:
        o = best_any.get("estimate") or {}
        unit = "tok/s" if opts.objective == "throughput" else "bytes per rank"
        return [f"passed over for the {pct:.0f}% memory headroom (cluster.memory_headroom_fraction): trial "
                f"#{best_any['number']} {best_any['label']} ({best_any['value']:,.0f} {unit}, "
                f"{o.get('memory_per_rank_bytes', 0) / gib:.1f} GiB of {o.get('device_memory_bytes', 0) / gib:.1f} GiB)"]
    return []
