"""The other training helpers' inputs, what the fuzz found: a NaN timing in the cross-rank view, the monitor's
NaN / zero / negative inputs, the batch ramp's and the Guard's bad arguments. Each is an error naming the
argument, or a result that says what it left out."""
import math

import pytest

from dstoolkit.estimate.batch_ramp import BatchRamp
from dstoolkit.runtime.train.crossrank import RankWindow, diagnose
from dstoolkit.runtime.train.monitor import Monitor, StepSample
from dstoolkit.runtime.train.spike import SettingError
from dstoolkit.spec.model import BatchRampSpec


def _rank(rank, compute):
    return RankWindow(rank, rank, f"h{rank}", 1.0, compute, 1.0 - compute, 0.0, 0.0)


@pytest.mark.parametrize("where", [0, 1, 3])
def test_a_nan_timing_on_any_rank_does_not_hide_the_slow_rank(where):
    # Was: NaN on rank 0 or 1 -> no bottleneck (max() with a NaN key, a median over a NaN); on rank 3 -> found.
    compute = [0.3, 0.3, 0.9, 0.3]
    compute[where] = math.nan
    b = diagnose([_rank(r, c) for r, c in enumerate(compute)])
    assert (b.kind, b.rank, b.slower_pct) == ("compute", 2, pytest.approx(200.0))
    assert b.evidence.endswith(f"; rank(s) {where} left out: NaN timings (nothing measured)")
    assert diagnose([_rank(0, 0.3), _rank(1, math.nan)]) is None  # one measured rank: nothing to compare


def _report(samples, **kw):
    m = Monitor(len(samples), **{"flops_per_token": 1e6, "peak_flops": 1e12, **kw})
    out = [m.record(s) for s in samples]
    return out[-1]


@pytest.mark.parametrize("field, value, message", [
    ("step_time_s", math.nan, "monitor: step 1: step_time_s=nan must be a finite number of seconds > 0"),
    ("step_time_s", 0.0, "monitor: step 1: step_time_s=0.0 must be a finite number of seconds > 0"),
    ("input_wait_s", -1.0, "monitor: step 1: input_wait_s=-1.0 must be a finite number of seconds >= 0"),
    ("cpu_time_s", math.inf, "monitor: step 1: cpu_time_s=inf must be a finite number of seconds >= 0"),
    ("comm_time_s", math.nan, "monitor: step 1: comm_time_s=nan must be a finite number of seconds >= 0"),
])
def test_monitor_refuses_a_timing_it_cannot_use(field, value, message):
    # Was: a NaN step time reported as 0 tok/s and 'idle-compute'.
    sample = dict(step=1, step_time_s=1.0, input_wait_s=0.0, tokens=1000, loss=2.0, cpu_time_s=1.0)
    sample[field] = value
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
        _report([StepSample(**sample)])


def test_monitor_flags_a_nonfinite_loss_instead_of_ok():
    r = _report([StepSample(i, 1.0, 0.0, 1000, loss, 1.0) for i, loss in enumerate([3.0, math.nan, 2.0], 1)])
    assert [f.name for f in r.flags] == ["nonfinite-loss"]
    assert r.flags[0].evidence == "loss not finite at step(s) 2; the trend is over the finite ones"
    assert r.loss_trend_per_step == -1.0 and r.line().endswith("| nonfinite-loss")


@pytest.mark.parametrize("kw, message", [
    ({"world_size": 0}, "monitor: world_size=0 must be a whole number >= 1"),
    ({"world_size": -2}, "monitor: world_size=-2 must be a whole number >= 1"),
    ({"peak_flops": -1.0}, "monitor: peak_flops=-1.0 must be a finite number > 0, or None (no MFU)"),
    ({"flops_per_token": math.nan}, "monitor: flops_per_token=nan must be a finite number > 0, or None (no MFU)"),
])
def test_monitor_settings_that_gave_a_traceback_or_a_wrong_mfu(kw, message):
    # Was: world_size 0 ZeroDivisionError, -2 a negative MFU, peak_flops -1 flagged 'above-peak'.
    with pytest.raises(SettingError) as info:
        Monitor(1, **{"flops_per_token": 1e6, "peak_flops": 1e12, **kw})
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("make, message", [
    (lambda: BatchRamp.from_spec(BatchRampSpec(kind="tokens", start_batch=8, ramp_tokens=1000), global_batch=64,
                                 micro_batch=2, dp_size=4, seq_len=0), "seq_len=0 must be > 0 (a whole number)"),
    (lambda: BatchRamp(8, 64, 8, math.nan, 2, 4), "batch_ramp.ramp_samples=nan must be > 0 (a whole number)"),
    (lambda: BatchRamp(8, 64.0, 8, 100, 2, 4), "batch_ramp.end_batch=64.0 must be > 0 (a whole number)"),
    (lambda: BatchRamp("16", 64, 8, 100, 2, 4), "batch_ramp.start_batch='16' must be > 0 (a whole number)"),
    (lambda: BatchRamp(8, 64, 8, 100, 2, 4).schedule(-3), "num_steps=-3 must be >= 0 (a whole number)"),
    (lambda: BatchRamp(8, 64, 8, 100, 2, 4, "tokens", 16).batch_at_tokens(-5),
     "consumed_tokens=-5 must be >= 0 (a whole number)"),
])
def test_batch_ramp_bad_arguments_name_the_argument(make, message):
    # Was: ZeroDivisionError, a silently skipped ramp, float batches, a TypeError, [], the wrong name.
    with pytest.raises(ValueError) as info:
        make()
    assert str(info.value) == message


def test_guard_bad_arguments_name_the_argument(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    from dstoolkit.runtime.train.guard import Guard

    class E:
        global_steps, optimizer = 0, None

    for kw, message in (({"keep": 0, "checkpoint_dir": str(tmp_path)}, "checkpoints: keep=0 must be a whole number"),
                        ({"save_every": -5}, "Guard: save_every=-5 must be a whole number >= 0"),
                        ({"monitor_every": -1}, "Guard: monitor_every=-1 must be a whole number >= 0"),
                        ({"max_rollbacks": -1}, "rollback: max_rollbacks=-1 must be a whole number >= 0")):
        with pytest.raises(SettingError) as info:
            Guard(E(), **kw)
        assert str(info.value).startswith(message)
    g = Guard(E(), monitor_every=0)
    with pytest.raises(TypeError, match="^Guard.step\\(loss\\): loss must be the loss tensor the engine returned"):
        g.step(2.5)
