"""s37 area A findings 2 and 3 (the guard): a resume after a spike rollback, before the next save, kept the
rollback's skipped positions but lost its LR cool-down and streak (retrained at lr_mult 1.0, the retrained checkpoints
marked healthy); `with Guard(...)` wrote its "done" record when the block raised. On a fake engine that counts like
DeepSpeed 0.19.8 (one micro-batch per step; load_checkpoint returns the client state saved with the tag); the real
2-rank runs are in test_s37_guard_dist.py."""
from __future__ import annotations

import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.runtime.train.ckpt import MANIFEST_NAME, ROLLBACK_STATE, CheckpointManager, tag_for  # noqa: E402
from dstoolkit.runtime.train.guard import CheckpointDirError, Guard  # noqa: E402
from dstoolkit.runtime.train.spike import Rollback, SpikeGuard, SpikeGuardConfig  # noqa: E402
from dstoolkit.runtime.train.writer_lock import WRITER_LOCK  # noqa: E402

POISON_POS = 13
"""The data position whose loss spikes: step 14 (one micro-batch per step), rolled back to step_00000012."""


class Opt:
    def __init__(self):
        self.param_groups = [{"lr": 0.1}]


class Engine:
    """engine.step() closes the window every micro-batch (gas 1); save/load keep global_steps and the client state."""

    def __init__(self):
        self.global_steps, self.micro_steps, self.optimizer, self.device, self.module = 0, 0, Opt(), None, None

    def gradient_accumulation_steps(self):
        return 1

    def is_gradient_accumulation_boundary(self):
        return True

    def backward(self, loss):
        pass

    def step(self):
        self.global_steps += 1
        self.micro_steps += 1

    def get_global_grad_norm(self):
        return 1.0

    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        os.makedirs(os.path.join(d, tag), exist_ok=True)
        torch.save({"gs": self.global_steps, "cs": client_state}, os.path.join(d, tag, "mp_rank_00_model_states.pt"))

    def load_checkpoint(self, root, tag):
        p = os.path.join(root, tag, "mp_rank_00_model_states.pt")
        s = torch.load(p, weights_only=False)
        self.global_steps = s["gs"]
        return p, s["cs"]


def _loss(pos):
    return 100.0 if pos == POISON_POS else 2.0 + 0.01 * (pos % 3)


def _guard(ck, metrics):
    return Guard(Engine(), config=SpikeGuardConfig(on_loss_spike="rollback"), checkpoint_dir=str(ck), save_every=4,
                 metrics_path=str(metrics), monitor_every=0, log=lambda m: None)


def _train(g, steps, stop_after_rollback=False):
    while g.step_count < steps:
        if g.should_skip_position():
            g.advance()
            continue
        if g.step(torch.tensor(_loss(g.data_pos))) == "rolled_back" and stop_after_rollback:
            return


def _trajectory(metrics):
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [(r["step"], r["data_pos"], r["loss"], r["lr_multiplier"]) for r in rows if "event" not in r]
    ckpts = [(r["step"], r["healthy"]) for r in rows if r.get("event") == "checkpoint"]
    return steps, ckpts, rows


def test_resume_right_after_a_rollback_continues_its_cool_down_streak_and_health_marks(tmp_path):
    # reference: uninterrupted
    ref = _guard(tmp_path / "a", tmp_path / "a.jsonl")
    _train(ref, 24)
    ref.close()
    ref_steps, ref_ckpts, _ = _trajectory(tmp_path / "a.jsonl")
    # the same run stopped right after the rollback event (a killed process: nothing closed), then resumed
    first = _guard(tmp_path / "b", tmp_path / "b.jsonl")
    _train(first, 24, stop_after_rollback=True)
    assert (first.step_count, first.guard.lr_cooldown_left, first.rollbacks.streak) == (12, 10, 1)
    second = _guard(tmp_path / "b", tmp_path / "b2.jsonl")
    assert second.resume() == tag_for(12)
    assert (second.guard.lr_cooldown_left, second.rollbacks.streak, second.rollbacks.unresolved_step) == (10, 1, 14)
    _train(second, 24)
    second.close()
    steps, ckpts, rows = _trajectory(tmp_path / "b2.jsonl")
    (resume,) = [r for r in rows if r.get("event") == "resume"]
    assert (resume["after_rollback"], resume["lr_cooldown_left"], resume["rollback_streak"]) == (True, 10, 1)
    after = [s for s in ref_steps if s[0] > 12][-12:]  # the retrained steps 13..24 of the reference
    assert steps == after
    assert [m for _, _, _, m in steps] == [0.1] * 10 + [1.0] * 2  # was 1.0 everywhere: the cool-down was dropped
    assert ckpts == [c for c in ref_ckpts if c[0] > 12][-3:] == [(16, False), (20, False), (24, True)]  # was True
    assert POISON_POS not in [p - 1 for _, p, _, _ in steps]


