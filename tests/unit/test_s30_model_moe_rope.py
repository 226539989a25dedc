"""MoE routing and RoPE scaling as Megatron runs them.

- norm_topk_prob false (Qwen2-MoE, DeepSeek-V2: softmax over all experts, top-k weights not renormalised) writes
  Megatron-LM's --moe-router-pre-softmax; Qwen2-MoE's shared_expert_gate writes --moe-shared-expert-gate.
  Megatron-DeepSpeed (DeepSpeed MoE renormalises the top-k) refuses naming norm_topk_prob.
- rope_scaling llama3 writes --use-rope-scaling --rope-scaling-factor; linear with a whole factor
  --rotary-seq-len-interpolation-factor; dynamic within the original length is plain RoPE; the rest is refused
  naming the type. Megatron-DeepSpeed has no scaling flags: refused.

Before: none of these flags were written, and the scaling was dropped silently."""
from __future__ import annotations

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.megatron_common import UnsupportedTarget
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.models.hf import shape_from_hf_dict
from dstoolkit.spec import spec_from_dict

SPEC = {"name": "t", "model": {"preset": "tiny"}, "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "training": {"global_batch": 64, "seq_len": 2048}}
CAND = Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1)
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 4096}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 688, "vocab_size": 1024, "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 128, "shared_expert_intermediate_size": 512}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 688, "vocab_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2}


def _lm(cfg, seq_len=2048):
    spec = spec_from_dict({**SPEC, "training": {**SPEC["training"], "seq_len": seq_len}})
    return megatron_lm_args(spec, shape_from_hf_dict(cfg), CAND)


def _mds(cfg):
    return megatron_deepspeed_args(spec_from_dict(SPEC), shape_from_hf_dict(cfg), CAND, ds_config_path="ds_config.json")


def test_qwen2_moe_routing_flags():
    lm = _lm(QWEN2_MOE)  # Qwen2MoeConfig.norm_topk_prob defaults to False
    assert "--moe-router-pre-softmax" in lm and "--moe-shared-expert-gate" in lm
    lm = _lm({**QWEN2_MOE, "norm_topk_prob": True})
    assert "--moe-router-pre-softmax" not in lm and "--moe-shared-expert-gate" in lm


def test_mixtral_renormalises_by_default():
    lm = _lm(MIXTRAL)
    assert "--moe-router-pre-softmax" not in lm and "--moe-shared-expert-gate" not in lm


def test_megatron_deepspeed_refuses_unnormalised_topk():
    with pytest.raises(UnsupportedTarget, match="norm_topk_prob false"):
        _mds(QWEN2_MOE)


def test_llama3_rope_scaling():
    cfg = {**LLAMA, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    lm = _lm(cfg)
    assert lm[lm.index("--use-rope-scaling") + 1:lm.index("--use-rope-scaling") + 3] == ["--rope-scaling-factor", "8.0"]
    with pytest.raises(UnsupportedTarget, match="rope_scaling llama3"):
        _mds(cfg)
    odd = {**cfg, "rope_scaling": {**cfg["rope_scaling"], "high_freq_factor": 2.0}}
    with pytest.raises(UnsupportedTarget, match="high_freq_factor"):
        _lm(odd)


def test_other_rope_scaling_types():
    lm = _lm({**LLAMA, "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert lm[lm.index("--rotary-seq-len-interpolation-factor") + 1] == "4"
    dyn = {**LLAMA, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    assert "--use-rope-scaling" not in _lm(dyn, seq_len=4096)  # within max_position_embeddings: plain RoPE
    with pytest.raises(UnsupportedTarget, match="rope_scaling dynamic"):
        _lm(dyn, seq_len=8192)
    yarn = {**LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}
    with pytest.raises(UnsupportedTarget, match="rope_scaling yarn"):
        _lm(yarn)
