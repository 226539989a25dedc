"""What a checkpoint folder holds, read from file names and pickled metadata, never from tensors (no torch).

`inspect_checkpoint(path)` accepts a DeepSpeed checkpoint root (with `latest`), one tag folder, a universal
checkpoint (root with `latest_universal`, or its tag folder with `zero/`), an HF Trainer output folder or one of
its `checkpoint-N/` folders (DeepSpeed's `global_stepN/` inside), or the project's trainer root (`step_XXXXXXXX/`
tags with `dstoolkit_manifest.json`, whose sizes and SHA-256 are verified). Every torch file is checked as a zip
archive (a truncated one has no end record) and by CRC, or, in torch's legacy format, by its structure and length;
the metadata come from `dstoolkit.ckpt.torchzip`. A universal checkpoint is complete when it holds what DeepSpeed's
universal loaders read (`dstoolkit.ckpt.universal.check_universal`). The tag comes from `latest` / `latest_universal`; when that is empty
or missing the newest tag is taken and a note says so; one that is not text or leaves the folder is an error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt import names as N
from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.info import CheckpointInfo, Problem, RankFiles, load_meta
from dstoolkit.ckpt.inspect_files import (dtype_of, hard_links, leftover_rank_files, merge_problems,
                                           model_file_optimizer_dtypes, optimizer_bytes_in_model_files)
from dstoolkit.ckpt.manifest import absent_manifest, verify_manifest
from dstoolkit.ckpt.torchzip import Opaque, check_archive, is_legacy, tensors
from dstoolkit.ckpt.universal import check_universal


def _step_of(tag: str) -> Optional[int]:
    m = N.STEP_TAG.match(tag) or N.HF_CHECKPOINT_DIR.match(tag)
    return int(m.group("step")) if m else None


def _is_tag_dir(p: Path) -> bool:
    return p.is_dir() and (any(N.MODEL_STATES.match(f.name) or N.ZERO3_MODEL_STATES.match(f.name)
                               or N.OPTIM_STATES.match(f.name) or N.PIPE_LAYER.match(f.name)
                               for f in p.iterdir()) or (p / N.UNIVERSAL_ZERO_DIR).is_dir())


def _tags_in(root: Path) -> list[str]:
    out = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and _is_tag_dir(p)]
    return sorted(out, key=lambda t: (_step_of(t) or -1, t), reverse=True)


def _read_latest(root: Path, name: str, tags: list[str]) -> Optional[str]:
    """The tag a pointer file (`latest`, `latest_universal`) names; '' when it is empty, None when there is none.

    Raises:
        CkptError: the file is not text, or names something that is not a folder directly inside `root`.
    """
    p = root / name
    example = f"`printf %s {tags[0] if tags else 'global_stepN'} > {p}`"
    if p.is_dir():  # engine.load_checkpoint reads it only when os.path.isfile (runtime/engine.py:4430) and
        # save_checkpoint's open(save_dir/'latest', 'w') fails on a folder (engine.py:4961, 4979)
        raise CkptError(str(p), f"is a folder, not the file DeepSpeed reads the tag from: engine.load_checkpoint "
                        f"without tag= loads nothing from {root} and the next save_checkpoint fails writing {name}",
                        f"move what {p} holds elsewhere and remove the folder, then write the tag into a file of "
                        f"that name, e.g. {example}; or give the tag folder itself")
    if not p.is_file():
        return None
    fix = (f"rewrite {p} to hold the name of one tag folder ({', '.join(tags[:5]) or 'none found'}), "
           f"e.g. {example}")
    raw = p.read_bytes()
    try:
        tag = raw.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise CkptError(str(p), f"is not text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): DeepSpeed reads "
                        "the tag folder's name from it", fix) from None
    if tag and (tag in (".", "..") or any(c in tag for c in "/\\\0\n")):
        raise CkptError(str(p), f"names {tag!r}, which is not a tag folder inside {root} (a tag is one folder "
                        "name; this one would leave the checkpoint folder)", fix)
    return tag


def _trainer_wrapper(root: Path, tags: list[str]) -> str:
    """"dstoolkit-trainer" when `root` is the project trainer's --checkpoint-dir (a tag there has its manifest),
    else ''. Every tag of such a folder is then held to the trainer's rule (`manifest.verify_manifest`: no
    manifest, the save did not finish), as `dstoolkit train --resume` holds it."""
    return "dstoolkit-trainer" if any((root / t / N.DSTOOLKIT_MANIFEST).is_file() for t in tags) else ""


def _two_pointers(root: Path, named: dict[str, str]) -> CkptError:
    """The refusal for a folder whose `latest_universal` and `latest` name different tags (a run that loaded a
    universal checkpoint and saved into the same folder). Which one DeepSpeed 0.19.8 loads depends on the loading
    run's config, not on the folder: engine.load_checkpoint(root) reads latest_universal when checkpoint.load_universal
    is true, else latest (runtime/engine.py:4428), and `dstoolkit train --resume` loads neither
    (`resume_check.universal_refusal`). So no tag is picked for the user."""
    def what(pointer: str) -> str:
        tag = named[pointer]
        kind = "a universal checkpoint" if (root / tag / N.UNIVERSAL_ZERO_DIR).is_dir() else "a ZeRO checkpoint"
        step = _step_of(tag)
        return f"{pointer} -> {tag} ({kind}{'' if step is None else f', step {step}'})"

    return CkptError(str(root), f"holds two pointers naming different tags: {what(N.LATEST_UNIVERSAL)}, "
                     f"{what(N.LATEST)}; DeepSpeed's engine.load_checkpoint reads latest_universal with "
                     "checkpoint.load_universal true and latest without it (runtime/engine.py:4428)",
                     f"give the tag folder you mean: {root / named[N.LATEST]} or {root / named[N.LATEST_UNIVERSAL]}")


def _resolve(path: Path) -> tuple[Path, str, str, list[str], list[str]]:
    """resolve(), plus the notes on how the tag was chosen."""
    path = Path(path)
    if not path.exists():
        raise CkptError(str(path), "does not exist", "give the checkpoint folder (the one holding `latest`, a "
                        "global_stepN/ tag folder, or an HF Trainer checkpoint-N/)")
    if not path.is_dir():
        raise CkptError(str(path), "is a file, not a checkpoint folder",
                        f"give its folder ({path.parent}) or the checkpoint root above it")
    if _is_tag_dir(path):
        tags = _tags_in(path.parent)
        return path.parent, path.name, _trainer_wrapper(path.parent, tags), tags, []
    hf = sorted((p for p in path.iterdir() if p.is_dir() and N.HF_CHECKPOINT_DIR.match(p.name)),
                key=lambda p: int(N.HF_CHECKPOINT_DIR.match(p.name).group("step")), reverse=True)
    if hf and not (path / N.LATEST).is_file():  # an HF Trainer output_dir: its newest checkpoint-N
        root, tag, _, _, notes = _resolve(hf[0])
        return root, tag, "hf-trainer", [p.name for p in hf], notes
    tags = _tags_in(path)
    wrapper = "hf-trainer" if (path / N.HF_TRAINER_STATE).is_file() else _trainer_wrapper(path, tags)
    empty: list[str] = []
    named: dict[str, str] = {}
    for pointer in (N.LATEST_UNIVERSAL, N.LATEST):
        tag = _read_latest(path, pointer, tags)
        if tag == "":
            empty.append(pointer)
        elif tag is not None:
            if not (path / tag).is_dir():
                raise CkptError(str(path / pointer), f"names tag {tag!r} but {path / tag} does not exist",
                                f"pick an existing tag folder ({', '.join(tags) or 'none found'}), or rewrite "
                                f"{pointer} to name one")
            named[pointer] = tag
    if len(set(named.values())) > 1:
        raise _two_pointers(path, named)
    if named:
        return path, next(iter(named.values())), wrapper, tags, []
    if tags:
        pointer = N.LATEST_UNIVERSAL if (path / tags[0] / N.UNIVERSAL_ZERO_DIR).is_dir() else N.LATEST
        why = (f"{path / pointer} is empty" if pointer in empty else
               f"{path / empty[0]} is empty and there is no {pointer}" if empty else f"there is no {pointer} file")
        return path, tags[0], wrapper, tags, [
            f"{why}: took the newest tag, {tags[0]}. DeepSpeed's engine.load_checkpoint({str(path)!r}) without "
            f"tag= reads {pointer} and would load nothing: write the tag into {path / pointer} or pass "
            f"tag={tags[0]!r}"]
    raise CkptError(str(path), "is not a checkpoint folder: no `latest` file, no *_model_states.pt / "
                    "*_optim_states.pt, no checkpoint-N/ or global_stepN/ folder",
                    "give the folder DeepSpeed's save_checkpoint wrote (or an HF Trainer output_dir)")


def resolve(path: Path) -> tuple[Path, str, str, list[str]]:
    """(root, tag, wrapper format or '', tags beside it) of the checkpoint at `path`.

    Raises:
        CkptError: `path` is no checkpoint of a kind we know, or `latest` is not text, names a tag that is not
            there, or names a path that leaves the checkpoint folder.
    """
    return _resolve(path)[:4]


def _zero_stage(v: Any) -> Optional[int]:
    if isinstance(v, Opaque) and v.args:
        v = v.args[0]
    return int(v) if isinstance(v, int) else None


def _bf16_names(optim: dict, ds_config: dict) -> bool:
    """Whether the tag's optimizer files carry DeepSpeed's bf16_ prefix (engine.py _get_zero_ckpt_name: bf16_ when
    bfloat16_enabled()): as the files present are named, else as the saved ds_config's bf16 (or bfloat16) section
    says, so a missing file is named as DeepSpeed writes it even when no optimizer file is left."""
    if optim:
        return any(N.OPTIM_STATES.match(p.name).group("bf16") for p in optim.values())
    sec = ds_config.get("bf16", ds_config.get("bfloat16"))
    return isinstance(sec, dict) and sec.get("enabled") is True


def inspect_checkpoint(path: Path | str, *, crc: bool = True) -> CheckpointInfo:
    """Inspect the checkpoint at `path` (see the module docstring for what `path` may be).

    Args:
        path: the checkpoint folder.
        crc: also check every member's CRC (reads every byte once; off: the zip end record only).

    Returns:
        A CheckpointInfo; `complete` is False (with `problems` naming each file) when a rank's file is missing,
        truncated, damaged or does not match the project's manifest.

    Raises:
        CkptError: `path` is not a checkpoint folder.
    """
    root, tag, wrapper, tags, resolve_notes = _resolve(Path(path))
    tag_dir = root / tag
    files = sorted(p for p in tag_dir.iterdir() if p.is_file())
    universal = (tag_dir / N.UNIVERSAL_ZERO_DIR).is_dir()
    # the format is the wrapper's until the tag's own kind is known: verify_manifest holds a trainer tag to the
    # trainer's rule (its manifest must be there), the rule `dstoolkit train --resume` applies (runtime/train/ckpt.py
    # `verify`)
    info = CheckpointInfo(root=root, tag_dir=tag_dir, format=wrapper, tag=tag, step=_step_of(tag), tags=tags)
    late_notes = list(resolve_notes)
    if wrapper == "hf-trainer":
        info.step = _step_of(root.name) if _step_of(root.name) is not None else info.step
    model_files = [p for p in files if N.MODEL_STATES.match(p.name)]
    z3_model = {(int(m.group("dp")), int(m.group("mp"))): p for p in files if (m := N.ZERO3_MODEL_STATES.match(p.name))}
    optim = {(int(m.group("dp")), int(m.group("mp"))): p for p in files if (m := N.OPTIM_STATES.match(p.name))}
    expert_optim = {int(m.group("ep")): p for p in files if (m := N.EXPERT_OPTIM_STATES.match(p.name))}
    experts = [p for p in files if N.EXPERT_STATES.match(p.name)]
    pipe = [p for p in files if N.PIPE_LAYER.match(p.name)]

    for p in files:
        if p.suffix == ".pt":
            problem = check_archive(p, crc=crc)
            if problem is not None:
                info.problems.append(Problem(str(p), problem))
    verify_manifest(tag_dir, info)
    bad = {pr.file for pr in info.problems}

    head_file = (model_files or [z3_model[k] for k in sorted(z3_model)] or [None])[0]
    head = load_meta(head_file, info) if head_file is not None and str(head_file) not in bad else None
    if head_file is None:
        info.problems.append(Problem(str(tag_dir / "mp_rank_00_model_states.pt"),
                                     "is missing (no *_model_states.pt in the tag folder" +
                                     ("; a universal load reads the step, scheduler and client state from it)"
                                      if universal else ")")))
    ds_config: dict = {}
    mp_world_size = None  # how many model-parallel ranks named files (leftover_rank_files); None: not stated
    if isinstance(head, dict):
        ds_config = head.get("ds_config") if isinstance(head.get("ds_config"), dict) else {}
        info.dp = head.get("dp_world_size")
        dims = head.get("checkpoint_parallel_dimensions") or {}
        info.tp = dims.get("tp_degree", head.get("mp_world_size"))
        mpw = head.get("mp_world_size")
        mp_world_size = mpw if isinstance(mpw, int) and not isinstance(mpw, bool) and mpw >= 1 else None
        info.pp = dims.get("pp_degree")
        info.scheduler = head.get("lr_scheduler") is not None
        info.deepspeed_version = head.get("ds_version")
        if isinstance(head.get("global_steps"), int):
            info.step = head["global_steps"] if info.step is None or wrapper != "hf-trainer" else info.step
        ne = head.get("num_experts")
        if isinstance(ne, list) and ne:
            info.num_experts = [int(x) for x in ne]
        elif isinstance(ne, int) and ne > 1:
            info.num_experts = [ne]
        module = head.get("module")
        if isinstance(module, dict):
            info.dtypes["model"] = dtype_of(tensors(module)) or "?"
        if head.get("optimizer") is not None:
            info.optimizer_states = True
            model_file_optimizer_dtypes(head["optimizer"], info)
        zo = ds_config.get("zero_optimization") or {}
        info.zero_stage = zo.get("stage", 0) if isinstance(zo.get("stage", 0), int) else None
        off = zo.get("offload_optimizer") or {}
        if isinstance(off, dict) and off.get("device") not in (None, "none"):
            info.offload = str(off.get("device"))
        off = zo.get("offload_param") or {}
        if isinstance(off, dict) and off.get("device") not in (None, "none"):
            info.offload_param = str(off.get("device"))
            late_notes.append(f"parameter offload to {info.offload_param} (zero_optimization.offload_param of the "
                              "saved config): the files are the same as without it")

    first_optim = optim[min(optim)] if optim else None
    if first_optim is not None and str(first_optim) not in bad:
        osd = load_meta(first_optim, info)
        if isinstance(osd, dict):
            o = osd.get("optimizer_state_dict") or {}
            stage = _zero_stage(o.get("zero_stage"))
            if stage is not None:
                info.zero_stage = stage
            info.optimizer_states = True
            base = o.get("base_optimizer_state") or o.get("optimizer_state_dict") or {}
            state_t = [t for t in tensors(base.get("state") if isinstance(base, dict) else base)
                       if not t[0].endswith("step")]
            info.dtypes["optimizer"] = dtype_of(state_t) or info.dtypes.get("optimizer", "?")
            master = o.get("single_partition_of_fp32_groups") or o.get("fp32_flat_groups")
            if master is not None:
                info.dtypes["master"] = dtype_of(tensors(master)) or "?"
            groups = base.get("param_groups") if isinstance(base, dict) else None
            for g in groups or []:
                name = g.get("name") if isinstance(g, dict) else None
                if isinstance(name, str) and name.startswith("ep_size_") and name[8:].isdigit():
                    info.ep = int(name[8:])
    if experts and info.ep is None:
        info.ep = 1

    if universal:
        info.format = "deepspeed-universal"
        check_universal(tag_dir / N.UNIVERSAL_ZERO_DIR, head, info, crc=crc)
    elif pipe or (info.pp or 1) > 1:
        info.format = "deepspeed-pipeline"
        if pipe and "model" not in info.dtypes:
            lay = load_meta(pipe[0], info) if str(pipe[0]) not in bad else None
            if isinstance(lay, dict):
                info.dtypes["model"] = dtype_of(tensors(lay)) or "?"
    elif info.num_experts:
        info.format = "deepspeed-moe"
    else:
        info.format = "deepspeed-zero"
    if wrapper == "hf-trainer" and (root / "scheduler.pt").is_file():
        info.scheduler = True  # HF Trainer keeps its own scheduler beside DeepSpeed's tag folder
    if wrapper:
        info.notes.insert(0, f"{info.format} checkpoint inside")
        info.format = wrapper
    elif not universal:
        absent_manifest(info, crc)

    # completeness: every data-parallel rank's partition present; the files an earlier save at another layout
    # left in the tag are problems, and neither expected nor counted below
    expect_dp = info.dp if isinstance(info.dp, int) and info.dp > 0 else None
    z3_ranked = z3_model if info.zero_stage == 3 else {}
    ranked = {p: (None, int(N.MODEL_STATES.match(p.name).group("mp"))) for p in model_files}
    ranked.update({p: k for k, p in list(optim.items()) + list(z3_ranked.items())})
    gone = set() if universal else leftover_rank_files(
        tag_dir, expect_dp if info.zero_stage else None, mp_world_size, ranked, info)
    model_files = [p for p in model_files if p not in gone]
    optim = {k: p for k, p in optim.items() if p not in gone}
    z3_model = {k: p for k, p in z3_model.items() if p not in gone}
    if info.zero_stage and info.zero_stage >= 1 and not universal:
        mp = max(1, int(info.tp or 1)) * max(1, int(info.pp or 1))
        n_opt = expect_dp if expect_dp else (max(d for d, _ in optim) + 1 if optim else 0)
        mps = sorted({m for _, m in optim} | {m for _, m in z3_model}) or [0]
        prefix = "bf16_" if _bf16_names(optim, ds_config) else ""
        for m in mps:
            for r in range(n_opt):
                if (r, m) not in optim:
                    info.problems.append(Problem(
                        str(tag_dir / f"{prefix}zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt"),
                        f"is missing (rank {r} of dp {n_opt})"))
                if info.zero_stage == 3 and (r, m) not in z3_model:
                    info.problems.append(Problem(str(tag_dir / f"zero_pp_rank_{r}_mp_rank_{m:02d}_model_states.pt"),
                                                 f"is missing (rank {r} of dp {n_opt})"))
        if mp > 1 and len(mps) < mp and not pipe:
            info.notes.append(f"model-parallel size {mp} but optimizer files for mp ranks {mps} only")
    if info.num_experts:
        for layer, n in enumerate(info.num_experts):
            for e in range(n):
                p = tag_dir / f"layer_{layer}_expert_{e}_mp_rank_00_model_states.pt"
                if not p.is_file():
                    info.problems.append(Problem(str(p), f"is missing (expert {e} of {n}, MoE layer {layer})"))

    # degrees and bytes per rank
    if info.dp is not None:
        info.world_size = int(info.dp) * int(info.tp or 1) * int(info.pp or 1)
    owned: dict[tuple[int, int], list[Path]] = {}
    for key, p in list(optim.items()) + list(z3_model.items()):
        owned.setdefault((key[1], key[0]), []).append(p)  # ranks ordered model-parallel rank major
    for r, p in expert_optim.items():
        owned.setdefault((0, r), []).append(p)
    all_files = [p for p in files if p not in gone]
    if universal:
        zdir = tag_dir / N.UNIVERSAL_ZERO_DIR
        all_files += [p for p in sorted(zdir.iterdir()) if p.is_file()]
        all_files += [f for d in sorted(zdir.iterdir()) if d.is_dir() for f in sorted(d.iterdir()) if f.is_file()]
    foreign = [d.name for d in sorted(tag_dir.iterdir())
               if d.is_dir() and not (universal and d.name == N.UNIVERSAL_ZERO_DIR)]
    if foreign:
        late_notes.append(f"sub-folder(s) {', '.join(foreign)} of {tag_dir} are not part of the checkpoint "
                          "(DeepSpeed writes no folders there): not checked, not counted in the bytes")
    legacy = [p.name for p in files if p.suffix == ".pt" and is_legacy(p)]
    if legacy:
        late_notes.append(f"{len(legacy)} file(s) in torch's legacy (non-zip) format ({legacy[0]}"
                          f"{', ...' if len(legacy) > 1 else ''}): torch.load reads them; they carry no checksums, "
                          "so only their structure and length were checked")
    links = hard_links([p for _, ps in sorted(owned.items()) for p in sorted(ps)] + all_files)
    for link, first in links.items():
        late_notes.append(f"{link.relative_to(tag_dir)} is a hard link to {first.relative_to(tag_dir)} (one file "
                          "under two names): its bytes are counted once, under the second name")
    all_files = [p for p in all_files if p not in links]
    owned = {k: kept for k, ps in owned.items() if (kept := [p for p in ps if p not in links])}
    owned_set = {p for ps in owned.values() for p in ps}
    info.ranks = [RankFiles(i, tuple(p.name for p in sorted(ps)), sum(p.stat().st_size for p in ps))
                  for i, (_, ps) in enumerate(sorted(owned.items()))]
    info.total_bytes = sum(p.stat().st_size for p in all_files)
    info.shared_bytes = sum(p.stat().st_size for p in all_files if p not in owned_set)
    opt_files = set(optim.values()) | set(expert_optim.values())
    if universal:
        opt_files |= {p for p in all_files if p.name in ("exp_avg.pt", "exp_avg_sq.pt", "optimizer_state.pt")}
    info.optimizer_state_bytes = sum(p.stat().st_size for p in all_files if p in opt_files)
    info.model_state_bytes = sum(p.stat().st_size for p in all_files
                                 if p not in opt_files and p.suffix == ".pt")
    inside = optimizer_bytes_in_model_files(model_files, head, bad, info) if not optim and not universal else 0
    if inside:
        info.optimizer_state_bytes += inside
        info.model_state_bytes -= inside
        late_notes.append(f"the optimizer states ({inside} bytes: moments and fp32 masters) are inside "
                          f"{model_files[0].name}{' and the other model-states files' if len(model_files) > 1 else ''}"
                          " (no ZeRO partitions at stage 0): counted as optimizer states, the rest of the file as "
                          "model states")
    info.other_bytes = info.total_bytes - info.model_state_bytes - info.optimizer_state_bytes
    if info.zero_stage == 3 and info.optimizer_states and not universal:
        info.notes.append("ZeRO-3: the weights live in the fp32 partitions of the *_optim_states.pt files "
                          "(the model-states files hold placeholders)")
    info.notes.extend(late_notes)
    info.problems = merge_problems(info.problems)
    info.complete = not info.problems
    return info
