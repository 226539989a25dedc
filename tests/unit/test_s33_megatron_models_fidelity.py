"""Both Megatron targets read the model's constants the way transformers 5 saves them, and refuse what their GPT
model would drop (s33 models report, findings 1, 4, 5, 7, 9).

Before: `--rotary-base 10000` for every config transformers 5 writes (rope_theta sits in rope_parameters); Mamba got
the args of a 1-head GPT; Granite's µP multipliers, Gemma's softcapping and Cohere's logit_scale were dropped without
a word; LLaVA got text-only GPT args while the estimate counted its towers; StarCoder2's norm_epsilon and
residual_dropout were not read (--norm-epsilon 1e-05, --hidden-dropout 0.0)."""
from __future__ import annotations

import textwrap

import pytest

T = pytest.importorskip("transformers")

from dstoolkit.generate.candidates import Candidate  # noqa: E402
from dstoolkit.generate.io import load_spec_and_shape  # noqa: E402
from dstoolkit.generate.megatron_common import UnsupportedTarget  # noqa: E402
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args  # noqa: E402
from dstoolkit.generate.megatron_lm import megatron_lm_args  # noqa: E402
from dstoolkit.generate.megatron_model import model_constants, rope_theta_problem, rope_thetas  # noqa: E402

CAND = Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1)
SMALL = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=2048)


