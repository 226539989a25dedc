"""Is a universal checkpoint complete (split from dstoolkit.ckpt.inspect): what DeepSpeed 0.19.8's universal
loaders read under `zero/`, and which ZeRO stages a folder resumes at. No torch import."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.info import CheckpointInfo, Problem, load_meta
from dstoolkit.ckpt.torchzip import check_archive


def _param_names(head: Any) -> tuple[Optional[list[str]], list[str]]:
    """(names of the optimizer's parameters, of the frozen ones) from the model states' param_shapes."""
    if not isinstance(head, dict):
        return None, []
    shapes = head.get("param_shapes")
    groups = shapes if isinstance(shapes, list) else [shapes] if isinstance(shapes, dict) else None
    names = None
    if groups is not None and all(isinstance(g, dict) for g in groups):
        names = [str(k) for g in groups for k in g]
    frozen = head.get("frozen_param_shapes")
    return names, [str(k) for k in frozen] if isinstance(frozen, dict) else []


def _int_step_note(zdir: Path, opt_sd: Any, with_step: list[str], info: CheckpointInfo) -> None:
    """A note when the Adam step is stored as a number, not a tensor: a universal checkpoint of an offload run
    (DeepSpeedCPUAdam keeps an int) written by DeepSpeed's ds_to_universal itself or by `ckpt reshard` before it
    stored the step as a tensor (runtime/ckpt/reshard.py `adam_step_for_any_optimizer`, which says why)."""
    steps = []
    if with_step:
        steps.append(load_meta(zdir / with_step[0] / "step.pt", info))
    osd = opt_sd.get("optimizer_state_dict") if isinstance(opt_sd, dict) else None
    state = osd.get("state") if isinstance(osd, dict) else None
    if isinstance(state, dict) and isinstance(state.get(0), dict):
        steps.append(state[0].get("step"))
    if any(isinstance(s, (int, float)) and not isinstance(s, bool) for s in steps):
        info.notes.append("the Adam step is stored as a Python number (an optimizer-offload run's DeepSpeedCPUAdam), "
                          "not a tensor: it resumes with offload_optimizer only; torch's Adam/AdamW (torch_adam) "
                          "fails at its first step ('state_steps ... singleton tensors'): re-run `dstoolkit ckpt "
                          "reshard` on the source checkpoint, which stores it as a tensor")


def check_universal(zdir: Path, head: Any, info: CheckpointInfo, *, crc: bool) -> None:
    """What DeepSpeed 0.19.8's universal loaders read: zero/optimizer_state.pt (both assert it:
    runtime/base_optimizer.py:333-337 for ZeRO-1/2, runtime/zero/stage3.py:3655-3658 for ZeRO-3), and per parameter
    zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt (+ step.pt): ZeRO-3 loads the three for every parameter
    (stage3.py:3665-3677), ZeRO-1/2 whatever files the folder holds (checkpoint/universal_checkpoint.py:240-257),
    so a missing moment would restart silently. ds_to_universal writes them all for every parameter of the
    optimizer (ds_to_universal.py:372-383) and fp32.pt alone for the rest (ds_to_universal.py:1212-1223)."""
    opt = zdir / "optimizer_state.pt"
    opt_sd = None
    if not opt.is_file():
        info.problems.append(Problem(str(opt), "is missing: both universal loaders of DeepSpeed require it "
                                     "(runtime/base_optimizer.py:335, runtime/zero/stage3.py:3657)"))
    else:
        problem = check_archive(opt, crc=crc)
        if problem is not None:
            info.problems.append(Problem(str(opt), problem))
        else:
            opt_sd = load_meta(opt, info)
    params = sorted(p for p in zdir.iterdir() if p.is_dir())
    if not params:
        info.problems.append(Problem(str(zdir), "holds no parameter folders: a universal load restores every "
                                     "weight from zero/<parameter>/fp32.pt (the conversion did not finish)"))
    names, frozen = _param_names(head)
    trained = set(names) if names is not None else {p.name for p in params}
    if names is not None and params:  # (an empty zero/ is one problem, above)
        for name in names:
            if not (zdir / name).is_dir():
                info.problems.append(Problem(str(zdir / name), "is missing (a parameter the model states list in "
                                             "param_shapes; the loader opens this folder)"))
    adam = False
    if isinstance(opt_sd, dict):
        groups = opt_sd.get("param_groups")
        osd = opt_sd.get("optimizer_state_dict")
        if groups is None and isinstance(osd, dict):
            groups = osd.get("param_groups")
        adam = any(isinstance(g, dict) and "betas" in g for g in groups or [])
        if "param_groups" not in opt_sd and "optimizer_state_dict" not in opt_sd:
            info.problems.append(Problem(str(opt), "holds neither param_groups (read by the ZeRO-1/2 loader) nor "
                                         "optimizer_state_dict (read by ZeRO-3): not written by ds_to_universal"))
        elif "optimizer_state_dict" not in opt_sd:
            info.notes.append("zero/optimizer_state.pt has no optimizer_state_dict: resumable at ZeRO-1/2 only "
                              "(`dstoolkit ckpt reshard` adds it for ZeRO-3)")
        elif "param_groups" not in opt_sd or "ds_version" not in opt_sd:
            info.notes.append("zero/optimizer_state.pt has no top-level param_groups / ds_version: resumable at "
                              "ZeRO-3 only (`dstoolkit ckpt reshard` adds them for ZeRO-1/2)")
    present = {p.name: {f.name for f in p.iterdir() if f.is_file() and f.suffix == ".pt"} for p in params}
    states = set().union(*(present[n] for n in present if n in trained)) if present else set()
    states |= {"fp32.pt"}
    if adam:
        states |= {"exp_avg.pt", "exp_avg_sq.pt"}
    for p in params:
        need = states if p.name in trained and p.name not in frozen else {"fp32.pt"}
        for fname in sorted(need - present[p.name]):
            info.problems.append(Problem(str(p / fname), "is missing (" + (
                "every parameter needs its fp32 copy" if fname == "fp32.pt" else
                f"the optimizer keeps {fname[:-3]} for every parameter it trains; a universal load would "
                "restore this one without it") + ")"))
        for fname in sorted(present[p.name]):
            problem = check_archive(p / fname, crc=crc)
            if problem is not None:
                info.problems.append(Problem(str(p / fname), problem))
    info.optimizer_states = any("exp_avg.pt" in v for v in present.values())
    info.dtypes.setdefault("master", "float32")
    if params and not any("step.pt" in present[n] for n in present if n in trained):
        info.notes.append("no zero/<parameter>/step.pt: a ZeRO-1/2 resume restarts Adam's step count "
                          "(checkpoint/universal_checkpoint.py:248-254); ZeRO-3 reads the step from "
                          "optimizer_state.pt")
    _int_step_note(zdir, opt_sd, [n for n in present if n in trained and "step.pt" in present[n]], info)
    tag_dir = zdir.parent
    restricted = any("resumable at ZeRO" in n for n in info.notes)
    for have, other, stages in (("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt", "1/2"),
                                ("zero_pp_rank_0_mp_rank_00_model_states.pt", "mp_rank_00_model_states.pt", "3")):
        if (tag_dir / have).is_file() and not (tag_dir / other).is_file():
            info.notes.append(f"model states only as {have}: a universal load reads the file named as the loading "
                              f"stage writes it (runtime/engine.py `_get_all_ckpt_names`), so this resumes at ZeRO-"
                              f"{stages} only (`dstoolkit ckpt reshard` writes both names)")
            restricted = True
    info.notes.append(f"{len(params)} parameters under zero/" + (
        "" if not params else " (layout-free: resumable at another dp)" if restricted else
        " (layout-free: resumable at any dp / ZeRO stage)"))
