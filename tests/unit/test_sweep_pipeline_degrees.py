"""The sweep's pipeline degrees divide the world size (candidate_grid.pp_choices), so a cluster that is not a power of
two (BLOOM's 48 nodes x 8 GPUs) gets layouts; and a ranked layout whose peak fits but whose sum of parts does not is
marked (generate.costing.only_peak_fits)."""
from __future__ import annotations

import json

import pytest
import yaml

from dstoolkit.cli import main
from dstoolkit.generate.candidate_grid import pow2_upto, pp_choices
from dstoolkit.generate.costing import CandidateEstimate, only_peak_fits
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.hardware.table import get_gpu

GiB = 2**30


def test_pp_choices_are_the_divisors_of_the_world_up_to_the_layer_count():
    assert pp_choices(384, 72) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert pp_choices(24, 126) == [1, 2, 3, 4, 6, 8, 12, 24]
    assert pp_choices(6, 2) == [1, 2]


@pytest.mark.parametrize("world", [1, 2, 8, 64, 4096])
@pytest.mark.parametrize("layers", [2, 32, 126])
def test_on_a_power_of_two_world_they_are_the_powers_of_two(world, layers):
    assert pp_choices(world, layers) == pow2_upto(min(world, layers))


def _spec(tmp_path, training: dict) -> str:
    doc = {"name": "n48", "model": {"preset": "llama-3-8b"},
           "cluster": {"nodes": 48, "gpus_per_node": 8, "gpu": "A100-80G"},
           "training": {"seq_len": 4096, "global_batch": 2048, "zero_stage": 1, "activation_checkpointing": "full",
                        **training}}
    path = tmp_path / "n48.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_48_nodes_rank_the_pipeline_degrees_that_give_a_power_of_two_dp(tmp_path):
    # 384 GPUs, tp 8: dp = 48 / pp, and 2048 sequences split into micro batches of 1 only over a power-of-two dp,
    # so pp 3, 6, 12 and 24 keep the batch. The 32 layers split over 12 and 24 stages too (layout.stage_layers:
    # DeepSpeed's PipelineModule uniformly; Megatron with first/last-stage flags), so all four rank. A
    # powers-of-two grid had no layout at all here.
    spec, shape = load_spec_and_shape(_spec(tmp_path, {"tp": 8, "pp": "auto", "micro_batch": 1}))
    res = run_sweep(spec, shape, top=20, validate=False, advise=False)
    assert sorted(r.candidate.pp for r in res.ranked) == [3, 6, 12, 24]
    dropped = {d.candidate.pp: d.code for d in res.dropped}
    assert dropped == {1: "batch", 2: "batch", 4: "batch", 8: "batch", 16: "batch", 32: "mp-world"}


def _estimate(fits: bool, sum_of_parts_gib: float) -> CandidateEstimate:
    return CandidateEstimate(memory_per_rank_bytes=60 * GiB, memory_breakdown_bytes={}, host_memory_per_rank_bytes=0,
                             device_memory_bytes=80 * GiB, step_time_s=1.0, mfu=0.4, fits=fits, source="test",
                             sum_of_parts_bytes=int(sum_of_parts_gib * GiB), allowance_bytes=1 * GiB)


def test_only_peak_fits_compares_the_sum_of_parts_with_the_device():
    gpu = get_gpu("A100-80G")
    assert only_peak_fits(_estimate(True, 79.5), gpu)  # 79.5 + 1 GiB allowance > 80 GiB
    assert not only_peak_fits(_estimate(True, 78.5), gpu)
    assert not only_peak_fits(_estimate(False, 90.0), gpu)  # does not fit at all: not a caution
    assert not only_peak_fits(_estimate(True, 90.0), get_gpu("cpu"))  # host RAM: no caching allocator


def _bloom_tp4_pp3(tmp_path):
    """BLOOM-176B's shape at tp 4 pp 3 on 48 x 8 A100-80G: the peak fits, the sum of parts does not."""
    doc = {"name": "bloom_tp4_pp3", "model": {"model_type": "bloom", "hidden_size": 14336, "n_layer": 72,
                                              "n_head": 64, "vocab_size": 250880},
           "cluster": {"nodes": 48, "gpus_per_node": 8, "gpu": "A100-80G"},
           "training": {"seq_len": 2048, "global_batch": 2048, "micro_batch": 2, "precision": "fp16", "tp": 4,
                        "pp": 3, "zero_stage": 1, "activation_checkpointing": "full"}}
    path = tmp_path / "bloom.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_sweep_marks_a_layout_whose_sum_of_parts_is_over_the_device(tmp_path, capsys):
    path = _bloom_tp4_pp3(tmp_path)
    assert main(["sweep", str(path), "--format", "json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert len(ranked) == 1 and ranked[0]["only_peak_fits"] is True
    assert ranked[0]["sum_of_parts_bytes"] > ranked[0]["memory_per_rank_bytes"]
    assert main(["sweep", str(path)]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith(" 1  "))
    assert "GiB*" in row
    caution = next(ln for ln in out.splitlines() if ln.startswith("* the peak fits, but the sum of parts + allowance ("))
    assert caution.endswith("GiB) is over the 80 GiB device: a caching allocator that keeps each phase's blocks can "
                            "hold that much; leave room or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_tune_reports_the_caution_on_a_point_whose_sum_of_parts_is_over_the_device(tmp_path):
    from dstoolkit.tune.space import TuneSpace

    path = _bloom_tp4_pp3(tmp_path)
    spec, shape = load_spec_and_shape(str(path))
    space = TuneSpace.from_spec(spec, shape, bucket_scales=(1.0,), tune_overlap=False)
    point = next(iter(space.points()))
    chk = space.check(point)
    assert not chk.pruned and only_peak_fits(chk.estimate, spec.cluster.gpu_spec)
    assert [w for w in chk.warnings if w.startswith("memory: the peak fits, but the sum of parts + allowance (")]
