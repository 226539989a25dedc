"""The trainer leaves the trained transformers model's config.json beside its checkpoint tags, where `dstoolkit ckpt
export` looks for it (runtime/ckpt/export.py find_config). Was: no config.json, so exporting a `--shrink` run
needed --config. Written atomically by rank 0; the same config again (a resume) is kept; a different file (the
user's, another model's) is never overwritten: the run is refused, naming the file, what differs and the fix. The
real run + export: tests/dist/test_s29_train_export.py."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from dstoolkit.runtime.train.builders import model_config_json, write_model_config
from dstoolkit.runtime.train.ckpt import CheckpointManager
from dstoolkit.runtime.train.trainer_inputs import UsageError

CONFIG = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 128,
          "transformers_version": "5.25.0"}
TEXT = json.dumps(CONFIG, indent=2)


def test_written_beside_the_tags_where_export_looks(tmp_path):
    from dstoolkit.runtime.ckpt.export import CONFIG_NAME

    mgr = CheckpointManager(tmp_path / "ck")
    assert mgr.write_model_config(TEXT) == "written"
    assert CONFIG_NAME == "config.json"
    assert (tmp_path / "ck" / "config.json").read_text() == TEXT
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["config.json"]  # no temporary file left
    assert mgr.tags() == []  # not a checkpoint tag


def test_the_same_config_again_is_kept(tmp_path):
    mgr = CheckpointManager(tmp_path)
    mgr.write_model_config(TEXT)
    newer = json.dumps({**CONFIG, "transformers_version": "5.26.0"})  # a resume under a newer transformers
    assert mgr.write_model_config(TEXT) == "kept" and mgr.write_model_config(newer) == "kept"
    assert (tmp_path / "config.json").read_text() == TEXT


def test_only_rank_0_writes(tmp_path):
    assert CheckpointManager(tmp_path, rank=1).write_model_config(TEXT) == "written"
    assert not (tmp_path / "config.json").exists()


def test_a_users_different_config_is_never_overwritten(tmp_path):
    mine = json.dumps({**CONFIG, "hidden_size": 4096, "num_hidden_layers": 32, "rope_theta": 5e5})
    (tmp_path / "config.json").write_text(mine)
    with pytest.raises(FileExistsError) as info:
        CheckpointManager(tmp_path).write_model_config(TEXT)
    assert str(info.value) == (
        f"{tmp_path / 'config.json'} describes another model: hidden_size, num_hidden_layers, rope_theta differ from "
        "the model this run trains; `dstoolkit ckpt export` reads the config.json beside the tags, so it is not "
        "overwritten: move it away or give this run another --checkpoint-dir")
    assert (tmp_path / "config.json").read_text() == mine


@pytest.mark.parametrize("content, why", [("{not json", "is not readable JSON (JSONDecodeError)"),
                                          ("[1, 2]", "holds a JSON list, not a model config")])
def test_an_unreadable_config_is_not_overwritten_either(tmp_path, content, why):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(FileExistsError) as info:
        CheckpointManager(tmp_path).write_model_config(TEXT)
    assert str(info.value).startswith(f"{tmp_path / 'config.json'} {why}; `dstoolkit ckpt export` reads")
    assert (tmp_path / "config.json").read_text() == content


class _Config:
    def to_json_string(self, use_diff=True):
        return TEXT if not use_diff else json.dumps({"model_type": "llama"})


def test_the_trainer_writes_the_hf_models_full_config_and_refuses_a_conflict_as_usage(tmp_path):
    hf_model = SimpleNamespace(hf=SimpleNamespace(config=_Config()))
    assert model_config_json(hf_model) == TEXT  # every field, not the diff from transformers' defaults
    mgr = CheckpointManager(tmp_path)
    assert write_model_config(mgr, hf_model) == "written"
    assert write_model_config(None, hf_model) is None
    assert write_model_config(mgr, SimpleNamespace()) is None  # the TinyTransformer: no HF config describes it
    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "vocab_size": 256}))
    with pytest.raises(UsageError, match=rf"^--checkpoint-dir {tmp_path}: {tmp_path / 'config.json'} describes "
                                         r"another model: vocab_size differ"):
        write_model_config(mgr, hf_model)


def test_a_real_shrunk_models_config_builds_back_in_transformers():
    pytest.importorskip("transformers")
    import transformers as tf

    from dstoolkit.runtime.hf_model import build_hf_model

    model = build_hf_model({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                            "vocab_size": 128})
    d = json.loads(model_config_json(model))
    cfg = tf.AutoConfig.for_model(**{k: v for k, v in d.items() if k != "transformers_version"})
    assert (type(cfg).__name__, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == ("LlamaConfig", 32, 2, 128)
