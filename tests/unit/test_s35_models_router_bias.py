"""Session 35 models finding 1: DeepSeek-V3's gate.e_score_correction_bias was counted as a parameter
(ParamCount.total, active, router) by the analytic path. transformers 5 registers it as a buffer
(DeepseekV3TopkRouter, nn.Buffer): no gradient, no optimizer state, no FLOPs; the state dict holds it. Now in
ParamCount.buffers, on both paths.
"""
from __future__ import annotations

import pytest

from dstoolkit.models import count_params, get_preset
from dstoolkit.models.hf import shape_from_hf_dict

TINY_DSV3 = dict(vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_shared_experts=1,
                 num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, q_lora_rank=32,
                 kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


# ------------------------------------------------------------------------------------------------------------------

def test_deepseek_v3_router_bias_is_a_buffer_not_a_parameter():
    n = count_params(get_preset("deepseek-v3"))
    # 58 MoE layers x 256 routed experts: 14,848 fp32 elements, no longer in total / active / router
    assert n.buffers == 58 * 256 == 14_848
    assert n.router == 58 * 256 * 7168
    assert (n.total, n.active) == (671_026_404_352, 37_552_282_624)  # before: 671_026_419_200, 37_552_297_472


def test_analytic_count_equals_transformers_parameters_and_buffers():
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = transformers.DeepseekV3Config(**TINY_DSV3)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    n = count_params(shape_from_hf_dict(cfg.to_dict()))
    assert n.total == sum(p.numel() for p in model.parameters())
    assert n.buffers == sum(b.numel() for name, b in model.named_buffers() if name.endswith("e_score_correction_bias"))
    assert n.buffers == 3 * 8
