"""A NaN/Inf loss is never back-propagated. Was: `--spike-action lr_scale` made the guard's on_nonfinite
"lr_scale" (builders.build_guard), so the trainer back-propagated and stepped a NaN loss with a scaled LR (NaN
weights), and `SpikeGuardConfig(on_nonfinite="lr_scale")` / "none" were accepted for the same result. Now the CLI
maps every --spike-action but rollback to skip for a non-finite loss, and the config refuses the two actions that
train on it. Also --inject-poison STEP[:MICRO] (which micro-batch of the step gets the random labels)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dstoolkit.runtime.train.builders import build_guard
from dstoolkit.runtime.train.spike import SettingError, SpikeGuardConfig
from dstoolkit.runtime.train.trainer_inputs import build_parser

REQUIRED = ["--deepspeed_config", "ds.json", "--spec", "s.yaml", "--steps", "3", "--metrics-out", "m.jsonl"]


@pytest.mark.parametrize("value", ["lr_scale", "none"])
def test_actions_that_train_on_a_nonfinite_loss_are_refused(value):
    with pytest.raises(SettingError) as info:
        SpikeGuardConfig(on_nonfinite=value)
    assert str(info.value) == (f"spike guard: on_nonfinite={value!r} would back-propagate a NaN/Inf loss and step it "
                               "(every weight NaN); use one of skip, rollback")
    assert (info.value.name, info.value.value) == ("on_nonfinite", value)


def test_a_word_that_is_no_action_is_refused_with_the_allowed_ones():
    with pytest.raises(SettingError, match=r"^spike guard: on_nonfinite='drop' is not an action; use one of skip, "
                                           r"rollback$"):
        SpikeGuardConfig(on_nonfinite="drop")


def test_skip_and_rollback_are_the_nonfinite_actions():
    from dstoolkit.runtime.train.spike import NONFINITE_ACTIONS

    assert NONFINITE_ACTIONS == ("skip", "rollback")
    assert [SpikeGuardConfig(on_nonfinite=a).on_nonfinite for a in NONFINITE_ACTIONS] == ["skip", "rollback"]
    assert SpikeGuardConfig().on_nonfinite == "skip"


@pytest.mark.parametrize("action, expected", [("none", "skip"), ("skip", "skip"), ("lr_scale", "skip"),
                                              ("rollback", "rollback")])
def test_the_cli_maps_every_spike_action_to_a_nonfinite_action_that_never_trains(action, expected):
    args = build_parser().parse_args(REQUIRED + ["--spike-action", action, "--checkpoint-dir", "ck"])
    guard = build_guard(args)
    assert (guard.config.on_loss_spike, guard.config.on_nonfinite) == (action, expected)
    d = guard.check_loss(math.nan, 1)
    assert (d.kind, d.action) == ("nonfinite_loss", expected)


class _Engine:
    """engine(x, y) returns the next scripted loss; backward records what it is given."""

    def __init__(self, losses):
        import torch

        self.losses = [torch.tensor(v, requires_grad=True) for v in losses]
        self.backwarded: list[float] = []
        self.steps = 0

    def __call__(self, x, y):
        return self.losses.pop(0) * 1.0

    def backward(self, loss):
        self.backwarded.append(float(loss.detach()))

    def step(self):
        self.steps += 1


def test_trainer_with_spike_action_lr_scale_skips_a_nan_loss_instead_of_stepping_it():
    torch = pytest.importorskip("torch")
    from dstoolkit.runtime.train.faults import FaultInjector
    from dstoolkit.runtime.train.run_state import RunState
    from dstoolkit.runtime.train.trainer import accumulate

    args = build_parser().parse_args(REQUIRED + ["--spike-action", "lr_scale"])
    events: list[dict] = []
    writer = SimpleNamespace(write=events.append)
    good = [2.0, 2.01, 1.99, 2.02, 1.98, 2.0]
    engine = _Engine(good + [math.nan, 2.01, 1.99])
    lr_calls: list[float] = []
    run = SimpleNamespace(
        args=args, state=RunState(), guard=build_guard(args), engine=engine, on_cuda=False, shape=None,
        data=SimpleNamespace(batch=lambda pos: (torch.zeros(1, 2), torch.zeros(1, 2))),
        faults=FaultInjector(args, {}, writer), writer=writer, log=lambda m: None, global_mean=lambda v: v,
        lr=SimpleNamespace(own_schedule=True, set=lambda m: lr_calls.append(m) or 0.1), ckpt=None)
    acc = accumulate(run, target=1, gas=8, lr=0.1, mult=1.0)
    assert engine.backwarded == pytest.approx(good + [2.01, 1.99]) and engine.steps == 8
    assert acc.losses == pytest.approx(good + [2.01, 1.99]) and run.state.data_pos == 9
    assert acc.positions == [0, 1, 2, 3, 4, 5, 6, 7, 8] and lr_calls == []  # no LR cool-down for a NaN
    (spike,) = events
    assert (spike["kind"], spike["action"], spike["data_pos"]) == ("nonfinite_loss", "skip", 6)


@pytest.mark.parametrize("text, parsed", [("14", (14, 0)), ("5:2", (5, 2)), ("1:0", (1, 0))])
def test_inject_poison_names_the_step_and_its_micro_batch(text, parsed):
    args = build_parser().parse_args(REQUIRED + ["--inject-poison", text])
    assert args.inject_poison == [parsed]


@pytest.mark.parametrize("text", ["0", "5:-1", "x", "5:y", "5:1:2"])
def test_inject_poison_out_of_range_is_a_usage_error(text, capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(REQUIRED + ["--inject-poison", text])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"argument --inject-poison: {text!r}: expected STEP[:MICRO], a step >= 1 and the 0-based micro-batch of "
        "that step, e.g. 14 or 5:2")


def test_poison_fires_once_at_its_micro_batch():
    from dstoolkit.runtime.train.faults import FaultInjector

    args = build_parser().parse_args(REQUIRED + ["--inject-poison", "5:2"])
    f = FaultInjector(args, {}, SimpleNamespace(write=lambda e: None))
    assert [f.poison_due(5, m) for m in range(4)] == [False, False, True, False]
    assert not f.poison_due(4, 2)
    f.poisoned(5, 18)
    assert not f.poison_due(5, 2)  # a rollback that replays step 5 trains on clean labels
