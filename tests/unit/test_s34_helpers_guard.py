"""Guard / BatchRamp / the cross-rank view in a user's own loop, on a fake engine that counts like DeepSpeed 0.19.8
(the window closes when (micro_steps + 1) % gas == 0; set_train_batch_size leaves micro_steps alone; a ZeRO-0 fp32
engine reports no grad norm and its step empties the .grads; save_checkpoint copies zero_to_fp32.py into the folder
it saves to). Findings of the s34 helpers report: 1 grad norm at ZeRO-0 fp32, 2 writer lock, 3 ramp window,
4 checkpoint settings without checkpoint_dir / final save, 5 strict JSON, input wait, .staging debris."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.runtime.train.crossrank import RankWindow, StepWindows, diagnose  # noqa: E402
from dstoolkit.runtime.train.guard import CheckpointDirError, Guard  # noqa: E402
from dstoolkit.runtime.train.ramp import BatchRamp  # noqa: E402
from dstoolkit.runtime.train.spike import SettingError, SpikeGuardConfig  # noqa: E402
from dstoolkit.runtime.train.writer_lock import WRITER_LOCK  # noqa: E402


class Opt:
    """A torch-like optimizer without `_global_grad_norm` (DeepSpeed then reports None: engine._take_model_step)."""

    def __init__(self):
        self.param_groups = [{"lr": 0.1}]


class DSFake:
    def __init__(self, gas=1, module=None, norm=None, optimizer=None, grad_at=None):
        self.gas, self.micro_steps, self.global_steps = gas, 0, 0
        self.module, self.norm, self.optimizer, self.device = module, norm, optimizer or Opt(), None
        self.grad_at = grad_at or (lambda n: 1.0)  # value of every .grad for the n-th backward
        self.windows, self._open, self._n = [], 0, 0

    def gradient_accumulation_steps(self):
        return self.gas

    def train_batch_size(self):
        return 2 * self.gas

    def set_train_batch_size(self, gb):
        self.gas = gb // 2

    def is_gradient_accumulation_boundary(self):
        return (self.micro_steps + 1) % self.gas == 0

    def backward(self, loss):
        self._open += 1
        if self.module is not None:
            for p in self.module.parameters():
                p.grad = torch.full_like(p, self.grad_at(self._n))
        self._n += 1

    def step(self):
        if self.is_gradient_accumulation_boundary():
            self.global_steps += 1
            self.windows.append(self._open)
            self._open = 0
            if self.module is not None:
                for p in self.module.parameters():
                    p.grad = None  # DeepSpeed's zero_grad after the step
        self.micro_steps += 1

    def get_global_grad_norm(self):
        return self.norm

    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        os.makedirs(os.path.join(d, tag), exist_ok=True)
        torch.save({"gs": self.global_steps, "cs": client_state}, os.path.join(d, tag, "mp_rank_00_model_states.pt"))
        with open(os.path.join(d, "zero_to_fp32.py"), "w") as f:  # DeepSpeed: _copy_recovery_script(save_path)
            f.write("# recovery\n")

    def load_checkpoint(self, root, tag):
        p = os.path.join(root, tag, "mp_rank_00_model_states.pt")
        s = torch.load(p, weights_only=False)
        self.global_steps = s["gs"]
        return p, s["cs"]


def _quiet(**kw):
    return dict(monitor_every=0, log=lambda m: None, **kw)


def _train(g, steps, loss=lambda pos: 1.0):
    while g.step_count < steps:
        g.step(torch.tensor(loss(g.data_pos)))


# 1. ZeRO-0 fp32: DeepSpeed gives no norm -------------------------------------------------------------------------
def test_grad_norm_measured_before_the_step_when_the_engine_reports_none():
    # was: grad_norm None on every step, and a NaN gradient (position 3, step 4) was never judged
    e = DSFake(module=torch.nn.Linear(2, 2), grad_at=lambda n: math.nan if n == 3 else 0.5)
    g = Guard(e, **_quiet())
    _train(g, 5)
    (spike,) = [s for s in g.events if s["event"] == "spike"]
    assert (spike["kind"], spike["step"], spike["action"], spike["data_pos"]) == (
        "nonfinite_grad_norm", 4, "rollback", 3)
    (unavail,) = [s for s in g.events if s["event"] == "rollback_unavailable"]
    assert unavail["kind"] == "nonfinite_grad_norm"


def test_grad_norm_value_is_the_2_norm_of_the_grads(tmp_path):
    e = DSFake(module=torch.nn.Linear(2, 2), grad_at=lambda n: 0.5)  # 6 grads of 0.5: norm sqrt(6 * 0.25)
    g = Guard(e, **_quiet(metrics_path=str(tmp_path / "m.jsonl")))
    _train(g, 2)
    g.close()
    rows = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["grad_norm"] for r in rows if "event" not in r] == [pytest.approx(math.sqrt(1.5))] * 2
    assert not [r for r in rows if r.get("event") == "grad_norm_off"]


def test_no_norm_anywhere_is_said_once():
    opt = Opt()
    opt._global_grad_norm = None  # ZeRO-1/2 with compute_grad_norm false: the engine copies None
    lines = []
    g = Guard(DSFake(optimizer=opt), monitor_every=0, log=lines.append)
    _train(g, 3)
    assert len([e for e in g.events if e["event"] == "grad_norm_off"]) == 1
    assert [m for m in lines if m.startswith("grad-norm detection is off")] and len(lines) == 1


def test_checkpoint_with_nonfinite_weights_is_not_healthy(tmp_path):
    m = torch.nn.Linear(2, 2)
    e = DSFake(module=m)
    g = Guard(e, **_quiet(checkpoint_dir=str(tmp_path / "ck")))
    _train(g, 1)
    with torch.no_grad():
        m.weight[0, 0] = math.nan
    g.save()
    ck = [x for x in g.events if x["event"] == "checkpoint"]
    assert [c["healthy"] for c in ck] == [False]
    manifest = json.loads((tmp_path / "ck" / "step_00000001" / "dstoolkit_manifest.json").read_text())
    assert manifest["healthy"] is False


# 2. writer lock ---------------------------------------------------------------------------------------------------
def test_guard_holds_the_writer_lock_and_gives_it_back(tmp_path):
    ck = tmp_path / "ck"
    with Guard(DSFake(), **_quiet(checkpoint_dir=str(ck))) as g:
        held = json.loads((ck / WRITER_LOCK).read_text())
        assert (held["pid"], held["host"]) == (os.getpid(), socket.gethostname())
        g2 = Guard(DSFake(), **_quiet(checkpoint_dir=str(ck)))  # the same process again: shares it
        g2.resume()
        g2.close()
        assert (ck / WRITER_LOCK).exists()
        g.resume()
        _train(g, 1)
    assert not (ck / WRITER_LOCK).exists()


def test_a_folder_another_live_run_writes_is_refused(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        try:
            import psutil

            start = psutil.Process(other.pid).create_time()
        except ImportError:
            start = None
        (ck / WRITER_LOCK).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname(),
                                                  "process_start": start, "taken": time.time()}))
        with pytest.raises(CheckpointDirError) as e:
            Guard(DSFake(), **_quiet(checkpoint_dir=str(ck)))
        assert str(e.value).startswith(f"checkpoint_dir {ck}: another run is writing checkpoints there "
                                       f"(pid {other.pid} on host {socket.gethostname()}")
        assert f"kill {other.pid}" in str(e.value)
    finally:
        other.kill()
        other.wait()


# 3. batch ramp ----------------------------------------------------------------------------------------------------
def test_ramp_apply_starts_the_new_window_with_the_next_micro_batch():
    ramp = BatchRamp(start_batch=2, end_batch=6, increment=2, ramp_samples=12, micro_batch=2, dp_size=1)
    e = DSFake(gas=1)
    consumed = 0
    while e.global_steps < 8:
        ramp.apply(e, consumed)
        before = e.global_steps
        while e.global_steps == before:
            e.backward(None)
            e.step()
        consumed += e.train_batch_size()
    assert e.windows == [ramp.batch_at(c) // 2 for c in _consumed(ramp, 8)]
    assert sorted(set(e.windows)) == [1, 2, 3]


def _consumed(ramp, steps):
    out, c = [], 0
    for _ in range(steps):
        out.append(c)
        c += ramp.batch_at(c)
    return out


def test_guard_step_realigns_after_set_train_batch_size():
    e = DSFake(gas=1)
    g = Guard(e, **_quiet())
    _train(g, 3)
    e.set_train_batch_size(4)  # gas 2 with micro_steps at 3: DeepSpeed would close after 1 micro-batch
    _train(g, 5)
    assert e.windows == [1, 1, 1, 2, 2]
    assert g.data_pos == 7


# 4. checkpoint settings without a folder; the final save -------------------------------------------------------
def test_save_every_without_checkpoint_dir_is_refused():
    with pytest.raises(SettingError) as e:
        Guard(DSFake(), **_quiet(save_every=5))
    assert str(e.value) == (
        "Guard: checkpoint_dir=None but save_every=5 needs checkpoint_dir: without one no checkpoint is ever saved, "
        "so every rollback finds no target and a resume nothing to load; give checkpoint_dir, or drop it")


def test_rollback_actions_without_checkpoint_dir_are_refused():
    cfg = SpikeGuardConfig(on_loss_spike="rollback", on_nonfinite="rollback")
    with pytest.raises(SettingError, match=r"on_loss_spike='rollback' / on_nonfinite='rollback' need "
                                           r"checkpoint_dir: .*give checkpoint_dir, or drop them$"):
        Guard(DSFake(), config=cfg, **_quiet())
    Guard(DSFake(), **_quiet())  # the default escalation to a rollback is no explicit action: accepted


@pytest.mark.parametrize("every,steps,saved", [(0, 3, [3]), (2, 4, [2, 4]), (2, 5, [2, 4, 5])])
def test_with_guard_saves_the_last_step_once(tmp_path, every, steps, saved):
    with Guard(DSFake(), **_quiet(checkpoint_dir=str(tmp_path / "ck"), save_every=every)) as g:
        g.resume()
        _train(g, steps)
    assert [x["step"] for x in g.events if x["event"] == "checkpoint"] == saved
    assert (tmp_path / "ck" / f"step_{steps:08d}").is_dir()


# 5. strict JSON, input wait, .staging ----------------------------------------------------------------------------
def test_guard_metrics_are_strict_json(tmp_path):
    path = tmp_path / "m.jsonl"
    g = Guard(DSFake(), **_quiet(metrics_path=str(path)))
    g.step(torch.tensor(math.nan))
    g.close()

    def refuse(c):
        raise ValueError(c)

    rows = [json.loads(x, parse_constant=refuse) for x in path.read_text().splitlines()]
    (spike,) = [r for r in rows if r.get("event") == "spike"]
    assert (spike["kind"], spike["value"]) == ("nonfinite_loss", None)


def _rank(rank, compute, inp=0.0, comm=0.01):
    return RankWindow(rank=rank, node=0, host="h0", step_s=compute + comm + inp, compute_s=compute, comm_s=comm,
                      input_s=inp, mem_bytes=0.0)


def test_unmeasured_input_is_not_printed_as_zero_ms():
    ranks = [_rank(0, 0.004, comm=0.3), _rank(1, 0.305), _rank(2, 0.004, comm=0.3)]
    b = diagnose(ranks, input_measured=False)
    assert b.kind == "compute" and not b.input_measured
    assert "input wait not measured (counted as compute)" in b.evidence and "input 0 ms" not in b.evidence
    assert "compute-bound rank (its host's other ranks are not slow) or its input (input wait not measured" in b.line(4)
    measured = diagnose(ranks)
    assert "input 0 ms" in measured.evidence and "not measured" not in measured.line(4)


def test_step_windows_record_whether_input_was_measured():
    w = StepWindows(2)
    assert [w.step(s, 0.1) for s in (1, 2)][1] is None
    assert w.step(3, 0.1)["input_measured"] is False
    w.step(4, 0.1, 0.02)
    assert w.step(5, 0.1, 0.03)["input_measured"] is True
    w.step(6, 0.1, 0.02)
    assert w.step(7, 0.1)["input_measured"] is False


def test_guard_step_checks_input_wait():
    g = Guard(DSFake(), **_quiet())
    with pytest.raises(SettingError, match=r"^Guard.step: input_wait_s=-1 must be a finite number of seconds >= 0"):
        g.step(torch.tensor(1.0), input_wait_s=-1)
    assert g.step(torch.tensor(1.0), input_wait_s=0.25) == "trained"


def test_killed_save_debris_is_removed_and_recovery_script_sits_at_the_root(tmp_path):
    ck = tmp_path / "ck"
    (ck / ".staging" / "step_00000004").mkdir(parents=True)
    (ck / ".staging" / "step_00000004" / "mp_rank_00_model_states.pt").write_bytes(b"\0" * 1000)
    g = Guard(DSFake(), **_quiet(checkpoint_dir=str(ck)))
    assert not (ck / ".staging").exists()
    g.resume()
    _train(g, 1)
    g.save()
    assert sorted(p.name for p in ck.iterdir()) == sorted(["latest", "step_00000001", WRITER_LOCK,
                                                            "zero_to_fp32.py"])
    g.close()


def test_step_with_norm_only_at_the_boundary_and_prefers_the_engines_norm():
    from dstoolkit.runtime.train.gradnorm import step_with_norm

    e = DSFake(gas=2, module=torch.nn.Linear(1, 1), grad_at=lambda n: 2.0)  # 2 grads of 2.0: norm sqrt(8)
    e.backward(None)
    assert step_with_norm(e) is None  # inside accumulation: no optimizer step
    e.backward(None)
    assert step_with_norm(e) == pytest.approx(math.sqrt(8.0))
    opt = Opt()
    opt._global_grad_norm = 0.5
    e2 = DSFake(module=torch.nn.Linear(1, 1), norm=0.5, optimizer=opt)
    e2.backward(None)
    assert step_with_norm(e2) == 0.5


# s34 review mends: (3) a Guard whose constructor failed after taking the writer lock kept the folder locked for the
# life of the process; (4) leaving `with Guard(...)` saved a checkpoint although the Guard never stepped
def test_a_guard_that_fails_to_start_gives_the_lock_back(tmp_path):
    ck = tmp_path / "ck"
    under_a_file = tmp_path / "f.txt"
    under_a_file.write_text("x")
    with pytest.raises(Exception):
        Guard(DSFake(), **_quiet(checkpoint_dir=str(ck), metrics_path=str(under_a_file / "m.jsonl")))
    assert not (ck / WRITER_LOCK).exists()


def test_leaving_a_guard_that_never_stepped_saves_nothing(tmp_path):
    ck = tmp_path / "ck"
    eng = DSFake()
    eng.global_steps = 5
    with Guard(eng, **_quiet(checkpoint_dir=str(ck))):
        pass
    assert sorted(p.name for p in ck.iterdir()) == []
    with Guard(eng, **_quiet(checkpoint_dir=str(ck))) as g:  # one step after it: that step is saved on exit
        _train(g, 6)
    assert any(p.name.startswith("step_") for p in ck.iterdir())
