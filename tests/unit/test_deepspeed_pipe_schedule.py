"""DeepSpeed's PipelineEngine runs TrainSchedule (deepspeed/runtime/pipe/schedule.py): 2(m + p - 1) steps, even
and odd stages alternating forward and backward, each step opening with a blocking send/recv pair between two
neighbours. Replayed step by step from DeepSpeed's own schedule objects (a stage's step starts once it and the
neighbour it exchanges with have finished their previous step), its makespan is the one the estimator charges
(pipeline_stages.bubble_fraction "1f1b": the heaviest stage's forward + backward x (m + p - 1))."""
from __future__ import annotations

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


@pytest.mark.parametrize("p,m", [(6, 64), (12, 128)])
def test_a_heavier_last_stage_sets_the_pace(p, m):
    # the output layer on the last stage: it is the heaviest, and the makespan stays within 3% below the
    # estimator's heaviest-stage x (m + p - 1) (the other stages' shorter fill and drain)
    fwd, bwd = [1.0] * p, [3.0] * p
    fwd[-1], bwd[-1] = 1.3, 3.9
    ds = _makespan(p, m, fwd, bwd)
    charged = 5.2 * m * (1.0 + ps.bubble_fraction("1f1b", p, m))
    assert 0.97 * charged <= ds <= charged
