"""The estimator's per-tensor layout must hold exactly the parameters count_params counts (issue #4)."""
from pathlib import Path

import pytest

from dstoolkit.estimate.layout import param_layout
from dstoolkit.models import count_params, get_preset, load_hf_config

FIXTURES = sorted((Path(__file__).resolve().parents[1] / "golden" / "hf_configs").glob("*.json"))
PRESETS = ["llama-3-8b", "llama-3-70b", "mixtral-8x7b", "deepseek-v3", "tiny", "tiny-moe"]


@pytest.mark.parametrize("shape", [get_preset(n) for n in PRESETS] + [load_hf_config(p) for p in FIXTURES],
                         ids=lambda s: s.name)
def test_layout_total_equals_count_params(shape):
    # GPT-2 (LayerNorm bias, MLP biases, learned positions) and Qwen3 (q/k norms) were once missing here.
    assert sum(p.numel for p in param_layout(shape)) == count_params(shape).total
