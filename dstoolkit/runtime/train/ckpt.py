"""Atomic, verified DeepSpeed checkpoints: stage, hash, rename; on resume skip a truncated/corrupt one.

Layout under the checkpoint root:
    step_00000010/            one DeepSpeed checkpoint (engine.save_checkpoint tag) + dstoolkit_manifest.json
    latest                    DeepSpeed's own pointer file (written atomically, for `load_checkpoint(root)`)
    config.json               the transformers model's HF config (a --shrink run), where `dstoolkit ckpt export` and
                              `reshard` look for it (`CheckpointManager.write_model_config`)
    zero_to_fp32.py           DeepSpeed's recovery scripts (`RECOVERY_SCRIPTS`), where DeepSpeed puts them: the save dir
    .staging/                 where a checkpoint is written before it is renamed into place (emptied by the next save
                              and when a run takes the folder: `CheckpointManager.clear_staging`)
A checkpoint counts only when its manifest exists and every file matches its recorded size and SHA-256,
so a rank killed mid-save, a truncated file or flipped bytes make `latest_valid` fall back to the previous one.
The rename is atomic on one filesystem; multi-node runs need a shared filesystem for the checkpoint root.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.names import DSTOOLKIT_MANIFEST as MANIFEST_NAME  # one name: written here, read by ckpt inspect
from dstoolkit.ckpt.names import TRAINER_TAG_PREFIX as TAG_PREFIX  # one prefix: written here, told apart by inspect
from dstoolkit.common.atomic import atomic_write_text
from dstoolkit.common.filehash import sha256_file
from dstoolkit.runtime.ckpt.export import CONFIG_NAME  # one name: written here, read by ckpt export (find_config)
from dstoolkit.runtime.ckpt.outputs import is_enospc
from dstoolkit.runtime.train.run_match import MANIFEST_KEY as RUN_KEY, manifest_run

STAGING = ".staging"
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
"""What DeepSpeed copies into the folder it saves to beside the tag, ZeRO checkpoints only (deepspeed/runtime/
engine.py `_save_zero_checkpoint` -> `_copy_recovery_script(save_path)`): moved from .staging to the root."""
_ABSENT = object()
ROLLBACK_STATE = "rollback_state"  # manifest key: the guard's state right after a rollback to it (record_rollback)


def tag_for(step: int) -> str:
    return f"{TAG_PREFIX}{step:08d}"


def step_of(tag: str) -> Optional[int]:
    if not tag.startswith(TAG_PREFIX):
        return None
    try:
        return int(tag[len(TAG_PREFIX):])
    except ValueError:
        return None


def step_tags(root: Path) -> list[str]:
    """The checkpoint tag folders (step_*) in `root`, newest first; [] when `root` is not a folder."""
    if not root.is_dir():
        return []
    out = [p.name for p in root.iterdir() if p.is_dir() and step_of(p.name) is not None]
    return sorted(out, key=lambda t: step_of(t), reverse=True)


def write_manifest(ckpt_dir: Path, meta: dict) -> dict:
    files = {}
    for p in sorted(ckpt_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST_NAME:
            files[str(p.relative_to(ckpt_dir))] = {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {"format": 1, "files": files, **meta}
    atomic_write_text(ckpt_dir / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def verify(ckpt_dir: Path) -> Optional[str]:
    """None when the checkpoint is complete and intact, else the first reason it is not: the manifest's one
    reader, `dstoolkit.ckpt.manifest.verify_manifest` (what `dstoolkit ckpt inspect` checks), every file's size and
    SHA-256 against it."""
    from dstoolkit.ckpt.info import CheckpointInfo
    from dstoolkit.ckpt.manifest import verify_manifest

    info = CheckpointInfo(root=ckpt_dir.parent, tag_dir=ckpt_dir, format="dstoolkit-trainer", tag=ckpt_dir.name)
    verify_manifest(ckpt_dir, info)
    if not info.problems:
        return None
    first = Path(info.problems[0].file)
    where = first.relative_to(ckpt_dir) if first.is_relative_to(ckpt_dir) else first
    return f"{ckpt_dir.name}: {where} {info.problems[0].problem}"


def read_manifest(ckpt_dir: Path) -> dict:
    return json.loads((ckpt_dir / MANIFEST_NAME).read_text())


@dataclass(frozen=True)
class Found:
    """Result of a search for a usable checkpoint."""

    tag: Optional[str]
    step: Optional[int]
    rejected: list[str]
    """Reasons for each newer checkpoint that was passed over."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (raised on every rank; the message is one line, with the fix)."""


