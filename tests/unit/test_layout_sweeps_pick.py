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
    assert got == {"applicable": False, "why": f"1 of 2 layouts outside the sweep space ({ls.SWEEP_SPACE})"}


def _row(rid, pred_s, meas_s, fits=True, tokens=1000):
    return {"id": rid, "predicted_step_s": pred_s, "measured_step_s": meas_s, "fits": fits, "tokens_per_step": tokens}


def test_marked_set_holds_the_measured_best_within_the_error():
    # a is estimated fastest; b lies 4% above it (inside 5.5%), c 10% above (outside). b measured best.
    ran = [_row("a", 100.0, 110.0), _row("b", 104.0, 100.0), _row("c", 110.0, 105.0)]
    got = ls.marked_undecided(ran, error=0.055)
    assert got == {"marked": ["a", "b"], "best_marked": True, "regret_after_measuring": 0.0}


def test_marked_set_reports_what_measuring_it_leaves_when_the_best_is_outside():
    ran = [_row("a", 100.0, 110.0), _row("b", 104.0, 108.0), _row("c", 110.0, 100.0)]
    got = ls.marked_undecided(ran, error=0.055)
    assert got["marked"] == ["a", "b"] and got["best_marked"] is False
    assert abs(got["regret_after_measuring"] - 0.08) < 1e-12


def test_marked_set_skips_layouts_estimated_not_to_fit_and_compares_per_token():
    # d is estimated fastest but not to fit: never marked, though it ran and measured best. e ran 990 tokens where
    # f ran 1000: per token e is estimated 0.1 s and f 0.104 s, so only e lies within 2%.
    ran = [_row("d", 50.0, 80.0, fits=False), _row("e", 99.0, 99.0, tokens=990), _row("f", 104.0, 103.0)]
    got = ls.marked_undecided(ran, error=0.02)
    assert got["marked"] == ["e"] and got["best_marked"] is False
    assert abs(got["regret_after_measuring"] - (0.1 / 0.08 - 1.0)) < 1e-12


def test_sweep_pick_summary_counts_applicable_and_measured_picks():
    sweeps = {"a": {"applicable": False, "why": "outside"},
              "b": {"applicable": True, "pick": "tp4 pp12 mb2", "regret": 0.0},
              "c": {"applicable": True, "pick": "tp4 pp3 mb2", "regret": None, "why": "the sweep's pick was not measured"},
              "d": {"applicable": True, "pick": "tp8 pp6 mb4", "regret": 0.06}}
    got = ls.sweep_pick_summary(sweeps)
    assert got == {"groups": 4, "applicable": 3, "measured": 2, "mean_regret": 0.03, "max_regret": 0.06}
    assert ls.sweep_pick_summary({"a": {"applicable": False}}) == {
        "groups": 1, "applicable": 0, "measured": 0, "mean_regret": None, "max_regret": None}
