"""Exact counts for HF config.json files of every supported family, pinned to published sizes.

Fixtures are hand-written from public facts (tests/golden/hf_configs/README.md lists the sources).
"""
import json
import pathlib

import pytest

from dstoolkit.models import count_params, get_preset, load_hf_config, shape_from_hf_dict

HF = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs"
REL_TOL = 0.005


def _count(name):
    return count_params(load_hf_config(HF / f"{name}.json"))


def _cfg(name):
    return json.loads((HF / f"{name}.json").read_text())


# (fixture, published total, published active or None, published non-embedding or None)
PUBLISHED = [
    ("qwen2-7b", 7.61e9, None, 6.53e9),  # Qwen2.5-7B model card (same shape as Qwen2-7B)
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9, None),  # Qwen1.5-MoE blog: 14.3B total, 2.7B activated
    ("qwen2-57b-a14b", 57.41e9, None, None),  # Qwen2 blog model table
    ("qwen3-30b-a3b", 30.5e9, None, 29.9e9),  # Qwen3-30B-A3B model card
    ("deepseek-v2-lite", 15.7e9, None, None),  # DeepSeek-V2 paper: V2-Lite 15.7B total
    ("deepseek-v2", 236e9, None, None),  # DeepSeek-V2 paper: 236B total
    ("deepseek-v3", 671e9, None, None),  # DeepSeek-V3 paper: 671B total (MTP excluded)
    ("mistral-7b", 7.24e9, None, None),  # checkpoint count on the model page
    ("mixtral-8x7b", 46.7e9, 12.9e9, None),  # docs/anchors.md
    ("llama-3.2-1b", 1.23e9, None, None),  # Llama 3.2 model card
    ("gpt2", 124e6, None, None),  # GPT-2 small checkpoint (124M)
]


@pytest.mark.parametrize("name,total,active,non_embedding", PUBLISHED)
def test_hf_config_counts_match_published(name, total, active, non_embedding):
    c = _count(name)
    assert c.total == pytest.approx(total, rel=REL_TOL)
    if active is not None:
        assert c.active == pytest.approx(active, rel=REL_TOL)
    if non_embedding is not None:
        # Qwen model cards' "non-embedding" excludes both the input table and the untied lm_head.
        assert c.non_embedding == pytest.approx(non_embedding, rel=REL_TOL)


def test_deepseek_activated_convention():
    # DeepSeek publishes activated counts with two significant figures; both V2 ("21B") and V3 ("37B")
    # match the count that leaves out the input-embedding lookup.
    v2, v3 = _count("deepseek-v2"), _count("deepseek-v3")
    assert round((v2.active - v2.embedding) / 1e9) == 21
    assert round((v3.active - v3.embedding) / 1e9) == 37


def test_qwen3_moe_active_two_significant_figures():
    # Qwen3-30B-A3B model card: 3.3B activated (two significant figures).
    c = _count("qwen3-30b-a3b")
    assert c.active == pytest.approx(3.3e9, rel=0.02)


@pytest.mark.parametrize("preset", ["mixtral-8x7b", "deepseek-v3"])
def test_hf_reader_agrees_with_preset(preset):
    # Two independent routes to the same model (config.json vs the hand-written preset) must agree exactly.
    assert _count(preset) == count_params(get_preset(preset))


def test_tied_embeddings_drop_the_lm_head():
    cfg = _cfg("llama-3.2-1b")
    tied = count_params(shape_from_hf_dict(cfg))
    untied = count_params(shape_from_hf_dict({**cfg, "tie_word_embeddings": False}))
    assert tied.lm_head == 0
    assert untied.total - tied.total == 128256 * 2048


def test_qwen2_qkv_biases_and_no_o_bias():
    cfg = _cfg("qwen2-7b")
    qwen = count_params(shape_from_hf_dict(cfg))
    as_llama = count_params(shape_from_hf_dict({**cfg, "model_type": "llama"}))
    # Per layer: q bias (28 heads x 128) + k and v biases (4 kv heads x 128 each); o_proj has none.
    assert qwen.attention - as_llama.attention == 28 * (28 * 128 + 2 * 4 * 128)


def test_llama_attention_bias_includes_o_proj():
    cfg = _cfg("llama-3.2-1b")
    base = count_params(shape_from_hf_dict(cfg))
    biased = count_params(shape_from_hf_dict({**cfg, "attention_bias": True, "mlp_bias": True}))
    h, L = 2048, 16
    assert biased.attention - base.attention == L * (32 * 64 + 2 * 8 * 64 + h)
    assert biased.dense_mlp - base.dense_mlp == L * (2 * 8192 + h)