LOW_SPACE_BYTES = 64 << 20
"""Free bytes under which a failed save is put down to a full disk: torch's zip writer reports a short write as
`[enforce fail at inline_container.cc] unexpected pos`, without errno, so the free space decides (read after the
failure, before the partial files are removed)."""


def save_failure_message(final: Path, staged: Path, error: Optional[BaseException], names: Any = None) -> str:
    """The one line for a failed save of checkpoint `final` (staged in `staged`; `error`: this rank's exception, None
    when another rank's save failed). `names`: how the caller names the folder, `keep` and the resume
    (`names.Names`; default the command line's flags)."""
    from dstoolkit.runtime.train.names import CLI

    names = names or CLI
    try:
        usage = shutil.disk_usage(staged.parent if staged.parent.exists() else final.parent)
    except OSError:
        usage = None
    full = is_enospc(error) or (usage is not None and usage.free < LOW_SPACE_BYTES)
    removed = f"the partial save ({staged}) is removed"
    if full:
        free = f" ({usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.1f} MiB)" if usage else ""
        return (f"checkpoint {final}: no space left on device{free}; {removed}. Free space, keep fewer checkpoints "
                f"(a lower {names.keep}), or give {names.dir} a folder on a larger disk, then rerun with {names.resume}")
    why = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}" \
        if error is not None else "another rank's save failed"
    return f"checkpoint {final}: could not be written ({why}); {removed}. Check that {names.dir} is writable"


