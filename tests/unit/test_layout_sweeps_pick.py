"""benchmarks/layout_sweeps.py sweep_pick: runs whose execution facts hold lists (Megatron recompute_modules, as the
MoE model-zoo group's rows do) are compared, not refused with a TypeError, and the reason the sweep does not apply
is reported."""
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402


def _run(rid, tp, ep, modules):
    return {"id": rid, "gpus_per_node": 8, "micro_batch": 1, "recompute": "none",
            "layout": {"tp": tp, "pp": 8, "ep": ep, "zero_stage": 1},
            "execution": {"framework": "megatron", "recompute_modules": modules}}


def test_list_valued_execution_is_compared_not_hashed():
    # same layout facts but a different recompute_modules list: the layouts differ beyond tp/pp/micro batch
    group = {"runs": [_run("a", 2, 8, ["layernorm", "moe_act"]), _run("b", 4, 8, ["moe_act"])]}
    got = ls.sweep_pick(group, [], pathlib.Path("unused.yaml"))
    assert got == {"applicable": False,
                   "why": "the layouts differ in more than tp/pp/micro batch (ZeRO stage, schedule, framework or EP)"}


def test_equal_lists_are_one_set_of_fixed_facts():
    # equal lists (in another dict order) are the same facts; tp 3 lies outside the sweep space, so no sweep runs
    a, b = _run("a", 2, 8, ["layernorm", "moe_act"]), _run("b", 3, 8, ["layernorm", "moe_act"])
    b["execution"] = dict(reversed(list(b["execution"].items())))
    got = ls.sweep_pick({"runs": [a, b]}, [], pathlib.Path("unused.yaml"))
    assert got == {"applicable": False, "why": "1 of 2 layouts outside the sweep space (tp/pp/micro batch powers of two)"}
