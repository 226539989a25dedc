"""--kv-channels in the Megatron-LM argument file (dstoolkit.generate.megatron_common.kv_channels).

Megatron-LM's validate_args runs `assert hidden_size % num_attention_heads == 0` whenever --kv-channels is not given
(megatron/training/arguments.py:1331-1333 at d98e8a64). The file used to leave the flag out for multi-latent
attention, so GLM-4.7-Flash (hidden 2048, 20 heads) got files every rank refused at start-up with a bare
AssertionError. Now every file carries it: MLA gets qk_nope_head_dim (Megatron's --qk-head-dim, what Megatron-LM's
DeepSeek / Kimi recipes and THUDM slime's GLM-4.7-Flash recipe pass), standard attention its per-head width.
Checked against the real parser (parse_args + validate_args + core_transformer_config_from_args, Megatron-LM
d98e8a64): every GLM-4.7-Flash, GLM-5 and DeepSeek-V3.2 strategy accepted.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron_lm import megatron_lm_args

ROOT = Path(__file__).resolve().parents[2]
GLM47_FLASH = ROOT / "tests" / "golden" / "hf_configs" / "released" / "zai-org--GLM-4.7-Flash.json"


def _flag(words: list[str], flag: str) -> list[str]:
    """The values of every occurrence of `flag` (one list per occurrence)."""
    return [[words[i + 1]] for i, w in enumerate(words) if w == flag]


def _args(tmp_path: Path, model_yaml: str, training: str = "tp: 1, pp: 1, ep: 1, zero_stage: 1, micro_batch: 1"):
    (tmp_path / "s.yaml").write_text(textwrap.dedent(f"""\
        name: kvc
        model: {model_yaml}
        cluster: {{nodes: 1, gpus_per_node: 8, gpu: H100-SXM}}
        training: {{seq_len: 1024, global_batch: 64, {training}}}
        """))
    spec, shape = load_spec_and_shape(tmp_path / "s.yaml")
    t = spec.training
    cand = Candidate(zero_stage=t.zero_stage, tp=t.tp, pp=t.pp, ep=t.ep, micro_batch=t.micro_batch)
    return shape, megatron_lm_args(spec, shape, cand)


def test_glm47_flash_mla_gets_kv_channels_qk_head_dim(tmp_path):
    """GLM-4.7-Flash: 2048 % 20 = 8, so without the flag Megatron-LM asserts; the file now says --kv-channels 192
    (its qk_nope_head_dim, equal to the file's --qk-head-dim)."""
    shape, words = _args(tmp_path, f"{{hf_config: {GLM47_FLASH}}}")
    assert shape.is_mla and shape.hidden_size % shape.num_attention_heads == 8
    assert _flag(words, "--kv-channels") == [["192"]]
    assert _flag(words, "--qk-head-dim") == [["192"]] and _flag(words, "--v-head-dim") == [["256"]]
    assert "--multi-latent-attention" in words


def test_mla_with_divisible_heads_gets_qk_head_dim_too(tmp_path):
    """One rule for every MLA model, divisible or not: an inline DeepSeek-V3-style MLA with 8 heads of hidden 256
    (256 / 8 = 32) still gets qk_nope_head_dim 48, not hidden / heads."""
    shape, words = _args(tmp_path, """{model_type: deepseek_v3, hidden_size: 256, num_hidden_layers: 2,
        num_attention_heads: 8, num_key_value_heads: 8, intermediate_size: 512, moe_intermediate_size: 128,
        n_routed_experts: 4, num_experts_per_tok: 2, n_shared_experts: 1, first_k_dense_replace: 1,
        kv_lora_rank: 64, q_lora_rank: 96, qk_nope_head_dim: 48, qk_rope_head_dim: 16, v_head_dim: 40,
        vocab_size: 1024, max_position_embeddings: 2048}""")
    from dstoolkit.generate.megatron_common import kv_channels

    assert shape.is_mla and kv_channels(shape) == 48
    assert _flag(words, "--kv-channels") == [["48"]]


def test_mla_with_indivisible_heads_inline(tmp_path):
    """Kimi-K3's case (7168 / 96 heads) in small: hidden 256 over 6 heads (remainder 4) -> --kv-channels 32."""
    shape, words = _args(tmp_path, """{model_type: deepseek_v3, hidden_size: 256, num_hidden_layers: 2,
        num_attention_heads: 6, num_key_value_heads: 6, intermediate_size: 512, moe_intermediate_size: 128,
        n_routed_experts: 4, num_experts_per_tok: 2, n_shared_experts: 1, first_k_dense_replace: 1,
        kv_lora_rank: 64, q_lora_rank: 96, qk_nope_head_dim: 32, qk_rope_head_dim: 16, v_head_dim: 24,
        vocab_size: 1024, max_position_embeddings: 2048}""", training="tp: 2, pp: 1, ep: 1, zero_stage: 1, micro_batch: 1")
    assert shape.hidden_size % shape.num_attention_heads == 4
    assert _flag(words, "--kv-channels") == [["32"]]


def test_explicit_head_dim_standard_attention_keeps_its_width(tmp_path):
    """Qwen3/Gemma-style explicit head_dim on standard attention (hidden 1000 over 16 heads of 128): --kv-channels
    is the config's head_dim, as before (the other family where hidden % heads != 0)."""
    shape, words = _args(tmp_path, """{model_type: qwen3, hidden_size: 1000, num_hidden_layers: 2,
        num_attention_heads: 16, num_key_value_heads: 4, head_dim: 128, intermediate_size: 2048,
        vocab_size: 1024, max_position_embeddings: 2048}""")
    assert not shape.is_mla and shape.hidden_size % shape.num_attention_heads == 8
    from dstoolkit.generate.megatron_common import kv_channels

    assert kv_channels(shape) == 128
    assert _flag(words, "--kv-channels") == [["128"]]