def test_record_rollback_keeps_the_newest_state_and_restore_prefers_it(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=5)
    for step in (4, 8):
        mgr.save(Engine(), step, {}, healthy=True, barrier=lambda: None)
    g = SpikeGuard(SpikeGuardConfig(lr_scale_steps=7))
    rb = Rollback(g)
    assert mgr.rollback_state(tag_for(4)) is None  # no rollback recorded
    g.losses.extend([2.0, 2.5])
    g.after_rollback()
    rb.streak, rb.unresolved_step = 2, 9
    mgr.record_rollback(tag_for(4), [7], rb.after_state())
    g.lr_cooldown_left = 3
    mgr.record_rollback(tag_for(4), [8], rb.after_state())  # a second rollback to the same tag: the newest state
    manifest = json.loads((tmp_path / tag_for(4) / MANIFEST_NAME).read_text())
    assert manifest[ROLLBACK_STATE] == {"guard": {"losses": [2.0, 2.5], "grad_norms": [], "consecutive_skips": 0,
                                                  "lr_cooldown_left": 3, "last_spike_step": -(10**9)},
                                        "rollback": {"streak": 2, "unresolved_step": 9}}
    assert manifest["rollback_skip_positions"] == [7, 8] and mgr.tags() == [tag_for(4)]
    # a resume: the recorded state wins over what the checkpoint saved (the guard as at the save, streak 0)
    fresh = Rollback(SpikeGuard(SpikeGuardConfig(lr_scale_steps=7)))
    assert fresh.restore({"streak": 0, "unresolved_step": None}, mgr.rollback_state(tag_for(4))) is True
    assert (list(fresh.guard.losses), fresh.guard.lr_cooldown_left, fresh.streak, fresh.unresolved_step) == (
        [2.0, 2.5], 3, 2, 9)
    # no record: the streak the checkpoint saved; a checkpoint from before streaks were saved: nothing changes
    other = Rollback(SpikeGuard())
    assert other.restore({"streak": 1, "unresolved_step": 6}, None) is False
    assert (other.streak, other.unresolved_step) == (1, 6)
    assert other.restore(None, None) is False and (other.streak, other.unresolved_step) == (1, 6)
    # a damaged record: one line naming the file, the key and the fix
    manifest[ROLLBACK_STATE] = {"guard": {}}
    (tmp_path / tag_for(4) / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match=rf"{MANIFEST_NAME}: rollback_state is {{'guard': {{}}}}, not a guard "
                                           r"state after a rollback; remove that key"):
        mgr.rollback_state(tag_for(4))


def test_a_resume_from_a_later_save_keeps_the_streak(tmp_path):
    # the streak travels in every checkpoint: --max-rollbacks keeps counting across a crash
    g = _guard(tmp_path / "c", tmp_path / "c.jsonl")
    _train(g, 16)
    g.close()
    again = _guard(tmp_path / "c", tmp_path / "c2.jsonl")
    assert again.resume() == tag_for(16)
    assert (again.rollbacks.streak, again.rollbacks.unresolved_step, again.guard.lr_cooldown_left) == (1, 14, 6)


# finding 3: "done" only for a block that finished ------------------------------------------------------------------
def test_a_with_block_that_raises_writes_no_done_and_gives_the_lock_back(tmp_path):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    with pytest.raises(ZeroDivisionError):
        with _guard(ck, metrics) as g:
            _train(g, 2)
            1 / 0
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r.get("event") for r in rows] == [None, None]  # the two steps; was: then "done"
    assert not (ck / WRITER_LOCK).exists() and not any(ck.glob("step_*"))  # no save on a failed exit either


def test_a_refused_run_appends_no_done_to_the_earlier_runs_metrics(tmp_path):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    with _guard(ck, metrics) as g:
        _train(g, 4)
    before = metrics.read_text()
    assert json.loads(before.splitlines()[-1])["event"] == "done"
    with pytest.raises(CheckpointDirError, match="no guard.resume()"):
        with _guard(ck, metrics) as g:  # no resume(): refused at the first step
            _train(g, 6)
    assert metrics.read_text() == before and not (ck / WRITER_LOCK).exists()


def test_a_failed_final_save_gives_the_lock_back_without_done(tmp_path, monkeypatch):
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    with pytest.raises(OSError, match="disk gone"):
        with _guard(ck, metrics) as g:
            _train(g, 3)

            def fail(*a, **k):
                raise OSError("disk gone")
            monkeypatch.setattr(g.mgr, "save", fail)
    assert not (ck / WRITER_LOCK).exists()
    assert "done" not in metrics.read_text()
