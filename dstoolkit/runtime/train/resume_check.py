"""What a --checkpoint-dir holds, checked against the run about to start (no torch): read once by `dstoolkit train`'s
pre-flight (`preflight.check_launch`, before any rank starts) and again by each rank (a launch.sh or torchrun
started by hand), so a refused folder is one line and exit 2, never a DeepSpeed traceback per rank.

- A fresh run (no --resume) into a folder that already holds checkpoints would overwrite the tags it shares with them
  and prune the rest (`CheckpointManager.save` / `_prune`): refused (`fresh_run_refusal`).
- A --resume from a checkpoint saved at another ZeRO stage or data-parallel size fails inside DeepSpeed 0.19.8:
  another stage looks for other file names (ZeRO-3 reads zero_pp_rank_*_model_states.pt; runtime/state_dict_factory.py
  `SDLoaderFactory` then fails `assert len(self.ckpt_list) > 0`), another dp size for stages 1-3 raises in
  runtime/engine.py `_load_zero_checkpoint` ("used a DP world size of ..."). Stage 0 keeps the whole optimizer in
  mp_rank_00_model_states.pt, so its dp size may change. Refused before that (`layout_refusal`).
- A --resume from a checkpoint saved in bf16 by a run that is not (or the reverse), at another expert-parallel size,
  or of another model (parameter names / shapes) fails inside DeepSpeed too (`run_match` says where): refused before
  that (`run_refusal`; the pre-flight, which builds no model, checks the precision only).
- A universal checkpoint (`dstoolkit ckpt reshard` output: `latest_universal`, zero/<param>/ folders, no
  dstoolkit_manifest.json) is not the trainer's own format: refused, naming it (`universal_refusal`).
- A --resume whose every checkpoint is rejected would start from step 0 as if resumed: refused
  (`all_rejected_refusal`); a folder with no checkpoint at all starts from step 0.
Each rank's check of the folder it resumes from is `pick_resume`. The same refusals guard a user's own loop
(`dstoolkit.runtime.train.guard.Guard`): each message names the folder, the resume and the rank count as the caller
does (`Names`: `CLI` for the command line's flags, `GUARD` for Guard's parameters).
The layout is read from the tag's pickled metadata (`dstoolkit.ckpt.torchzip.read_meta`, as `dstoolkit ckpt inspect`
reads it): the model states' `dp_world_size` and saved ds_config, the first optimizer file's `zero_stage`; the
precision, ep size and parameters from the manifest's "run" (`run_match`), else from those files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from dstoolkit.ckpt import names as N
from dstoolkit.ckpt.torchzip import Opaque, TorchFileError, read_meta
from dstoolkit.runtime.train import run_match
from dstoolkit.runtime.train.ckpt import read_manifest, step_tags
from dstoolkit.runtime.train.names import CLI, GUARD, Names  # noqa: F401 - GUARD: the names callers import here


def reshard_fix(names: Names = CLI) -> str:
    return ("or `dstoolkit ckpt reshard` it to a universal checkpoint and load that in your own DeepSpeed trainer "
            f"with checkpoint.load_universal true ({names.who} resumes only its own checkpoints)")


RESHARD_FIX = reshard_fix()


def existing_checkpoints(root: Path | str) -> list[str]:
    """The trainer's tag folders (step_*, newest first) and pointer files (`latest`, `latest_universal`) in `root`."""
    root = Path(root)
    return step_tags(root) + [n for n in (N.LATEST, N.LATEST_UNIVERSAL) if (root / n).is_file()]


def _listed(names: Sequence[str], limit: int = 5) -> str:
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def fresh_run_refusal(root: Path | str, names: Names = CLI) -> Optional[str]:
    """Why a run without --resume must not write into `root` (None: it holds no checkpoint)."""
    found = existing_checkpoints(root)
    if not found:
        return None
    return (f"{names.where(root)}: already holds checkpoints ({_listed(found)}) and this run has no {names.resume}: "
            f"it would overwrite the tags it saves again and prune the others; {names.add_resume} (to continue from "
            f"them), or give a new {names.dir}")


@dataclass(frozen=True)
class SavedLayout:
    """How a tag was saved: ZeRO stage and data-parallel size (None: not readable), precision, ep size and model."""

    zero_stage: Optional[int]
    dp: Optional[int]
    run: run_match.RunMatch = run_match.RunMatch()


