"""benchmarks/data/clusters.yaml: a measured cluster named by `gpu: {cluster: NAME}` in the published-runs and the
layout-sweeps tables resolves to one GpuSpec mapping (one owner of the figure), and a name it does not hold is refused
naming the field, the value and what is known."""
from __future__ import annotations

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import layout_sweeps_table as lst  # noqa: E402
import published_runs_specs as prs  # noqa: E402


def test_cluster_resolves_to_the_measured_gpu():
    gpu = prs.resolve_gpu({"cluster": "jean_zay_a100"}, "t")
    assert gpu["name"] == "A100-80G-JeanZay"
    assert gpu["inter_node_bw_bytes_per_s"] == 5.07e9  # BigScience's all_reduce_bench on that partition, 40.6 Gb/s
    assert gpu["nics_per_node"] == 4


def test_names_and_mappings_pass_unchanged():
    assert prs.resolve_gpu("A100-80G", "t") == "A100-80G"
    spec = {"name": "x", "memory_bytes": 1}
    assert prs.resolve_gpu(spec, "t") is spec


def test_unknown_cluster_is_refused_with_the_known_names():
    with pytest.raises(SystemExit) as e:
        prs.resolve_gpu({"cluster": "jean_zay"}, "published_runs.yaml r1")
    msg = str(e.value)
    assert "published_runs.yaml r1: gpu.cluster 'jean_zay' is not in benchmarks/data/clusters.yaml" in msg
    assert "jean_zay_a100" in msg


def test_both_tables_read_one_jean_zay_spec():
    published = {r["id"]: r for r in prs.load_table()["runs"]}
    sweeps = lst.load()
    assert published["bloom_176b_384xa100"]["gpu"] == sweeps["common"]["bigscience_prequel"]["gpu"] == \
        prs.resolve_gpu({"cluster": "jean_zay_a100"}, "t")


def test_jean_zay_entry_reproduces_its_own_benchmark():
    """The measured layout (one 32-rank group, 8 ranks on each of 4 nodes) gets exactly the measured busbw: its NCCL
    log routes the group's rings through one device per direction (nics_per_group 1), not a ring per NIC."""
    from dstoolkit.estimate.collective_time import group_inter_node_busbw

    g = prs.resolve_gpu({"cluster": "jean_zay_a100"}, "t")
    measured = group_inter_node_busbw(g["inter_node_bw_bytes_per_s"], g["nics_per_node"], 8, 1,
                                      g["intra_node_bw_bytes_per_s"], g["nics_per_group"])
    assert measured == 5.07e9
    # tp 8: 8 groups of one rank per node share the 4 links; tp 2: 2 groups of 4 ranks, one link each (the cap)
    assert group_inter_node_busbw(5.07e9, 4, 1, 8, 2.3e11, 1) == 5.07e9 / 2
    assert group_inter_node_busbw(5.07e9, 4, 4, 2, 2.3e11, 1) == 5.07e9
    assert group_inter_node_busbw(5.07e9, 4, 4, 2, 2.3e11) == 2 * 5.07e9  # no cap: a ring per NIC


def test_nics_per_group_is_a_spec_field():
    from dstoolkit.hardware.table import GpuSpec

    spec = GpuSpec.model_validate(prs.resolve_gpu({"cluster": "jean_zay_a100"}, "t"))
    assert spec.nics_per_group == 1
