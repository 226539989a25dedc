"""The spike guard's policy pieces, what the fuzz found: like-for-like baseline under gradient accumulation,
consecutive skips, the level-shift bound, the rollback count, pruning that keeps a rollback target, the record a
rollback leaves for a resume, the config's and the trainer flags' checks. No torch."""
import json
import math
import types

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train.ckpt import MANIFEST_NAME, CheckpointManager, tag_for
from dstoolkit.runtime.train.spike import Rollback, SettingError, SpikeGuard, SpikeGuardConfig

BAND = [2.00, 2.02, 1.98, 2.01, 1.99, 2.03, 1.97, 2.00]


def _warm(g, losses=BAND):
    for i, loss in enumerate(losses):
        assert g.observe_step(loss, None, i + 1).action == "none"


def test_the_window_holds_the_accepted_micro_batch_losses_not_step_means():
    g = SpikeGuard(SpikeGuardConfig(window=6))
    micro = [[2.0, 2.4, 1.6, 2.2], [1.8, 2.1, 2.3, 1.9]]
    for step, losses in enumerate(micro, 1):
        for x in losses:
            assert g.check_loss(x, step).action == "none"
        g.end_step()
        g.observe_step(sum(losses) / 4, 1.0, step)
    assert list(g.losses) == [1.6, 2.2, 1.8, 2.1, 2.3, 1.9]  # the newest 6 batch losses, none a mean
    g.check_loss(2.05, 3)
    g.observe_step(2.05, float("inf"), 3)  # a flagged update: its batches stay out of the baseline
    assert list(g.losses) == [1.6, 2.2, 1.8, 2.1, 2.3, 1.9] and g.pending == []


def test_a_batch_trained_on_between_two_skips_ends_the_run_of_skips():
    g = SpikeGuard(SpikeGuardConfig(escalate_after=2))
    _warm(g)
    assert g.check_loss(50.0, 9).action == "skip"
    assert g.check_loss(2.0, 9).action == "none" and g.consecutive_skips == 0
    d = g.check_loss(50.0, 9)
    assert (d.action, g.consecutive_skips) == ("skip", 1)  # was: rollback (counted since the last optimizer step)


def test_escalation_off_bounds_the_run_of_skips_by_the_window():
    g = SpikeGuard(SpikeGuardConfig(escalate_after=0, window=6))
    _warm(g, BAND[:6])
    actions = [g.check_loss(2.6, 7).action for _ in range(6)]
    assert actions == ["skip"] * 6 and len(g.losses) == 0 and g.consecutive_skips == 0
    assert [g.check_loss(2.6, 7).action for _ in range(8)] == ["none"] * 8  # the new level is the baseline


class _Mgr:
    def __init__(self, tag):
        self.tag, self.asked = tag, []

    def latest_valid(self, *, max_step=None, require_healthy=False):
        self.asked.append(max_step)
        return types.SimpleNamespace(tag=self.tag, step=None, rejected=[] if self.tag else ["step_00000010: x"])


def test_a_rollback_without_a_target_is_not_counted_and_restarts_the_baseline():
    # Was: counted before looking for a checkpoint: 5 'rollback_unavailable' -> "5 rollbacks did not clear".
    g = SpikeGuard()
    _warm(g)
    rb = Rollback(g, max_rollbacks=1)
    for spike in (20, 40, 60):
        assert rb.perform(_Mgr(None), spike, "r", load=None) == (None, ["step_00000010: x"])
        assert (rb.done, rb.streak, len(g.losses)) == (0, 0, 0)
        _warm(g)
    assert rb.perform(None, 80, "r", load=None) == (None, ["no checkpoint directory"])
    g.observe_step(2.0, 1.0, 1)
    rb.perform(_Mgr(None), 90, "r", load=None, kind="nonfinite_grad_norm")
    assert (len(g.losses), len(g.grad_norms)) == (1, 0)  # a grad-norm rollback restarts the grad-norm baseline


def test_rollbacks_that_clear_their_spike_do_not_use_up_the_limit():
    # Was: six rollbacks for six unrelated spikes 20 steps apart stopped the run ("5 rollbacks did not clear").
    g = SpikeGuard()
    rb = Rollback(g, max_rollbacks=2)
    loaded = []
    for spike in (21, 41, 61, 81, 101, 121):
        assert rb.perform(_Mgr("step_x"), spike, "r", loaded.append)[0] == "step_x"
    assert (rb.done, rb.streak, loaded) == (6, 1, ["step_x"] * 6)
    rb.perform(_Mgr("step_x"), 119, "r", loaded.append)  # back before 121: the same trouble, second in a row
    with pytest.raises(RuntimeError, match=r"^step 121: 2 rollbacks did not clear the spike \(r\); stopping"):
        rb.perform(_Mgr("step_x"), 121, "r", loaded.append)
    with pytest.raises(RuntimeError, match="a rollback is needed but max_rollbacks=0 allows none"):
        Rollback(g, max_rollbacks=0).perform(_Mgr("step_x"), 5, "r", loaded.append)


class _Engine:
    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        from pathlib import Path

        (Path(d) / tag).mkdir(parents=True, exist_ok=True)
        (Path(d) / tag / "model.pt").write_text(json.dumps(client_state))


def test_pruning_keeps_the_newest_healthy_checkpoint(tmp_path):
    # Was: the newest `keep` regardless of health: four cool-down saves pushed out the only rollback target.
    mgr = CheckpointManager(tmp_path, keep=3)
    for step, healthy in ((2, True), (4, True), (6, False), (8, False), (10, False), (12, False)):
        mgr.save(_Engine(), step, {"s": step}, healthy=healthy, barrier=lambda: None)
    assert mgr.tags() == [tag_for(12), tag_for(10), tag_for(8), tag_for(4)]
    assert mgr.latest_valid(max_step=10, require_healthy=True).tag == tag_for(4)
    mgr.save(_Engine(), 14, {}, healthy=True, barrier=lambda: None)
    assert mgr.tags() == [tag_for(14), tag_for(12), tag_for(10)]  # the newest healthy one is among the kept


