"""Shapes transformers builds say what the blocks are made of (models.block_facts.block_facts: norm, biases, rotary
share, positions, residual wiring, embedding norm, head bias, activation), and the Megatron argument files express
it or refuse naming the property.

Before: shape_fields set none of these, so Pythia / Phi-2 / StarCoder2 / BLOOM got RMSNorm, no biases and full
RoPE (BLOOM even SwiGLU), and Falcon was refused for an "activation 'silu'" it does not have."""
from __future__ import annotations

import json
import pathlib

import pytest

pytest.importorskip("transformers")

from dstoolkit.generate.candidates import Candidate  # noqa: E402
from dstoolkit.generate.megatron_common import UnsupportedTarget  # noqa: E402
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args  # noqa: E402
from dstoolkit.generate.megatron_lm import megatron_lm_args  # noqa: E402
from dstoolkit.models.hf import load_hf_config, shape_from_hf_dict  # noqa: E402
from dstoolkit.spec import spec_from_dict  # noqa: E402

DATA = pathlib.Path(__file__).parent / "data_s30_models"
SPEC = {"name": "t", "model": {"preset": "tiny"}, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "training": {"global_batch": 64, "seq_len": 2048}}
CAND = Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1)


def _shape(name):
    return load_hf_config(DATA / f"{name}.json")


def _lm(shape):
    return megatron_lm_args(spec_from_dict(SPEC), shape, CAND)


def _mds(shape):
    return megatron_deepspeed_args(spec_from_dict(SPEC), shape, CAND, ds_config_path="ds_config.json")


def test_pythia_shape_is_gpt_neox():
    s = _shape("neox_pythia410m")
    assert (s.norm_type, s.attention_bias, s.o_proj_bias, s.mlp_bias, s.mlp_gated) == ("layernorm", True, True, True, False)
    assert s.rotary_fraction == 0.25 and s.parallel_residual and s.hidden_act == "gelu"
    assert s.intermediate_size == 4096


def test_phi2_starcoder2_bloom_falcon_shapes():
    phi = _shape("phi2")
    assert phi.rotary_fraction == pytest.approx(0.4) and phi.parallel_residual and phi.lm_head_bias
    assert phi.norm_type == "layernorm" and phi.o_proj_bias and phi.mlp_bias
    sc = _shape("starcoder2_3b")
    assert (sc.norm_type, sc.attention_bias, sc.o_proj_bias, sc.mlp_bias) == ("layernorm", True, True, True)
    assert not sc.parallel_residual and sc.rotary_fraction == 1.0
    bloom = _shape("bloom560m")
    assert bloom.position_encoding == "alibi" and bloom.embedding_norm and not bloom.mlp_gated
    assert bloom.intermediate_size == 4096  # 4h, not the 2732-wide SwiGLU the parameter count divided by 3h gave
    falcon = _shape("falcon7b")
    assert falcon.hidden_act == "gelu" and falcon.parallel_residual and not falcon.attention_bias


def test_starcoder2_megatron_flags():
    s = _shape("starcoder2_3b")
    lm = _lm(s)
    assert lm[lm.index("--normalization") + 1] == "LayerNorm"
    assert "--disable-bias-linear" not in lm and "--add-qkv-bias" not in lm  # Megatron's default: all biases
    assert "--openai-gelu" in lm and "--swiglu" not in lm
    mds = _mds(s)
    assert mds[mds.index("--normalization") + 1] == "layernorm" and "--disable-bias-linear" not in mds


@pytest.mark.parametrize("name, words", [
    ("neox_pythia410m", ["parallel attention + MLP block"]),
    ("falcon7b", ["parallel attention + MLP block"]),
    ("phi2", ["parallel attention + MLP block", "bias on the output head"]),
    ("bloom560m", ["ALiBi", "LayerNorm after the token embedding"]),
])
def test_refusals_name_the_real_property(name, words):
    s = _shape(name)
    for build in (_lm, _mds):
        with pytest.raises(UnsupportedTarget) as e:
            build(s)
        for w in words:
            assert w in str(e.value)
        assert "silu" not in str(e.value) and "q/k/v-only" not in str(e.value)


def test_partial_rotary_written_when_expressible():
    d = json.loads((DATA / "neox_pythia410m.json").read_text())
    d["use_parallel_residual"] = False  # a sequential GPT-NeoX: Megatron can build it
    s = shape_from_hf_dict(d)
    lm = _lm(s)
    assert lm[lm.index("--rotary-percent") + 1] == "0.25" and "--disable-bias-linear" not in lm
    mds = _mds(s)
    assert mds[mds.index("--rotary-percent") + 1] == "0.25"


def test_bias_combination_megatron_cannot_express():
    # Llama attention_bias=True: q/k/v and o_proj biased, MLP not: neither "all", "none" nor "q/k/v only"
    s = shape_from_hf_dict({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "intermediate_size": 688, "vocab_size": 1024,
                            "attention_bias": True})
    with pytest.raises(UnsupportedTarget, match="biases on q/k/v, attention output only"):
        _lm(s)
    with pytest.raises(UnsupportedTarget, match="biases on q/k/v, attention output only"):
        _mds(s)
