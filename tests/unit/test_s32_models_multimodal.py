"""Session 32, finding 4: a multimodal config's vision/audio towers are counted in what trains.

Before: `measure_config` computed `MeasuredParams.vision_params` and nothing read it; the estimate of Qwen3-VL-8B
equalled Qwen3-8B's (576,388,336 tower parameters with no weights, gradients or Adam states) while the assumption
line said the towers were "reported apart" (they were reported nowhere). transformers builds the towers trainable
(every parameter of Qwen3VLForConditionalGeneration / LlavaForConditionalGeneration requires grad) and HF Trainer
puts every parameter that requires grad in the optimizer, so they are model states; their activations and FLOPs
depend on the images per sample, which the estimate does not take, and the assumption line says so.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from dstoolkit.models import count_params, measured_layout  # noqa: E402
from dstoolkit.models.resolve import load_model  # noqa: E402
from tests.unit.estimate_cli_runs import run_estimate  # noqa: E402

HF = Path(__file__).resolve().parents[1] / "golden" / "hf_configs"
VL = HF / "released" / "Qwen--Qwen3-VL-8B-Instruct.json"
TEXT = HF / "released" / "Qwen--Qwen3-8B.json"
TOWER = 576_388_336
DS = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2}}

NOTE = ("model: multimodal config (qwen3_vl): the language model is read from text_config (qwen3_vl_text); the "
        "vision/audio towers and projectors (576,388,336 params) are counted in weights, gradients and optimizer "
        "states (transformers builds them trainable and HF Trainer optimizes them; frozen towers would hold less), "
        "not in activations or FLOPs (those depend on the images / audio per sample, which the estimate does not "
        "take); --seq-len counts the language model's tokens, image tokens included")


def _json_estimate(capsys, tmp_path, model, *extra):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(DS))
    rc, out, err = run_estimate(capsys, "--config", cfg, "--model", model, "--world-size", 8, "--seq-len", 2048,
                                "--format", "json", *extra)
    assert rc == 0, err
    return json.loads(out)


def test_qwen3_vl_towers_are_counted_in_params_and_model_states(capsys, tmp_path):
    vl = _json_estimate(capsys, tmp_path, VL)
    text = _json_estimate(capsys, tmp_path, TEXT)
    assert vl["params"]["total"] == text["params"]["total"] + TOWER == 8_767_123_696
    assert vl["params"]["active"] == text["params"]["active"] == 8_190_735_360  # text tokens skip the towers
    assert vl["params"]["per_rank"] == text["params"]["per_rank"] + TOWER  # ZeRO-2: every rank holds the weights
    mem_vl, mem_text = vl["memory_per_rank_bytes"], text["memory_per_rank_bytes"]
    assert mem_vl["params"] - mem_text["params"] == 2 * TOWER  # bf16 weights of the towers
    assert mem_vl["optimizer"] > mem_text["optimizer"] and mem_vl["grads"] > mem_text["grads"]
    # activations and FLOPs are the language model's, as the assumption line says
    assert mem_vl["activations"] == mem_text["activations"]
    assert vl["flops_per_token"] == text["flops_per_token"]
    assert NOTE in vl["assumptions"]


def test_qwen3_vl_text_output_says_what_is_counted(capsys, tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(DS))
    rc, out, _ = run_estimate(capsys, "--config", cfg, "--model", VL, "--world-size", 8, "--seq-len", 2048)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("model Qwen--Qwen3-VL-8B-Instruct: 8.767B params (8.191B active);")
    assert lines[1] == "  assumed: " + NOTE
    assert "reported apart" not in out


def test_towers_are_layout_entries_per_block_and_in_param_count():
    shape = load_model(VL)
    c = count_params(shape)
    assert (c.tower, c.total - c.tower, c.active) == (TOWER, 8_190_735_360, 8_190_735_360)
    layout = measured_layout(shape.measured)
    towers = [p for p in layout if p.kind == "tower"]
    # one entry per tower block (27 vision blocks, 3 deepstack mergers, the patch embedding, ...), first in the
    # layout, replicated over TP, outside the layers
    assert layout[:len(towers)] == tuple(towers) and sum(p.numel for p in towers) == TOWER
    assert {(p.layer, p.tp_split) for p in towers} == {(-1, False)}
    assert len(towers) == len(shape.measured.vision_blocks) > 27
    assert max(p.numel for p in towers) == 40_125_952  # a block (the merger), never the whole tower at once
    assert sum(p.numel for p in layout) == c.total


def test_llava_counts_equal_the_whole_transformers_model(tmp_path):
    import torch
    import transformers as tf

    text = json.loads((HF / "llama-3.2-1b.json").read_text())
    cfg = tf.LlavaConfig(text_config=text, vision_config={"model_type": "clip_vision_model"})
    path = tmp_path / "llava.json"
    path.write_text(json.dumps(cfg.to_dict()))
    with torch.device("meta"):
        full = tf.LlavaForConditionalGeneration(tf.AutoConfig.for_model(**json.loads(path.read_text())))
    assert all(p.requires_grad for p in full.parameters())  # transformers builds the towers trainable
    shape = load_model(path)
    c = count_params(shape)
    assert c.total == sum(p.numel() for p in full.parameters()) == 1_329_041_664
    assert (c.tower, c.active) == (93_227_264, 1_235_814_400)
    assert shape.notes[0].startswith("multimodal config (llava): the language model is read from text_config "
                                     "(llama); the vision/audio towers and projectors (93,227,264 params) are "
                                     "counted in weights, gradients and optimizer states")


def test_towers_sit_on_the_first_pipeline_stage_only():
    from dstoolkit.estimate.param_groups import _rank_param_groups

    shape = load_model(VL)
    first = sum(_rank_param_groups(shape, 1, 2, 1, 0)[0])
    last = sum(_rank_param_groups(shape, 1, 2, 1, 1)[0])
    text = load_model(TEXT)
    assert first - sum(_rank_param_groups(text, 1, 2, 1, 0)[0]) == TOWER
    assert last == sum(_rank_param_groups(text, 1, 2, 1, 1)[0])
