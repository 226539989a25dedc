"""Session 35 models finding 2: a router bias without scoring_func was taken as sigmoid (+ expert bias). Now the
model_type's default decides (router_scoring.SCORING_BY_MODEL_TYPE: Ernie-4.5-MoE and DeepSeek-V2 score with
softmax); an unknown model_type is assumed sigmoid with a note that names scoring_func.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from dstoolkit.models.hf import shape_from_hf_dict
from dstoolkit.models.router_scoring import router_scoring

TINY_DSV3 = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                 num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
                 kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


# ------------------------------------------------------------------------------------------------------------------

def test_the_model_type_default_decides_the_score_function():
    assert router_scoring("deepseek_v3", None) == ("sigmoid", None)
    assert router_scoring("deepseek_v2", None) == ("softmax", None)
    assert router_scoring("ernie4_5_moe", None) == ("softmax", None)
    assert router_scoring("ernie4_5_moe", "sigmoid") == ("sigmoid", None)  # the config's own value first
    unknown = router_scoring("my_moe", None)
    assert unknown.function == "sigmoid"
    assert unknown.note == ("the router holds a score-correction bias (e_score_correction_bias) and the config names "
                            "no scoring_func; model_type 'my_moe' has no known default, so sigmoid scoring was "
                            "assumed (set scoring_func in the config: sigmoid or softmax)")


def test_deepseek_v2_noaux_tc_without_scoring_func_is_softmax():
    # DeepSeek's own DeepseekV2 config defaults scoring_func to softmax: no sigmoid + expert-bias routing
    v2 = {"model_type": "deepseek_v2", **TINY_DSV3, "topk_method": "noaux_tc"}
    assert not shape_from_hf_dict(v2).router_score_correction_bias
    assert shape_from_hf_dict({**v2, "scoring_func": "sigmoid"}).router_score_correction_bias
    assert shape_from_hf_dict({"model_type": "deepseek_v3", **TINY_DSV3}).router_score_correction_bias


def test_ernie_moe_router_bias_scores_with_softmax():
    # Ernie4_5_MoeTopKRouter: softmax over the logits, then moe_statics.e_score_correction_bias for the top-k
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Ernie4_5_MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                                          moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, moe_num_experts=4, moe_k=2)
    shape = shape_from_hf_dict(cfg.to_dict(), source="transformers")
    assert shape.measured.arch.router_score_bias and not shape.router_score_correction_bias


def test_an_unknown_model_type_with_a_router_bias_says_sigmoid_was_assumed():
    transformers = pytest.importorskip("transformers")
    from dstoolkit.models import from_transformers as tf
    from dstoolkit.models.shape_fields import shape_fields

    d = transformers.DeepseekV3Config(**TINY_DSV3).to_dict()
    measured = tf.measure_config(d)
    kw = shape_fields(SimpleNamespace(**{**d, "model_type": "my_moe"}), measured)
    assert kw["router_score_correction_bias"] is True
    assert kw["notes"] == (router_scoring("my_moe", None).note,)
    # a known model_type assumes nothing
    assert "notes" not in shape_fields(tf.text_config_of(d), measured)


def test_multimodal_text_model_types_have_their_family_default():
    """shape_fields passes the text config's model_type: the text types of multimodal families score as their
    family (transformers 5.25: Glm5NextTopkRouter, Dots3Note..., MuseSpark..., Step3p7's step3p5 text: sigmoid),
    with no 'assumed' note (s35 review finding 7)."""
    from dstoolkit.models.router_scoring import router_scoring

    for t in ("glm5_next_text", "dots3_note_text", "muse_spark_text", "step3p5"):
        assert router_scoring(t, None) == ("sigmoid", None), t
