"""ZeRO-3 optimizer sub-groups, listed by distinct size instead of one entry per sub_group_size chunk (s36:
sub_group_size 1 made `memory._stepped_numels` build ~1e9 list entries and `dstoolkit estimate` never returned; a
2**30 hidden size did the same through fit_advice's ZeRO-3 variant; sub_group_size 0 looped forever)."""
import pytest

from dstoolkit.estimate import deepspeed_model_states
from dstoolkit.estimate.memory import _stepped_numels
from dstoolkit.estimate.step_temporaries import optimizer_temporary_bytes
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan


def _plan(shape, sub_group_size=None, world=8, stage=3):
    z = {"stage": stage} if sub_group_size is None else {"stage": stage, "sub_group_size": sub_group_size}
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW"}, "zero_optimization": z}
    return RunPlan(shape=shape, ds_config=ds, world_size=world, gpus_per_node=min(8, world),
                   gpu=get_gpu("H100-SXM"), seq_len=4096, precision="bf16")


def _old_loop(groups, group_dp, sub_group_size):
    """The pre-fix memory._stepped_numels stage-3 branch (one entry per sub_group_size chunk), as a reference."""
    out = []
    for g, dp in zip(groups, group_dp):
        part = sum(-(-n // dp) for n in g)
        while part > 0:
            out.append([min(part, sub_group_size)])
            part -= sub_group_size
    return out


SHAPES = [
    ([[10, 7, 3, 20]], [1], 1), ([[10, 7, 3, 20]], [1], 15), ([[10, 7, 3, 20]], [1], 40), ([[10, 7, 3, 20]], [1], 39),
    ([[10, 7, 3, 21]], [4], 5), ([[100, 1, 1], [64, 64]], [2, 8], 50), ([[5, 5, 5, 5]], [1], 5), ([[]], [2], 3),
]


@pytest.mark.parametrize("groups,group_dp,sub_group_size", SHAPES)
@pytest.mark.parametrize("impl", ["torch_for_loop", "torch_foreach"])
def test_same_temporaries_as_the_old_loop(groups, group_dp, sub_group_size, impl):
    plan = _plan(get_preset("tiny"), sub_group_size)
    new = _stepped_numels(plan, "zero3", groups, group_dp)
    old = _old_loop(groups, group_dp, sub_group_size)
    assert sorted(map(tuple, new)) == sorted(set(map(tuple, old)))  # the old sizes, each once
    for l2 in (False, True):
        assert optimizer_temporary_bytes(impl, new, l2) == optimizer_temporary_bytes(impl, old, l2)


def test_distinct_sizes_only():
    plan = _plan(get_preset("tiny"), 15)
    assert _stepped_numels(plan, "zero3", [[10, 7, 3, 20]], [1]) == [[15], [10]]  # 40 = 15 + 15 + 10
    assert _stepped_numels(_plan(get_preset("tiny"), 1), "zero3", [[2**60]], [8]) == [[1]]  # not 2**57 entries
    assert _stepped_numels(_plan(get_preset("tiny"), 0), "zero3", [[2**60]], [8]) == [[0]]  # the old loop: forever


def test_llama3_8b_sub_group_size_one_returns():
    # the tester's case (s36, /tmp/rA/ds/z3_sg1.json): llama-3-8b, ZeRO-3, sub_group_size 1, 8 ranks
    ms = deepspeed_model_states(_plan(get_preset("llama-3-8b"), 1))
    assert ms.grads_at_step - ms.grads_persistent == 4  # zero3_states: min(partition, sub_group_size) fp32 elements


def test_fit_advice_zero3_variant_of_a_huge_hidden_size_returns():
    # hidden_size 2**30 (s36): fit_advice tries ZeRO-3 (default sub_group_size 1e9) on ~1e18-element parameters
    from dstoolkit.generate.planner import fit_advice
    shape = get_preset("llama-3-8b").model_copy(update={"hidden_size": 2**30})
    assert fit_advice(_plan(shape, None, stage=2)) == []  # nothing makes it fit; before, this never returned
