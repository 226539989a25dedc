"""bench overlap: interval arithmetic of the profiler trace, η, and the variant grid."""
import pytest

from dstoolkit.runtime.bench import overlap, overlap_math
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.targets import BenchTarget


def test_union_and_exposed_intervals():
    assert overlap_math.union_intervals([(0, 2), (1, 3), (5, 6), (6, 7)]) == [(0, 3), (5, 7)]
    assert overlap_math.covered_length([(0, 2), (1, 3)]) == 3
    comm = [(0, 10)]
    compute = [(2, 4), (3, 5), (8, 12)]  # covers 2..5 and 8..10 -> 5 of 10 hidden
    assert overlap_math.exposed_length(comm, compute) == pytest.approx(5)
    assert overlap_math.exposed_length(comm, []) == pytest.approx(10)
    assert overlap_math.exposed_length([(0, 1), (4, 6)], [(-1, 7)]) == pytest.approx(0)


def test_eta_definition_and_clamp():
    # η = 1 − exposed / total communication (docs/anchors.md 'Overlap')
    assert overlap_math.eta_from(0.25, 1.0) == (0.75, 0.75)
    assert overlap_math.eta_from(2.0, 1.0) == (0.0, -1.0)
    assert overlap_math.eta_from(0.0, 0.0) == (1.0, 1.0)


def test_parse_bucket_sizes():
    assert overlap.parse_bucket_sizes("5e5, 2e6") == [500_000, 2_000_000]
    assert overlap.parse_bucket_sizes("auto") is None
    with pytest.raises(BenchInputError, match="not a number"):
        overlap.parse_bucket_sizes("big")
    with pytest.raises(BenchInputError, match="> 0"):
        overlap.parse_bucket_sizes("0")


def _target(stage, **zero):
    ds = {"train_batch_size": 16, "gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 4,
          "zero_optimization": {"stage": stage, **zero}, "bf16": {"enabled": True}}
    return BenchTarget(name=f"z{stage}", ds_config=ds, ds_config_path=None, spec_path=None)


def test_variants_cross_overlap_and_buckets_and_normalise_batch():
    vs = overlap.build_variants([_target(2), _target(0)], {"z2": 4_000_000, "z0": 4_000_000}, "both", None, None)
    z2 = [v for v in vs if v.config_name == "z2"]
    # auto buckets: ~16 and ~4 buckets of the model, plus DeepSpeed's default 5e8
    assert sorted({v.reduce_bucket_size for v in z2}) == [250_000, 1_000_000, 500_000_000]
    assert {v.overlap_comm for v in z2} == {True, False}
    assert len(z2) == 6
    for v in z2:
        assert v.ds_config["zero_optimization"]["overlap_comm"] is v.overlap_comm
        assert v.ds_config["gradient_accumulation_steps"] == 1 and "train_batch_size" not in v.ds_config
        assert v.opt_partitioned
    z0 = [v for v in vs if v.config_name == "z0"]
    assert len(z0) == 1 and z0[0].overlap_comm is None and z0[0].opt_partitioned  # bf16 optimizer partitions
    assert len({v.key for v in vs}) == len(vs)


def test_combine_computes_eta_from_medians():
    v = overlap.build_variants([_target(2)], {"z2": 1000}, "on", [1000], None)[0]
    multi = {"overlapped_samples_s": [1.2, 1.3, 1.25], "comm_samples_s": [0.4, 0.4, 0.4]}
    single = {"compute_fb_samples_s": [0.9, 0.9, 0.9], "compute_opt_samples_s": [0.2, 0.2, 0.2]}
    rec = overlap_math.combine(v, 2, multi, single)
    # compute-only = fb + opt/N = 1.0; exposed = 1.25 - 1.0; η = 1 - 0.25/0.4
    assert rec["compute_s"]["median"] == pytest.approx(1.0)
    assert rec["exposed_comm_s"] == pytest.approx(0.25)
    assert rec["eta"] == pytest.approx(1 - 0.25 / 0.4)


def test_merge_compute_only_takes_the_slowest_engine_per_step():
    a = [{"key": "k", "compute_fb_samples_s": [1.0, 1.0], "compute_opt_samples_s": [0.1, 0.5]}]
    b = [{"key": "k", "compute_fb_samples_s": [1.2, 0.8], "compute_opt_samples_s": [0.1, 0.1]},
         {"key": "only-b", "compute_fb_samples_s": [1.0], "compute_opt_samples_s": [0.1]}]
    merged = overlap_math.merge_compute_only([a, b])
    assert set(merged) == {"k"}  # a variant missing from one engine gives no result
    assert merged["k"]["compute_fb_samples_s"] == [1.2, 1.0]
    assert merged["k"]["compute_opt_samples_s"] == [0.1, 0.5]
