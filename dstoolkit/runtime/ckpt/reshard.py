"""`dstoolkit ckpt reshard`: a DeepSpeed ZeRO checkpoint -> a universal checkpoint, through DeepSpeed 0.19.8's own
`deepspeed/checkpoint/ds_to_universal.py` (`main`), and the config change a resume at another layout needs.

The universal checkpoint is written as OUT/<tag>/ (per-parameter fp32 weights and Adam moments under zero/, the
model-states files with the step, scheduler and client state) plus OUT/latest_universal, so a new run loads it with
`engine.load_checkpoint(OUT)` when its config has `"checkpoint": {"load_universal": true}` (`resume_config`).
"""
from __future__ import annotations

import contextlib
import copy
import math
import shutil
from argparse import Namespace
from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.info import incomplete_fix
from dstoolkit.ckpt.inspect import CheckpointInfo, inspect_checkpoint
from dstoolkit.ckpt.layout import Target, check_target
from dstoolkit.runtime.ckpt.outputs import atomic_output_folder, check_new_output_folder
from dstoolkit.runtime.ckpt.quiet import quiet_tool


UNIVERSAL_PEAK_PER_OPTIMIZER_BYTE = 2.5
"""Peak bytes `to_universal` writes per byte of the source's optimizer states (plus its model states): the
per-parameter copies and DeepSpeed's temporary slices (OUT/<tag>/tmp, removed at the end) are on disk together.
Measured on the tiny_cpu checkpoints (du polled every 50 ms): ZeRO-2 95.8 MB peak for 47.4 MB of optimizer
states (2.0x), ZeRO-3 118.9 MB for 47.4 MB (2.5x); the larger is taken."""


def universal_bytes_needed(info: CheckpointInfo) -> int:
    """About how many bytes a universal copy of `info`'s checkpoint needs free while it is written."""
    return int(info.model_state_bytes + UNIVERSAL_PEAK_PER_OPTIMIZER_BYTE * info.optimizer_state_bytes)


def resume_config(ds_config: dict) -> dict:
    """A copy of `ds_config` that loads a universal checkpoint (DeepSpeed reads `checkpoint.load_universal`,
    runtime/config.py `load_universal_checkpoint`); everything else unchanged."""
    out = copy.deepcopy(ds_config)
    ckpt = dict(out.get("checkpoint") or {})
    ckpt["load_universal"] = True
    out["checkpoint"] = ckpt
    return out


MODEL_STATES_NAMES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
"""A universal load reads the step, scheduler and client state from the model-states file named as the *loading*
engine's stage writes it (runtime/engine.py:4383-4388 `_get_all_ckpt_names`: ZeRO-3 globs zero_pp_rank_0_mp_rank_*,
ZeRO 0-2 mp_rank_*), while ds_to_universal copies the files as the *saving* stage named them; the weights come
from zero/ either way (engine.py:4660 skips the module load). Giving the file both names makes the universal
checkpoint loadable at every stage (ZeRO-1/2 -> 3 and 3 -> 1/2)."""


def _model_states_under_both_names(dest: Path) -> None:
    import os

    have = [n for n in MODEL_STATES_NAMES if (dest / n).is_file()]
    if len(have) != 1:
        return
    for name in MODEL_STATES_NAMES:
        if name not in have:
            try:
                os.link(dest / have[0], dest / name)  # same bytes, no extra space
            except OSError:
                shutil.copy2(dest / have[0], dest / name)


