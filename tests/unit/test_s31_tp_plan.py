"""A model's Hugging Face tp_plan and DeepSpeed 0.19.8 AutoTP: a style TPPlanConverter does not convert makes
deepspeed.initialize raise (measured: tiny Phi-3 / OLMo-2 at autotp_size 2 on 2 gloo ranks), so estimate refuses
the run and the hf / accelerate targets drop the AutoTP layout, naming the styles and the way out."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.hf_targets import hf_unavailable_reason
from dstoolkit.models import get_preset
from dstoolkit.models.hf import shape_from_hf_dict
from dstoolkit.models.tp_plan import declared_tp_plan, merged_tp_plan, tp_plan_of
from dstoolkit.runplan.autotp import HF_TP_PLAN_STYLES, tp_plan_refusal

PHI3 = {"model_type": "phi3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64,
        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 64}


class _Cfg:
    base_model_tp_plan = {"layers.*.mlp.down_proj": "rowwise", "embed_tokens": "embedding_rowwise"}


class _Model:
    _tp_plan = {"lm_head": "colwise_gather_output", "layers.*.mlp.down_proj": "rowwise_split_input"}

    def __init__(self):
        self.config = _Cfg()
        self._tp_plan = {"model.embed_tokens": "colwise", "model.norm": "replicated_with_grad_allreduce"}


def test_merged_plan_reads_config_then_class_then_instance_and_a_prefixed_pattern_yields():
    # the class overrides the config's down_proj; the instance's model.embed_tokens yields to embed_tokens, seen
    # before without the prefix; model.norm is new
    assert merged_tp_plan(_Model()) == (("layers.*.mlp.down_proj", "rowwise_split_input"),
                                        ("embed_tokens", "embedding_rowwise"), ("lm_head", "colwise_gather_output"),
                                        ("model.norm", "replicated_with_grad_allreduce"))


def test_declared_plan_of_a_model_type():
    assert ("layers.*.mlp.down_proj", "rowwise_split_input") in declared_tp_plan("phi3")
    assert ("layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj") in declared_tp_plan("deepseek_v3")
    assert all(style in HF_TP_PLAN_STYLES for _, style in declared_tp_plan("llama"))
    assert declared_tp_plan("no_such_model_type") == ()


def test_plan_of_a_built_model_a_preset_and_a_user_module():
    assert ("lm_head", "colwise_gather_output") in tp_plan_of(shape_from_hf_dict(PHI3))
    assert ("layers.*.self_attn.o_proj", "rowwise_split_input") in tp_plan_of(shape_from_hf_dict(PHI3))
    assert ("layers.*.self_attn.kv_a_proj_with_mqa", "mla_kv_a_proj") in tp_plan_of(get_preset("deepseek-v3"))
    assert tp_plan_of(get_preset("deepseek-v3").model_copy(update={"source": "user"})) == ()


def test_refusal_names_the_setting_the_styles_the_patterns_and_the_fix():
    plan = (("layers.*.self_attn.o_proj", "rowwise_split_input"), ("layers.*.mlp.down_proj", "rowwise_split_input"),
            ("lm_head", "colwise_gather_output"))
    msg = tp_plan_refusal(plan, 2, "cfg.json: tensor_parallel.autotp_size")
    assert msg.startswith("cfg.json: tensor_parallel.autotp_size=2: DeepSpeed 0.19.8 AutoTP rejects")
    assert "partition style rowwise_split_input it does not convert" in msg
    assert "layers.*.self_attn.o_proj: rowwise_split_input, layers.*.mlp.down_proj: rowwise_split_input;" in msg
    assert "tensor_parallel.partition_config" in msg and "without AutoTP" in msg
    assert tp_plan_refusal(plan, 1, "x") is None  # no AutoTP, nothing converted
    assert tp_plan_refusal(plan[2:], 2, "x") is None  # every style converted


def test_hf_target_drops_autotp_of_a_model_deepspeed_cannot_shard():
    phi3, llama = shape_from_hf_dict(PHI3), shape_from_hf_dict(LLAMA)
    reason = hf_unavailable_reason(Candidate(zero_stage=1, tp=2, micro_batch=1), phi3)
    assert reason and "rowwise_split_input" in reason and reason.startswith("tp (tensor_parallel.autotp_size)=2")
    assert hf_unavailable_reason(Candidate(zero_stage=1, tp=1, micro_batch=1), phi3) is None
    assert hf_unavailable_reason(Candidate(zero_stage=1, tp=2, micro_batch=1), llama) is None


@pytest.mark.parametrize("section, refused", [
    ({"autotp_size": 2}, True),
    ({"autotp_size": 2, "partition_config": {"layer_specs": [
        {"patterns": [r".*self_attn\.o_proj\.weight$", r".*mlp\.down_proj\.weight$"], "partition_type": "row"}]}},
     False),
])
def test_estimate_refuses_autotp_by_a_plan_deepspeed_rejects(tmp_path, section, refused):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                               "tensor_parallel": section}))
    model = tmp_path / "config.json"
    model.write_text(json.dumps(PHI3))
    out = subprocess.run([sys.executable, "-m", "dstoolkit", "estimate", "--config", str(cfg), "--model", str(model),
                          "--world-size", "2", "--gpus-per-node", "2", "--seq-len", "64"],
                         capture_output=True, text=True, timeout=300)
    if refused:
        assert out.returncode == 2
        assert "tensor_parallel.autotp_size=2: DeepSpeed 0.19.8 AutoTP rejects this model's" in out.stderr
        assert "Traceback" not in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert "step time" in out.stdout


def test_gpt2_without_a_plan_is_refused_by_the_heuristic_path_and_opt_is_not():
    # measured on 2 gloo ranks at autotp_size 2: GPT-2 raises 'AutoTP not supported for model' at initialize, OPT
    # (no tp_plan either) initializes with its attention and MLP split
    gpt2 = shape_from_hf_dict({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128,
                               "n_positions": 64})
    opt = shape_from_hf_dict({"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 4, "ffn_dim": 128, "vocab_size": 128,
                              "max_position_embeddings": 64, "word_embed_proj_dim": 64})
    assert tp_plan_of(gpt2) == () and tp_plan_of(opt) == ()
    msg = tp_plan_refusal(tp_plan_of(gpt2), 2, "x", gpt2.model_type)
    assert msg.startswith("x=2: DeepSpeed 0.19.8 AutoTP does not shard model_type gpt2")
    assert tp_plan_refusal(tp_plan_of(opt), 2, "x", opt.model_type) is None
    assert hf_unavailable_reason(Candidate(zero_stage=1, tp=2, micro_batch=1), gpt2).startswith("tp (tensor_parallel")


def test_estimate_takes_a_transformers_model_without_a_plan_down_the_heuristic_path(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
                               "tensor_parallel": {"autotp_size": 2}}))
    model = tmp_path / "config.json"
    model.write_text(json.dumps({"model_type": "opt", "hidden_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "ffn_dim": 128, "vocab_size": 128,
                                 "max_position_embeddings": 64, "word_embed_proj_dim": 64}))
    out = subprocess.run([sys.executable, "-m", "dstoolkit", "estimate", "--config", str(cfg), "--model", str(model),
                          "--world-size", "2", "--gpus-per-node", "2", "--seq-len", "64"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # before: taken as a tp_plan model (head split, logits all-gathered); DeepSpeed's heuristic keeps both whole
    assert "tied embedding / LM head (0.000B params) whole on every TP rank" in out.stdout
    assert "transformers declares none for opt" in out.stdout


def test_alibi_models_are_refused_under_autotp():
    # measured on 2 gloo ranks at autotp_size 2: BLOOM and MPT fail at the first forward (the ALiBi tensor has every
    # head, the sharded attention heads / tp); Falcon (rotary) gives the unsharded loss
    bloom = shape_from_hf_dict({"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4,
                                "vocab_size": 128})
    falcon = shape_from_hf_dict({"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "vocab_size": 128})
    assert bloom.position_encoding == "alibi" and falcon.position_encoding != "alibi"
    reason = hf_unavailable_reason(Candidate(zero_stage=1, tp=2, micro_batch=1), bloom)
    assert reason.startswith("tp (tensor_parallel.autotp_size)=2: DeepSpeed 0.19.8 AutoTP cannot train this model: its "
                             "ALiBi bias is built for every attention head")
    assert hf_unavailable_reason(Candidate(zero_stage=1, tp=1, micro_batch=1), bloom) is None
    assert hf_unavailable_reason(Candidate(zero_stage=1, tp=2, micro_batch=1), falcon) is None
    assert tp_plan_refusal((), 2, "x", "bloom", alibi=True).startswith("x=2: DeepSpeed 0.19.8 AutoTP cannot train")


def test_a_preset_spec_with_autotp_is_validated_without_torch(tmp_path):
    # the preset's declared plan is read from transformers' source, not by importing it (which imports torch)
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: p\nmodel: {preset: llama-3-8b}\ncluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
                    "training: {seq_len: 4096, global_batch: 64, micro_batch: 1, precision: bf16, zero_stage: 1, "
                    "tp: 2}\ntargets: [hf]\n")
    code = ("import sys; from dstoolkit.cli import main; rc = main(['validate', %r]); "
            "print('HEAVY', [m for m in ('torch', 'transformers') if m in sys.modules], rc)" % str(spec))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY [] 0" in out.stdout, out.stdout + out.stderr
