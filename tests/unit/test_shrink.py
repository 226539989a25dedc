"""dstoolkit.runtime.shrink (shrink_sizes, shrink_run): exact shrunk fields, the architecture kept, clear errors naming the field."""
import json
import pathlib

import pytest

from dstoolkit.runtime.shrink import shrink_config
from dstoolkit.runtime.shrink_run import fit_batch, model_config_of
from dstoolkit.runtime.shrink_sizes import ShrinkError, ShrinkSizes, parse_shrink

RELEASED = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "released"


def _cfg(name: str) -> dict:
    return json.loads((RELEASED / f"{name}.json").read_text())


def test_gemma4_keeps_the_sliding_full_pattern_and_moe_routing():
    s = shrink_config(_cfg("google--gemma-4-26B-A4B"))
    c = s.config
    assert s.model_type == "gemma4_text"  # the language model of the multimodal config
    assert c["num_hidden_layers"] == 6  # 5 sliding + 1 full: the first layers holding both kinds
    assert c["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    assert (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]) == (64, 4, 2)
    assert (c["head_dim"], c["global_head_dim"], c["num_global_key_value_heads"]) == (16, 32, 1)  # ratios kept
    assert (c["num_experts"], c["top_k_experts"]) == (16, 8)  # top-k kept, 2 x top-k experts
    assert c["vocab_size"] == 512 and c["vocab_size_per_layer_input"] == 512
    assert c["sliding_window"] == 16
    assert s.changed["num_hidden_layers"] == (30, 6) and s.changed["num_experts"] == (128, 16)
    assert s.kept["top_k_experts"] == 8
    assert s.kept["layer_kinds"]["layer_types"] == ["'full_attention'", "'sliding_attention'"]
    assert any("text_config" in n for n in s.notes)


def test_qwen3_next_hybrid_linear_attention_and_shared_expert():
    s = shrink_config(_cfg("Qwen--Qwen3-Next-80B-A3B-Thinking"))
    c = s.config
    assert c["num_hidden_layers"] == 4  # full_attention_interval 4: three linear-attention layers, one full
    assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (4, 8)
    assert (c["linear_key_head_dim"], c["linear_value_head_dim"], c["head_dim"]) == (8, 8, 16)
    assert (c["num_experts"], c["num_experts_per_tok"]) == (20, 10)
    assert c["shared_expert_intermediate_size"] == 16 and c["moe_intermediate_size"] == 16
    assert c["full_attention_interval"] == 4  # the pattern itself is kept


def test_nemotron_h_pattern_and_mamba_widths():
    s = shrink_config(_cfg("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    c = s.config
    assert c["hybrid_override_pattern"] == "MEMEM*"  # Mamba, MoE and attention layers all present
    assert c["num_hidden_layers"] == 6
    assert (c["mamba_num_heads"], c["mamba_head_dim"], c["n_groups"], c["ssm_state_size"]) == (8, 8, 1, 16)
    assert (c["n_routed_experts"], c["num_experts_per_tok"], c["n_shared_experts"]) == (12, 6, 1)


def test_deepseek_mla_grouped_routing_and_dense_first_layers():
    s = shrink_config(_cfg("deepseek-ai--DeepSeek-R1"))
    c = s.config
    assert c["num_hidden_layers"] == 2 and c["first_k_dense_replace"] == 1  # one dense layer, one MoE layer
    assert (c["n_group"], c["topk_group"], c["n_routed_experts"], c["num_experts_per_tok"]) == (8, 4, 16, 8)
    assert (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]) == (10, 6, 10)
    assert (c["q_lora_rank"], c["kv_lora_rank"]) == (16, 8)
    assert c["num_key_value_heads"] == 4  # MHA stays MHA


def test_gpt_oss_dense_llama_tied_and_token_ids():
    g = shrink_config(_cfg("openai--gpt-oss-20b")).config
    assert g["layer_types"] == ["sliding_attention", "full_attention"] and g["num_hidden_layers"] == 2
    assert (g["num_local_experts"], g["num_experts_per_tok"], g["experts_per_token"]) == (8, 4, 4)
    assert g["pad_token_id"] < 512 and g["eos_token_id"] < 512 and g["pad_token_id"] != g["eos_token_id"]
    q = shrink_config(_cfg("Qwen--Qwen3-8B"))
    assert q.config["tie_word_embeddings"] is False and q.kept["tie_word_embeddings"] is False
    assert q.config["max_window_layers"] == 2


def test_explicit_sizes_and_the_arg_round_trip():
    sizes = parse_shrink("layers=8,hidden=128,heads=8,experts=4,vocab=256")
    assert parse_shrink(sizes.to_arg()) == sizes
    c = shrink_config(_cfg("mistralai--Mixtral-8x22B-v0.1"), sizes).config
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"], c["vocab_size"]) == (8, 128, 8, 256)
    assert (c["num_local_experts"], c["num_experts_per_tok"]) == (4, 2)
    assert parse_shrink("auto") == ShrinkSizes() and parse_shrink(None) is None


def test_errors_name_the_field_value_and_fix():
    with pytest.raises(ShrinkError, match=r"--shrink hiden: unknown key 'hiden'; did you mean 'hidden'"):
        parse_shrink("hiden=64")
    with pytest.raises(ShrinkError, match=r"--shrink layers: 'x' is not a positive integer; give layers=N"):
        parse_shrink("layers=x")
    with pytest.raises(ShrinkError, match=r"experts=2 is below the routing top-k num_experts_per_tok=4 .* give "
                                          r"experts >= 4"):
        shrink_config(_cfg("openai--gpt-oss-20b"), parse_shrink("experts=2"))
    with pytest.raises(ShrinkError, match=r"layers=2 would drop a layer kind of layer_types .*give layers >= 6"):
        shrink_config(_cfg("google--gemma-4-26B-A4B"), parse_shrink("layers=2"))
    with pytest.raises(ShrinkError, match=r"^hidden_size: the config names no hidden size"):
        shrink_config({"model_type": "llama", "num_hidden_layers": 4})
    with pytest.raises(ShrinkError, match=r"num_local_experts: num_local_experts=8 but the config names no routing "
                                          r"top-k"):
        shrink_config({"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256,
                       "num_attention_heads": 4, "num_local_experts": 8})


def test_more_experts_than_the_config_is_refused():
    with pytest.raises(ShrinkError, match=r"experts=12 exceeds the config's num_local_experts=8"):
        shrink_config(_cfg("mistralai--Mixtral-8x22B-v0.1"), parse_shrink("experts=12"))


def test_a_preset_has_no_config_to_shrink():
    from dstoolkit.spec.model import ModelSpec

    with pytest.raises(ShrinkError, match=r"model.preset: preset 'tiny' is the project's own stand-in.*hf_config"):
        model_config_of(ModelSpec(preset="tiny"))
    cfg, cls = model_config_of(ModelSpec(model_type="llama", hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=128, vocab_size=256))
    assert cfg["model_type"] == "llama" and cls is None


def test_fit_batch_keeps_the_strategy_and_fits_the_ranks():
    ds = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}, "bf16": {"enabled": True}}
    cfg, changed = fit_batch(ds, 2, ShrinkSizes())
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (4, 2, 1)
    assert cfg["zero_optimization"] == ds["zero_optimization"] and cfg["bf16"] == ds["bf16"]
    assert changed == {"train_batch_size": (64, 4), "train_micro_batch_size_per_gpu": (8, 2)}