def test_qwen2_moe_shared_expert_and_gate():
    c = _count("qwen1.5-moe-a2.7b")
    h = 2048
    # Per MoE layer: shared expert (gate/up/down of 5632) + shared_expert_gate Linear(h, 1).
    assert c.shared_experts == 24 * (3 * h * 5632 + h)
    assert c.router == 24 * 60 * h
    assert c.expert_params_each == 3 * h * 1408
    assert c.active == c.total - 24 * (60 - 4) * c.expert_params_each


def test_qwen_decoder_sparse_step_and_mlp_only_layers():
    cfg = _cfg("qwen1.5-moe-a2.7b")
    # transformers Qwen2MoeDecoderLayer: sparse iff i not in mlp_only_layers and (i + 1) % step == 0.
    shape = shape_from_hf_dict({**cfg, "decoder_sparse_step": 2, "mlp_only_layers": [23]})
    assert [i for i in range(24) if shape.is_moe_layer(i)] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21]
    c = count_params(shape)
    assert c.dense_mlp == 13 * 3 * 2048 * 5632


def test_mla_without_q_lora_rank():
    # DeepSeek-V2-Lite: full q_proj (no q_a_proj / q_a_layernorm / q_b_proj).
    c = _count("deepseek-v2-lite")
    h, a = 2048, 16
    per_layer = (
        h * a * (128 + 64)  # q_proj
        + h * (512 + 64) + 512  # kv_a_proj_with_mqa + kv_a_layernorm
        + 512 * a * (128 + 128)  # kv_b_proj
        + a * 128 * h  # o_proj
    )
    assert c.attention == 27 * per_layer


def test_mla_with_q_lora_rank():
    c = _count("deepseek-v3")
    h, a = 7168, 128
    per_layer = (
        h * 1536 + 1536 + 1536 * a * 192  # q_a_proj + q_a_layernorm + q_b_proj
        + h * 576 + 512 + 512 * a * 256 + a * 128 * h
    )
    assert c.attention == 61 * per_layer


def test_deepseek_dense_layers_shared_experts_and_router_bias():
    v3 = _count("deepseek-v3")
    assert v3.num_moe_layers == 58  # first_k_dense_replace = 3 of 61
    assert v3.dense_mlp == 3 * 3 * 7168 * 18432
    assert v3.shared_experts == 58 * 3 * 7168 * 2048
    assert v3.router == 58 * 256 * 7168  # gate.weight
    assert v3.buffers == 58 * 256  # e_score_correction_bias (noaux_tc): a buffer, not a parameter
    v2 = _count("deepseek-v2")
    assert v2.router == 59 * 160 * 5120  # greedy routing: no correction bias
    assert v2.shared_experts == 59 * 3 * 5120 * (2 * 1536)  # 2 shared experts fused into one MLP


def test_deepseek_moe_layer_freq():
    cfg = _cfg("deepseek-v2-lite")
    shape = shape_from_hf_dict({**cfg, "moe_layer_freq": 2})
    # DeepseekV2DecoderLayer: MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0.
    assert shape.num_moe_layers == len([i for i in range(1, 27) if i % 2 == 0])


def test_deepseek_without_routed_experts_is_dense():
    cfg = {**_cfg("deepseek-v2-lite"), "n_routed_experts": None}
    c = count_params(shape_from_hf_dict(cfg))
    assert c.routed_experts == 0 and c.active == c.total
    assert c.dense_mlp == 27 * 3 * 2048 * 10944


def test_gpt2_exact():
    c = _count("gpt2")
    h, V, P, L = 768, 50257, 1024, 12
    assert c.embedding == V * h + P * h  # wte + wpe
    assert c.lm_head == 0  # tied
    assert c.attention == L * (h * 3 * h + 3 * h + h * h + h)  # c_attn + c_proj with biases
    assert c.dense_mlp == L * (h * 4 * h + 4 * h + 4 * h * h + h)  # c_fc + c_proj with biases
    assert c.norms == (2 * L + 1) * 2 * h  # ln_1, ln_2, ln_f with bias
    assert c.total == 124_439_808  # GPT-2 small, the figure transformers reports for the checkpoint
