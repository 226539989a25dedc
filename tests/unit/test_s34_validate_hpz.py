"""s34 validate finding 5: DeepSpeed 0.19.8 builds hpZ groups from consecutive global ranks
(utils/groups.py _create_zero_param_parallel_group), so an hpZ size that covers the whole world spans nodes when
the world has more than one node; the fix suggested is generate's (layout.dims.hpz_partition)."""
from dstoolkit.validate import validate_config

LLAVA_ZERO3PP = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
    "stage": 3, "zero_quantized_weights": True, "zero_hpz_partition_size": 16, "zero_quantized_gradients": True}}


def _ds221(cfg: dict, **kw) -> list:
    return [(f.message, f.suggestion) for f in validate_config(cfg, **kw) if f.code == "DS221"]


def _hpz(n: int) -> dict:
    return {**LLAVA_ZERO3PP, "zero_optimization": {**LLAVA_ZERO3PP["zero_optimization"], "zero_hpz_partition_size": n}}


def test_whole_world_hpz_on_two_nodes_warns():
    assert _ds221(LLAVA_ZERO3PP, world_size=16, gpus_per_node=8) == [(
        "zero_hpz_partition_size=16 does not divide --gpus-per-node 8; the secondary partition groups (16 consecutive "
        "ranks) span nodes (DeepSpeed runs it, without hpZ's benefit)", 'use "zero_hpz_partition_size": 8')]
    # at tp 2 the node holds 4 data-parallel ranks: generate's value
    assert _ds221(LLAVA_ZERO3PP, world_size=16, gpus_per_node=8, tp=2)[0][1] == 'use "zero_hpz_partition_size": 4'


def test_clamped_hpz_on_two_nodes_warns_about_nodes():
    assert _ds221(_hpz(32), world_size=16, gpus_per_node=8) == [(
        "zero_hpz_partition_size=32 is larger than the world size 16; DeepSpeed clamps the hpZ group to 16 ranks, "
        "which does not divide --gpus-per-node 8; the secondary partition groups (16 consecutive ranks) span nodes "
        "(DeepSpeed runs it, without hpZ's benefit)", 'use "zero_hpz_partition_size": 8')]


def test_one_node_and_node_sized_hpz():
    assert _ds221(LLAVA_ZERO3PP, world_size=16, gpus_per_node=16) == []
    assert _ds221(_hpz(8), world_size=16, gpus_per_node=8) == []
    [(message, suggestion)] = _ds221(LLAVA_ZERO3PP, world_size=8, gpus_per_node=8)
    assert message == "zero_hpz_partition_size=16 is larger than the world size 8; DeepSpeed clamps the hpZ group to 8 ranks"
    assert suggestion == ('"zero_hpz_partition_size": 8 says what runs; on one node hpZ saves no inter-node traffic, '
                          "and 1 (off) saves its second copy")
