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
    recs = [dict(cell=cell, rank=0, ok=True, stage=0, peak_bytes=tls["first"][1].peak_bytes * 2, losses=[]),
            dict(cell=cell, rank=1, ok=True, stage=1, peak_bytes=tls["last"][1].peak_bytes, losses=[]),
            dict(cell=flat, rank=0, ok=False, error="RuntimeError: x")]
    rows = pm.score(recs)
    first = next(r for r in rows if r.get("stage") == "first")
    last = next(r for r in rows if r.get("stage") == "last")
    assert first["error"] == -0.5 and last["error"] == 0.0
    assert next(r for r in rows if not r["ok"])["error"] == "RuntimeError: x"
    text = pm.render(rows, "2026-12-05")
    assert "Worst |error| 50.0%" in text and "FAILED" in text
