"""The pipeline layer split has one owner (dstoolkit.layout.stage_layers), per framework: Megatron's (even, else the
rest on stage 0, else on the first and the last stage) and the uniform one of DeepSpeed's PipelineModule. Any
1 <= pp <= L is a layout both frameworks run, so LY005 refuses only pp above the layer count."""
from __future__ import annotations

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.layout import (LayoutError, LayoutFacts, check_layout, pipeline_edge_stage_layers, pipeline_split,
                              stage_layer_range, stage_layers)


def test_megatron_split_exact():
    assert stage_layers(32, 4) == (8, 8, 8, 8)
    assert stage_layers(30, 4) == (6, 8, 8, 8)  # --decoder-first-pipeline-num-layers 6
    assert stage_layers(72, 16) == (1,) + (5,) * 14 + (1,)  # the rest (2) on the first and the last stage
    assert stage_layers(32, 12) == (1,) + (3,) * 10 + (1,)
    assert stage_layers(10, 9) == (1,) * 8 + (2,)
    assert stage_layers(3, 2) == (1, 2)


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
    """Every (L, pp) with pp <= L builds megatron.core's TransformerConfig with the split's edge-stage flags, and
    the split's stages are the ones Megatron-Core derives (middle stages even)."""
    try:
        import torch
        from megatron.core.transformer import TransformerConfig
    except Exception as exc:  # noqa: BLE001 - any import failure means: cannot check here
        pytest.skip(f"megatron-core cannot be imported here ({type(exc).__name__}: {exc})")
    for layers in (5, 30, 32, 61, 72):
        for pp in range(2, layers + 1):
            split = stage_layers(layers, pp)
            first, last = pipeline_edge_stage_layers(layers, pp)
            TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                              num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                              pipeline_dtype=torch.float32)
            assert sum(split) == layers and min(split) >= 1
            assert (first is None) == (split[0] == split[1])
            # pp 2: the second stage is Megatron's one middle stage, so the last flag never appears
            assert (last is None) == (pp == 2 or split[-1] == split[-2])


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
    assert words[i + 1] == "1" and words[j + 1] == "1"
    even = megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=8, pp=4, micro_batch=1))
    assert "--decoder-first-pipeline-num-layers" not in even and "--decoder-last-pipeline-num-layers" not in even
