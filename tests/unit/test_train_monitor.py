"""Monitor: bottleneck flags with evidence, MFU per docs/anchors.md, DeepSpeed monitor events."""
import pathlib

import pytest

from dstoolkit.runtime.train.monitor import Monitor, StepSample, _slope


class Recorder:
    enabled = True

    def __init__(self):
        self.events = []

    def write_events(self, ev):
        self.events.extend(ev)


def _feed(mon, n, **kw):
    base = dict(step_time_s=0.1, input_wait_s=0.0, tokens=1000, loss=2.0, cpu_time_s=0.1, comm_time_s=None)
    base.update(kw)
    out = None
    for i in range(n):
        out = mon.record(StepSample(step=i + 1, **base)) or out
    return out


def test_input_bound_flag_with_evidence():
    rep = _feed(Monitor(4, flops_per_token=None, peak_flops=None), 4, input_wait_s=0.05, cpu_time_s=0.05)
    assert [f.name for f in rep.flags] == ["input-bound"]
    assert "50%" in rep.flags[0].evidence and rep.input_wait_share == pytest.approx(0.5)


def test_comm_bound_flag():
    rep = _feed(Monitor(2, flops_per_token=None, peak_flops=None), 2, comm_time_s=0.06)
    assert [f.name for f in rep.flags] == ["comm-bound"] and rep.comm_share == pytest.approx(0.6)


def test_idle_flag_only_when_unexplained():
    rep = _feed(Monitor(2, flops_per_token=None, peak_flops=None), 2, cpu_time_s=0.02)
    assert [f.name for f in rep.flags] == ["idle-compute"]
    rep = _feed(Monitor(2, flops_per_token=None, peak_flops=None), 2, cpu_time_s=0.09)
    assert rep.flags == []


def test_mfu_is_tokens_per_s_times_flops_over_peak():
    # docs/anchors.md: MFU = tokens/s x FLOPs per token / peak; 10,000 tok/s x 6e6 / (2 ranks x 1e11) = 0.3
    rep = _feed(Monitor(1, flops_per_token=6e6, peak_flops=1e11, world_size=2), 1)
    assert rep.tokens_per_s == pytest.approx(10_000) and rep.mfu == pytest.approx(0.3)


def test_reports_every_n_and_writes_ds_events_and_line():
    rec = Recorder()
    mon = Monitor(3, flops_per_token=None, peak_flops=None, ds_monitor=rec)
    assert _feed(mon, 2) is None
    rep = _feed(mon, 1, input_wait_s=0.09)
    assert rep is not None and rep.steps == 3
    names = {e[0] for e in rec.events}
    assert {"Monitor/tokens_per_s", "Monitor/input_wait_share", "Monitor/flag_input-bound"} <= names
    assert "tok/s" in rep.line() and "MFU n/a" in rep.line()


def test_loss_trend_slope():
    assert _slope([3.0, 2.5, 2.0, 1.5]) == pytest.approx(-0.5)
    assert _slope([1.0]) == 0.0


def test_mfu_never_exceeds_one_a_beaten_peak_is_flagged_and_raised():
    # 10,000 tok/s x 6e6 FLOPs / 2 ranks = 3e10 FLOP/s per rank, above the given 1e10 peak
    mon = Monitor(1, flops_per_token=6e6, peak_flops=1e10, peak_label="probe", world_size=2)
    rep = _feed(mon, 1)
    assert rep.mfu == pytest.approx(1.0) and [f.name for f in rep.flags] == ["above-peak"]
    assert "30.0 GFLOP/s per rank > the peak 10.0 GFLOP/s (probe)" in rep.flags[0].evidence
    assert rep.peak_flops_per_rank == pytest.approx(3e10)
    slower = _feed(mon, 1, step_time_s=0.2)  # half the rate against the raised peak, no new flag
    assert slower.mfu == pytest.approx(0.5) and slower.flags == []
    assert "MFU 50.00% of 30.0 GFLOP/s" in slower.line()


def test_monitor_peak_is_the_estimators_peak(tmp_path, monkeypatch):
    """The trainer's MFU divides by `hardware.calibration.peak_flops_per_rank` of the same calibration the
    estimator reads (here a named file with a GEMM peak), and falls back to the table's row without one."""
    import json

    from dstoolkit.hardware.calibration import load_calibration, peak_flops_per_rank
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runtime.train.builders import monitor_peak
    from dstoolkit.spec import load_spec

    raw = {"matmul_flops_per_s_bf16": 3e10, "gemm_peak_flops_per_s_bf16": 9e10, "mem_bw_bytes_per_s": 5e9,
           "comm_busbw_bytes_per_s": 1e9}
    (tmp_path / "cal.json").write_text(json.dumps(raw))
    spec_text = (pathlib.Path(__file__).resolve().parents[2] / "ds_configs" / "tiny_cpu.yaml").read_text()
    (tmp_path / "spec.yaml").write_text(spec_text)
    spec = load_spec(tmp_path / "spec.yaml")
    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", str(tmp_path / "cal.json"))
    assert monitor_peak(spec, False, "bf16") == (9e10, "measured bf16 GEMM peak of the calibration")
    assert monitor_peak(spec, False, "bf16") == peak_flops_per_rank(
        get_gpu("cpu"), "bf16", load_calibration(tmp_path / "cal.json", "bf16"))
    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", "none")
    assert monitor_peak(spec, False, "bf16") == (get_gpu("cpu").peak_bf16_flops, "cpu bf16 peak (hardware table)")


def test_monitor_peak_on_cpu_ranks_is_the_cpu_row_even_for_a_gpu_spec(monkeypatch):
    """A strategy generated for H100s and run here shrunk: its ranks run on this CPU, so MFU divides by the
    CPU's peak, not the H100's 989 TFLOP/s."""
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runtime.train.builders import monitor_peak
    from dstoolkit.spec import load_spec

    spec = load_spec(pathlib.Path(__file__).resolve().parents[2] / "ds_configs" / "llama3_8b_1x8_h100.yaml")
    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", "none")
    assert monitor_peak(spec, False, "bf16") == (get_gpu("cpu").peak_bf16_flops, "cpu bf16 peak (hardware table)")
    assert monitor_peak(spec, True, "bf16")[0] == get_gpu("H100-SXM").peak_bf16_flops