def any_rank_failed(failed: bool) -> bool:
    """Whether any rank failed (`failed`: this rank's flag): a MAX all-reduce when torch.distributed is up (every
    rank must call it), else `failed`."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return failed
    on_gpu = dist.get_backend() == "nccl" and torch.cuda.is_available()
    flag = torch.tensor([1 if failed else 0], dtype=torch.int32,
                        device=torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def check_keep(keep: object) -> None:
    """`keep` (checkpoints kept on disk) must be a whole number >= 1 (`SettingError` names it)."""
    from dstoolkit.runtime.train.spike import check_int

    check_int("keep", keep, 1, "the newest checkpoints kept on disk; the newest healthy one is kept as well",
              where="checkpoints")


def _healthy(ckpt_dir: Path) -> bool:
    try:
        return read_manifest(ckpt_dir).get("healthy") is True
    except (OSError, ValueError, AttributeError):
        return False


class CheckpointManager:
    """Save and find DeepSpeed checkpoints atomically under one root. Pruning keeps the newest `keep` and,
    beyond them, the newest healthy one (the rollback target a run of cool-down saves would otherwise push out).
    A rollback (`record_rollback`) removes the abandoned trajectory's newer checkpoints, points `latest` at its
    target and records the offending data positions there, so a resume before the next save neither loads the
    abandoned state nor replays those batches (`rollback_skips`)."""

    def __init__(self, root: os.PathLike | str, *, keep: int = 3, rank: int = 0, names: Any = None) -> None:
        check_keep(keep)
        self.root = Path(root)
        self.keep = keep
        self.rank = rank
        self.names = names
        """How the caller names the folder, `keep` and the resume in messages (`names.Names`; None: the
        command line's flags)."""
        self.root.mkdir(parents=True, exist_ok=True)

    def tags(self) -> list[str]:
        """Checkpoint tags, newest first."""
        return step_tags(self.root)

    def save(self, engine: Any, step: int, client_state: dict, *, healthy: bool, barrier: Any) -> str:
        """Write `engine`'s checkpoint for `step` to staging, verify, then rename it into place.

        Args:
            engine: the DeepSpeed engine.
            step: completed optimizer steps (the tag).
            client_state: trainer state stored with the checkpoint (data position, guard, ...).
            healthy: whether the spike guard considers this state a valid rollback target.
            barrier: callable synchronising all ranks (whether any rank's save failed: `any_rank_failed`, an
                all-reduce when a process group is up).

        Raises:
            CheckpointSaveError: on every rank when the save failed on any (a full disk, an unwritable folder):
                the staging folder is removed and the message names the checkpoint and, when the disk is full, says
                so (torch's own message is `inline_container.cc ... unexpected pos`).
        """
        tag = tag_for(step)
        staging = self.root / STAGING
        # precision, ep size and parameters, what a resume compares before loading (resume_check.run_refusal)
        run = manifest_run(engine)
        if self.rank == 0:
            self.clear_staging()
            staging.mkdir(parents=True, exist_ok=True)
        barrier()
        error: Optional[BaseException] = None
        try:
            engine.save_checkpoint(str(staging), tag=tag, client_state=client_state, save_latest=False)
        except (OSError, RuntimeError) as exc:  # a write failed (torch.save: RuntimeError; open/makedirs: OSError)
            error = exc
            barrier()  # stands in for save_checkpoint's closing dist.barrier(), which the other ranks reach
        if any_rank_failed(error is not None):
            self._abandon(staging / tag, error, barrier)
        barrier()
        if self.rank == 0:
            try:
                self._commit(staging / tag, step, healthy, run)
            except OSError as exc:
                error = exc
        if any_rank_failed(error is not None):
            self._abandon(staging / tag, error, barrier)
        barrier()
        return tag

    def _commit(self, staged: Path, step: int, healthy: bool, run: Optional[dict] = None) -> None:
        """Rank 0: manifest (with `run`, `run_match.manifest_run`, when known), rename into place, `latest`, prune."""
        write_manifest(staged, {"step": step, "healthy": healthy, **({RUN_KEY: run} if run is not None else {})})
        final = self.root / staged.name
        if final.exists():  # re-saving a step after a rollback: swap the old copy out first
            trash = self.root / f".trash-{staged.name}"
            shutil.rmtree(trash, ignore_errors=True)
            os.replace(final, trash)
            os.replace(staged, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(staged, final)
        for script in RECOVERY_SCRIPTS:  # `python <root>/zero_to_fp32.py <root> out`, as DeepSpeed lays it out
            if (staged.parent / script).is_file():
                os.replace(staged.parent / script, self.root / script)
        try:
            staged.parent.rmdir()
        except OSError:
            pass
        atomic_write_text(self.root / "latest", staged.name)
        self._prune()

    def clear_staging(self) -> list[str]:
        """Rank 0: remove what a save killed mid-way (SIGTERM, a lost node) left in .staging -- partial tags no resume
        loads, possibly GBs -- and .staging itself. Call only while this run holds the folder (its writer lock):
        before each save, and when a run takes the folder. Returns the names removed."""
        staging = self.root / STAGING
        if self.rank != 0 or not staging.is_dir():
            return []
        names = sorted(p.name for p in staging.iterdir())
        shutil.rmtree(staging, ignore_errors=True)
        return names

    def _abandon(self, staged: Path, error: Optional[BaseException], barrier: Any) -> None:
        """Every rank, once any rank's save failed: the reason (the free space read before the debris goes), rank 0
        removes the staging folder, then the same error everywhere."""
        message = save_failure_message(self.root / staged.name, staged, error, self.names)
        barrier()
        if self.rank == 0:
            shutil.rmtree(staged, ignore_errors=True)
            try:
                staged.parent.rmdir()  # .staging itself, when nothing else is in it
            except OSError:
                pass
        barrier()
        raise CheckpointSaveError(message) from error

    def _prune(self) -> None:
        tags = self.tags()
        kept = set(tags[:self.keep])
        kept.update(next(([t] for t in tags if _healthy(self.root / t)), []))  # the newest healthy one
        for tag in tags:
            if tag not in kept:
                shutil.rmtree(self.root / tag, ignore_errors=True)

    def write_model_config(self, text: str) -> str:
        """Write `text` (the model's HF config, JSON) as config.json beside the tags, atomically (rank 0), where
        `dstoolkit ckpt export` finds it without --config. Returns "written", or "kept" when the same config is
        already there (a resumed run; the transformers version it was written with aside).

        Raises:
            FileExistsError: a different config.json is there (another model's, or the user's own): it is never
                overwritten; the message names the file, the fields that differ and the fix.
        """
        path = self.root / CONFIG_NAME
        want = json.loads(text)
        if path.exists():
            try:
                have = json.loads(path.read_bytes().decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                have, why = None, f"is not readable JSON ({type(exc).__name__})"
            if isinstance(have, dict):
                differ = sorted(k for k in set(have) | set(want) if k != "transformers_version"
                                and have.get(k, _ABSENT) != want.get(k, _ABSENT))
                if not differ:
                    return "kept"
                why = (f"describes another model: {', '.join(differ[:5])}{' ...' if len(differ) > 5 else ''} "
                       "differ from the model this run trains")
            elif have is not None:
                why = f"holds a JSON {type(have).__name__}, not a model config"
            raise FileExistsError(f"{path} {why}; `dstoolkit ckpt export` reads the config.json beside the tags, so "
                                  "it is not overwritten: move it away or give this run another --checkpoint-dir")
        if self.rank == 0:
            atomic_write_text(path, text)
        return "written"

    def record_rollback(self, tag: str, skip_positions: list[int], after_state: Optional[dict] = None) -> None:
        """After a rollback to `tag` (rank 0 writes; call it on every rank): the newer checkpoints (the abandoned
        trajectory) are removed, `latest` names `tag`, and `skip_positions` and the guard's state after the rollback
        (`after_state`: `spike.Rollback.after_state`, the newest rollback's) are recorded in its manifest."""
        if self.rank != 0:
            return
        step = step_of(tag)
        for newer in self.tags():
            if step_of(newer) > step:
                shutil.rmtree(self.root / newer, ignore_errors=True)
        manifest = read_manifest(self.root / tag)
        manifest["rollback_skip_positions"] = sorted(set(manifest.get("rollback_skip_positions", []))
                                                     | set(skip_positions))
        if after_state is not None:
            manifest[ROLLBACK_STATE] = after_state
        atomic_write_text(self.root / tag / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True))
        atomic_write_text(self.root / "latest", tag)

    def rollback_state(self, tag: str) -> Optional[dict]:
        """The guard's state right after the newest rollback to `tag` (`record_rollback`), None when there was none;
        a resume from `tag` continues from it (`spike.Rollback.restore`)."""
        from dstoolkit.runtime.train.spike import Rollback, SpikeGuard

        raw = read_manifest(self.root / tag).get(ROLLBACK_STATE)
        want = Rollback(SpikeGuard()).after_state()
        if raw is None or (isinstance(raw, dict) and raw.keys() == want.keys() and all(
                isinstance(raw[k], dict) and raw[k].keys() == want[k].keys() for k in want)):
            return raw
        raise RuntimeError(f"{self.root / tag / MANIFEST_NAME}: {ROLLBACK_STATE} is {str(raw)[:80]}, not a guard "
                           "state after a rollback; remove that key (a resume then starts without the rollback's LR "
                           "cool-down)")

    def rollback_skips(self, tag: str) -> set[int]:
        """Data positions rollbacks to `tag` marked offending (`record_rollback`); add them when loading it."""
        raw = read_manifest(self.root / tag).get("rollback_skip_positions", [])
        if not isinstance(raw, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in raw):
            raise RuntimeError(f"{self.root / tag / MANIFEST_NAME}: rollback_skip_positions is {str(raw)[:80]}, not "
                               "a list of data positions; fix or remove that key (the batches it listed are then "
                               "replayed)")
        return set(raw)

    def latest_valid(self, *, max_step: Optional[int] = None, require_healthy: bool = False) -> Found:
        """Newest intact checkpoint (optionally at or before `max_step`, optionally healthy only)."""
        rejected = []
        for tag in self.tags():
            step = step_of(tag)
            if max_step is not None and step > max_step:
                continue
            reason = verify(self.root / tag)
            if reason is None and require_healthy and not read_manifest(self.root / tag).get("healthy", False):
                reason = f"{tag}: saved while the spike guard was cooling down (not a rollback target)"
            if reason is None:
                return Found(tag, step, rejected)
            rejected.append(reason)
        return Found(None, None, rejected)


HF_MARKER = "dstoolkit_guard.json"
"""The HF callback's file in each Trainer checkpoint-N: the healthy flag and the guard's state."""


class HfCheckpoints:
    """The Trainer's checkpoint-N folders, as `Rollback` expects a checkpoint manager."""

    def __init__(self, output_dir: str) -> None:
        self.root = Path(output_dir)

    def latest_valid(self, *, max_step: Optional[int] = None, require_healthy: bool = False):
        rejected = []
        dirs = []
        for p in self.root.glob("checkpoint-*"):
            try:
                dirs.append((int(p.name.split("-")[1]), p))
            except (IndexError, ValueError):
                continue
        for step, p in sorted(dirs, reverse=True):
            if max_step is not None and step > max_step:
                continue
            marker = p / HF_MARKER
            if not marker.is_file() or not (p / "latest").is_file():
                rejected.append(f"{p.name}: no {HF_MARKER} / DeepSpeed 'latest' (saved without the callback or "
                                "incomplete)")
                continue
            if require_healthy and not json.loads(marker.read_text()).get("healthy"):
                rejected.append(f"{p.name}: saved while the spike guard was cooling down (not a rollback target)")
                continue
            return Found(str(p), step, rejected)
        return Found(None, None, rejected)
