"""BatchRamp: the exact schedule (Megatron rampup semantics), rounding to micro x dp, end of ramp."""
import pytest

from dstoolkit.spec import BatchRampSpec
from dstoolkit.runtime.train.ramp import BatchRamp


class FakeEngine:
    """Stands in for the two DeepSpeed engine methods BatchRamp.apply calls (real engine: dist tests)."""

    def __init__(self, gb):
        self.gb, self.calls = gb, []

    def train_batch_size(self):
        return self.gb

    def set_train_batch_size(self, gb):
        self.calls.append(gb)
        self.gb = gb


def test_megatron_form_schedule_by_hand():
    # start 4, +4 per increment, to 16 over 24 samples: 3 increments, one per 8 samples (Megatron
    # RampupBatchsizeNumMicroBatchesCalculator). micro 2 x dp 2 = unit 4.
    r = BatchRamp.from_spec(BatchRampSpec(kind="megatron", start_batch=4, increment=4, ramp_samples=24),
                            global_batch=16, micro_batch=2, dp_size=2, seq_len=32)
    assert [r.batch_at(c) for c in (0, 7, 8, 15, 16, 23, 24, 25, 10_000)] == [4, 4, 8, 8, 12, 12, 16, 16, 16]
    sched = r.schedule(6)
    assert [(p.consumed_samples, p.global_batch, p.grad_accum) for p in sched] == [
        (0, 4, 1), (4, 4, 1), (8, 8, 2), (16, 12, 3), (28, 16, 4), (44, 16, 4)]
    assert r.megatron_rampup_args() == ["--rampup-batch-size", "4", "4", "24"]


def test_rounding_down_to_micro_times_dp():
    # increment 3 is not a multiple of unit 4: 6 -> 4, 9 -> 8, 12 -> 12; start 2 rounds up to one unit (4).
    r = BatchRamp(start_batch=3, end_batch=12, increment=3, ramp_samples=30, micro_batch=2, dp_size=2)
    assert [r.batch_at(c) for c in (0, 10, 20, 30, 31)] == [4, 4, 8, 12, 12]
    r2 = BatchRamp(start_batch=2, end_batch=8, increment=2, ramp_samples=3, micro_batch=2, dp_size=2)
    assert r2.batch_at(0) == 4


def test_token_form_deepseek_v3():
    # DeepSeek-V3 (arXiv 2412.19437 §4.2): 3072 -> 15360 sequences over the first 469B tokens, seq 4096.
    spec = BatchRampSpec(kind="tokens", start_batch=3072, ramp_tokens=469_000_000_000, increment=1536)
    r = BatchRamp.from_spec(spec, global_batch=15360, micro_batch=1, dp_size=1536, seq_len=4096)
    assert r.ramp_samples == 114_501_954  # ceil(469e9 / 4096 = 114,501,953.125)
    assert r.batch_at_tokens(0) == 3072
    # 8 increments of 1536; the 4th lands at exactly half of 114,501,954 samples = 57,250,977
    assert r.batch_at(57_250_976) == 3072 + 3 * 1536
    assert r.batch_at(57_250_977) == 3072 + 4 * 1536
    assert r.batch_at_tokens(469_000_000_000 + 4096 * 2) == 15360
    assert r.megatron_rampup_args() == ["--rampup-batch-size", "3072", "1536", "114501954"]


def test_token_form_default_increment_is_one_unit():
    spec = BatchRampSpec(kind="tokens", start_batch=4, ramp_tokens=32 * 40)
    r = BatchRamp.from_spec(spec, global_batch=12, micro_batch=2, dp_size=2, seq_len=32)
    assert r.increment == 4 and r.ramp_samples == 40
    assert [r.batch_at(c) for c in (0, 19, 20, 40, 41)] == [4, 4, 8, 12, 12]


def test_apply_only_calls_set_train_batch_size_on_change():
    r = BatchRamp(start_batch=4, end_batch=8, increment=4, ramp_samples=8, micro_batch=2, dp_size=2)
    eng = FakeEngine(8)
    assert r.apply(eng, 0) == 4 and eng.calls == [4]
    r.apply(eng, 4)
    assert eng.calls == [4]
    r.apply(eng, 8)
    assert eng.calls == [4, 8]


@pytest.mark.parametrize("kwargs, match", [
    ({"start_batch": 20}, "start_batch=20 exceeds training.global_batch=16"),
    ({"end_batch": 18}, "global_batch=18 is not a multiple of micro_batch x dp"),
    ({"increment": 0}, "increment=0 must be > 0"),
])
def test_bad_ramps_name_the_field(kwargs, match):
    base = dict(start_batch=4, end_batch=16, increment=4, ramp_samples=24, micro_batch=2, dp_size=2)
    base.update(kwargs)
    with pytest.raises(ValueError, match=match):
        BatchRamp(**base)


def test_spec_missing_fields_are_named():
    # The schema already refuses these; from_spec re-checks for specs built without validation.
    with pytest.raises(ValueError, match="ramp_tokens"):
        BatchRampSpec(kind="tokens", start_batch=4)
    unchecked = BatchRampSpec.model_construct(kind="tokens", start_batch=4, increment=None, ramp_tokens=None,
                                              ramp_samples=None)
    with pytest.raises(ValueError, match="ramp_tokens is required"):
        BatchRamp.from_spec(unchecked, global_batch=8, micro_batch=2, dp_size=2, seq_len=8)
    unchecked = BatchRampSpec.model_construct(kind="megatron", start_batch=4, increment=4, ramp_tokens=None,
                                              ramp_samples=None)
    with pytest.raises(ValueError, match="increment and training.batch_ramp.ramp_samples are both required"):
        BatchRamp.from_spec(unchecked, global_batch=8, micro_batch=2, dp_size=2, seq_len=8)


def test_megatron_args_refuse_inexact_increment():
    r = BatchRamp(start_batch=4, end_batch=16, increment=5, ramp_samples=24, micro_batch=2, dp_size=2)
    with pytest.raises(ValueError, match="multiple of batch_ramp.increment=5"):
        r.megatron_rampup_args()


def test_lr_schedule_counts_tokens_not_steps():
    from dstoolkit.runtime.train.lr import LR_DECAY_FLOOR, _lr_at

    # warm-up over 1000 tokens, cosine to LR_DECAY_FLOOR x peak at 11000 tokens
    assert _lr_at(0, 1.0, 1000, 11000) == pytest.approx(1 / 1000)
    assert _lr_at(499, 1.0, 1000, 11000) == pytest.approx(0.5)
    assert _lr_at(1000, 1.0, 1000, 11000) == pytest.approx(1.0)
    assert _lr_at(6000, 1.0, 1000, 11000) == pytest.approx(LR_DECAY_FLOOR + (1 - LR_DECAY_FLOOR) * 0.5)
    assert _lr_at(50_000, 1.0, 1000, 11000) == pytest.approx(LR_DECAY_FLOOR)
