"""benchmarks/layout_sweeps.py execution_ab: a setting the source timed on and off on one layout, its predicted cost
beside the measured one."""
from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import layout_sweeps as ls  # noqa: E402


def test_launch_blocking_ab_costs_what_the_host_adds(tmp_path):
    doc = ls.load()
    (e,) = [e for e in doc["execution_ab"] if e["field"] == "cuda_launch_blocking"]
    doc = {**doc, "execution_ab": [{**e, "rows": e["rows"][:1]}]}
    (a,) = ls.execution_ab(doc, tmp_path)
    # measured: throughput without the setting over throughput with it, - 1 (97.20 / 91.04 TFLOPs)
    assert a["measured_cost"] == pytest.approx(97.20 / 91.04 - 1)
    # predicted: blocking adds the host's issue time, so it costs something, and far less than the step
    assert 0.0 < a["predicted_cost"] < 0.2
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "prequel_200b_launch_blocking_0_cuda_launch_blocking_false.yaml",
        "prequel_200b_launch_blocking_0_cuda_launch_blocking_true.yaml"]
