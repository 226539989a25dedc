"""Optional cross-check against Hugging Face `transformers` module trees (skipped when it is not installed).

CI does not install transformers; the published-number pins in test_params_hf.py are the gate. When it is
installed, every fixture is instantiated on the meta device (no weights, no download) and its parameter
count must equal ours. DeepSeek-V3's `e_score_correction_bias`, which transformers registers as a buffer, is not a
parameter on our side either: `ParamCount.buffers` (256 per MoE layer).
"""
import json
import pathlib

import pytest

from dstoolkit.models import count_params, load_hf_config

HF = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs"


@pytest.mark.parametrize("path", sorted(HF.glob("*.json")), ids=lambda p: p.stem)
def test_matches_transformers(path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = json.loads(path.read_text())
    try:
        config = transformers.AutoConfig.for_model(**cfg)
    except (KeyError, ValueError) as exc:
        pytest.skip(f"this transformers has no {cfg['model_type']}: {exc}")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    theirs = sum(p.numel() for p in model.parameters())
    ours = count_params(load_hf_config(path))
    buffers = dict(model.named_buffers())
    as_buffer = sum(b.numel() for n, b in buffers.items() if n.endswith("e_score_correction_bias"))
    assert (ours.total, ours.buffers) == (theirs, as_buffer)
