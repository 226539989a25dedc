"""The result of inspecting a checkpoint (split from dstoolkit.ckpt.inspect): `CheckpointInfo`, the `Problem`s
that make a checkpoint incomplete, each rank's files, and `load_meta` (a torch file's pickled metadata, or a
Problem). No torch import."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.torchzip import TorchFileError, read_meta


@dataclass(frozen=True)
class Problem:
    """One thing that makes the checkpoint incomplete: the file and what is wrong with it."""

    file: str
    problem: str
    fix: str = ""
    """What to do about this file when it is not "pick an older tag or re-save" (`incomplete_fix`); '' otherwise."""


@dataclass(frozen=True)
class RankFiles:
    """The files one data-parallel (or pipeline/expert) rank wrote, and their bytes on disk."""

    rank: int
    files: tuple[str, ...]
    bytes: int


@dataclass
class CheckpointInfo:
    """The inspection of one checkpoint tag."""

    root: Path
    """The folder holding the tag folders (and `latest`)."""
    tag_dir: Path
    format: str
    """deepspeed-zero | deepspeed-universal | deepspeed-pipeline | deepspeed-moe | hf-trainer | dstoolkit-trainer."""
    tag: str
    step: Optional[int] = None
    tags: list[str] = field(default_factory=list)
    """Every tag (or checkpoint-N) found beside this one, newest first."""
    world_size: Optional[int] = None
    dp: Optional[int] = None
    tp: Optional[int] = None
    pp: Optional[int] = None
    ep: Optional[int] = None
    zero_stage: Optional[int] = None
    num_experts: Optional[list[int]] = None
    dtypes: dict[str, str] = field(default_factory=dict)
    """Kind of state -> dtype: model (as the module states hold them), master (fp32 partitions), optimizer."""
    optimizer_states: bool = False
    scheduler: bool = False
    offload: Optional[str] = None
    """The ds_config's offload_optimizer device when the run offloaded (files are the same)."""
    offload_param: Optional[str] = None
    """The ds_config's offload_param device (ZeRO-3 parameter offload) when the run offloaded (files are the same)."""
    ranks: list[RankFiles] = field(default_factory=list)
    shared_bytes: int = 0
    """Bytes of files no single rank owns (model states written by rank 0 under ZeRO 0-2, expert files, universal)."""
    total_bytes: int = 0
    model_state_bytes: int = 0
    optimizer_state_bytes: int = 0
    other_bytes: int = 0
    """Bytes of the files that hold no tensors (the project's manifest, a config.json): total = model states +
    optimizer states + other."""
    complete: bool = True
    problems: list[Problem] = field(default_factory=list)
    manifest_verified: Optional[bool] = None
    manifest_problem: Optional[str] = None
    """What stopped the manifest check, in a few words, when `manifest_verified` is False: the manifest is missing,
    not valid JSON, damaged or empty, or how many listed files are missing, of another size or fail their SHA-256
    (each file is named in `problems`)."""
    manifest_absent: Optional[str] = None
    """Why a step_* tag has no `dstoolkit_manifest.json` to verify when nothing in its folder was saved by `dstoolkit
    train` (DeepSpeed tags named like the trainer's, from a loop of one's own), and what was checked instead; None
    otherwise (`manifest.absent_manifest`)."""
    resume_tag: Optional[str] = None
    """For the dstoolkit trainer's --checkpoint-dir: the tag `dstoolkit train --resume` would load (the trainer's
    own choice, the newest intact tag, whatever `latest` names); None for other formats or when none is loadable.
    Set by `dstoolkit ckpt inspect` (the choice is the runtime's), not by `inspect_checkpoint`."""
    deepspeed_version: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["root"], d["tag_dir"] = str(self.root), str(self.tag_dir)
        return d


def load_meta(path: Path, info: CheckpointInfo) -> Optional[Any]:
    try:
        return read_meta(path)
    except TorchFileError as exc:
        info.problems.append(Problem(str(path), str(exc)))
        return None


def incomplete_fix(info: CheckpointInfo, verb: str) -> str:
    """The advice `ckpt export` / `ckpt reshard` give when `info` is incomplete, from its first problem (the one they
    name): that problem's own fix (a leftover rank file: move it away), else re-save or pick an older tag."""
    first = info.problems[0] if info.problems else None
    if first is not None and first.fix:
        return first.fix
    return (f"{verb} a complete checkpoint: pick an older tag (`dstoolkit ckpt inspect` lists them) or re-save it")
