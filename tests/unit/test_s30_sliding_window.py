"""A window the config applies to every attention layer without `layer_types` (Mistral-7B-v0.1 sliding_window 4096,
StarCoder2, Phi-3; Qwen2/Qwen3 use_sliding_window) is carried on the shape (ModelShape.sliding_window), counted in
the attention FLOPs and the fused-kernel time, and written to Megatron-LM (--window-size W-1,0) or refused by
Megatron-DeepSpeed (no window flag).

Before: the hand-written readers dropped sliding_window and the transformers path read windows only from
layer_types, so Mistral-7B-v0.1 at seq 8192 was estimated at 55.55 GFLOPs per token (full attention; 49.10 with the
window) and its Megatron files trained full attention without a word.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from dstoolkit.estimate.flops import ATTENTION_TRAIN_COEFF, flops_per_token
from dstoolkit.models.hf import HFConfigError, shape_from_hf_dict

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "hf_configs"
MISTRAL = json.loads((GOLDEN / "mistral-7b.json").read_text())


def _qwen(model_type: str, **kw) -> dict:
    d = {"model_type": model_type, "hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000}
    if model_type.endswith("moe"):
        d.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
        if model_type == "qwen2_moe":
            d["shared_expert_intermediate_size"] = 256
    if model_type.startswith("qwen3"):
        d["head_dim"] = 64
    return {**d, **kw}


# ---- 1. the readers ----------------------------------------------------------------------------------------

def test_mistral_reader_keeps_the_window_and_transformers_default():
    assert shape_from_hf_dict(MISTRAL).sliding_window == 4096
    no_key = {k: v for k, v in MISTRAL.items() if k != "sliding_window"}
    assert shape_from_hf_dict(no_key).sliding_window == 4096  # MistralConfig.sliding_window defaults to 4096
    assert shape_from_hf_dict({**MISTRAL, "sliding_window": None}).sliding_window is None
    mixtral = json.loads((GOLDEN / "mixtral-8x7b.json").read_text())
    assert shape_from_hf_dict(mixtral).sliding_window is None
    mixtral_no_key = {k: v for k, v in mixtral.items() if k != "sliding_window"}
    assert shape_from_hf_dict(mixtral_no_key).sliding_window is None  # MixtralConfig: None
    assert shape_from_hf_dict({**mixtral, "sliding_window": 2048}).sliding_window == 2048
    with pytest.raises(HFConfigError, match="sliding_window: a window of 0 keys"):
        shape_from_hf_dict({**MISTRAL, "sliding_window": 0})


@pytest.mark.parametrize("model_type,full", [
    ("qwen2", (0, 1, 2, 3)),  # Qwen2Config: sliding on i >= max_window_layers
    ("qwen3", (0, 1, 2, 3)),
    ("qwen2_moe", (1, 3, 4, 5)),  # Qwen2MoeConfig: sliding on even i < max_window_layers
    ("qwen3_moe", ()),  # Qwen3MoeConfig / modeling_qwen3_moe: every layer
])
def test_qwen_readers_follow_use_sliding_window(model_type, full):
    off = shape_from_hf_dict(_qwen(model_type, sliding_window=512, max_window_layers=4))
    assert off.sliding_window is None  # use_sliding_window defaults to False
    on = shape_from_hf_dict(_qwen(model_type, use_sliding_window=True, sliding_window=512, max_window_layers=4))
    assert on.sliding_window == 512 and on.full_attention_layers == full
    assert [on.attention_window(i) for i in range(6)] == [None if i in full else 512 for i in range(6)]
    default = shape_from_hf_dict(_qwen(model_type, use_sliding_window=True))  # window 4096, max_window_layers 28
    assert default.sliding_window == (4096 if model_type in ("qwen2_moe", "qwen3_moe") else None)


# ---- 2. the estimate ----------------------------------------------------------------------------------------

def test_flops_count_min_seq_window_keys_and_nothing_changes_at_or_below_the_window():
    shape = shape_from_hf_dict(MISTRAL)
    full = shape.model_copy(update={"sliding_window": None})
    L, H, Q = 32, 32, 128
    # Mistral-7B-v0.1 at seq 8192: 12·L·H·Q·min(T, 4096), PaLM App. B with the window's keys
    assert flops_per_token(shape, 8192).attention == ATTENTION_TRAIN_COEFF * L * H * Q * 4096
    assert flops_per_token(full, 8192).attention == ATTENTION_TRAIN_COEFF * L * H * Q * 8192
    assert "32 sliding-window layers at min(T, 4096) keys" in flops_per_token(shape, 8192).detail
    for seq in (2048, 4096):  # the window bounds nothing: the very same figures and words
        assert flops_per_token(shape, seq) == flops_per_token(full, seq)


def test_llama_without_a_window_is_unchanged():
    llama = shape_from_hf_dict(json.loads((GOLDEN / "llama-3.2-1b.json").read_text()))
    assert getattr(llama, "sliding_window", None) is None  # (passes before the change too: a pin)
    f = flops_per_token(llama, 8192)
    H, Q = llama.num_attention_heads, llama.head_size
    assert f.attention == float(ATTENTION_TRAIN_COEFF * H * Q * 8192) * llama.num_hidden_layers
    assert f.detail.endswith("12·L·H·Q·T over all 16 layers (PaLM App. B)")


def _plan(shape, impl, seq):
    from dstoolkit.hardware import get_gpu
    from dstoolkit.runplan import RunPlan

    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=shape, ds_config=ds, world_size=8, gpus_per_node=8, gpu=get_gpu("H100-SXM"), seq_len=seq,
                   attention_impl=impl)


@pytest.mark.parametrize("impl", ["flash", "te", "sdpa", "eager"])
def test_fused_kernels_that_honour_the_window_run_its_band_only(impl):
    from dstoolkit.estimate.cluster_model import layer_compute_s

    shape = shape_from_hf_dict(MISTRAL)
    full = shape.model_copy(update={"sliding_window": None})

    def secs(s, seq):
        return layer_compute_s(_plan(s, impl, seq), 0, 1024.0, 0.0, 3e12)

    assert secs(shape, 4096) == secs(full, 4096)  # seq <= window: byte-identical
    if impl in ("flash", "te"):
        assert secs(shape, 16384) < secs(full, 16384)
        # the band T·W - W²/2 of T²: 4096·(1 - 4096/32768) = 3584 keys per query against the triangle's 8192
        from dstoolkit.estimate.attention_core import windowed_core_keys

        assert windowed_core_keys(_plan(shape, impl, 16384), 0) == 4096 * (1 - 4096 / 32768)
    else:  # eager / SDPA with transformers' sliding-window mask compute every score of the square
        assert secs(shape, 16384) == secs(full, 16384)


# ---- 3. the transformers path ------------------------------------------------------------------------------

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 256}


@pytest.mark.parametrize("model_type,window", [("starcoder2", 4096), ("phi3", 2047), ("mistral", 4096)])
def test_transformers_families_that_window_every_layer(model_type, window):
    pytest.importorskip("transformers")
    cfg = {"model_type": model_type, **TINY, "sliding_window": window, "pad_token_id": None}
    shape = shape_from_hf_dict(cfg, source="transformers")
    assert shape.sliding_window == window
    assert {l.attention_kind for l in shape.measured.layers} == {"sliding_attention"}
    f = flops_per_token(shape, 8192)
    H, Q = 4, 16
    assert f.attention == ATTENTION_TRAIN_COEFF * 2 * H * Q * min(8192, window)
    assert "(per layer from the config's sliding_window)" in f.detail


def test_transformers_without_a_window_or_with_layer_types_keep_theirs():
    pytest.importorskip("transformers")
    llama = shape_from_hf_dict({"model_type": "llama", **TINY}, source="transformers")
    assert llama.sliding_window is None and llama.attention_window(0) is None
    mistral = shape_from_hf_dict({"model_type": "mistral", **TINY, "sliding_window": None}, source="transformers")
    assert mistral.sliding_window is None
    # Qwen2 builds layer_types itself (max_window_layers): the per-layer windows, no uniform one
    qwen = shape_from_hf_dict({"model_type": "qwen2", **TINY, "use_sliding_window": True, "sliding_window": 512,
                               "max_window_layers": 1}, source="transformers")
    assert qwen.sliding_window is None
    assert [qwen.attention_window(i) for i in range(2)] == [None, 512]
    # Qwen3-MoE without use_sliding_window: its config sets sliding_window None
    moe = shape_from_hf_dict({"model_type": "qwen3_moe", **TINY, "head_dim": 16, "num_experts": 4,
                              "num_experts_per_tok": 2, "moe_intermediate_size": 32, "sliding_window": 512},
                             source="transformers")
    assert moe.sliding_window is None


# ---- 4. Megatron ---------------------------------------------------------------------------------------------

def _spec(tmp_path, seq, cfg=MISTRAL, tp=1, extra=""):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "s.yaml").write_text(textwrap.dedent(f"""\
        name: sw
        model: {{hf_config: config.json}}
        cluster: {{nodes: 1, gpus_per_node: 8, gpu: H100-SXM}}
        training: {{seq_len: {seq}, global_batch: 64, micro_batch: 1, tp: {tp}, pp: 1, zero_stage: 1{extra}}}
        """))
    from dstoolkit.generate.io import load_spec_and_shape

    return load_spec_and_shape(tmp_path / "s.yaml")


def _words(fn, *a, **kw):
    return " ".join(fn(*a, **kw))


def test_megatron_targets_write_or_refuse_the_window(tmp_path):
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.megatron_common import UnsupportedTarget
    from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args
    from dstoolkit.generate.megatron_lm import megatron_lm_args

    cand = Candidate(zero_stage=1, tp=1, pp=1, micro_batch=1)
    spec, shape = _spec(tmp_path, 8192)
    lm = megatron_lm_args(spec, shape, cand)
    i = lm.index("--window-size")
    assert lm[i + 1] == "4095,0"  # transformers' window W: keys q-W+1..q = Megatron's (left W-1, right 0)
    with pytest.raises(UnsupportedTarget, match=r"megatron-deepspeed: cannot express a sliding attention window of "
                       r"4096 tokens on 32 of 32 layers, below seq_len 8192 \(megatron/arguments.py has no window"):
        megatron_deepspeed_args(spec, shape, cand, ds_config_path="ds_config.json")
    with pytest.raises(UnsupportedTarget, match="with context parallelism"):
        megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=1, pp=1, micro_batch=1, cp=2))
    # at seq_len <= window the layers are full attention: nothing written, nothing refused
    spec, shape = _spec(tmp_path, 4096)
    assert "--window-size" not in megatron_lm_args(spec, shape, cand)
    assert "--window-size" not in _words(megatron_deepspeed_args, spec, shape, cand, ds_config_path="ds_config.json")
    # a window on some layers only (Qwen2 max_window_layers) is not written
    qwen = _qwen("qwen2", use_sliding_window=True, sliding_window=512, max_window_layers=4)
    spec, shape = _spec(tmp_path, 2048, cfg=qwen)
    with pytest.raises(UnsupportedTarget, match="megatron-lm: a sliding attention window of 512 tokens on 2 of 6"):
        megatron_lm_args(spec, shape, cand)


def test_megatron_lm_window_builds_a_megatron_core_config(tmp_path):
    pytest.importorskip("megatron.core")
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.megatron_lm import megatron_lm_args
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.utils import is_layer_window_attention

    spec, shape = _spec(tmp_path, 8192)
    lm = megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=1, pp=1, micro_batch=1))
    raw = lm[lm.index("--window-size") + 1]
    window = tuple(int(x) for x in raw.strip("()").split(","))  # Megatron-LM's tuple_type
    cfg = TransformerConfig(num_layers=32, hidden_size=4096, num_attention_heads=32, window_size=window)
    assert cfg.window_size == (4095, 0)
    assert all(is_layer_window_attention(cfg.window_size, None, n) for n in range(1, 33))
