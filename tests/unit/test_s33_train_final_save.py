"""The trainer's end of run (s33 ckpt findings 3 and 8), without a launch.

3: a run shorter than --save-every saved nothing (launch.sh's defaults: STEPS 20, SAVE_EVERY 1000), so --resume
   restarted from step 0; `Checkpoints.save_final` saves the last step once, unless it is saved already.
8: a --resume with nothing left to train wrote `"final_loss": NaN` (not JSON) into the metrics file; every
   non-finite number is written as null now. tests/dist/test_s33_train_end.py runs both for real.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

from dstoolkit.runtime.train.run_state import Checkpoints, MetricsWriter, RunState, finite_or_none


class _Mgr:
    root = "unused"

    def __init__(self):
        self.saved = []

    def save(self, engine, step, client_state, *, healthy, barrier):
        self.saved.append(step)
        return f"step_{step:08d}"


def _checkpoints(mgr):
    guard = SimpleNamespace(healthy=lambda: True, state_dict=lambda: {})
    events = []
    cp = Checkpoints(mgr, SimpleNamespace(max_rollbacks=3), None, RunState(), guard,
                     SimpleNamespace(write=events.append), lambda m: None)
    return cp, events


def test_a_run_shorter_than_save_every_saves_its_last_step():
    mgr = _Mgr()
    cp, events = _checkpoints(mgr)
    for step in (1, 2, 3):
        cp.state.step = step
        cp.maybe_save(1000, barrier=None)
    cp.save_final(barrier=None)
    assert mgr.saved == [3] and events[-1]["tag"] == "step_00000003"


def test_no_second_save_of_a_step_save_every_saved():
    mgr = _Mgr()
    cp, _ = _checkpoints(mgr)
    for step in (1, 2, 3, 4):
        cp.state.step = step
        cp.maybe_save(2, barrier=None)
    cp.save_final(barrier=None)
    assert mgr.saved == [2, 4]


def test_nothing_saved_without_a_checkpoint_dir_or_a_step():
    cp, _ = _checkpoints(None)
    cp.state.step = 3
    cp.save_final(barrier=None)  # no --checkpoint-dir: nothing to do, no error
    mgr = _Mgr()
    cp, _ = _checkpoints(mgr)
    cp.save_final(barrier=None)
    assert mgr.saved == []


def test_metrics_lines_are_strict_json(tmp_path):
    path = tmp_path / "m.jsonl"
    w = MetricsWriter(str(path), enabled=True)
    w.write({"event": "done", "steps": 6, "final_loss": float("nan"), "spike": {"loss": float("inf")},
             "losses": [1.0, float("-inf")]})
    w.close()
    line = path.read_text()
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) == {
        "event": "done", "steps": 6, "final_loss": None, "spike": {"loss": None}, "losses": [1.0, None]}
    assert finite_or_none((1.5, "x", True)) == [1.5, "x", True]