def _int(v: Any) -> Optional[int]:
    if isinstance(v, Opaque) and v.args:  # DeepSpeed pickles ZeroStageEnum
        v = v.args[0]
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _meta(path: Path) -> Any:
    try:
        return read_meta(path)
    except (TorchFileError, OSError):
        return None


def saved_layout(tag_dir: Path | str) -> SavedLayout:
    """The ZeRO stage and dp size `tag_dir` was saved at, from file names and pickled metadata (never tensors), and
    its precision, ep size and parameters (the manifest's "run", else the same metadata: `run_match.from_meta`)."""
    tag_dir = Path(tag_dir)
    files = sorted(p for p in tag_dir.iterdir() if p.is_file()) if tag_dir.is_dir() else []
    heads = [p for p in files if N.MODEL_STATES.match(p.name)] or [p for p in files
                                                                     if N.ZERO3_MODEL_STATES.match(p.name)]
    stage = dp = None
    head = _meta(heads[0]) if heads else None
    if isinstance(head, dict):
        dp = _int(head.get("dp_world_size"))
        ds = head.get("ds_config") if isinstance(head.get("ds_config"), dict) else {}
        zo = ds.get("zero_optimization") if isinstance(ds.get("zero_optimization"), dict) else {}
        stage = _int(zo.get("stage", 0))
    optim = [p for p in files if N.OPTIM_STATES.match(p.name)]
    osd = _meta(optim[0]) if optim else None
    if isinstance(osd, dict) and isinstance(osd.get("optimizer_state_dict"), dict):
        saved_stage = _int(osd["optimizer_state_dict"].get("zero_stage"))
        stage = saved_stage if saved_stage is not None else stage
    try:
        run = run_match.from_manifest(read_manifest(tag_dir))
    except (OSError, ValueError):
        run = None
    if run is None:
        run = run_match.from_meta(head, bf16_files=any(N.OPTIM_STATES.match(p.name)["bf16"] for p in optim))
    return SavedLayout(stage, dp, run)


def config_zero_stage(ds_config: Any) -> Optional[int]:
    """The ZeRO stage a DeepSpeed config runs (0 when it has no zero_optimization; None when not a whole number)."""
    zo = ds_config.get("zero_optimization", {}) if isinstance(ds_config, dict) else {}
    return _int(zo.get("stage", 0)) if isinstance(zo, dict) else None


def layout_refusal(root: Path | str, tag: str, saved: SavedLayout, zero_stage: Optional[int], world: int,
                   names: Names = CLI) -> Optional[str]:
    """Why `tag` (saved as `saved`) cannot be resumed by a run at ZeRO `zero_stage` on `world` data-parallel ranks
    (None: it can, or the saved layout is unreadable and DeepSpeed's own check stays)."""
    stage_differs = None not in (saved.zero_stage, zero_stage) and saved.zero_stage != zero_stage
    dp_differs = (saved.dp is not None and saved.dp != world and (saved.zero_stage or 0) >= 1)
    if not (stage_differs or dp_differs):
        return None
    runs = []
    if stage_differs:
        runs.append(f"ZeRO-{zero_stage}")
    if dp_differs:
        runs.append(f"dp {world}")
    dp_note = f", dp {saved.dp}" if saved.dp is not None else ""
    return (f"{names.where(root)}: {names.resume} would load {tag}, saved at ZeRO-{saved.zero_stage}{dp_note}, but this "
            f"run is {' and '.join(runs)}; DeepSpeed loads a ZeRO checkpoint only at the stage and data-parallel size "
            f"it was saved at. Resume with a ZeRO-{saved.zero_stage} config"
            + (f" and {names.nproc} {saved.dp}" if saved.dp is not None else "") + f", {reshard_fix(names)}")


def universal_refusal(root: Path | str, names: Names = CLI) -> Optional[str]:
    """Why the bundled trainer cannot resume `root`: it holds a universal checkpoint (None: it does not)."""
    root = Path(root)
    uni = [t for t in existing_checkpoints(root) if (root / t / N.UNIVERSAL_ZERO_DIR).is_dir()]
    if not uni and not (root / N.LATEST_UNIVERSAL).is_file():
        return None
    what = _listed(uni) if uni else N.LATEST_UNIVERSAL
    return (f"{names.where(root)}: holds a DeepSpeed universal checkpoint ({what}: `dstoolkit ckpt reshard` "
            f"output, zero/<param>/ folders, no dstoolkit_manifest.json), which {names.who} does not resume "
            "(it loads only its own step_* checkpoints, at the ZeRO stage and world size they were saved at): load it "
            f"in your own DeepSpeed trainer with checkpoint.load_universal true (engine.load_checkpoint), or "
            f"{names.resume} from the original checkpoint folder with the config and {names.nproc} it was saved with")