def _load(tmp_path, cfg):
    cfg.save_pretrained(tmp_path / "m")
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: t
        model: {hf_config: m/config.json}
        cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}
        training: {seq_len: 1024, global_batch: 16, micro_batch: 1, tp: 1, pp: 1, zero_stage: 1}
        """))
    return load_spec_and_shape(tmp_path / "s.yaml")


def _lm(spec, shape):
    return megatron_lm_args(spec, shape, CAND)


def _mds(spec, shape):
    return megatron_deepspeed_args(spec, shape, CAND, ds_config_path="ds_config.json")


def _flag(words, name):
    return words[words.index(name) + 1]


def _refusals(spec, shape):
    out = []
    for build in (_lm, _mds):
        with pytest.raises(UnsupportedTarget) as e:
            build(spec, shape)
        out.append(str(e.value))
    return out


# --- finding 1: the RoPE base from transformers 5's rope_parameters, in both targets ---

@pytest.mark.parametrize("make, theta", [
    (lambda: T.LlamaConfig(**SMALL, rope_theta=500000.0), "500000"),
    (lambda: T.Qwen2Config(**SMALL, rope_theta=1000000.0), "1000000"),
    (lambda: T.Starcoder2Config(**SMALL, rope_theta=100000.0), "100000"),
])
def test_rope_base_read_from_rope_parameters(tmp_path, make, theta):
    cfg = make()
    spec, shape = _load(tmp_path, cfg)
    assert "rope_theta" not in (tmp_path / "m" / "config.json").read_text().split("rope_parameters")[0]
    assert _flag(_lm(spec, shape), "--rotary-base") == theta
    if shape.model_type == "starcoder2":  # the one of the three Megatron-DeepSpeed takes (q/k/v-only bias: Qwen2)
        assert _flag(_mds(spec, shape), "--rotary-position-embeddings-theta") == theta
    assert model_constants(spec, shape).rope_theta == float(theta)


def test_rope_base_reader_forms():
    assert rope_thetas({"rope_theta": 5e5}) == {"rope_theta": 5e5}
    assert rope_thetas({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == {
        "rope_parameters.rope_theta": 1e6}
    # transformers: a rope_theta inside the rope dict wins over the top-level one, which fills a dict without one
    assert set(rope_thetas({"rope_theta": 1.0, "rope_parameters": {"rope_theta": 2.0}}).values()) == {2.0}
    old_style = {"rope_theta": 3.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    assert set(rope_thetas(old_style).values()) == {3.0}
    gemma3 = {"layer_types": ["sliding_attention", "full_attention"],
              "rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}}
    problem = rope_theta_problem(gemma3)
    assert "full_attention.rope_theta 1e+06" in problem and "sliding_attention.rope_theta 10000" in problem
    same = {"layer_types": gemma3["layer_types"],
            "rope_parameters": {"full_attention": {"rope_theta": 1e4}, "sliding_attention": {"rope_theta": 1e4}}}
    assert rope_theta_problem(same) is None


def test_gemma3_per_layer_rope_bases_refused_not_picked(tmp_path):
    cfg = T.Gemma3TextConfig(**SMALL, head_dim=32, sliding_window=4096,
                             layer_types=["sliding_attention", "full_attention"],
                             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    spec, shape = _load(tmp_path, cfg)
    for msg in _refusals(spec, shape):
        assert "a RoPE base per layer type" in msg and "sliding_attention.rope_theta 10000" in msg
    with pytest.raises(UnsupportedTarget, match="RoPE base per layer type"):
        model_constants(spec, shape)


def test_rope_bases_of_layer_types_the_model_does_not_use_are_ignored(tmp_path):
    # only sliding layers: the global base is never used, so one --rotary-base describes the model (transformers:
    # nested_rope_parameter_keys reads the layer types the config declares)
    cfg = T.Gemma3TextConfig(**SMALL, head_dim=32, layer_types=["sliding_attention", "sliding_attention"],
                             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    spec, shape = _load(tmp_path, cfg)
    assert model_constants(spec, shape).rope_theta == 1e4


# --- finding 9: StarCoder2's key spellings ---

def test_starcoder2_norm_epsilon_and_residual_dropout(tmp_path):
    cfg = T.Starcoder2Config(**SMALL, norm_epsilon=1e-6, residual_dropout=0.1, embedding_dropout=0.1)
    spec, shape = _load(tmp_path, cfg)
    lm, mds = _lm(spec, shape), _mds(spec, shape)
    assert _flag(lm, "--norm-epsilon") == "1e-06" and _flag(lm, "--hidden-dropout") == "0.1"
    assert _flag(mds, "--layernorm-epsilon") == "1e-06" and _flag(mds, "--hidden-dropout") == "0.1"


def test_embedding_dropout_other_than_hidden_dropout_refused(tmp_path):
    cfg = T.Starcoder2Config(**SMALL, residual_dropout=0.1, embedding_dropout=0.2)
    spec, shape = _load(tmp_path, cfg)
    for msg in _refusals(spec, shape):
        assert "embedding_dropout=0.2 beside a hidden dropout of 0.1" in msg


# --- finding 4: non-attention token mixers ---

def test_mamba_refused_by_both_targets(tmp_path):
    cfg = T.MambaConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, state_size=8)
    spec, shape = _load(tmp_path, cfg)
    for msg in _refusals(spec, shape):
        assert "2 mamba token-mixer layers of 2" in msg and "pretrain_mamba.py" in msg


# --- finding 5: scaling keys, declared once in SCALE_KEYS ---

def test_granite_multipliers_refused_naming_key_and_value(tmp_path):
    cfg = T.GraniteConfig(**SMALL, embedding_multiplier=12.0, residual_multiplier=0.22,
                          attention_multiplier=0.0078125, logits_scaling=16.0)
    spec, shape = _load(tmp_path, cfg)
    for msg in _refusals(spec, shape):
        for words in ("embedding_multiplier=12.0", "residual_multiplier=0.22", "attention_multiplier=0.0078125",
                      "logits_scaling=16.0", "hf / accelerate targets"):
            assert words in msg


def test_granite_with_neutral_multipliers_is_llama_math(tmp_path):
    # attention_multiplier is the score scale itself (GraniteAttention.scaling): neutral at head_dim**-0.5
    cfg = T.GraniteConfig(**SMALL, embedding_multiplier=1.0, residual_multiplier=1.0,
                          attention_multiplier=32 ** -0.5, logits_scaling=1.0)
    spec, shape = _load(tmp_path, cfg)
    assert "--swiglu" in _lm(spec, shape) and "--swiglu" in _mds(spec, shape)


def test_granite_default_attention_multiplier_is_not_neutral(tmp_path):
    cfg = T.GraniteConfig(**SMALL)  # transformers' default attention_multiplier 1.0: scores not divided by sqrt(d)
    spec, shape = _load(tmp_path, cfg)
    for msg in _refusals(spec, shape):
        assert "attention_multiplier=1.0" in msg and "embedding_multiplier" not in msg


@pytest.mark.parametrize("make, words", [
    (lambda: T.Gemma2Config(**SMALL, head_dim=32, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                            query_pre_attn_scalar=32),
     ["final_logit_softcapping=30.0", "attn_logit_softcapping=50.0", "token embeddings scaled by sqrt(hidden_size)"]),
    (lambda: T.CohereConfig(**SMALL, logit_scale=0.0625), ["logit_scale=0.0625"]),
    (lambda: T.OlmoConfig(**SMALL, clip_qkv=8.0), ["clip_qkv=8.0"]),
])
def test_other_scaling_keys_named(tmp_path, make, words):
    spec, shape = _load(tmp_path, make())
    for msg in _refusals(spec, shape):
        for w in words:
            assert w in msg


# --- finding 7: vision towers ---

def test_llava_towers_refused(tmp_path):
    cfg = T.LlavaConfig(text_config=T.LlamaConfig(**SMALL).to_dict(),
                        vision_config={"model_type": "clip_vision_model", "hidden_size": 64, "intermediate_size": 128,
                                       "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 32,
                                       "patch_size": 16, "projection_dim": 64})
    spec, shape = _load(tmp_path, cfg)
    assert shape.measured is not None and shape.measured.vision_params > 0
    for msg in _refusals(spec, shape):
        assert "vision / audio towers" in msg and "builds the language model only" in msg
