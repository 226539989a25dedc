"""benchmarks/pipeline_memory.py scoring: each rank's measured peak against its own stage's estimated timeline
(rank 0 the first stage, rank 1 the last; no stage without a pipeline), on hand-made records."""
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import pipeline_memory as pm  # noqa: E402


def test_each_rank_is_scored_against_its_stage():
    from dstoolkit.estimate.core import stage_timelines
    from dstoolkit.estimate.memory import deepspeed_model_states
    from dstoolkit.estimate.param_groups import fp8_weight_cache_bytes

    cell, flat = pm.CELLS[-1], pm.CELLS[0]
    assert cell["pp"] == 2 and flat["pp"] == 1
    plan = pm.plan_for(cell)
    tls = stage_timelines(plan, deepspeed_model_states(plan), fp8_weight_cache_bytes(plan))
    first_peak, last_peak = tls["first"][1].peak_bytes * 2, tls["last"][1].peak_bytes
    # rank 0 peaked in its optimizer step, rank 1 in a backward pass with ReduceGrads within the tie
    recs = [dict(cell=cell, rank=0, ok=True, stage=0, peak_bytes=first_peak, losses=[], peak_phase="OptimizerStep",
                 phase_max_bytes={"OptimizerStep": first_peak, "BackwardPass": first_peak // 2}),
            dict(cell=cell, rank=1, ok=True, stage=1, peak_bytes=last_peak, losses=[], peak_phase="BackwardPass",
                 phase_max_bytes={"BackwardPass": last_peak, "ReduceGrads": last_peak - 1}),
            dict(cell=flat, rank=0, ok=False, error="RuntimeError: x")]
    rows = pm.score(recs)
    first = next(r for r in rows if r.get("stage") == "first")
    last = next(r for r in rows if r.get("stage") == "last")
    assert first["error"] == -0.5 and last["error"] == 0.0
    assert first["measured_phases"] == ["OptimizerStep"]
    assert last["measured_phases"] == ["BackwardPass", "ReduceGrads"]
    # each row agrees when the estimate's peak phase falls in one of its measured peak instructions
    for r in (first, last):
        assert r["phase_agrees"] == (pm.measured_phase_of(r["estimated_phase"], True) in r["measured_phases"])
    assert pm.measured_phase_of("backward_end", True) == "ReduceGrads"
    assert pm.measured_phase_of("backward_end", False) == "BackwardPass"
    assert pm.measured_phase_of("optimizer_step_cast", True) == "OptimizerStep"
    assert next(r for r in rows if not r["ok"])["error"] == "RuntimeError: x"
    text = pm.render(rows, "2026-12-05")
    assert "Worst |error| 50.0%" in text and "FAILED" in text
