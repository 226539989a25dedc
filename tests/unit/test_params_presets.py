"""Preset parameter counts pinned to published totals (docs/anchors.md), within 0.5%."""
import pytest

from dstoolkit.models import PRESETS, ParamCount, count_params, get_preset

REL_TOL = 0.005  # the brief's tolerance: published totals within 0.5%

# (preset, published total, published active or None), docs/anchors.md "Other public model sizes" and DeepSeek-V3.
PUBLISHED = [
    ("llama-3-8b", 8.03e9, None),
    ("llama-3-70b", 70.6e9, None),
    ("llama-3.1-405b", 405.9e9, None),
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # active counts embeddings (docs/anchors.md)
    ("deepseek-v3", 671e9, None),  # active: see test_deepseek_v3_active below
]


@pytest.mark.parametrize("name,total,active", PUBLISHED)
def test_preset_total_matches_published(name, total, active):
    c = count_params(get_preset(name))
    assert c.total == pytest.approx(total, rel=REL_TOL)
    if active is not None:
        assert c.active == pytest.approx(active, rel=REL_TOL)


def test_deepseek_v3_active_is_37b():
    # arXiv 2412.19437: "671B total parameters with 37B activated for each token" (MTP excluded).
    # 37B has two significant figures. A token touches 37.55B weights when both the embedding table and
    # the output head are counted; DeepSeek's figure matches the count without the input-embedding lookup
    # (36.63B -> "37B"; the same convention gives DeepSeek-V2's "21B", see test_params_hf.py).
    c = count_params(get_preset("deepseek-v3"))
    assert round((c.active - c.embedding) / 1e9) == 37
    assert c.active == pytest.approx(37e9, rel=0.02)
    assert c.active < c.total / 17  # sanity: about 5.5% of the model is active


def test_deepseek_v3_excludes_mtp_module():
    # The public checkpoint is 685B because it carries the 14B MTP module (docs/anchors.md); counts exclude it.
    shape = get_preset("deepseek-v3")
    assert shape.num_nextn_predict_layers == 1
    assert count_params(shape).total < 672e9


@pytest.mark.parametrize("name", list(PRESETS))
def test_breakdown_sums_to_total(name):
    c = count_params(PRESETS[name])
    parts = c.embedding + c.lm_head + c.attention + c.dense_mlp + c.routed_experts + c.shared_experts + c.router + c.norms
    assert parts == c.total
    assert c.non_expert == c.total - c.routed_experts
    assert 0 < c.active <= c.total


def test_dense_presets_are_fully_active():
    for name in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b", "tiny"):
        c = count_params(PRESETS[name])
        assert c.active == c.total
        assert c.routed_experts == c.router == c.shared_experts == c.expert_params_each == 0


def test_moe_active_is_top_k_experts_per_layer():
    c = count_params(get_preset("mixtral-8x7b"))
    # Mixtral: 8 experts of 3 * 4096 * 14336 (w1, w2, w3), top-2, 32 MoE layers (paper Table 1).
    assert c.expert_params_each == 3 * 4096 * 14336
    assert c.routed_experts == 32 * 8 * c.expert_params_each
    assert c.active == c.total - 32 * 6 * c.expert_params_each


def test_llama_3_8b_exact_components():
    # Llama 3 8B layout: GQA 32 q heads / 8 kv heads of 128, SwiGLU 14336, untied 128256 x 4096 tables.
    c = count_params(get_preset("llama-3-8b"))
    assert c.embedding == c.lm_head == 128256 * 4096
    assert c.attention == 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024)
    assert c.dense_mlp == 32 * 3 * 4096 * 14336
    assert c.norms == 65 * 4096


def test_tiny_presets_shape_and_size():
    tiny, moe = get_preset("tiny"), get_preset("tiny-moe")
    assert (tiny.hidden_size, tiny.num_hidden_layers, tiny.num_attention_heads, tiny.kv_heads) == (256, 4, 8, 4)
    assert (tiny.intermediate_size, tiny.vocab_size, tiny.tie_word_embeddings) == (688, 2048, False)
    assert (moe.num_experts, moe.num_experts_per_tok, moe.expert_ffn_size) == (4, 2, 688)
    assert moe.num_moe_layers == 4
    ct, cm = count_params(tiny), count_params(moe)
    # The MoE model differs only in its FFNs: 4 experts + router instead of one dense FFN per layer.
    assert cm.total - ct.total == 4 * (3 * ct.dense_mlp // 4 + 4 * 256)
    # Weights (fp32) dominate a 2-rank DeepSpeed run's buffers only if the model is several MB: > 10 MB.
    assert ct.total * 4 > 10 * 2**20


def test_get_preset_is_case_insensitive_and_suggests():
    assert get_preset("Llama-3-8B") is PRESETS["llama-3-8b"]
    with pytest.raises(ValueError, match=r"unknown model preset 'lama-3-8b' \(did you mean 'llama-3-8b'\?"):
        get_preset("lama-3-8b")
    with pytest.raises(ValueError, match="known presets: llama-3-8b"):
        get_preset("gpt-5")


def test_param_count_is_frozen():
    c = count_params(get_preset("tiny"))
    assert isinstance(c, ParamCount)
    with pytest.raises(Exception, match="frozen"):
        c.total = 1
