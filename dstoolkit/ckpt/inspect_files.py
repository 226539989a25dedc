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


def leftover_rank_files(tag_dir: Path, dp: int, optim: dict[tuple[int, int], Path],
                        z3_model: dict[tuple[int, int], Path], info: CheckpointInfo) -> None:
    """A Problem for each per-rank file of a data-parallel rank >= `dp` (the model states' dp_world_size): DeepSpeed
    0.19.8 writes ranks 0..dp-1 only (runtime/engine.py `_get_zero_ckpt_name`, `_get_ckpt_name`) and removes
    nothing, so such a file is left over from an earlier save of the same tag at a larger world size.
    engine.load_checkpoint at dp opens ranks 0..dp-1 by name (engine.py `_get_all_zero_checkpoint_names`) and never
    sees it, but zero_to_fp32 (`ckpt export`; utils/zero_to_fp32.py `get_optim_files`) and ds_to_universal
    (`ckpt reshard`; checkpoint/ds_to_universal.py `_get_optim_files`) glob every *_optim_states.pt /
    *_model_states.pt and fail on it."""
    wrote = "rank 0" if dp == 1 else f"ranks 0-{dp - 1}"
    for (r, _), p in sorted(list(optim.items()) + list(z3_model.items())):
        if r >= dp:
            info.problems.append(Problem(
                str(p), f"is left over from an earlier save: rank {r} is outside dp={dp} (the model states' "
                f"dp_world_size; this save wrote {wrote}); DeepSpeed's load_checkpoint at dp={dp} skips it, but "
                "zero_to_fp32 (export) and ds_to_universal (reshard) read every rank file in the folder and fail",
                f"move {p.name} (and any other rank >= {dp}) out of {tag_dir}: it belongs to an older save"))
