"""Guard (the wrapper for a user's DeepSpeed loop) on a fake CPU engine: what the spike-guard fuzz found.
Gradient accumulation compared like with like, consecutive means consecutive, a lasting level shift without a
checkpoint, a non-finite grad norm's batch not replayed, resume after a rollback, the LR cool-down on the
update (timing, and a scheduler's schedule kept). The real 2-rank runs: tests/dist/test_user_scripts.py."""
import json
import math
import os
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.runtime.train.guard import Guard  # noqa: E402
from dstoolkit.runtime.train.spike import SpikeGuardConfig  # noqa: E402


class Opt:
    """An optimizer without step hooks (the Guard scales the LR around engine.step)."""

    def __init__(self, lr):
        self.param_groups = [{"lr": lr}]


class FakeEngine:
    """The DeepSpeed engine calls the Guard makes, on CPU: GA counting, LR log per update, checkpoints."""

    def __init__(self, ga=1, lr=1.0, grad_norm=lambda step: 1.0):
        self.ga, self.global_steps, self.micro, self.optimizer = ga, 0, 0, Opt(lr)
        self.grad_norm, self.device = grad_norm, None
        self.lr_used, self.trained = [], []

    def backward(self, loss):
        self.trained.append(float(loss))

    def step(self):
        self.micro += 1
        if self.micro % self.ga == 0:
            self.global_steps += 1
            self.lr_used.append(self.optimizer.param_groups[0]["lr"])

    def get_global_grad_norm(self):
        return self.grad_norm(self.global_steps)

    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        os.makedirs(os.path.join(d, tag), exist_ok=True)
        torch.save({"gs": self.global_steps, "cs": client_state, "lr": self.optimizer.param_groups[0]["lr"]},
                   os.path.join(d, tag, "mp_rank_00_model_states.pt"))

    def load_checkpoint(self, root, tag):
        p = os.path.join(root, tag, "mp_rank_00_model_states.pt")
        s = torch.load(p, weights_only=False)
        self.global_steps, self.micro = s["gs"], s["gs"] * self.ga
        self.optimizer.param_groups[0]["lr"] = s["lr"]
        return p, s["cs"]


def _run(g, steps, loss_at, limit=10_000):
    """Drive `g` like a user's loop until `steps` optimizer steps (or `limit` batches); loss_at(data_pos)."""
    results = {}
    for _ in range(limit):
        if g.step_count >= steps:
            break
        r = g.step(torch.tensor(loss_at(g.data_pos)))
        results[r] = results.get(r, 0) + 1
    return results


def _events(g, name):
    return [e for e in g.events if e["event"] == name]


@pytest.mark.parametrize("ga", [1, 4, 16])
def test_grad_accum_judges_micro_batches_against_micro_batch_losses(ga):
    # Was: each micro-batch loss against a window of step MEANS (sqrt(GA) less noisy): GA=16 flagged 565 of
    # 4800 batches of pure noise as spikes. Now the window holds the accepted micro-batch losses.
    rng = random.Random(0)
    e = FakeEngine(ga=ga)
    g = Guard(e, monitor_every=0, log=lambda m: None)
    assert _run(g, 60, lambda pos: 2.5 + rng.gauss(0, 0.15)) == {"trained": 60 * ga}
    assert _events(g, "spike") == []
    assert list(g.guard.losses) == e.trained[-20:]


def test_two_bad_micro_batches_with_a_good_one_between_are_not_consecutive(tmp_path):
    e = FakeEngine(ga=4)
    g = Guard(e, checkpoint_dir=str(tmp_path / "ck"), save_every=2, monitor_every=0, log=lambda m: None)
    rng = random.Random(0)
    _run(g, 12, lambda pos: 50.0 if pos in (40, 42) else 2.0 + rng.gauss(0, 0.002))
    assert [(s["data_pos"], s["action"]) for s in _events(g, "spike")] == [(40, "skip"), (42, "skip")]
    assert _events(g, "rollback") == [] and g.step_count == 12 and g.data_pos == 50