def adam_step_for_any_optimizer(step: Any) -> Any:
    """The Adam step count in the one form every DeepSpeed 0.19.8 Adam accepts after a universal load: a 0-dim
    float32 CPU tensor (anything that is not a number or a one-element tensor is returned unchanged).

    The universal loaders hand the saved value to the optimizer as it is (checkpoint/universal_checkpoint.py:248-254
    -> runtime/base_optimizer.py:372 for ZeRO-1/2; runtime/zero/stage3.py:3664,3680 for ZeRO-3). The optimizers
    disagree on its type:
    - torch.optim.Adam / AdamW (what "torch_adam": true builds, runtime/engine.py:2382, neither fused nor capturable)
      keep `torch.tensor(0.0, dtype=_get_scalar_dtype())` on the CPU (torch 2.13 optim/adam.py `_init_group`) and
      refuse anything else at their first step ("`state_steps` argument must contain a list of singleton tensors");
    - DeepSpeedCPUAdam (ops/adam/cpu_adam.py:155-170, every offload_optimizer run) and FusedAdam
      (ops/adam/fused_adam.py:153-192) keep a Python int, add 1 in place and pass it to their C++ kernels, which
      take a 0-dim tensor through its __int__ as well (a universal checkpoint of a torch-Adam run resumes with
      offload: ZeRO-1 -> ZeRO-2 offload, bit-exact).
    So an offload run's int step is stored as a tensor; float32 holds every step count below 2**24 exactly."""
    import torch

    if isinstance(step, bool) or not isinstance(step, (int, float, torch.Tensor)):
        return step
    if isinstance(step, torch.Tensor):
        if step.numel() != 1:
            return step
        step = step.item()
    return torch.tensor(float(step), dtype=torch.float32)


def _rewrite_step_file(path: Path) -> None:
    import torch

    torch.save(adam_step_for_any_optimizer(torch.load(path, map_location="cpu", weights_only=False)), path)


def _optimizer_state_for_every_stage(dest: Path) -> None:
    """Make zero/optimizer_state.pt and the per-parameter step readable by the ZeRO-1/2 and the ZeRO-3 loader.

    DeepSpeed 0.19.8 writes the two source kinds differently and each loader reads only its own:
    - from ZeRO-1/2 (ds_to_universal.py:1004-1013 `_save_optimizer_state`) the file has `param_groups` and the step
      sits in zero/<param>/step.pt; the ZeRO-3 loader reads `optimizer_state_dict.state[0].step` and
      `optimizer_state_dict.param_groups` (runtime/zero/stage3.py:3664, 3687) -> KeyError 'optimizer_state_dict';
    - from ZeRO-3 (ds_to_universal.py:1016-1022) the step is only in `optimizer_state_dict`, never in step.pt, and
      the ZeRO-1/2 loader takes the step from step.pt (checkpoint/universal_checkpoint.py:248-254,
      runtime/base_optimizer.py:361-373): Adam would restart its step count (bias correction) silently.
    Both facts are added from the checkpoint's own values, and the step is stored in the form every Adam takes
    (`adam_step_for_any_optimizer`: an offload run's int step made torch Adam fail at its first step); nothing
    else changes.
    """
    import torch

    zero = dest / "zero"
    path = zero / "optimizer_state.pt"
    sd = torch.load(path, map_location="cpu", weights_only=False)
    params = sorted(p for p in zero.iterdir() if p.is_dir())
    if "optimizer_state_dict" not in sd:
        steps = [p / "step.pt" for p in params if (p / "step.pt").is_file()]
        for f in steps:
            _rewrite_step_file(f)
        if steps:
            step = torch.load(steps[0], map_location="cpu", weights_only=False)
            sd["optimizer_state_dict"] = {"state": {0: {"step": step}}, "param_groups": sd["param_groups"]}
            torch.save(sd, path)
        return
    from deepspeed.checkpoint.constants import CAT_DIM, PARAM

    state = sd["optimizer_state_dict"].get("state") or {}
    for entry in state.values():
        if isinstance(entry, dict) and "step" in entry:
            entry["step"] = adam_step_for_any_optimizer(entry["step"])
    step = (state.get(0) or {}).get("step")
    # ZeRO-3's merge (ds_to_universal.py:543-550 `merge_zero3_slices`) saves each state as a bare flat tensor;
    # the ZeRO-1/2 loader indexes it as {"param": tensor shaped like the parameter} (universal_checkpoint.py:257)
    shapes: dict = {}
    model_states = dest / MODEL_STATES_NAMES[1]
    if model_states.is_file():
        ms = torch.load(model_states, map_location="cpu", weights_only=False)
        for group in ms.get("param_shapes") or []:
            shapes.update({k: tuple(v) for k, v in group.items()})
    for p in params:
        if step is not None and not (p / "step.pt").is_file():
            torch.save(step, p / "step.pt")
        elif (p / "step.pt").is_file():
            _rewrite_step_file(p / "step.pt")
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            f = p / f"{key}.pt"
            if not f.is_file():
                continue
            t = torch.load(f, map_location="cpu", weights_only=False)
            if isinstance(t, dict):
                continue
            shape = shapes.get(p.name)
            if shape is not None and t.numel() == math.prod(shape):
                t = t.reshape(shape)
            torch.save({PARAM: t, CAT_DIM: 0}, f)
    if "ds_version" not in sd:
        import deepspeed

        sd["ds_version"] = deepspeed.__version__
    torch.save(sd, path)


