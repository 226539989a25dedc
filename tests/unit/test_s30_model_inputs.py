"""Model inputs transformers refuses, or cannot run, are refused here too, naming the key or field:

- a learned position table shorter than the sequence (GPT-2 n_positions 1024 at seq_len 4096): the spec at
  training.seq_len, estimate's --config form at --seq-len; a RoPE model past max_position_embeddings is accepted;
- num_key_value_heads 0 and an unknown rope_scaling type;
- `--model DIR` resolves DIR/config.json as a spec's hf_config does, and says so when it is missing.

Before: all of these were estimated as valid (and --model DIR said "file not found")."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli.estimate_flags import load_shape
from dstoolkit.models.hf import HFConfigError, shape_from_hf_dict
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import spec_from_dict

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 688, "vocab_size": 1024, "max_position_embeddings": 1024}
GPT2 = {"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4, "n_positions": 1024, "vocab_size": 1000}


def _spec(model, seq_len):
    return spec_from_dict({"name": "t", "model": model, "training": {"global_batch": 8, "seq_len": seq_len},
                           "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8}})


def test_learned_table_shorter_than_seq_len_is_refused():
    with pytest.raises(ValueError, match=r"training.seq_len=4096 is longer than the learned position table.*1024"):
        resolve_spec_model(_spec(GPT2, 4096))
    assert resolve_spec_model(_spec(GPT2, 1024)).learned_positions


def test_rope_model_past_max_position_embeddings_is_accepted():
    assert resolve_spec_model(_spec(LLAMA, 4096)).max_position_embeddings == 1024


def test_estimate_flag_form_names_seq_len(tmp_path, capsys):
    from dstoolkit.cli import main

    cfg = tmp_path / "gpt2.json"
    cfg.write_text(json.dumps(GPT2))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                              "zero_optimization": {"stage": 1}}))
    rc = main(["estimate", "--config", str(ds), "--model", str(cfg), "--world-size", "8", "--seq-len", "8192"])
    assert rc == 2
    assert "--seq-len=8192 is longer than the learned position table" in capsys.readouterr().err


def test_zero_kv_heads_refused():
    with pytest.raises(HFConfigError, match="num_key_value_heads: 0 key/value heads"):
        shape_from_hf_dict({**LLAMA, "num_key_value_heads": 0})


def test_unknown_rope_type_refused():
    with pytest.raises(HFConfigError, match=r"rope_scaling.type='bogus' is not a rope type"):
        shape_from_hf_dict({**LLAMA, "rope_scaling": {"type": "bogus", "factor": 8}})


def test_model_folder_resolves_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA))
    assert load_shape(str(tmp_path / "m")).hidden_size == 256
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_shape(str(tmp_path / "empty"))
