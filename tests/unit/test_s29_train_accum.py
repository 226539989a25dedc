"""`dstoolkit.runtime.train.accum`: closing DeepSpeed's accumulation window before a rollback's load, and aligning
it after a batch-ramp change, against DeepSpeed 0.19.8's counting rule (runtime/engine.py: the optimizer steps in
`step()` when (micro_steps + 1) % gradient_accumulation_steps == 0, then micro_steps += 1; `load_checkpoint`
leaves micro_steps and the accumulated gradients alone). The real engines: tests/dist/test_s29_train_rollback_accum.py
and test_s29_train_ramp_window.py."""
from __future__ import annotations

import pytest

from dstoolkit.runtime.train.accum import align_window, close_window, open_micro_batches


class _Loss:
    def __init__(self, value):
        self.value = value

    def __mul__(self, k):
        return _Loss(self.value * k)


class CountingEngine:
    """DeepSpeed's boundary rule, the gradient sum and the load that leaves both alone."""

    def __init__(self, gas):
        self.gas, self.micro_steps, self.grad, self.updates = gas, 0, 0.0, []

    def gradient_accumulation_steps(self):
        return self.gas

    def backward(self, loss):
        self.grad += loss.value

    def step(self):
        if (self.micro_steps + 1) % self.gas == 0:
            self.updates.append(self.grad)
            self.grad = 0.0
        self.micro_steps += 1

    def train(self, *values):
        for v in values:
            self.backward(_Loss(v))
            self.step()


def test_close_window_steps_the_abandoned_gradients_away_and_ends_at_a_window_start():
    e = CountingEngine(gas=4)
    e.train(1, 1, 1, 1, 5, 7)  # one full step, then 2 micro-batches into the next window
    assert open_micro_batches(e) == 2
    assert close_window(e, _Loss(1000.0)) == 2  # the rejected micro-batch's loss, weight 0
    assert e.updates == [4.0, 12.0] and e.grad == 0.0 and open_micro_batches(e) == 0
    e.train(1, 2, 3, 4)  # the first step after the rollback holds its own 4 micro-batches only
    assert e.updates[-1] == 10.0


def test_close_window_does_nothing_at_a_window_start():
    e = CountingEngine(gas=4)
    e.train(1, 1, 1, 1)
    assert close_window(e, None) == 0 and e.updates == [4.0] and e.micro_steps == 4


def test_an_open_window_without_a_loss_is_an_error_not_a_silent_mix():
    e = CountingEngine(gas=4)
    e.train(1)
    with pytest.raises(RuntimeError, match=r"^a rollback 1 micro-batches into an accumulation window of 4 needs the "
                                           r"rejected micro-batch's loss to close the window"):
        close_window(e, None)


def test_align_window_after_the_ramp_changes_the_window():
    e = CountingEngine(gas=1)
    e.train(1, 1, 1)
    e.gas = 2  # engine.set_train_batch_size: the window grows, the count stays at 3
    assert open_micro_batches(e) == 1 and align_window(e) == 1 and e.micro_steps == 2
    e.train(2, 3)
    assert e.updates == [1.0, 1.0, 1.0, 5.0] and align_window(e) == 0


def test_an_engine_without_deepspeeds_count_is_left_alone():
    class Stand:
        micro = 3

    assert (open_micro_batches(Stand()), close_window(Stand(), None), align_window(Stand())) == (0, 0, 0)
