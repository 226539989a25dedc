"""HF config reader errors and ModelShape consistency rules."""
import json
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from dstoolkit.models import FAMILIES, HFConfigError, ModelShape, load_hf_config, shape_from_hf_dict

HF = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs"


def cfg(name):
    return json.loads((HF / f"{name}.json").read_text())


def test_supported_families():
    assert {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "deepseek_v2", "deepseek_v3", "gpt2"} <= set(FAMILIES)


def test_unknown_model_type_is_refused_with_the_reason():
    pytest.importorskip("transformers")
    # A type neither the analytic readers nor transformers know: transformers' reason, and no spelling guess.
    with pytest.raises(HFConfigError, match=r"model_type: unsupported model_type 'jambaa': transformers .* does "
                       r"not know model_type 'jambaa'") as info:
        shape_from_hf_dict({**cfg("mistral-7b"), "model_type": "jambaa"})
    assert "did you mean" not in str(info.value)
    # Only separator/case variants are suggested (the same architecture, never a spelling neighbour).
    with pytest.raises(ValueError, match=r"did you mean 'qwen2_moe'\?"):
        shape_from_hf_dict({**cfg("qwen2-7b"), "model_type": "qwen2-moe"})


def test_analytic_only_source_lists_supported():
    with pytest.raises(HFConfigError, match=r"model_type: unsupported model_type 'falcon' \(analytic readers only\)"):
        shape_from_hf_dict({**cfg("mistral-7b"), "model_type": "falcon"}, source="analytic")


def test_missing_model_type():
    d = cfg("mistral-7b")
    del d["model_type"]
    with pytest.raises(HFConfigError, match=r"model_type: required field is missing"):
        shape_from_hf_dict(d)


@pytest.mark.parametrize(
    "name,field",
    [
        ("mistral-7b", "hidden_size"),
        ("mistral-7b", "intermediate_size"),
        ("llama-3.2-1b", "vocab_size"),
        ("mixtral-8x7b", "num_experts_per_tok"),
        ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size"),
        ("qwen1.5-moe-a2.7b", "moe_intermediate_size"),
        ("deepseek-v3", "q_lora_rank"),
        ("deepseek-v3", "kv_lora_rank"),
        ("deepseek-v3", "first_k_dense_replace"),
        ("deepseek-v2-lite", "n_routed_experts"),
        ("gpt2", "n_embd"),
    ],
)
def test_missing_field_is_named(name, field):
    d = cfg(name)
    del d[field]
    with pytest.raises(HFConfigError, match=rf"^{field}: required field is missing") as info:
        shape_from_hf_dict(d)
    assert info.value.field == field


def test_wrong_type_is_named():
    with pytest.raises(HFConfigError, match=r"num_hidden_layers: expected a non-negative integer, got '32'"):
        shape_from_hf_dict({**cfg("mistral-7b"), "num_hidden_layers": "32"})
    with pytest.raises(HFConfigError, match=r"tie_word_embeddings: expected true/false, got 1"):
        shape_from_hf_dict({**cfg("mistral-7b"), "tie_word_embeddings": 1})


def test_inconsistent_shape_is_a_value_error():
    with pytest.raises(HFConfigError, match=r"num_attention_heads=32 is not a multiple of num_key_value_heads=5"):
        shape_from_hf_dict({**cfg("mistral-7b"), "num_key_value_heads": 5})
    with pytest.raises(HFConfigError, match=r"num_experts_per_tok=9 must be in 1..num_experts=8"):
        shape_from_hf_dict({**cfg("mixtral-8x7b"), "num_experts_per_tok": 9})