def to_universal(src: Path, out: Path, *, target: Optional[Target] = None, quiet: bool = True) -> CheckpointInfo:
    """Convert the DeepSpeed checkpoint at `src` (a checkpoint root with `latest`, or one tag folder) into a
    universal checkpoint under the new folder `out` (OUT/<tag>/ + OUT/latest_universal).

    Args:
        src: the checkpoint (any folder `dstoolkit.ckpt.inspect_checkpoint` resolves to one DeepSpeed tag).
        out: a folder that must not exist yet (nothing is overwritten).
        target: the layout the universal checkpoint will be resumed at; refused early when it cannot be.
        quiet: without ds_to_universal's prints and tqdm bars (`quiet_tool`; its errors still raise).

    Returns:
        The inspection of the source checkpoint.

    Raises:
        CkptError: not a checkpoint, incomplete, already universal, a target it cannot be resharded to, `out`
            inside (or around) the checkpoint, or `out` exists.
        OutputSpaceError: the disk filled while writing (`atomic_output_folder`: nothing is left; an interrupt
            leaves nothing either, and a killed run's temporary folder is removed by the next).
        FileInPathError: a part of `out` above it is a file (`check_new_output_folder`; nothing is written).
    """
    check_new_output_folder(Path(src), Path(out), "--out", "_universal")
    info = inspect_checkpoint(src)
    if info.format == "deepspeed-universal":
        raise CkptError(str(src), "is already a universal checkpoint",
                        "resume from it directly with \"checkpoint\": {\"load_universal\": true}")
    if not info.complete:
        raise CkptError(info.problems[0].file, info.problems[0].problem, incomplete_fix(info, "reshard"))
    if info.zero_stage is None or info.zero_stage < 1:
        raise CkptError(str(info.tag_dir), f"ZeRO stage {info.zero_stage}: ds_to_universal converts ZeRO-1/2/3 "
                        "checkpoints only (it reads the *_optim_states.pt partitions)",
                        "save the run with zero_optimization.stage >= 1, or load its mp_rank_* model states directly")
    problems = check_target(info, target if target is not None else Target())  # MoE: refused whatever the target
    if problems:
        raise CkptError(str(info.tag_dir), problems[0][0], problems[0][1])
    out = Path(out)
    from deepspeed.checkpoint import ds_to_universal

    with atomic_output_folder(out, "--out", universal_bytes_needed(info)) as tmp:
        dest = tmp / info.tag
        args = Namespace(input_folder=str(info.tag_dir), output_folder=str(dest), num_extract_workers=1,
                         num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
        try:
            with quiet_tool(ds_to_universal) if quiet else contextlib.nullcontext():
                ds_to_universal.main(args)
        except Exception as exc:  # noqa: BLE001 - DeepSpeed's converter failing: one line; a full disk is
            # atomic_output_folder's to say (OutputSpaceError), which is why the cause is kept
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            raise CkptError(str(info.tag_dir), f"DeepSpeed's ds_to_universal failed: {type(exc).__name__}: {first}",
                            "check the checkpoint with `dstoolkit ckpt inspect`; report the message") from exc
        _model_states_under_both_names(dest)
        _optimizer_state_for_every_stage(dest)
        for extra in ("config.json",):  # the model config, when the run left one beside the tags (export reads it)
            p = info.root / extra
            if p.is_file():
                shutil.copy2(p, tmp / extra)
    return info
