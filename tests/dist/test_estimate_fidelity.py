"""Estimate vs real DeepSpeed engines on 2 gloo ranks (benchmarks/memory_fidelity.py --grid quick).

One torchrun launch runs a few cells (ZeRO-2 bf16 with activations, ZeRO-3, ZeRO-1 fp32 with CPU optimizer
offload, full recompute at stage 0 bf16, MoE ep=2 at ZeRO-2); each rank counts the real bytes of its parameter,
gradient and optimizer-state tensors inside the inner optimizer step, and the saved-for-backward bytes of one
forward. The full grid and its table live in benchmarks/results/memory_fidelity_*.
"""
import importlib.util
import math

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # one 2-rank launch, ~60 s on 2 quiet cores


def _bench(repo_root):
    spec = importlib.util.spec_from_file_location("memory_fidelity", repo_root / "benchmarks" / "memory_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(600)
def test_model_states_and_activations_match_real_deepspeed(repo_root, tmp_path):
    bench = _bench(repo_root)
    recs = bench.launch(bench.grid("quick"), tmp_path, timeout_s=540)
    summary = bench.summarize(recs)
    assert not summary["failed"], summary["failed"]
    rows = summary["rows"]
    assert {r["rank"] for r in rows} == {0, 1}
    assert len({r["cell"] for r in rows}) == len(bench.grid("quick"))
    for r in rows:
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"]), r["cell"]
        assert abs(r["err_total"]) <= bench.MODEL_STATE_GOAL, (r["cell"], r["rank"], r["err_total"])
        if "err_activations" in r:
            assert abs(r["err_activations"]) <= bench.ACTIVATION_GOAL, (r["cell"], r["err_activations"])
    # the cells really exercised different DeepSpeed classes
    classes = {r["optimizer_class"] for r in rows}
    assert {"DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3", "FP16_UnfusedOptimizer"} <= classes
    assert any("err_activations" in r for r in rows)