def test_lenient_by_default_strict_for_inline():
    d = {**cfg("mistral-7b"), "some_new_key": 1}
    assert shape_from_hf_dict(d).hidden_size == 4096
    with pytest.raises(HFConfigError, match=r"some_new_key: unknown field \(remove it"):
        shape_from_hf_dict(d, strict=True)
    with pytest.raises(HFConfigError, match=r"hiden_size: unknown field \(did you mean 'hidden_size'\?\)"):
        shape_from_hf_dict({**cfg("mistral-7b"), "hiden_size": 1}, strict=True)
    with pytest.raises(HFConfigError, match=r"num_local_experts: not a field of model_type 'mistral'"):
        shape_from_hf_dict({**cfg("mistral-7b"), "num_local_experts": 8}, strict=True)
    # Every key of the real-looking fixtures is known, so strict mode accepts them.
    for path in HF.glob("*.json"):
        shape_from_hf_dict(json.loads(path.read_text()), strict=True)


def test_load_hf_config_paths_and_names(tmp_path):
    (tmp_path / "Mistral-7B").mkdir()
    (tmp_path / "Mistral-7B" / "config.json").write_text((HF / "mistral-7b.json").read_text())
    assert load_hf_config(tmp_path / "Mistral-7B").name == "Mistral-7B"
    assert load_hf_config(tmp_path / "Mistral-7B" / "config.json").name == "Mistral-7B"
    assert load_hf_config(HF / "gpt2.json").name == "gpt2"
    (tmp_path / "bad.json").write_text("{\n  \"model_type\": \"llama\",\n}")
    with pytest.raises(HFConfigError, match=r"bad.json:3:1: invalid JSON"):
        load_hf_config(tmp_path / "bad.json")
    with pytest.raises(HFConfigError, match=r"cannot read HF config"):
        load_hf_config(tmp_path / "absent.json")


def test_family_layouts():
    q = shape_from_hf_dict(cfg("qwen2-7b"))
    assert q.attention_bias and not q.o_proj_bias
    g = shape_from_hf_dict(cfg("gpt2"))
    assert (g.learned_positions, g.norm_type, g.mlp_gated, g.tie_word_embeddings, g.intermediate_size) == (True, "layernorm", False, True, 3072)
    v3 = shape_from_hf_dict(cfg("deepseek-v3"))
    assert v3.is_mla and v3.router_score_correction_bias and v3.num_nextn_predict_layers == 1
    assert v3.q_head_dim == 192
    lite = shape_from_hf_dict(cfg("deepseek-v2-lite"))
    assert lite.q_lora_rank is None and not lite.router_score_correction_bias
    q3 = shape_from_hf_dict(cfg("qwen3-30b-a3b"))
    assert q3.qk_norm and q3.head_size == 128 and q3.hidden_size // q3.num_attention_heads == 64


def test_shape_mla_fields_must_be_complete():
    with pytest.raises(ValueError, match=r"MLA needs all of kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim; missing v_head_dim"):
        ModelShape(model_type="deepseek_v3", hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                   intermediate_size=8, vocab_size=8, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


_FIXTURE_KEYS = sorted({k for p in HF.glob("*.json") for k in json.loads(p.read_text())})


@settings(max_examples=200, deadline=None)
@given(
    base=st.sampled_from(sorted(p.stem for p in HF.glob("*.json"))),
    key=st.sampled_from(_FIXTURE_KEYS) | st.text(max_size=12),
    value=_json,
    strict=st.booleans(),
)
def test_reader_never_crashes(base, key, value, strict):
    # Any perturbed config either reads or fails with HFConfigError (a ValueError naming the field).
    d = cfg(base)
    d[key] = value
    try:
        shape_from_hf_dict(d, strict=strict)
    except HFConfigError:
        pass


def test_load_model_preset_or_path(tmp_path):
    from dstoolkit.models import get_preset, load_model

    assert load_model("tiny") is get_preset("tiny")
    assert load_model(HF / "gpt2.json").model_type == "gpt2"
    assert load_model(str(HF / "gpt2.json")).learned_positions
    with pytest.raises(ValueError, match=r"unknown model preset 'llama3-8b' \(did you mean 'llama-3-8b'\?.*; or give a path to an HF config.json\)"):
        load_model("llama3-8b")
    with pytest.raises(ValueError, match="cannot read HF config"):
        load_model(tmp_path / "nothing.json")
