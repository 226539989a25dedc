"""ZeRO-3 optimizer sub-groups as DeepSpeed 0.19.8 builds them (stage3.py `_create_fp16_sub_groups`), computed per
parameter, never per sub_group_size chunk (s36: sub_group_size 1 made `memory._stepped_numels` build ~1e9 list
entries and `dstoolkit estimate` never returned; a 2**30 hidden size did the same through fit_advice's ZeRO-3
variant; sub_group_size 0, axolotl's zero3_bf16.json, looped forever)."""
from types import SimpleNamespace

import pytest

from dstoolkit.estimate import deepspeed_model_states
from dstoolkit.estimate.zero_states import stage3_sub_group_numels
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan


def _plan(shape, sub_group_size=None, world=8, stage=3):
    z = {"stage": stage} if sub_group_size is None else {"stage": stage, "sub_group_size": sub_group_size}
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW"}, "zero_optimization": z}
    return RunPlan(shape=shape, ds_config=ds, world_size=world, gpus_per_node=min(8, world),
                   gpu=get_gpu("H100-SXM"), seq_len=4096, precision="bf16")


def _fp32_grad_copy_bytes(plan) -> int:
    """zero3_states: grads_at_step = persistent grad-partition buffer + fp32 copy of the largest sub-group."""
    ms = deepspeed_model_states(plan)
    return ms.grads_at_step - ms.grads_persistent


def _old_loop(groups, group_dp, sub_group_size):
    """The pre-fix memory._stepped_numels stage-3 branch (element chunks of sub_group_size), kept as a reference."""
    out = []
    for g, dp in zip(groups, group_dp):
        part = sum(-(-n // dp) for n in g)
        while part > 0:
            out.append(min(part, sub_group_size))
            part -= sub_group_size
    return out


def _deepspeed_sub_groups(groups, group_dp, sub_group_size):
    """DeepSpeed 0.19.8's own DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups, called on stand-in params whose
    partition_numel() is partition_parameters.py's _aligned_size(param) // world."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    owner = SimpleNamespace(sub_group_size=sub_group_size)
    out = []
    for g, dp in zip(groups, group_dp):
        params = [SimpleNamespace(partition_numel=(lambda k=-(-n // dp): k)) for n in g]
        for sub in stage3.DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups(owner, params):
            out.append(sum(p.partition_numel() for p in sub))
    return out


SHAPES = [
    ([[10, 7, 3, 20]], [1], 1),
    ([[10, 7, 3, 20]], [1], 0),  # sub_group_size 0: DeepSpeed accepts it (zero/config.py ge=0), one param each
    ([[10, 7, 3, 20]], [1], 15),  # closes at >= 15: [17, 23]
    ([[10, 7, 3, 20]], [1], 17),  # exactly at the boundary
    ([[10, 7, 3, 20]], [1], 40),  # the whole group fits: one sub-group
    ([[10, 7, 3, 20]], [1], 39),
    ([[10, 7, 3, 21]], [4], 5),  # partitions ceil(n / 4): 3, 2, 1, 6
    ([[100, 1, 1], [64, 64]], [2, 8], 50),  # a dense and an expert group over different partition sizes
    ([[5, 5, 5, 5]], [1], 5),
]


@pytest.mark.parametrize("groups,group_dp,sub_group_size", SHAPES)
def test_sub_groups_are_deepspeeds(groups, group_dp, sub_group_size):
    assert stage3_sub_group_numels(groups, group_dp, sub_group_size) == _deepspeed_sub_groups(
        groups, group_dp, sub_group_size)


def test_hand_derived_sub_groups():
    assert stage3_sub_group_numels([[10, 7, 3, 20]], [1], 15) == [17, 23]
    assert stage3_sub_group_numels([[10, 7, 3, 20]], [1], 1) == [10, 7, 3, 20]
    assert stage3_sub_group_numels([[10, 7, 3, 20]], [1], 0) == [10, 7, 3, 20]
    assert stage3_sub_group_numels([[10, 7, 3, 21]], [4], 5) == [5, 7]  # 3+2, then 1+6
    # a 2**60-element parameter at sub_group_size 1: one sub-group per parameter, not 2**57 chunks
    assert stage3_sub_group_numels([[2**60] * 3], [8], 1) == [2**57] * 3
    assert stage3_sub_group_numels([[2**60]], [8], 10**9) == [2**57]


@pytest.mark.parametrize("groups,group_dp,sub_group_size", [
    ([[10, 7, 3, 20]], [1], 40), ([[10, 7, 3, 20]], [1], 10**9), ([[5, 5, 5, 5]], [1], 5),
    ([[100, 1, 1], [64, 64]], [2, 8], 52), ([[8, 8], [16]], [2, 4], 4)])
def test_same_as_the_old_loop_where_it_matched_deepspeed(groups, group_dp, sub_group_size):
    # one sub-group per param group, or parameters that fill sub-groups exactly: the old chunking was right there
    assert stage3_sub_group_numels(groups, group_dp, sub_group_size) == _old_loop(groups, group_dp, sub_group_size)


def test_old_loop_split_parameters_deepspeed_does_not():
    # the old loop cut a sub-group at exactly sub_group_size elements, inside a parameter; DeepSpeed never does
    assert _old_loop([[10, 7, 3, 20]], [1], 15) == [15, 15, 10]
    assert stage3_sub_group_numels([[10, 7, 3, 20]], [1], 15) == [17, 23]


def test_sub_group_size_one_fp32_grad_is_the_largest_parameter_partition():
    # tiny: embedding and LM head 2048 x 256 = 524,288 elements, 262,144 per rank over 2 ranks; one sub-group per
    # parameter, so the fp32 gradient copy at step (stage3.py _prepare_fp32_grad_for_sub_group) is 262,144 x 4 bytes
    assert _fp32_grad_copy_bytes(_plan(get_preset("tiny"), 1, world=2)) == 262_144 * 4
    assert _fp32_grad_copy_bytes(_plan(get_preset("tiny"), 0, world=2)) == 262_144 * 4


def test_llama3_8b_sub_group_size_one_returns_exact_bytes():
    # the tester's case (s36, /tmp/rA/ds/z3_sg1.json): llama-3-8b, ZeRO-3, sub_group_size 1, 8 ranks. Largest
    # parameter: embedding / LM head 128256 x 4096 = 525,336,576 elements, 65,667,072 per rank
    assert _fp32_grad_copy_bytes(_plan(get_preset("llama-3-8b"), 1)) == 65_667_072 * 4


def test_default_sub_group_size_one_sub_group_unchanged():
    # tiny at 2 ranks is one sub-group (far under 1e9 elements): the whole partition, as before
    plan = _plan(get_preset("tiny"), None, world=2)
    ms = deepspeed_model_states(plan)
    assert _fp32_grad_copy_bytes(plan) == ms.grads_persistent // 2 * 4  # bf16 buffer -> fp32 copy of all of it


def test_fit_advice_zero3_variant_of_a_huge_hidden_size_returns():
    # hidden_size 2**30 (s36): fit_advice tries ZeRO-3 (default sub_group_size 1e9) on ~1e18-element parameters
    from dstoolkit.generate.planner import fit_advice
    shape = get_preset("llama-3-8b").model_copy(update={"hidden_size": 2**30})
    plan = _plan(shape, None, stage=2)
    assert fit_advice(plan) == []  # nothing makes it fit; before, this never returned
