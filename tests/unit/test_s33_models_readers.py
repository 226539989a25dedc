"""Session 33 models report, findings 2, 3, 8 and 11: configs that transformers 5 writes.

2. The hand-written readers refused Qwen3-MoE (transformers 5 saves num_experts as num_local_experts: its
   attribute_map) and DeepSeek-V2/V3 (no moe_layer_freq: transformers 5 makes every layer from first_k_dense_replace
   on MoE). Now read as transformers reads them, with transformers' meta-device counts; a key that is really
   required names the --model-class workaround.
3. The transformers build of DeepSeek-V3 lost its sigmoid scoring + e_score_correction_bias (a buffer in
   transformers 5): ModelShape.router_score_correction_bias was set only by the hand-written reader.
8. BERT was estimated as a causal decoder (AutoModelForCausalLM builds BertLMHeadModel); CLIP was refused with an
   internal NotImplementedError text.
11. The buffer note called BERT's token_type_ids "router score-correction biases"; OLMo-1's norm was "LayerNorm
   without bias" though it has no weight either.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.models import count_params, load_hf_config
from dstoolkit.models.hf import HFConfigError, shape_from_hf_dict
from dstoolkit.spec import ModelSpec

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

QWEN3_30B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                 num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                 num_experts_per_tok=8, norm_topk_prob=True, tie_word_embeddings=False, max_position_embeddings=40960)
TINY_DSV3 = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                 num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
                 kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


def _saved(tmp_path, config, name="m"):
    config.save_pretrained(tmp_path / name)
    return tmp_path / name


def _meta_count(config) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


# --- 2: the hand-written readers read what transformers 5 writes --------------------------------------------------

def test_qwen3_moe_written_by_transformers_5_is_read_with_its_count(tmp_path):
    path = _saved(tmp_path, transformers.Qwen3MoeConfig(**QWEN3_30B))
    assert "num_local_experts" in json.loads((path / "config.json").read_text())  # transformers' attribute_map
    shape = load_hf_config(path)
    assert shape.source == "analytic" and shape.num_experts == 128
    n = count_params(shape)
    # transformers 5.25 meta-device sum(p.numel()) of this config (report finding 2; published: 30.5B / 3.3B active)
    assert (n.total, n.active) == (30_532_122_624, 3_353_032_704)


def test_qwen3_moe_tiny_count_equals_the_meta_build(tmp_path):
    cfg = transformers.Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      num_experts=6, num_experts_per_tok=2, mlp_only_layers=[1])
    shape = load_hf_config(_saved(tmp_path, cfg))
    assert count_params(shape).total == _meta_count(cfg)
    assert shape.mlp_only_layers == (1,)


def test_deepseek_v3_default_config_is_read_with_transformers_count(tmp_path):
    path = _saved(tmp_path, transformers.DeepseekV3Config())
    assert "moe_layer_freq" not in json.loads((path / "config.json").read_text())
    shape = load_hf_config(path)
    assert shape.source == "analytic" and shape.num_moe_layers == 58 and shape.router_score_correction_bias
    n = count_params(shape)
    # transformers 5.25's meta count (report finding 2); e_score_correction_bias, 256 per MoE layer, is a buffer
    # (ParamCount.buffers), not a parameter
    assert (n.total, n.buffers) == (671_026_404_352, 58 * 256)


@pytest.mark.parametrize("cls", ["DeepseekV2Config", "DeepseekV3Config"])
def test_deepseek_without_moe_layer_freq_equals_the_meta_build(tmp_path, cls):
    cfg = getattr(transformers, cls)(**TINY_DSV3)
    shape = load_hf_config(_saved(tmp_path, cfg))
    assert [shape.is_moe_layer(i) for i in range(4)] == [False, True, True, True]  # DeepseekV*DecoderLayer
    n = count_params(shape)
    assert (n.total, n.buffers) == (_meta_count(cfg), 3 * 8 if shape.router_score_correction_bias else 0)


def test_an_alias_and_its_key_that_disagree_are_refused():
    cfg = transformers.Qwen3MoeConfig(**QWEN3_30B).to_dict()
    with pytest.raises(HFConfigError, match=r"^num_local_experts: num_local_experts=128 and num_experts=64 name the "
                                            r"same field .* \(keep one of 'num_experts' and 'num_local_experts'\)"):
        shape_from_hf_dict({**cfg, "num_experts": 64})


def test_inline_spec_accepts_the_transformers_5_spelling():
    cfg = {k: v for k, v in QWEN3_30B.items() if k != "num_experts"}
    shape = shape_from_hf_dict({"model_type": "qwen3_moe", **cfg, "num_local_experts": 128}, strict=True)
    assert shape.num_experts == 128


def test_a_missing_required_key_offers_the_transformers_build():
    cfg = {k: v for k, v in QWEN3_30B.items() if k != "num_experts"}
    with pytest.raises(HFConfigError) as info:
        shape_from_hf_dict({"model_type": "qwen3_moe", **cfg})
    assert str(info.value) == ("num_experts: required field is missing (add 'num_experts'; or let transformers read "
                               "the config, with its defaults: --model-class Qwen3MoeForCausalLM (spec: model_class: "
                               "Qwen3MoeForCausalLM))")


# --- 3: the transformers build keeps DeepSeek-V3's routing --------------------------------------------------------

def test_transformers_build_of_deepseek_v3_has_sigmoid_routing_with_expert_bias(tmp_path):
    path = _saved(tmp_path, transformers.DeepseekV3Config(**TINY_DSV3))
    built = load_hf_config(path, model_class="DeepseekV3ForCausalLM")
    read = load_hf_config(path)
    assert built.source == "transformers" and built.router_score_correction_bias
    assert (built.router_score_correction_bias, built.norm_topk_prob) == (read.router_score_correction_bias,
                                                                        read.norm_topk_prob)
    assert "e_score_correction_bias: 24" in " ".join(built.notes)


def test_softmax_scoring_config_does_not_get_the_expert_bias(tmp_path):
    # DeepSeek's own configs name the scoring function; a softmax router is not Megatron's sigmoid + expert bias
    path = _saved(tmp_path, transformers.DeepseekV3Config(**TINY_DSV3))
    cfg = {**json.loads((path / "config.json").read_text()), "scoring_func": "softmax"}
    assert not shape_from_hf_dict(cfg, source="transformers").router_score_correction_bias
    qwen = load_hf_config(_saved(tmp_path, transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2), "q"),
        model_class="Qwen3MoeForCausalLM")
    assert not qwen.router_score_correction_bias


# --- 8: encoder-only and non-LM configs refused in one line -------------------------------------------------------

def test_bert_is_refused_as_encoder_only(tmp_path):
    path = _saved(tmp_path, transformers.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                    intermediate_size=128))
    with pytest.raises(HFConfigError) as info:
        load_hf_config(path)
    assert str(info.value) == (
        "is_decoder: 'bert' (BertConfig) is an encoder-only model (bidirectional self-attention: is_decoder is not "
        "true): not estimated (the estimator models a causal decoder-only language model) (estimate a decoder-only "
        "model; set is_decoder: true only if it is trained as a causal LM)")
    with pytest.raises(HFConfigError, match="encoder-only model"):
        load_hf_config(path, model_class="BertLMHeadModel")


def test_spec_resolution_refuses_roberta(tmp_path):
    from dstoolkit.models.resolve import resolve_model

    path = _saved(tmp_path, transformers.RobertaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                       intermediate_size=128))
    with pytest.raises(ValueError, match="'roberta' \\(RobertaConfig\\) is an encoder-only model"):
        resolve_model(ModelSpec(hf_config=str(path)))


def test_an_encoder_family_set_to_decode_is_a_causal_lm(tmp_path):
    cfg = transformers.RobertaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                     is_decoder=True)
    shape = load_hf_config(_saved(tmp_path, cfg))
    assert count_params(shape).total == _meta_count(cfg)
    # 11: the note names the buffer it means (not "router score-correction biases")
    assert shape.notes == ("512 elements of registered buffers (token_type_ids: 512) are not parameters and are not "
                           "counted",)


def test_clip_is_refused_as_not_a_language_model(tmp_path):
    path = _saved(tmp_path, transformers.CLIPConfig())
    with pytest.raises(HFConfigError) as info:
        load_hf_config(path)
    msg = str(info.value)
    assert msg.startswith("model_type: CLIP is not a causal language model: transformers ")
    assert "AutoModel builds CLIPModel, without a language-model head" in msg and "NotImplementedError" not in msg
    assert "\n" not in msg


def test_user_module_bert_is_refused_by_the_same_rule(monkeypatch):
    import sys
    import types

    from dstoolkit.models.user_module import load_user_model
    from dstoolkit.models.user_module_build import UserModelError

    mod = types.ModuleType("s33_bert_fixture")
    mod.build = lambda: transformers.BertLMHeadModel(transformers.BertConfig(
        num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, vocab_size=64))
    monkeypatch.setitem(sys.modules, "s33_bert_fixture", mod)
    with pytest.raises(UserModelError) as info:
        load_user_model("s33_bert_fixture:build")
    assert info.value.problem.startswith("it builds BertLMHeadModel, an encoder-only model")


# --- 11: OLMo-1's non-parametric LayerNorm -----------------------------------------------------------------------

def test_olmo_1_norm_is_described_as_non_parametric(tmp_path):
    cfg = transformers.OlmoConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                  num_attention_heads=4)
    shape = load_hf_config(_saved(tmp_path, cfg))
    assert (shape.norm_type, shape.norm_variant) == ("layernorm", "LayerNorm without weight or bias (non-parametric)")
