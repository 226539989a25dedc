"""This machine's CPU calibration: probed once per machine key, cached, reused; the packaged reference only
when asked for or when nothing can probe (no torch)."""
from __future__ import annotations

import json
import shutil

import pytest

from dstoolkit.hardware import calibration as cal
from dstoolkit.hardware import machine_calibration as machine


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DSTOOLKIT_CALIBRATION", raising=False)
    return tmp_path / "cache" / "calibration"


class FakeProbe:
    """Writes the packaged reference's rates as if measured; counts calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, out, key):
        self.calls.append(dict(key))
        shutil.copy(cal.PACKAGED["cpu"], out)


KEY = {"cpu": "Test CPU", "flags": ["avx2"], "cores": 2, "torch": "2.13.0", "ranks": 2}


def test_second_run_does_not_probe_again(cache):
    probe, said = FakeProbe(), []
    first = machine.machine_calibration_path(KEY, probe=probe, announce=said.append)
    second = machine.machine_calibration_path(KEY, probe=probe, announce=said.append)
    assert first == second and first.parent == cache and first.is_file()
    assert len(probe.calls) == 1 and "calibrating this CPU once (Test CPU, 2 cores, torch 2.13.0)" in said[0]


@pytest.mark.parametrize("change", [{"torch": "2.14.0"}, {"cpu": "Other CPU"}, {"cores": 4},
                                    {"flags": ["avx2", "avx512_bf16"]}])
def test_another_cpu_or_torch_probes_again(cache, change):
    probe = FakeProbe()
    a = machine.machine_calibration_path(KEY, probe=probe, announce=lambda m: None)
    b = machine.machine_calibration_path({**KEY, **change}, probe=probe, announce=lambda m: None)
    assert a != b and len(probe.calls) == 2


def test_without_torch_the_reference_is_used_and_said(cache, monkeypatch):
    said = []
    assert machine.machine_calibration_path({**KEY, "torch": None}, announce=said.append) is None
    assert "torch is not installed" in said[0] and "packaged reference" in said[0]
    assert not cache.exists()
    # what an estimate then uses: the packaged reference, by its package path
    monkeypatch.setattr(machine, "machine_key", lambda ranks=machine.PROBE_RANKS: {**KEY, "torch": None})
    monkeypatch.setattr(machine.importlib.util, "find_spec", lambda name: None)
    assert cal.calibration_path("machine", "cpu") == cal.PACKAGED["cpu"]
    assert cal.path_label(cal.PACKAGED["cpu"]) == "reference calibration dstoolkit/data/calibration_cpu_reference.json"


def test_default_for_cpu_is_this_machine(cache, monkeypatch):
    seeded = cache / f"cpu-{machine._key_digest(machine.machine_key())}.json"
    seeded.parent.mkdir(parents=True)
    shutil.copy(cal.PACKAGED["cpu"], seeded)
    assert cal.calibration_path(None, "cpu") == seeded
    assert cal.path_label(seeded).startswith("this machine's calibration ")
    # explicit words and the environment variable take precedence
    assert cal.calibration_path("reference", "cpu") == cal.PACKAGED["cpu"]
    assert cal.calibration_path("none", "cpu") is None
    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", "reference")
    assert cal.calibration_path(None, "cpu") == cal.PACKAGED["cpu"]
    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", "none")
    assert cal.calibration_path(None, "cpu") is None


def test_gpu_rows_get_no_default_calibration(cache):
    assert cal.calibration_path(None, "H100-SXM") is None
    with pytest.raises(cal.CalibrationInputError, match="'machine' probes this machine's CPU"):
        cal.calibration_path("machine", "H100-SXM")  # asked for by name: refused, not ignored


def test_machine_key_names_what_rates_depend_on():
    key = machine.machine_key()
    assert set(key) == {"cpu", "flags", "cores", "torch", "ranks", "probe"} and key["cores"] >= 1 and key["ranks"] == 2
    assert key["probe"] == machine.PROBE_VERSION  # a calibration from an older probe is probed again
    json.dumps(key)  # recorded in the probe's file


def test_cached_lookup_never_probes(cache, monkeypatch):
    assert machine.cached_machine_calibration_path(KEY) is None
    path = machine.machine_calibration_path(KEY, probe=lambda out, key: out.write_text("{}"), announce=lambda m: None)
    assert machine.cached_machine_calibration_path(KEY) == path
    monkeypatch.setattr(machine, "machine_calibration_path", lambda *a, **k: pytest.fail("probed"))
    assert cal.calibration_path("machine", "cpu", probe=False) is None  # a training rank's question: no probe


RAW = {"matmul_flops_per_s_fp32": 50e9, "matmul_flops_per_s_fp32_large": 60e9, "matmul_flops_per_s_bf16": 2e9,
       "mem_bw_bytes_per_s": 5e9, "comm_busbw_bytes_per_s": 1e9}


def test_peak_is_the_measured_gemm_peak_and_never_below_the_block_rates():
    from dstoolkit.hardware.table import get_gpu

    c = cal.calibration_from_raw({**RAW, "gemm_peak_flops_per_s_fp32": 80e9, "gemm_peak_flops_per_s_bf16": 1e9}, "fp32")
    assert c.peak_flops_per_s == 80e9
    assert cal.peak_flops_per_rank(get_gpu("cpu"), "fp32", c) == (80e9, "measured fp32 GEMM peak of the calibration")
    # bf16: the square matmul (1 GFLOP/s) was slower than the block probe (2): the peak is the block rate
    assert cal.calibration_from_raw({**RAW, "gemm_peak_flops_per_s_bf16": 1e9}, "bf16").peak_flops_per_s == 2e9
    # no GEMM peak in the file (the packaged reference, older probes): the hardware table's, named so
    old = cal.calibration_from_raw(RAW, "fp32")
    assert old.peak_flops_per_s is None
    assert cal.peak_flops_per_rank(get_gpu("cpu"), "fp32", old) == (get_gpu("cpu").peak_bf16_flops,
                                                                     "cpu bf16 peak (hardware table)")
    h100 = get_gpu("H100-SXM")
    assert cal.peak_flops_per_rank(h100, "fp8", None)[0] == h100.peak_fp8_flops
    assert cal.peak_flops_per_rank(h100, "bf16", None)[0] == h100.peak_bf16_flops


def test_a_failed_probe_is_an_error_naming_it(cache, monkeypatch):
    def broken(out, key):
        raise machine.ProbeError("probing this machine failed (exit 1): boom")

    with pytest.raises(machine.ProbeError, match="probing this machine failed"):
        machine.machine_calibration_path(KEY, probe=broken, announce=lambda m: None)
    # an estimate asking for this machine's calibration gets the calibration input error its callers handle
    monkeypatch.setattr(machine, "machine_calibration_path", lambda *a, **k: broken(None, KEY))
    with pytest.raises(cal.CalibrationInputError, match=r"probing this machine failed \(exit 1\): boom"):
        cal.calibration_path("machine", "cpu")


def test_the_probe_subprocess_failure_names_exit_and_output(cache, monkeypatch):
    # the real subprocess path, with a command that exits 3 after printing: ProbeError with both
    class Done:
        def __init__(self, *a, **k):
            self.stdout = iter(["line one\n", "the end\n"])

        def wait(self):
            return 3

        def kill(self):  # the timeout's handle; never fired here
            raise AssertionError("killed")

    monkeypatch.setattr(machine.subprocess, "Popen", Done)
    with pytest.raises(machine.ProbeError, match=r"\(exit 3\): line one \| the end"):
        machine._probe_subprocess(cache / "out.json", KEY)


def test_test_jobs_run_fp32_exactly_where_this_cpu_has_no_native_bf16():
    """runtime.cpu_precision.precision_for_this_cpu (the cross-rank monitor's scenario job uses it): bf16 where the CPU
    has native bf16 GEMMs (avx512_bf16 / amx_bf16), fp32 where bf16 runs through aten's generic GEMM."""
    from dstoolkit.runtime.cpu_precision import precision_for_this_cpu

    native = bool({"avx512_bf16", "amx_bf16"} & set(machine.cpu_flags()))
    assert precision_for_this_cpu("bf16") == ("bf16" if native else "fp32")
    assert precision_for_this_cpu("fp32") == "fp32"


class SharedProbe:
    """Writes the packaged reference's record with its wall-clock block rate scaled to `share` of the CPU-time one
    (a probe whose ranks ran that share of the elapsed time); counts calls."""

    def __init__(self, *shares):
        self.shares = list(shares)
        self.calls = 0

    def __call__(self, out, key):
        rec = json.loads(cal.PACKAGED["cpu"].read_text())
        c = rec["calibration"]
        c["wall"][machine.SHARE_RATE] = c["cpu"][machine.SHARE_RATE] * self.shares[self.calls]
        self.calls += 1
        out.write_text(json.dumps(rec))


def _age(path, seconds):
    import os
    import time
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_a_calibration_probed_on_a_busy_machine_is_probed_again(cache):
    """A probe beside a busy test run read rates 3-16x low and stayed cached for good: the README demo's estimate
    came out 139% over its measured step. Its ranks ran 27% of the elapsed time (wall-clock over CPU-time rate), so
    it is probed again once it is REPROBE_AFTER_S old, and the less contended probe is kept."""
    said = []
    probe = SharedProbe(0.27, 1.0)
    path = machine.machine_calibration_path(KEY, probe=probe, announce=said.append)
    assert machine.cpu_share(json.loads(path.read_text())) == pytest.approx(0.27)
    assert machine.machine_calibration_path(KEY, probe=probe, announce=said.append) == path and probe.calls == 1
    _age(path, machine.REPROBE_AFTER_S + 1)
    assert machine.machine_calibration_path(KEY, probe=probe, announce=said.append) == path and probe.calls == 2
    assert "ran 27% of the time" in said[-1] and "probing again" in said[-1]
    assert machine.cpu_share(json.loads(path.read_text())) == pytest.approx(1.0)
    _age(path, machine.REPROBE_AFTER_S + 1)
    assert machine.machine_calibration_path(KEY, probe=probe, announce=said.append) == path and probe.calls == 2


def test_a_machine_that_stays_busy_keeps_the_better_probe_and_waits(cache):
    probe = SharedProbe(0.5, 0.3)
    path = machine.machine_calibration_path(KEY, probe=probe, announce=lambda m: None)
    _age(path, machine.REPROBE_AFTER_S + 1)
    machine.machine_calibration_path(KEY, probe=probe, announce=lambda m: None)
    assert probe.calls == 2 and machine.cpu_share(json.loads(path.read_text())) == pytest.approx(0.5)
    assert not list(cache.glob("*.reprobe.json"))
    machine.machine_calibration_path(KEY, probe=probe, announce=lambda m: None)  # just tried: no third probe
    assert probe.calls == 2


def test_the_packaged_reference_was_probed_on_a_quiet_machine():
    assert machine.cpu_share(json.loads(cal.PACKAGED["cpu"].read_text())) > machine.CONTENDED_CPU_SHARE
