"""SpikeGuard decisions on loss / grad-norm sequences (real runs: tests/dist/test_train_spike.py)."""
import math

import pytest

from dstoolkit.runtime.train.spike import SpikeGuard, SpikeGuardConfig, robust_z

BAND = [2.00, 2.02, 1.98, 2.01, 1.99, 2.03, 1.97, 2.00]


def _warm(guard, losses=BAND, norms=None):
    for i, loss in enumerate(losses):
        d = guard.observe_step(loss, None if norms is None else norms[i], i + 1)
        assert d.action == "none"


def test_robust_z_matches_definition():
    # median 2, |dev| = [0, .1, .1, .2, .2] -> MAD 0.1; z = (2.5 - 2) / (1.4826 * 0.1)
    z, med, mad = robust_z(2.5, [2.0, 2.1, 1.9, 2.2, 1.8], mad_floor_frac=0.0)
    assert (med, round(mad, 12)) == (2.0, 0.1)
    assert z == pytest.approx(0.5 / 0.14826)


def test_band_losses_pass_and_spike_is_skipped_with_reason():
    g = SpikeGuard()
    _warm(g)
    assert g.check_loss(2.05, 9).action == "none"
    assert g.check_loss(1.5, 9).action == "none"  # a drop is never a spike
    d = g.check_loss(6.0, 9)
    assert (d.action, d.kind) == ("skip", "loss_spike")
    assert "robust sigmas above the trend" in d.reason and d.z > 6


def test_nonfinite_loss_is_caught_even_without_history():
    g = SpikeGuard()
    d = g.check_loss(float("nan"), 1)
    assert (d.action, d.kind) == ("skip", "nonfinite_loss") and "not finite" in d.reason
    assert g.check_loss(math.inf, 1).kind == "nonfinite_loss"


def test_consecutive_skips_escalate_to_rollback_and_reset_on_a_good_step():
    g = SpikeGuard(SpikeGuardConfig(escalate_after=2))
    _warm(g)
    assert g.check_loss(9.0, 9).action == "skip"
    d = g.check_loss(9.5, 9)
    assert d.action == "rollback" and "2 consecutive skipped batches -> rollback" in d.reason
    g.after_rollback()
    assert g.lr_multiplier() == pytest.approx(0.1) and not g.healthy()
    assert g.check_loss(9.0, 9).action == "skip"  # counter restarted after the rollback
    g.observe_step(2.0, None, 9)
    assert g.consecutive_skips == 0


def test_lr_cooldown_counts_steps():
    g = SpikeGuard(SpikeGuardConfig(on_loss_spike="lr_scale", lr_scale=0.5, lr_scale_steps=3))
    _warm(g)
    assert g.check_loss(9.0, 9).action == "lr_scale"
    mults = []
    for _ in range(4):
        mults.append(g.lr_multiplier())
        g.end_step()
    assert mults == [0.5, 0.5, 0.5, 1.0]


def test_grad_norm_spike_and_nonfinite_grad_norm():
    g = SpikeGuard(SpikeGuardConfig(grad_norm_z_threshold=10))
    _warm(g, norms=[1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02, 0.98])
    d = g.observe_step(2.0, 50.0, 9)
    assert (d.action, d.kind) == ("lr_scale", "grad_norm_spike") and "grad norm 50" in d.reason
    assert len(g.grad_norms) == 8 and len(g.losses) == 8  # a flagged step does not enter the baseline
    assert g.observe_step(2.0, float("inf"), 10).action == "rollback"


def test_flat_loss_noise_is_not_a_spike():
    g = SpikeGuard()
    _warm(g, losses=[2.0] * 8)  # MAD 0: the 1% floor keeps tiny noise below threshold
    assert g.check_loss(2.05, 9).action == "none"
    assert g.check_loss(2.5, 9).action == "skip"


def test_state_roundtrip_and_rollback_limit():
    g = SpikeGuard(SpikeGuardConfig(rollback_margin_steps=2))
    _warm(g)
    h = SpikeGuard()
    h.load_state_dict(g.state_dict())
    assert list(h.losses) == BAND and h.rollback_limit(15) == 13


@pytest.mark.parametrize("kwargs, match", [
    ({"min_history": 1}, "min_history"),
    ({"lr_scale": 0.0}, "lr_scale=0.0"),
    ({"on_grad_norm_spike": "skip"}, "impossible"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpikeGuardConfig(**kwargs)


def test_detrended_baseline_catches_a_spike_during_a_fast_fall():
    falling = [4.25, 4.02, 3.76, 3.62, 3.11, 3.01, 2.78, 2.41]  # measured early-training losses
    plain, trend = SpikeGuard(SpikeGuardConfig(detrend=False)), SpikeGuard()
    _warm(plain, falling)
    _warm(trend, falling)
    assert plain.check_loss(5.3, 9).action == "none"  # median 3.37, MAD 0.5: the spread hides it
    d = trend.check_loss(5.3, 9)
    assert d.action == "skip" and d.baseline < 2.6  # baseline = trend value at the newest point
    assert trend.check_loss(2.3, 9).action == "none"  # the next point on the trend is fine
