"""s34 ckpt finding 1: a universal checkpoint resharded from an optimizer-offload run (DeepSpeedCPUAdam keeps the
Adam step as a Python int) kept the int, and torch's Adam/AdamW (a run without offload, "torch_adam": true) died at
its first step with "`state_steps` argument must contain a list of singleton tensors". `ckpt reshard` now stores the
step as a 0-dim float32 tensor, which torch Adam and DeepSpeedCPUAdam both take (the real 2-rank resume is
tests/dist/test_s34_ckpt_offload_resume.py).

The folders below are what DeepSpeed 0.19.8's ds_to_universal writes for each source kind: from ZeRO-1/2 a
zero/optimizer_state.pt with param_groups and an int zero/<param>/step.pt (`_save_optimizer_state`, the step from
`extract_zero_shards`); from ZeRO-3 an optimizer_state_dict whose state[0] holds the int step and bare flat tensors
per parameter (`_save_optimizer_state_stage3`, `merge_zero3_slices`)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dstoolkit.runtime.ckpt.reshard import MODEL_STATES_NAMES, _optimizer_state_for_every_stage, \
    adam_step_for_any_optimizer

GROUPS = [{"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "params": [0]}]
SHAPES = {"w": (2, 3), "b": (3,)}


def _zero12_source(dest: Path, step) -> None:
    zero = dest / "zero"
    for name, shape in SHAPES.items():
        (zero / name).mkdir(parents=True)
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            torch.save({"param": torch.ones(shape), "cat_dim": 0}, zero / name / f"{key}.pt")
        torch.save(step, zero / name / "step.pt")
    torch.save({"param_groups": GROUPS, "ds_version": "0.19.8"}, zero / "optimizer_state.pt")


def _zero3_source(dest: Path, step) -> None:
    zero = dest / "zero"
    for name, shape in SHAPES.items():
        (zero / name).mkdir(parents=True)
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            torch.save(torch.ones(shape).flatten(), zero / name / f"{key}.pt")
    osd = {"state": {0: {"step": step, "exp_avg": torch.zeros(9), "exp_avg_sq": torch.zeros(9)}},
           "param_groups": GROUPS}
    torch.save({"optimizer_state_dict": osd, "param_groups": GROUPS}, zero / "optimizer_state.pt")
    torch.save({"param_shapes": [SHAPES]}, dest / MODEL_STATES_NAMES[1])


def _steps(dest: Path) -> list:
    """Every step a universal loader hands to the optimizer: each zero/<param>/step.pt (ZeRO-1/2,
    universal_checkpoint.py:248-254) and optimizer_state_dict.state[0].step (ZeRO-3, stage3.py:3664)."""
    zero = dest / "zero"
    out = [torch.load(zero / n / "step.pt", weights_only=False) for n in sorted(SHAPES)]
    out.append(torch.load(zero / "optimizer_state.pt", weights_only=False)["optimizer_state_dict"]["state"][0]["step"])
    return out


def _torch_adamw_takes(step) -> float:
    """One torch.optim.AdamW step (what DeepSpeed builds for "torch_adam": true, runtime/engine.py:2382) from a
    state holding `step`, as the universal loaders set it; returns the step count after it."""
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([p], lr=1e-2)
    opt.state[p] = {"step": step, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
    p.grad = torch.ones(3)
    opt.step()
    return float(opt.state[p]["step"])


@pytest.mark.parametrize("source", [_zero12_source, _zero3_source], ids=["from_zero12", "from_zero3"])
def test_offload_int_step_becomes_a_tensor_torch_adam_takes(tmp_path, source):
    source(tmp_path, 3)  # DeepSpeedCPUAdam's int step (ops/adam/cpu_adam.py:155-170)
    _optimizer_state_for_every_stage(tmp_path)
    steps = _steps(tmp_path)
    assert len(steps) == 3
    for s in steps:
        assert isinstance(s, torch.Tensor), type(s)
        assert s.dtype == torch.float32 and s.shape == () and s.device.type == "cpu"
        assert s.item() == 3.0
        assert _torch_adamw_takes(s) == 4.0


@pytest.mark.parametrize("source", [_zero12_source, _zero3_source], ids=["from_zero12", "from_zero3"])
def test_torch_adam_tensor_step_is_kept(tmp_path, source):
    source(tmp_path, torch.tensor(7.0))  # a torch Adam run's step: already the form every Adam takes
    _optimizer_state_for_every_stage(tmp_path)
    assert [s.item() for s in _steps(tmp_path)] == [7.0, 7.0, 7.0]
    assert all(isinstance(s, torch.Tensor) and s.dtype == torch.float32 for s in _steps(tmp_path))


def test_the_int_step_is_what_torch_adam_refuses():
    # the failure the conversion prevents, as torch 2.13 raises it
    with pytest.raises(RuntimeError, match="state_steps"):
        _torch_adamw_takes(3)


def test_adam_step_for_any_optimizer_values():
    for given in (3, 3.0, torch.tensor(3), torch.tensor(3.0, dtype=torch.float64), torch.tensor([3.0])):
        got = adam_step_for_any_optimizer(given)
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float32 and got.shape == () and got.item() == 3.0
    for other in (None, True, "3", {"step": 3}, torch.zeros(2)):
        assert adam_step_for_any_optimizer(other) is other


def test_inspect_notes_an_int_step_until_resharded(tmp_path):
    from dstoolkit.ckpt.inspect import inspect_checkpoint

    dest = tmp_path / "global_step3"
    _zero12_source(dest, 3)  # as DeepSpeed's ds_to_universal leaves an offload run (or reshard did before)
    torch.save({"module": {}, "dp_world_size": 2, "global_steps": 3, "param_shapes": [SHAPES],
                "ds_config": {"zero_optimization": {"stage": 2}}}, dest / MODEL_STATES_NAMES[0])
    note = ("the Adam step is stored as a Python number (an optimizer-offload run's DeepSpeedCPUAdam), not a tensor: "
            "it resumes with offload_optimizer only; torch's Adam/AdamW (torch_adam) fails at its first step "
            "('state_steps ... singleton tensors'): re-run `dstoolkit ckpt reshard` on the source checkpoint, which "
            "stores it as a tensor")
    assert note in inspect_checkpoint(dest).notes
    _optimizer_state_for_every_stage(dest)
    assert note not in inspect_checkpoint(dest).notes