@pytest.mark.parametrize("path", sorted(RELEASED.glob("*.json")), ids=lambda p: p.stem)
def test_every_released_config_shrinks_or_names_why(path):
    # The shrink is a pure dict function: every released config either shrinks to small sizes or names a field.
    try:
        s = shrink_config(json.loads(path.read_text()))
    except ShrinkError as exc:
        assert exc.field and exc.fix
        return
    sizes = s.sizes()
    assert sizes["hidden"] == 64 and sizes["layers"] <= 8 and (sizes["vocab"] or 0) <= 512


def _trainer_args(tmp_path, model: str, shrink: str) -> list[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"model: {model}\ncluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu}}\n"
                    "training: {seq_len: 32, global_batch: 4, micro_batch: 2, zero_stage: 0}\n")
    ds = tmp_path / "ds.json"
    ds.write_text("{}")
    return ["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "2", "--metrics-out",
            str(tmp_path / "m.jsonl"), "--shrink", shrink]


@pytest.mark.parametrize("model,shrink,expect", [
    ("{preset: tiny}", "auto", r"--shrink \(spec .*\): model.preset: preset 'tiny' is the project's own stand-in"),
    (f"{{hf_config: {RELEASED / 'openai--gpt-oss-20b.json'}}}", "hiden=64", r"did you mean 'hidden'"),
    (f"{{hf_config: {RELEASED / 'openai--gpt-oss-20b.json'}}}", "experts=3",
     r"experts=3 is below the routing top-k num_experts_per_tok=4"),
    ("{hf_config: missing.json}", "auto", r"model.hf_config: cannot read"),
])
def test_trainer_bad_shrink_input_is_a_usage_error_without_traceback(tmp_path, capsys, model, shrink, expect):
    from dstoolkit.runtime.train import trainer

    rc = trainer.main(_trainer_args(tmp_path, model, shrink))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    import re

    assert re.search(expect, err), err


def test_bench_and_tune_refuse_bad_shrink_input(tmp_path):
    from dstoolkit.runtime.bench.harness import BenchInputError
    from dstoolkit.runtime.bench.train import run_train
    from dstoolkit.tune.space import TuneInputError
    from dstoolkit.tune.options import TuneOptions, _shrunk_run

    with pytest.raises(BenchInputError, match=r"--shrink seqlen: unknown key 'seqlen'; did you mean 'seq_len'"):
        run_train([str(tmp_path)], spec=None, strategies=None, steps=3, skip_steps=1, world_size=2, out=None,
                  resume=False, timeout_s=10, calibration_path=None, progress=False, shrink="seqlen=32")
    with pytest.raises(BenchInputError, match=r"--shrink trains the example trainer's model; a command after `--`"):
        run_train([str(tmp_path)], spec=None, strategies=None, steps=3, skip_steps=1, world_size=2, out=None,
                  resume=False, timeout_s=10, calibration_path=None, progress=False, shrink="auto",
                  command=["python", "train.py"])
    opts = TuneOptions(spec_path=tmp_path / "s.yaml", out_dir=tmp_path / "o", budget=1, mode="estimate", shrink="auto")
    with pytest.raises(TuneInputError, match=r"--shrink is for real mode"):
        _shrunk_run(opts, None)
