"""The pipeline layer split has one owner (dstoolkit.layout.stage_layers), per framework: Megatron's (even, else the
rest on stage 0, else on the first and the last stage, else a --pipeline-model-parallel-layout) and the uniform one
of DeepSpeed's PipelineModule. Any 1 <= pp <= L is a layout both frameworks run, so LY005 refuses only pp above the
layer count."""
from __future__ import annotations

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.layout import (LayoutError, LayoutFacts, MegatronSplit, check_layout, megatron_split, pipeline_split,
                              stage_layer_range, stage_layers)


def test_megatron_split_exact():
    assert megatron_split(32, 4) == MegatronSplit((8, 8, 8, 8))  # no flag
    # the lighter stage last, beside the output layer: --decoder-last-pipeline-num-layers
    assert megatron_split(30, 4) == MegatronSplit((8, 8, 8, 6), last=6)
    assert megatron_split(61, 16) == MegatronSplit((4,) * 15 + (1,), last=1)
    assert megatron_split(3, 2) == MegatronSplit((2, 1), last=1)
    # 72 over 16: 5 on 15 stages would leave the last -3, so the rest (2) on the first and the last stage
    assert megatron_split(72, 16) == MegatronSplit((1,) + (5,) * 14 + (1,), first=1, last=1)
    # 33 over 12: the rest (3) split over the edges, the smaller half last
    assert megatron_split(33, 12) == MegatronSplit((2,) + (3,) * 10 + (1,), first=2, last=1)
    # 61 over 32: 2 on 30 middle stages leaves 1 for both edges, so the uniform split as a layout
    s = megatron_split(61, 32)
    assert s.layers == (2,) * 29 + (1,) * 3 and s.first is None and s.last is None
    assert s.layout == "|".join(["Et*2"] + ["t*2"] * 28 + ["t*1"] * 2 + ["t*1L"])
    for layers in range(2, 80):
        for pp in range(1, layers + 1):
            assert max(stage_layers(layers, pp)) == -(-layers // pp)


def test_uniform_split_exact():
    assert stage_layers(72, 16, "uniform") == (5,) * 8 + (4,) * 8
    assert stage_layers(61, 16, "uniform") == (4,) * 13 + (3,) * 3
    assert stage_layers(30, 4, "uniform") == (8, 8, 7, 7)


def test_ranges_cover_every_block_once():
    for split in ("megatron", "uniform"):
        blocks = [i for st in range(16) for i in stage_layer_range(72, 16, st, split)]
        assert blocks == list(range(72))


@pytest.mark.parametrize("layers", [2, 7, 30, 61, 72, 96])
def test_uniform_is_deepspeeds_partition_uniform(layers):
    from deepspeed.runtime.utils import partition_uniform

    for pp in range(1, layers + 1):
        parts = partition_uniform(num_items=layers, num_parts=pp)
        assert stage_layers(layers, pp, "uniform") == tuple(b - a for a, b in zip(parts, parts[1:]))


def test_megatron_split_is_one_megatron_core_accepts():
    """Every (L, pp) with pp <= L builds megatron.core's TransformerConfig with the split's flags, and Megatron-Core
    puts the same number of decoder layers on each stage."""
    try:
        import torch
        from megatron.core.transformer import TransformerConfig
        from megatron.core.transformer.enums import LayerType
    except Exception as exc:  # noqa: BLE001 - any import failure means: cannot check here
        pytest.skip(f"megatron-core cannot be imported here ({type(exc).__name__}: {exc})")
    for layers in (5, 30, 32, 61, 72):
        for pp in range(2, layers + 1):
            s = megatron_split(layers, pp)
            cfg = TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                                    pipeline_model_parallel_size=pp, num_layers_in_first_pipeline_stage=s.first,
                                    num_layers_in_last_pipeline_stage=s.last, pipeline_model_parallel_layout=s.layout,
                                    pipeline_dtype=torch.float32)
            assert sum(s.layers) == layers and min(s.layers) >= 1
            if s.layout is not None:
                per_stage = [sum(t == LayerType.decoder for t in row[0]) for row in cfg.pipeline_model_parallel_layout.layout]
                assert tuple(per_stage) == s.layers
            elif s.first is not None or s.last is not None:
                middle = (layers - (s.first or 0) - (s.last or 0)) // (pp - (s.first is not None) - (s.last is not None))
                assert s.layers == ((s.first,) if s.first else ()) + (middle,) * (pp - (s.first is not None)
                                                                                  - (s.last is not None)) + ((s.last,) if s.last else ())


