"""A block that norms an attention or MLP output before its residual add (OLMo-2's post-norm, Gemma-2's and GLM-4's
sandwich) is read as such (models.block_facts.sublayer_output_norm: the decoder layer's forward by data flow), and
neither Megatron target writes it (megatron_common.architecture_gaps). Before: OLMo-2 got Megatron-LM files of a
pre-norm block, a different model, without a word. Pre-norm (Llama), parallel (GPT-NeoX: its second norm reads the
block input) and BLOOM (its attention adds the residual it is handed, then the norm reads the sum) are not."""
from __future__ import annotations

import json

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.megatron_common import UnsupportedTarget
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.models.resolve import load_model
from dstoolkit.spec import spec_from_dict

pytest.importorskip("transformers")

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 512}


def _shape(tmp_path, **cfg):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(str(path))


@pytest.mark.parametrize("cfg,want", [
    ({"model_type": "olmo2", **SMALL}, True),
    ({"model_type": "glm4", **SMALL, "head_dim": 16, "pad_token_id": 0}, True),
    ({"model_type": "llama", **SMALL}, False),
    ({"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 256, "use_parallel_residual": True}, False),
    ({"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256}, False),
])
def test_output_norm_is_read_from_the_layer_forward(tmp_path, cfg, want):
    assert _shape(tmp_path, **cfg).output_norm is want


def test_megatron_refuses_a_post_norm_block(tmp_path):
    shape = _shape(tmp_path, model_type="olmo2", **SMALL)
    spec = spec_from_dict({"name": "t", "model": {"preset": "tiny"}, "cluster": {"gpu": "cpu", "gpus_per_node": 2},
                           "training": {"global_batch": 8, "seq_len": 128}})
    with pytest.raises(UnsupportedTarget, match="a norm on the attention / MLP output before the residual add"):
        megatron_lm_args(spec, shape, Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1))


@pytest.mark.parametrize("cfg,want", [
    # OLMoE's q_norm / k_norm span the whole projection (heads x head_dim); Gemma-3's each head
    ({"model_type": "olmoe", **SMALL, "num_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0,
      "eos_token_id": 1}, (True, "projection")),
    ({"model_type": "gemma3_text", **SMALL, "head_dim": 16}, (True, "head")),
    ({"model_type": "llama", **SMALL}, (False, "head")),
])
def test_qk_norms_are_read_with_their_scope(tmp_path, cfg, want):
    # before: a transformers-built model's q/k norms were not read at all (qk_norm False), so Megatron files left
    # them out (Gemma-3, Qwen3.5, MiniMax-M2.5) without a word
    shape = _shape(tmp_path, **cfg)
    assert (shape.qk_norm, shape.qk_norm_scope) == want


def test_mla_latent_norms_are_not_qk_norms():
    shape = load_model("tests/golden/hf_configs/released/zai-org--GLM-4.7-Flash.json")
    assert shape.is_mla and not shape.qk_norm  # q_a_layernorm / kv_a_layernorm belong to MLA


def test_megatron_refuses_projection_wide_qk_norms(tmp_path):
    shape = _shape(tmp_path, model_type="olmoe", **SMALL, num_experts=4, num_experts_per_tok=2, pad_token_id=0,
                   eos_token_id=1)
    spec = spec_from_dict({"name": "t", "model": {"preset": "tiny"}, "cluster": {"gpu": "cpu", "gpus_per_node": 2},
                           "training": {"global_batch": 8, "seq_len": 128}})
    with pytest.raises(UnsupportedTarget, match="q/k norms over the whole q / k projection"):
        megatron_lm_args(spec, shape, Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1))
