"""Per-file accounting for `ckpt.inspect.inspect_checkpoint`: tensor dtypes from pickled metadata, the optimizer
bytes a ZeRO-0 model-states file holds, hard-linked names, and one problem line per file. No torch import."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.info import CheckpointInfo, Problem, load_meta
from dstoolkit.ckpt.torchzip import TensorMeta, storage_bytes_of, tensors


def dtype_of(items: list[tuple[str, TensorMeta]]) -> Optional[str]:
    kinds = sorted({t.dtype for _, t in items if t.numel or t.storage_bytes})
    return "+".join(kinds) if kinds else (items[0][1].dtype if items else None)


def hard_links(paths: list[Path]) -> dict[Path, Path]:
    """{later name: first name} for the paths that are the same file (device and inode) as an earlier one: `ckpt
    reshard` gives a universal checkpoint's model states both names by a hard link (runtime/ckpt/reshard.py
    `MODEL_STATES_NAMES`), and a copy made with `cp -al` links every file; the bytes are on disk once."""
    seen: dict[tuple[int, int], Path] = {}
    out: dict[Path, Path] = {}
    for p in paths:
        st = p.stat()
        key = (st.st_dev, st.st_ino)
        if key in seen and seen[key] != p:
            out[p] = seen[key]
        seen.setdefault(key, p)
    return out


def model_file_optimizer_dtypes(opt: Any, info: CheckpointInfo) -> None:
    """dtypes of the optimizer a model-states file holds (ZeRO-0): the moments (`optimizer` dtype) and, for a
    bf16/fp16 run, the fp32 master copies DeepSpeed's wrapper saves beside them (runtime/fp16/unfused_optimizer.py
    `fp32_groups`, fused_optimizer.py `fp32_groups_flat`, runtime/bf16_optimizer.py
    `single_partition_of_fp32_groups`)."""
    base = opt.get("optimizer_state_dict") if isinstance(opt, dict) else None
    base = base if isinstance(base, dict) else opt
    state = base.get("state") if isinstance(base, dict) and "state" in base else base
    moments = [t for t in tensors(state) if not t[0].endswith("step")]
    info.dtypes["optimizer"] = dtype_of(moments) or dtype_of(tensors(opt)) or "?"
    if isinstance(opt, dict):
        master = next((opt[k] for k in ("fp32_groups", "fp32_groups_flat", "single_partition_of_fp32_groups")
                       if opt.get(k) is not None), None)
        if master is not None:
            info.dtypes["master"] = dtype_of(tensors(master)) or "?"


def optimizer_bytes_in_model_files(model_files: list[Path], head: Any, bad: set[str],
                                    info: CheckpointInfo) -> int:
    """Bytes of the optimizer tensors inside the mp_rank_*_model_states.pt files (ZeRO-0 saves the whole optimizer
    there, under `optimizer`; at stage >= 1 it is None and the *_optim_states.pt partitions hold it): their
    distinct storages, read from the pickled metadata."""
    total = 0
    for i, p in enumerate(model_files):
        meta = head if i == 0 else (load_meta(p, info) if str(p) not in bad else None)
        if isinstance(meta, dict) and meta.get("optimizer") is not None:
            total += storage_bytes_of(meta["optimizer"])
    return total


def merge_problems(problems: list[Problem]) -> list[Problem]:
    """One Problem per file (the checks overlap: the manifest and the layout both see a missing rank file)."""
    by_file: dict[str, list[str]] = {}
    fixes: dict[str, str] = {}
    for p in problems:
        texts = by_file.setdefault(p.file, [])
        if p.problem not in texts:
            texts.append(p.problem)
        if p.fix:
            fixes.setdefault(p.file, p.fix)
    out = []
    for file, texts in by_file.items():
        missing = [t[len("is missing ("):-1] for t in texts if t.startswith("is missing (") and t.endswith(")")]
        rest = [t for t in texts if not (t.startswith("is missing (") and t.endswith(")"))]
        if missing:
            rest.insert(0, f"is missing ({'; '.join(missing)})")
        out.append(Problem(file, "; ".join(rest), fixes.get(file, "")))
    return out


def leftover_rank_files(tag_dir: Path, dp: Optional[int], mp_world_size: Optional[int],
                        ranked: dict[Path, tuple[Optional[int], int]], info: CheckpointInfo) -> set[Path]:
    """The per-rank files of `ranked` ({file: (data-parallel rank or None, model-parallel rank)}) that this save did
    not write, each with a Problem: one whose model-parallel rank is >= `mp_world_size` or whose data-parallel rank is
    >= `dp` (the model states' own mp_world_size / dp_world_size; None: not known, not checked). They are left over
    from an earlier save of the same tag at another layout: DeepSpeed 0.19.8 names a file by the saving rank's
    checkpoint_mp_rank, which is 0 unless mp_world_size > 1 and then the mpu's model-parallel rank, below it
    (runtime/engine.py:2166-2169), and by its data-parallel rank below dp (engine.py `_get_zero_ckpt_name`,
    `_get_ckpt_name`), and removes nothing. engine.load_checkpoint opens its own ranks by name
    (engine.py `_get_all_zero_checkpoint_names`) and never sees such a file, but zero_to_fp32 (`ckpt export`;
    utils/zero_to_fp32.py `get_optim_files`, `get_model_state_files`) and ds_to_universal (`ckpt reshard`;
    checkpoint/ds_to_universal.py `_get_optim_files`, `_get_model_state_files`) glob every *_optim_states.pt /
    *_model_states.pt: ds_to_universal refuses a model-states count other than tp x pp
    (checkpoint/reshape_3d_utils.py `get_model_3d_descriptor_from_metadata`), zero_to_fp32 an optimizer-file count
    other than the partition count (zero_to_fp32.py `parse_optim_states`). Such files are not part of the checkpoint:
    the caller leaves them out of the ranks and bytes."""
    out: set[Path] = set()
    for p, (r, m) in sorted(ranked.items(), key=lambda kv: kv[0].name):
        if mp_world_size is not None and m >= mp_world_size:
            wrote = "mp_rank_00" if mp_world_size == 1 else f"mp_rank_00 to mp_rank_{mp_world_size - 1:02d}"
            info.problems.append(Problem(
                str(p), f"is left over from an earlier save at another layout: model-parallel rank {m} is outside the "
                f"saved layout (mp_world_size={mp_world_size} in the model states; this save wrote {wrote}); "
                "DeepSpeed's load_checkpoint skips it, but ds_to_universal (reshard) and zero_to_fp32 (export) take every "
                "*_model_states.pt / *_optim_states.pt in the folder for part of the checkpoint",
                f"move {p.name} (and any other mp_rank >= {mp_world_size:02d}) out of {tag_dir}: it belongs to an "
                "older save at another layout"))
        elif dp is not None and r is not None and r >= dp:
            wrote = "rank 0" if dp == 1 else f"ranks 0-{dp - 1}"
            info.problems.append(Problem(
                str(p), f"is left over from an earlier save: rank {r} is outside dp={dp} (the model states' "
                f"dp_world_size; this save wrote {wrote}); DeepSpeed's load_checkpoint at dp={dp} skips it, but "
                "zero_to_fp32 (export) and ds_to_universal (reshard) read every rank file in the folder and fail",
                f"move {p.name} (and any other rank >= {dp}) out of {tag_dir}: it belongs to an older save"))
        else:
            continue
        out.add(p)
    return out