def test_a_rollback_removes_the_abandoned_checkpoints_and_records_its_skips(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=5)
    for step in (5, 10, 15):
        mgr.save(_Engine(), step, {}, healthy=True, barrier=lambda: None)
    mgr.record_rollback(tag_for(5), [11, 10])
    mgr.record_rollback(tag_for(5), [12])
    assert mgr.tags() == [tag_for(5)] and (tmp_path / "latest").read_text() == tag_for(5)
    assert mgr.rollback_skips(tag_for(5)) == {10, 11, 12} and mgr.latest_valid().tag == tag_for(5)
    assert CheckpointManager(tmp_path, rank=1).rollback_skips(tag_for(5)) == {10, 11, 12}
    manifest = json.loads((tmp_path / tag_for(5) / MANIFEST_NAME).read_text())
    manifest["rollback_skip_positions"] = "10"
    (tmp_path / tag_for(5) / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match="rollback_skip_positions is 10, not a list of data positions"):
        mgr.rollback_skips(tag_for(5))


@pytest.mark.parametrize("kwargs, message", [
    ({"on_loss_spike": "rolback"}, "spike guard: on_loss_spike='rolback' must be one of none, skip, lr_scale, "
                                   "rollback"),
    ({"on_nonfinite": "drop"}, "spike guard: on_nonfinite='drop' is not an action; use one of skip, rollback"),
    ({"on_grad_norm_spike": "skip"}, "spike guard: on_grad_norm_spike='skip' is impossible (the norm is known "
                                     "after the update); use one of none, lr_scale, rollback"),
    ({"z_threshold": -1}, "spike guard: z_threshold=-1 must be a finite number > 0 (robust sigmas above the "
                          "baseline; the default is 6)"),
    ({"z_threshold": math.nan}, "spike guard: z_threshold=nan must be a finite number > 0"),
    ({"grad_norm_z_threshold": 0}, "spike guard: grad_norm_z_threshold=0 must be a finite number > 0"),
    ({"escalate_after": -1}, "spike guard: escalate_after=-1 must be a whole number >= 0"),
    ({"lr_scale_steps": -3}, "spike guard: lr_scale_steps=-3 must be a whole number >= 1"),
    ({"lr_scale_steps": 2.5}, "spike guard: lr_scale_steps=2.5 must be a whole number >= 1"),
    ({"rollback_margin_steps": -5}, "spike guard: rollback_margin_steps=-5 must be a whole number >= 0"),
    ({"window": 3}, "spike guard: window=3 must be a whole number >= 5 (accepted losses in the baseline, at least "
                    "min_history=5)"),
    ({"mad_floor_frac": -0.1}, "spike guard: mad_floor_frac=-0.1 must be a finite number >= 0"),
    ({"lr_scale": 5}, "spike guard: lr_scale=5 must be in (0, 1]"),
    ({"detrend": "yes"}, "spike guard: detrend='yes' must be True or False"),
])
def test_config_values_that_would_break_the_guard_are_refused(kwargs, message):
    with pytest.raises(SettingError) as info:
        SpikeGuardConfig(**kwargs)
    assert str(info.value).startswith(message) and info.value.name == next(iter(kwargs))


@pytest.mark.parametrize("extra, message", [
    (["--spike-z", "-1"], "--spike-z=-1.0 must be a finite number > 0 (robust sigmas above the baseline; the "
                          "default is 6)"),
    (["--spike-z", "nan"], "--spike-z=nan must be a finite number > 0"),
    (["--spike-window", "3"], "--spike-window=3 must be a whole number >= 5"),
    (["--escalate-after", "-1"], "--escalate-after=-1 must be a whole number >= 0"),
    (["--lr-scale", "5"], "--lr-scale=5.0 must be in (0, 1]"),
    (["--lr-scale-steps", "-3"], "--lr-scale-steps=-3 must be a whole number >= 1"),
    (["--max-rollbacks", "-1"], "--max-rollbacks=-1 must be a whole number >= 0"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints=0 must be a whole number >= 1"),
    (["--monitor-every", "0"], "--monitor-every=0 must be a whole number >= 1"),
])
def test_dstoolkit_train_refuses_bad_helper_flags_before_launch(train_files, capsys, monkeypatch, extra, message):
    from dstoolkit.cli import train as train_cli

    monkeypatch.setattr(train_cli.subprocess, "run", lambda *a, **k: pytest.fail("launched"))
    spec, ds = train_files
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--", *extra])
    assert rc == 2 and capsys.readouterr().err.startswith(f"dstoolkit train: error: {message}")


def test_ratio_policy_counts_the_ratio_as_written():
    """ceil(ratio * L) of the decimal the user wrote: 0.28 * 25 is 7.000000000000001 in floating point (8 blocks)."""
    from fractions import Fraction
    import math

    from dstoolkit.spec.checkpoint import CheckpointPolicy

    for L, r, want in ((25, 0.28, 7), (50, 0.14, 7), (50, 0.56, 28), (75, 0.28, 21), (10, 0.25, 3), (4, 1.0, 4)):
        assert sum(CheckpointPolicy(kind="ratio", ratio=r).checkpointed_layers(L)) == want
    misses = [(L, k) for L in range(1, 129) for k in range(1, 100)
              if sum(CheckpointPolicy(kind="ratio", ratio=k / 100).checkpointed_layers(L))
              != math.ceil(Fraction(k, 100) * L)]
    assert misses == []
