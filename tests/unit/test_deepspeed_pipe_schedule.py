"""DeepSpeed's PipelineEngine runs TrainSchedule (deepspeed/runtime/pipe/schedule.py): 2(m + p - 1) steps, even
and odd stages alternating forward and backward, each step opening with a blocking send/recv pair between two
neighbours. Replayed step by step from DeepSpeed's own schedule objects (a stage's step starts once it and the
neighbour it exchanges with have finished their previous step), its makespan is the one the estimator charges
(pipeline_stages.flush_s with bubble_fraction "1f1b": the heaviest stage's forward + backward x m, plus one pass
through each other stage for the fill and drain)."""
from __future__ import annotations

import random

import pytest

from dstoolkit.estimate import cluster_model as cm
from dstoolkit.estimate import pipeline_stages as ps


def _makespan(p: int, m: int, fwd: list[float], bwd: list[float]) -> float:
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    steps = [list(TrainSchedule(micro_batches=m, stages=p, stage_id=s).steps()) for s in range(p)]
    end = [0.0] * p
    for t in range(len(steps[0])):
        new = list(end)
        for s in range(p):
            partner, work = None, 0.0
            for cmd in steps[s][t]:
                name = type(cmd).__name__
                if name in ("SendGrad", "RecvActivation"):
                    partner = s - 1
                elif name in ("RecvGrad", "SendActivation"):
                    partner = s + 1
                elif name == "ForwardPass":
                    work = fwd[s]
                elif name == "BackwardPass":
                    work = bwd[s]
            new[s] = (end[s] if partner is None else max(end[s], end[partner])) + work
        end = new
    return max(end)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 32), (12, 128), (35, 48)])
def test_equal_stages_take_the_1f1b_makespan(p, m):
    # full recompute: backward = recomputed forward + 2 x forward
    ds = _makespan(p, m, [1.0] * p, [3.0] * p)
    assert ds == pytest.approx(4.0 * m * (1.0 + ps.bubble_fraction("1f1b", p, m)))


@pytest.mark.parametrize("p,m,extra", [(6, 64, 0.3), (12, 128, 0.18), (32, 96, 0.085), (4, 8, 0.3)])
def test_a_heavier_last_stage_sets_the_pace_and_the_others_fill_and_drain(p, m, extra):
    # the output layer on the last stage makes it the heaviest: it runs all m micro batches back to back, and the
    # fill and drain pass once through each of the other p - 1 stages, not at the heaviest stage's pace
    fwd, bwd = [1.0] * p, [3.0] * p
    fwd[-1], bwd[-1] = 1.0 + extra, 3.0 * (1.0 + extra)
    ds = _makespan(p, m, fwd, bwd)
    stage = [f + b for f, b in zip(fwd, bwd)]
    assert ps.flush_s(stage, m, ps.bubble_fraction("1f1b", p, m)) == pytest.approx(ds)
    assert ds == pytest.approx(4.0 * (1.0 + extra) * m + 4.0 * (p - 1))


def test_uneven_stages_are_charged_between_the_makespan_and_the_heaviest_stage_throughout():
    # any stage may be the heaviest: the charge never undercuts DeepSpeed's makespan, and never exceeds charging
    # the heaviest stage's pace for the fill and drain as well
    rng = random.Random(7)
    for _ in range(60):
        p = rng.choice([2, 3, 4, 6, 8, 12])
        m = rng.choice([p, 2 * p, 32])
        fwd = [1.0 + 0.5 * rng.random() for _ in range(p)]
        bwd = [rng.uniform(2.0, 3.2) * f for f in fwd]
        stage = [f + b for f, b in zip(fwd, bwd)]
        charged = ps.flush_s(stage, m, ps.bubble_fraction("1f1b", p, m))
        assert _makespan(p, m, fwd, bwd) <= charged * (1 + 1e-9)
        assert charged <= max(stage) * (m + p - 1) * (1 + 1e-9)