def test_level_shift_without_checkpoint_restarts_the_baseline_instead_of_skipping_forever():
    # Was: loss 2.0 -> 2.6 at batch 30, no checkpoint: 4970 of 5000 batches skipped, 30 steps, no error.
    rng = random.Random(0)
    g = Guard(FakeEngine(), monitor_every=0, log=lambda m: None)
    res = _run(g, 200, lambda pos: (2.0 if pos < 30 else 2.6) + rng.gauss(0, 0.01))
    assert res == {"trained": 200, "skipped": 2} and g.data_pos == 202
    assert [(s["data_pos"], s["action"]) for s in _events(g, "spike")] == [(30, "skip"), (31, "rollback")]
    (un,) = _events(g, "rollback_unavailable")
    assert (un["step"], un["kind"], un["rejected"], un["baseline_restarted"]) == (
        31, "loss_spike", ["no checkpoint directory"], True)
    assert min(g.guard.losses) > 2.5  # the baseline is the new level


def test_level_shift_with_escalation_off_restarts_after_window_skips():
    rng = random.Random(0)
    g = Guard(FakeEngine(), config=SpikeGuardConfig(escalate_after=0, window=10), monitor_every=0,
              log=lambda m: None)
    res = _run(g, 100, lambda pos: (2.0 if pos < 30 else 2.6) + rng.gauss(0, 0.01))
    assert res == {"trained": 100, "skipped": 10}
    spikes = _events(g, "spike")
    assert [s["data_pos"] for s in spikes] == list(range(30, 40)) and {s["action"] for s in spikes} == {"skip"}
    assert spikes[-1]["reason"].endswith("10 consecutive skipped batches with escalation off (escalate_after=0): "
                                         "the loss moved to a new level, the baseline restarts from the next 5 "
                                         "batches")


def test_nonfinite_grad_norm_marks_the_batches_of_that_update(tmp_path):
    # Was: the rollback marked no data position, the same batch came back after every rollback until
    # max_rollbacks raised.
    rng = random.Random(0)
    bad = {"now": False}

    class E(FakeEngine):
        def get_global_grad_norm(self):
            return math.inf if bad["now"] else 1.0 + rng.gauss(0, 0.01)

    e = E()
    g = Guard(e, checkpoint_dir=str(tmp_path / "ck"), save_every=5, monitor_every=0, log=lambda m: None)

    def loss_at(pos):
        bad["now"] = pos == 17
        return 2.0 + rng.gauss(0, 0.01)

    _run(g, 40, loss_at)
    (rb,) = _events(g, "rollback")
    assert (rb["step"], rb["to_tag"], rb["skip_positions"]) == (19, "step_00000015", [17])
    assert g.step_count == 40 and g.skip_positions == {17}


def test_resume_after_a_rollback_takes_its_target_and_keeps_the_skipped_batches(tmp_path):
    # Was: `latest` and the newest tag still named step 10 of the abandoned trajectory; a kill before the next
    # save resumed from it with the offending batches forgotten.
    rng = random.Random(0)
    ck = tmp_path / "ck"
    g = Guard(FakeEngine(), checkpoint_dir=str(ck), save_every=5, monitor_every=0, log=lambda m: None)
    while not _events(g, "rollback"):  # killed right after the rollback, before step 10 is saved again
        g.step(torch.tensor(50.0 if g.data_pos in (10, 11) else 2.0 + rng.gauss(0, 0.01)))
    (rb,) = _events(g, "rollback")
    assert (rb["step"], rb["to_tag"], rb["skip_positions"], g.step_count) == (11, "step_00000005", [10, 11], 5)
    assert (ck / "latest").read_text() == "step_00000005" and g.mgr.tags() == ["step_00000005"]
    g2 = Guard(FakeEngine(), checkpoint_dir=str(ck), save_every=5, monitor_every=0, log=lambda m: None)
    assert g2.resume() == "step_00000005"
    assert (g2.step_count, g2.data_pos, g2.skip_positions) == (5, 5, {10, 11})


def test_lr_cooldown_scales_the_spiking_update_and_the_next_ones():
    # Was: steps 16..24 scaled (9, starting one late); now 15..24 (lr_scale_steps=10, the spiking step first).
    rng = random.Random(0)
    e = FakeEngine(lr=1.0)
    g = Guard(e, config=SpikeGuardConfig(on_loss_spike="lr_scale", lr_scale=0.1, lr_scale_steps=10),
              monitor_every=0, log=lambda m: None)
    _run(g, 30, lambda pos: 50.0 if pos == 14 else 2.0 + rng.gauss(0, 0.01))
    assert [s for s, lr in enumerate(e.lr_used, 1) if lr != 1.0] == list(range(15, 25))
    assert {lr for lr in e.lr_used if lr != 1.0} == {0.1} and e.optimizer.param_groups[0]["lr"] == 1.0
    rows = [r for r in g.events if r.get("event") == "spike"]
    assert rows[0]["action"] == "lr_scale" and rows[0]["step"] == 15


