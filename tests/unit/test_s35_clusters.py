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
