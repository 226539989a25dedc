"""The estimator lays out architectures built by transformers from their exact per-layer counts (hybrid
mixers, per-layer widths), so its per-rank model states add up to the exact count."""
from __future__ import annotations

import pathlib

import pytest

RELEASED = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "released"


@pytest.mark.parametrize("name", ["nvidia--Nemotron-H-56B-Base-8K.json", "Qwen--Qwen3-Next-80B-A3B-Thinking.json",
                                  "openai--gpt-oss-20b.json"])
def test_layout_of_a_measured_shape_sums_to_the_exact_count(name):
    from dstoolkit.estimate.layout import param_layout
    from dstoolkit.models import load_model
    from dstoolkit.models.params import count_params

    shape = load_model(str(RELEASED / name))
    assert shape.measured is not None  # built by transformers, no hand-written formula
    layout = param_layout(shape)
    assert sum(e.numel for e in layout) == count_params(shape).total == shape.measured.total
    experts = sum(e.numel for e in layout if e.kind == "expert")
    assert experts == sum(layer.expert_params_each * layer.num_experts for layer in shape.measured.layers)