def _scheduled_run(spike_pos, metrics=None):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    used = []
    e = FakeEngine()
    e.optimizer = opt
    count = e.step

    def step():  # DeepSpeed's order: optimizer step, then the scheduler
        count()
        p.grad = torch.zeros(1)
        opt.step()
        sched.step()

    e.step = step
    g = Guard(e, config=SpikeGuardConfig(on_loss_spike="lr_scale", lr_scale=0.5, lr_scale_steps=4),
              monitor_every=0, log=lambda m: None, metrics_path=metrics)
    opt.register_step_pre_hook(lambda o, a, k: used.append(o.param_groups[0]["lr"]))  # after the Guard's hook
    rng = random.Random(0)
    _run(g, 20, lambda pos: 50.0 if pos == spike_pos else 2.0 + rng.gauss(0, 0.01))
    return used, opt.param_groups[0]["lr"], g


def test_lr_cooldown_scales_what_the_scheduler_sets_and_keeps_the_schedule(tmp_path):
    # Was: the LR pinned at the captured start value x scale for the cool-down, then a stale value restored:
    # at step 20 the LR was 0.1853 instead of the schedule's 0.1351.
    plain, plain_end, _ = _scheduled_run(spike_pos=None)
    used, end, g = _scheduled_run(spike_pos=8, metrics=str(tmp_path / "m.jsonl"))
    g.close()
    assert plain == pytest.approx([0.9 ** k for k in range(20)], rel=1e-12) and plain_end == pytest.approx(0.9 ** 20)
    assert used == [lr * 0.5 if 9 <= s <= 12 else lr for s, lr in enumerate(plain, 1)]
    assert end == plain_end
    rows = [json.loads(ln) for ln in (tmp_path / "m.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "event" not in r]
    assert [r["lr"] for r in steps] == used  # the LR each update used
    assert [r["lr_multiplier"] for r in steps] == [0.5 if 9 <= r["step"] <= 12 else 1.0 for r in steps]


def test_hf_callback_cooldown_starts_with_the_spiking_update_and_lasts_lr_scale_steps(tmp_path):
    # Was: the spiking step's update unscaled and lr_scale_steps - 1 scaled ones after it (as in the Guard).
    pytest.importorskip("transformers")
    import types

    from dstoolkit.runtime.train.hf import DstoolkitCallback

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, input_ids=None, value=1.0):
            return {"loss": self.w.sum() * value}

    cb = DstoolkitCallback(config=SpikeGuardConfig(min_history=3, window=5, on_loss_spike="lr_scale", lr_scale=0.5,
                                                   lr_scale_steps=2), cross_rank_every=0)
    state, args, m = types.SimpleNamespace(global_step=0), types.SimpleNamespace(output_dir=str(tmp_path)), M()
    cb.on_train_begin(args, state, None, model=m)
    groups = [{"lr": 1.0}]
    cb.engine = types.SimpleNamespace(optimizer=types.SimpleNamespace(param_groups=groups),
                                      get_global_grad_norm=lambda: 1.0)
    used = []
    for step, v in enumerate([2.0, 2.01, 1.99, 2.0, 2.02, 50.0, 2.0, 2.01, 1.98], start=1):
        m(input_ids=torch.zeros(1, 4, dtype=torch.long), value=v)
        used.append(groups[0]["lr"])  # the optimizer steps with this LR
        groups[0]["lr"] = 1.0  # a constant schedule sets the LR after the step
        state.global_step = step
        cb.on_step_end(args, state, None)
    assert used == [1.0] * 5 + [0.5, 0.5] + [1.0] * 2


def test_a_second_guard_on_the_same_optimizer_does_not_scale_the_lr_twice():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    e = FakeEngine()
    e.optimizer = opt
    cfg = SpikeGuardConfig(on_loss_spike="lr_scale", lr_scale=0.5)
    Guard(e, config=cfg, monitor_every=0, log=lambda m: None)
    g = Guard(e, config=cfg, monitor_every=0, log=lambda m: None)
    used = []
    opt.register_step_pre_hook(lambda o, a, k: used.append(o.param_groups[0]["lr"]))
    g.guard.lr_cooldown_left = 1
    p.grad = torch.zeros(1)
    opt.step()
    assert used == [0.5] and opt.param_groups[0]["lr"] == 1.0
