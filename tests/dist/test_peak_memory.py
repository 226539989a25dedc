"""Peak memory per rank against real DeepSpeed engines on 2 gloo ranks (benchmarks/peak_memory.py --grid quick).

One torchrun launch trains four cells for 2 steps each: the project's model at ZeRO-1 bf16 (peak inside step()
while a gradient partition is cast to fp32) and at ZeRO-3 bf16 with full recompute (parameters kept gathered
for reuse at the end of forward), and a transformers Llama (GQA, built from a config) at ZeRO-0 bf16 (peak at
the optimizer step) and at ZeRO-2 fp32 with optimizer offload (peak at the end of forward). Each rank takes a
census of live tensor storages + autograd-saved tensors at every phase point of step 2; the estimator's
timeline must agree with the measured peak within the benchmark's goal, and name the same phase.
"""
import importlib.util

import pytest

pytestmark = [pytest.mark.dist]


def _bench(repo_root):
    spec = importlib.util.spec_from_file_location("peak_memory", repo_root / "benchmarks" / "peak_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(300)
def test_estimated_peak_matches_measured_phases(repo_root, tmp_path):
    bench = _bench(repo_root)
    cells = bench.grid("quick")
    recs = bench.launch(cells, tmp_path, timeout_s=280)
    rows = bench.score(recs)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {r["rank"] for r in rows} == {0, 1} and len({r["cell"] for r in rows}) == len(cells)
    by = {(r["cell"], r["rank"]): r for r in rows}
    for r in rows:
        assert abs(r["err_peak"]) <= bench.PEAK_GOAL, (r["cell"], r["rank"], r["err_peak"], r["measured_phases"],
                                                       r["estimate_phases"])
        # the old additive total over-states every one of these cells by more than the goal
        assert r["err_sum_of_parts"] > bench.PEAK_GOAL, (r["cell"], r["err_sum_of_parts"])
    # the phase accounting, not only the maximum: where each cell peaks, measured and estimated
    expect = {"proj-z1-bf16": "optimizer_step_cast", "proj-z3-bf16-ckpt_full": "forward_end",
              "llama-z0-bf16": "optimizer_step", "llama-z2-fp32-off_optimizer": "forward_end"}
    for cell, phase in expect.items():
        r = by[(cell, 0)]
        assert r["measured_phase"] == phase, (cell, r["measured_phases"])
        assert r["estimate_phase"] == phase, (cell, r["estimate_phases"])
    # per phase, not only at the peak: the optimizer-step census is the model states (exact since issue #4)
    for r in rows:
        m, e = r["measured_phases"]["optimizer_step"], r["estimate_phases"]["optimizer_step"]
        assert abs(e - m) / m <= 0.01, (r["cell"], m, e)
