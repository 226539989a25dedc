"""FLOPs of hybrid models: the quadratic attention term only on the layers with softmax attention (and a
sliding / chunked / indexed layer at min(T, its window) keys), per layer from the config's layer types, plus
the chunked scans of gated-DeltaNet and Mamba-2 layers, checked against FLOPs traced on a shrunk copy
(dstoolkit.runtime.trace) at two sequence lengths."""
from __future__ import annotations

import json
import pathlib

import pytest

pytest.importorskip("transformers")

from dstoolkit.estimate.flops import flops_per_token  # noqa: E402
from dstoolkit.models import get_preset, load_hf_config, shape_from_hf_dict  # noqa: E402
from dstoolkit.models.measured import LayerParams  # noqa: E402

R = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "released"


def _shape(name):
    return load_hf_config(R / name)


def test_qwen3_next_counts_attention_on_its_full_attention_layers_only():
    s = _shape("Qwen--Qwen3-Next-80B-A3B-Thinking.json")  # full_attention_interval 4: 12 of 48 layers
    f = flops_per_token(s, 4096)
    assert f.path == "per-layer" and "12 softmax-attention layers of 48" in f.detail
    assert f.attention - f.scan == pytest.approx(12 * 12 * 16 * 256 * 4096)  # 12·H·Q·T on 12 layers (16 x 256)


def test_nemotron_h_counts_no_attention_on_mamba_and_mlp_layers():
    s = _shape("nvidia--Nemotron-H-56B-Base-8K.json")
    f = flops_per_token(s, 8192)
    n_attn = sum(l.mixer == "attention" for l in s.measured.layers)
    assert n_attn == 10 and f"{n_attn} softmax-attention layers of 118" in f.detail
    assert f.attention - f.scan == pytest.approx(n_attn * 12 * s.num_attention_heads * s.head_size * 8192)


@pytest.mark.parametrize("name, window, n_local", [("openai--gpt-oss-20b.json", 128, 12),
                                                   ("google--gemma-4-26B-A4B.json", 1024, 25)])
def test_sliding_window_layers_are_counted_by_their_window(name, window, n_local):
    s = _shape(name)
    local = [l for l in s.measured.layers if l.attention_kind == "sliding_attention"]
    assert len(local) == n_local and {l.attention_window for l in local} == {window}
    f_short, f_long = flops_per_token(s, window), flops_per_token(s, 4 * window)
    full = [l for l in s.measured.layers if l.attention_window is None]
    # Beyond the window only the full-attention layers keep growing with T.
    grow = sum(12 * l.attention_width * 3 * window for l in full)
    assert f_long.attention - f_short.attention == pytest.approx(grow)


def test_gemma4_global_layers_use_their_own_width():
    s = _shape("google--gemma-4-26B-A4B.json")
    widths = {l.attention_kind: l.attention_width for l in s.measured.layers}
    assert widths == {"sliding_attention": 16 * 256, "full_attention": 16 * 512}


def test_analytic_shapes_keep_12_L_H_Q_T():
    for name in ("llama-3-8b", "mixtral-8x7b", "deepseek-v3"):
        s = get_preset(name)
        f = flops_per_token(s, 4096)
        H, Q = s.num_attention_heads, s.q_head_dim
        assert f.path == "analytic" and f.attention == pytest.approx(12 * s.num_hidden_layers * H * Q * 4096)


_SCAN_FACTS = "scan" in LayerParams.model_fields
"""Whether the measured layers carry their scan widths (LayerParams.scan, filled by models.from_transformers);
without them flops.py cannot count the gated-delta / Mamba-2 scans (-2.15% / -1.83% at T=128, traced)."""


@pytest.mark.parametrize("seq_len", [128, 512])
@pytest.mark.parametrize("name", [
    "openai--gpt-oss-20b.json",  # sliding window 128: at T=512 the local layers stop growing
    pytest.param("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json",  # Mamba-2 + MoE + 6 attention layers
                 marks=pytest.mark.skipif(not _SCAN_FACTS, reason="LayerParams has no scan facts yet")),
    pytest.param("Qwen--Qwen3-Next-80B-A3B-Thinking.json",  # 36 gated-DeltaNet + 12 attention layers
                 marks=[pytest.mark.slow,
                        pytest.mark.skipif(not _SCAN_FACTS, reason="LayerParams has no scan facts yet")]),
])
def test_per_layer_flops_agree_with_the_traced_copy(name, seq_len):
    from dstoolkit.runtime.trace import trace_config

    import torch

    cfg = json.loads((R / name).read_text())
    # FLOPs do not depend on the dtype; fp32 because a CPU without native bf16 runs bf16 GEMMs at ~1 GFLOP/s
    # (aten's generic cpublas path): the bf16 trace of this test took over 50 minutes on such a machine
    traced = trace_config(cfg, seq_len=seq_len, dtype=torch.float32)
    f = flops_per_token(shape_from_hf_dict(cfg), seq_len)
    assert f.path == "per-layer"
    assert f.model == pytest.approx(traced.flops_per_token, rel=0.02), (f.model, traced.flops_per_token)


@pytest.mark.skipif(not _SCAN_FACTS, reason="LayerParams has no scan facts yet")
def test_scans_are_counted_per_layer_kind():
    from dstoolkit.estimate.flops import layer_scan_flops

    s = _shape("Qwen--Qwen3-Next-80B-A3B-Thinking.json")
    facts = {l.scan for l in s.measured.layers if l.mixer == "linear_attention"}
    assert len(facts) == 1 and all(l.scan is None for l in s.measured.layers if l.mixer == "attention")
    (gd,) = facts  # transformers' torch_chunk_gated_delta_rule: 32 value heads of 128 x 128, chunks of 64
    assert (gd.kind, gd.heads, gd.key_dim, gd.value_dim, gd.chunk) == ("gated_delta", 32, 128, 128, 64)
    f = flops_per_token(s, 4096)
    assert f.scan == pytest.approx(36 * layer_scan_flops(gd, 4096))
    assert f.attention == pytest.approx(12 * 12 * 16 * 256 * 4096 + f.scan)
    n = _shape("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json")
    kinds = {(l.mixer, l.scan.kind if l.scan else None) for l in n.measured.layers}
    assert kinds == {("mamba", "mamba2_ssd"), ("attention", None), ("none", None)}
    (ssd,) = {l.scan for l in n.measured.layers if l.scan}
    assert (ssd.heads, ssd.key_dim, ssd.value_dim, ssd.chunk) == (64, 128, 64, 128)  # config's mamba_* and chunk_size


def test_grouped_conv_backward_is_not_charged_per_channel():
    # torch's convolution_backward formula ignores groups; the tracers' mapping counts the real cost.
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from dstoolkit.models.flop_count import attention_flop_mapping

    conv = torch.nn.Conv1d(64, 64, 4, groups=64, bias=False)
    x = torch.randn(1, 64, 32, requires_grad=True)
    c = FlopCounterMode(display=False, custom_mapping=attention_flop_mapping())
    with c:
        conv(x).sum().backward()
    fwd = 2 * 64 * 29 * 4  # out elements x kernel (one input channel per group)
    assert c.get_total_flops() == 3 * fwd
