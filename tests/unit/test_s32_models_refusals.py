"""Session 32, findings 7 and 12: configs the estimator cannot estimate honestly are refused in one line.

7. Encoder-decoder models (T5, BART, ...). Before: `--model-class T5ForConditionalGeneration` was estimated as one
   decoder-only stack (num_decoder_layers 24 -> 2 halved the parameters, activations unchanged, "24 softmax-attention
   layers of 24", no cross-attention, no assumption line), and a BART config without a class silently became
   BartForCausalLM's decoder alone. Now refused naming the model type; a family's causal-LM class (BartForCausalLM)
   is offered and, when named, builds the decoder alone as the user asked.
12. A config transformers refuses to make: `head_dim: 63` with RoPE (transformers 5 raises 'RoPE requires an even
   rotary dimension') was estimated normally by the hand-written llama reader (1.233B params). Now refused by the
   light reader itself (no torch, no transformers), and the transformers path's refusal is one line naming the key.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dstoolkit.models.hf import HFConfigError, shape_from_hf_dict
from tests.unit.estimate_cli_runs import estimate_error

HF = Path(__file__).resolve().parents[1] / "golden" / "hf_configs"
LLAMA = json.loads((HF / "llama-3.2-1b.json").read_text())
DS = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2}}
T5 = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 1024, "d_ff": 2816, "d_kv": 64,
      "num_heads": 16, "num_layers": 24, "num_decoder_layers": 2, "vocab_size": 32128,
      "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
BART = {"model_type": "bart", "d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 100,
        "max_position_embeddings": 128}
ENC_DEC = ("is an encoder-decoder model: not estimated (the estimator models one decoder-only stack; the encoder, "
           "source / target lengths and cross-attention would be left out)")
DECODER_ONLY = "estimate a decoder-only model: any causal LM transformers builds, multimodal ones by their text_config"


def _files(tmp_path, model: dict) -> tuple[Path, Path]:
    cfg, m = tmp_path / "ds.json", tmp_path / "model.json"
    cfg.write_text(json.dumps(DS))
    m.write_text(json.dumps(model))
    return cfg, m


def _error(capsys, tmp_path, model: dict, *extra) -> str:
    cfg, m = _files(tmp_path, model)
    return estimate_error(capsys, "--config", cfg, "--model", m, "--world-size", 8, "--seq-len", 512, *extra)


# --- 7: encoder-decoder ------------------------------------------------------------------------------------------

def test_t5_with_its_conditional_generation_class_is_refused(capsys, tmp_path):
    pytest.importorskip("transformers")
    assert _error(capsys, tmp_path, T5, "--model-class", "T5ForConditionalGeneration") == (
        f"model_type: 't5' (T5ForConditionalGeneration) {ENC_DEC} ({DECODER_ONLY})")


def test_t5_without_a_class_is_refused_as_encoder_decoder_not_offered_the_class(capsys, tmp_path):
    pytest.importorskip("transformers")
    # before: "cannot build ... build it with --model-class T5ForConditionalGeneration", which then estimated wrong
    assert _error(capsys, tmp_path, T5) == f"model_type: 't5' (T5Config) {ENC_DEC} ({DECODER_ONLY})"


def test_bart_is_refused_and_offered_its_causal_lm_class(capsys, tmp_path):
    pytest.importorskip("transformers")
    # before: AutoModelForCausalLM built BartForCausalLM (the decoder alone) without a word
    assert _error(capsys, tmp_path, BART) == (
        f"model_type: 'bart' (BartConfig) {ENC_DEC} ({DECODER_ONLY}; for this model's decoder alone as a causal LM, "
        "--model-class BartForCausalLM)")
    assert _error(capsys, tmp_path, BART, "--model-class", "BartForConditionalGeneration").startswith(
        f"model_type: 'bart' (BartForConditionalGeneration) {ENC_DEC}")


def test_bart_decoder_alone_builds_when_named():
    pytest.importorskip("transformers")
    shape = shape_from_hf_dict(BART, model_class="BartForCausalLM")
    assert shape.model_class == "BartForCausalLM" and shape.num_hidden_layers == 1


def test_user_module_building_an_encoder_decoder_is_refused(monkeypatch):
    pytest.importorskip("transformers")
    import types

    import transformers as tf

    from dstoolkit.models.user_module import load_user_model
    from dstoolkit.models.user_module_build import UserModelError

    mod = types.ModuleType("s32_encdec_fixture")
    mod.build = lambda: tf.T5ForConditionalGeneration(tf.T5Config(d_model=32, d_ff=64, d_kv=8, num_heads=4,
                                                                   num_layers=1, vocab_size=64))
    monkeypatch.setitem(sys.modules, "s32_encdec_fixture", mod)
    with pytest.raises(UserModelError) as info:
        load_user_model("s32_encdec_fixture:build")
    assert info.value.problem == (
        "it builds T5ForConditionalGeneration, an encoder-decoder model: not estimated (the estimator models one "
        "decoder-only stack; the encoder, source / target lengths and cross-attention would be left out)")


# --- 12: configs transformers refuses --------------------------------------------------------------------------

def test_odd_head_dim_refused_by_the_hand_written_reader(capsys, tmp_path):
    assert _error(capsys, tmp_path, {**LLAMA, "head_dim": 63}) == (
        "head_dim: 63 is odd and fully rotated: RoPE needs an even rotary dimension (transformers refuses the "
        "config: 'RoPE requires an even rotary dimension') (give head_dim an even value)")


def test_odd_head_dim_from_hidden_size_over_heads_is_refused():
    cfg = {**LLAMA, "model_type": "qwen2", "hidden_size": 2016, "num_attention_heads": 32}
    cfg.pop("head_dim", None)
    with pytest.raises(HFConfigError) as info:
        shape_from_hf_dict(cfg, source="analytic")
    assert (info.value.field, info.value.problem) == (
        "head_dim", "hidden_size / num_attention_heads = 2016 / 32 = 63 is odd and fully rotated: RoPE needs an even "
        "rotary dimension (transformers refuses the config: 'RoPE requires an even rotary dimension')")


def test_odd_qk_rope_head_dim_of_mla_is_refused():
    cfg = {**json.loads((HF / "deepseek-v2-lite.json").read_text()), "qk_rope_head_dim": 63}
    with pytest.raises(HFConfigError) as info:
        shape_from_hf_dict(cfg, source="analytic")
    assert info.value.field == "qk_rope_head_dim" and info.value.problem.startswith("63 is odd and fully rotated")


@pytest.mark.parametrize("extra", [{"head_dim": 64}, {"head_dim": 3}, {"head_dim": 63, "partial_rotary_factor": 0.5},
                                   {"head_dim": 63, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                                        "partial_rotary_factor": 0.5}}])
def test_what_transformers_accepts_is_still_read(extra):
    # transformers 5 lets head_dim <= 4 through, and a partial rotary dim that does not cover the whole head
    shape = shape_from_hf_dict({**LLAMA, **extra}, source="analytic")
    assert shape.head_size == extra["head_dim"]


def test_gpt2_learned_positions_have_no_rotary_rule():
    shape = shape_from_hf_dict({"model_type": "gpt2", "vocab_size": 100, "n_embd": 63 * 2, "n_head": 2,
                                "n_layer": 1, "n_positions": 64}, source="analytic")
    assert shape.head_size == 63


def test_the_light_reader_refuses_without_torch_or_transformers(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**LLAMA, "head_dim": 63}))
    code = ("import sys\nfrom dstoolkit.models.resolve import load_model\n"
            f"try:\n    load_model({str(path)!r})\nexcept ValueError as e:\n    print(e)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "head_dim: 63 is odd and fully rotated: RoPE needs an even rotary dimension (transformers refuses the "
        "config: 'RoPE requires an even rotary dimension') (give head_dim an even value)", "[]"]


def test_transformers_refusal_is_one_line_naming_the_key(capsys, tmp_path):
    tf = pytest.importorskip("transformers")
    msg = _error(capsys, tmp_path, {**LLAMA, "model_type": "olmo2", "head_dim": 63})
    assert msg == (f"head_dim: transformers {tf.__version__} refuses this 'olmo2' config: ValueError: RoPE requires "
                   "an even rotary dimension, but got `head_dim`=63 with `partial_rotary_factor`=1.0 for "
                   "`full_attention`. (fix head_dim)")
    # the same through --model-class (the class's own config class), not "reading the transformers build failed"
    assert _error(capsys, tmp_path, {**LLAMA, "head_dim": 63}, "--model-class", "LlamaForCausalLM") == (
        msg.replace("'olmo2'", "'llama'"))