def test_ly005_refuses_only_pp_above_the_layer_count():
    assert check_layout(LayoutFacts(pp=16, num_layers=72), ("LY005",)) == []
    assert check_layout(LayoutFacts(pp=12, num_layers=32), ("LY005",)) == []
    (v,) = check_layout(LayoutFacts(pp=40, num_layers=32), ("LY005",))
    assert v.code == "LY005" and "pp=40 exceeds num_hidden_layers=32" in v.message and "between 1 and 32" in v.fix
    with pytest.raises(LayoutError):
        stage_layers(32, 33)


def test_framework_picks_the_split():
    assert pipeline_split("megatron") == "megatron"
    assert pipeline_split("deepspeed") == pipeline_split("fsdp") == "uniform"


def test_megatron_lm_args_carry_both_edge_flags(tmp_path):
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("name: s\nmodel: {preset: llama-3-8b}\ncluster: {nodes: 12, gpus_per_node: 8, gpu: H100-SXM}\n"
                         "training: {seq_len: 4096, global_batch: 96, zero_stage: 1}\n")
    spec, shape = load_spec_and_shape(spec_path)  # 32 layers
    words = megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=8, pp=12, micro_batch=1))
    i, j = words.index("--decoder-first-pipeline-num-layers"), words.index("--decoder-last-pipeline-num-layers")
    assert words[i + 1] == "1" and words[j + 1] == "1" and "--pipeline-model-parallel-layout" not in words
    even = megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=8, pp=4, micro_batch=1))
    assert not {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--pipeline-model-parallel-layout"} & set(even)
    # 32 over 24: ceil 2 leaves 32 - 22 x 2 < 2 for the edges, so a layout: 8 stages of 2, 16 of 1
    deep = megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=4, pp=24, micro_batch=1))
    layout = deep[deep.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "|".join(["Et*2"] + ["t*2"] * 7 + ["t*1"] * 15 + ["t*1L"])


def test_estimate_prints_and_returns_the_split(tmp_path, capsys):
    import json

    from dstoolkit.cli import main

    text = ("name: gpt30\nmodel: {model_type: gpt2, n_embd: 1024, n_layer: 30, n_head: 16, vocab_size: 51200, "
            "n_positions: 2048}\ncluster: {nodes: 2, gpus_per_node: 8, gpu: A100-80G}\ntraining: {seq_len: 2048, "
            "global_batch: 64, micro_batch: 1, zero_stage: 1, tp: 2, pp: 4, framework: FW}\n")
    for fw, line, layers in (
            ("megatron", "pipeline stages: 3 stages of 8 layers, 1 stage of 6 layers, stage 0 first (Megatron-LM: "
                         "--decoder-last-pipeline-num-layers 6); the last stage also holds the output layer", [8, 8, 8, 6]),
            ("deepspeed", "pipeline stages: 2 stages of 8 layers, 2 stages of 7 layers, stage 0 first (DeepSpeed "
                          "PipelineModule's uniform "
                          "partition); the last stage also holds the output layer", [8, 8, 7, 7])):
        spec = tmp_path / f"{fw}.yaml"
        spec.write_text(text.replace("FW", fw))
        assert main(["estimate", str(spec)]) == 0
        assert line in capsys.readouterr().out.splitlines()
        assert main(["estimate", str(spec), "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["pipeline_stage_layers"] == layers