def all_rejected_refusal(root: Path | str, rejected: Sequence[str], names: Names = CLI) -> str:
    """The message for a --resume whose every checkpoint in `root` was rejected (`rejected`: one reason each)."""
    return (f"{names.where(root)}: {names.resume} found no checkpoint it can load ({len(rejected)} rejected: "
            f"{'; '.join(rejected[:3])}{' ...' if len(rejected) > 3 else ''}); check them with `dstoolkit ckpt "
            f"inspect`, or start afresh without {names.resume} in a new {names.dir}")


def resume_refusal(root: Path | str, ds_config: Any, world: int, names: Names = CLI,
                   ep: Optional[int] = None) -> Optional[str]:
    """Pre-flight for --resume (before any rank starts): a universal checkpoint, no tag the trainer saved (none has
    its manifest), or the newest such tag saved at another ZeRO stage / dp size, in another precision or (`ep`:
    the run's expert-parallel size, None: not compared) at another ep size. None: go ahead (the ranks still verify
    every file's hash, skip a damaged tag and compare the model's parameters)."""
    root = Path(root)
    problem = universal_refusal(root)
    if problem:
        return problem
    tags = step_tags(root)
    if not tags:
        return None
    own = [t for t in tags if (root / t / N.DSTOOLKIT_MANIFEST).is_file()]
    if not own:
        return all_rejected_refusal(root, [f"{t}: {N.DSTOOLKIT_MANIFEST} is missing: the save did not finish (the "
                                           "trainer writes it last)" for t in tags])
    saved = saved_layout(root / own[0])
    return (layout_refusal(root, own[0], saved, config_zero_stage(ds_config), world, names)
            or run_refusal(root, own[0], saved, run_match.RunMatch(precision=run_match.precision_of(ds_config), ep=ep),
                           names))


def run_refusal(root: Path | str, tag: str, saved: SavedLayout, current: run_match.RunMatch,
                names: Names = CLI) -> Optional[str]:
    """Why `tag` cannot be resumed by a run that trains `current` (another precision, ep size or model; None: it
    can, as far as both are known): `run_match.run_refusal` in the caller's names."""
    return run_match.run_refusal(names.where(root), names.resume, tag, saved.run, current, names.ep, names.model)


def pick_resume(mgr: Any, engine: Any, names: Names = CLI, log: Any = lambda m: None) -> tuple[Any, Optional[str]]:
    """On each rank, with the engine up: the checkpoint a resume loads from `mgr` (a `ckpt.CheckpointManager`; its
    `latest_valid()`, rejected ones logged) and why it must not (None: load `found.tag`, or start from step 0 when
    `found.tag` is None) -- a universal checkpoint, every checkpoint rejected, or one saved at another ZeRO stage /
    dp size than the DeepSpeed `engine` runs, or in another precision, at another ep size or of another model
    (`run_refusal`). The bundled trainer (`run_state.Checkpoints.resume`) and `Guard.resume`."""
    problem = universal_refusal(mgr.root, names)
    if problem:
        return None, problem
    found = mgr.latest_valid()
    for reason in found.rejected:
        log(f"resume: skipping checkpoint: {reason}")
    if found.tag is None:
        return found, all_rejected_refusal(mgr.root, found.rejected, names) if found.rejected else None
    if not hasattr(engine, "zero_optimization_stage") or getattr(engine, "dp_world_size", None) is None:
        return found, None  # not a DeepSpeed engine (a test double): its own load says what it cannot read
    saved = saved_layout(mgr.root / found.tag)
    current = run_match.of_engine(engine)
    return found, (layout_refusal(mgr.root, found.tag, saved, engine.zero_optimization_stage(), engine.dp_world_size,
                                  names)
                   or (run_refusal(mgr.root, found.tag, saved, current, names) if current is not None else None))
