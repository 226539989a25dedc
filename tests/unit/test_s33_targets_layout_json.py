"""layout.json records, for every file of a generated folder, the layout that file holds (s33 finding 6).

Before: a target group whose every target was refused (Megatron-LM for a YaRN-rope Llama: `megatron_lm_args` has no
YaRN for a non-MLA model) reached `_layout_json` with no targets, `all(is_hf(t) for t in [])` was True, and the empty
group claimed ds_config_hf.json with its own (Megatron-Core) layout. `dstoolkit validate OUT/` then checked the HF JSON
(AutoTP 2, no pipeline) at tp1 pp2 and reported DS225 on a folder `generate` had just written.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main

transformers = pytest.importorskip("transformers")

TARGETS = ["deepspeed", "hf", "accelerate", "megatron-lm", "megatron-deepspeed"]
SPEC = """name: llama-yarn
model:
  hf_config: model/config.json
cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}
training:
  seq_len: 4096
  global_batch: 64
  micro_batch: auto
  precision: bf16
  optimizer: adamw
  lr: 0.0003
  warmup_steps: 100
  train_steps: 1000
  activation_checkpointing: auto
  tp: auto
  pp: auto
  zero_stage: auto
targets: [deepspeed, hf, accelerate, megatron-lm, megatron-deepspeed]
"""


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A Llama-2-7B-sized model with YaRN rope scaling (what the s33 tester wrote), generated for every target."""
    root = tmp_path_factory.mktemp("llama_yarn")
    cfg = transformers.LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                 "original_max_position_embeddings": 4096})
    cfg.save_pretrained(root / "model")
    (root / "spec.yaml").write_text(SPEC)
    out = root / "out"
    assert main(["generate", str(root / "spec.yaml"), "--out", str(out)]) == 0
    return out


def _layouts(out):
    return {d.name: json.loads((d / "layout.json").read_text())["files"] for d in sorted(out.iterdir()) if d.is_dir()}


def test_megatron_lm_is_refused_in_every_folder(generated):
    # the premise: the Megatron-LM group resolves a layout, then its only target is refused
    for name, files in _layouts(generated).items():
        assert not (generated / name / "megatron_lm_args.txt").exists()


def test_validate_passes_on_the_generated_folder(generated, capsys):
    rc = main(["validate", str(generated)])
    got = capsys.readouterr()
    text = got.out + got.err
    assert rc == 0, text
    assert " 0 error(s)" in text and "DS225" not in text and "DS223" not in text


def test_hf_json_has_the_hf_group_layout(generated):
    layouts = _layouts(generated)
    assert layouts
    for name, files in layouts.items():
        hf = files["ds_config_hf.json"]
        # the hf/accelerate group's entry (accelerate_config.yaml is written from the same pick)
        assert hf == files["accelerate_config.yaml"], name
        assert hf["targets"] == ["hf", "accelerate"], name
        # and it is the layout the file holds: AutoTP size = tp, no pipeline for an HF model
        cfg = json.loads((generated / name / "ds_config_hf.json").read_text())
        assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == hf["tp"], name
        assert hf["pp"] == 1, name
        # ds_config.json keeps the DeepSpeed group's entry
        assert files["ds_config.json"]["targets"] == ["deepspeed"], name
