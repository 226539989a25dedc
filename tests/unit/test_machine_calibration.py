"""This machine's CPU calibration: probed once per machine key, cached, reused; the packaged reference only
when asked for or when nothing can probe (no torch)."""
from __future__ import annotations

import json
import shutil

import pytest

from dstoolkit.hardware import calibration as cal


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
    first = cal.machine_calibration_path(KEY, probe=probe, announce=said.append)
    second = cal.machine_calibration_path(KEY, probe=probe, announce=said.append)
    assert first == second and first.parent == cache and first.is_file()
    assert len(probe.calls) == 1 and "calibrating this CPU once (Test CPU, 2 cores, torch 2.13.0)" in said[0]


@pytest.mark.parametrize("change", [{"torch": "2.14.0"}, {"cpu": "Other CPU"}, {"cores": 4},
                                    {"flags": ["avx2", "avx512_bf16"]}])
def test_another_cpu_or_torch_probes_again(cache, change):
    probe = FakeProbe()
    a = cal.machine_calibration_path(KEY, probe=probe, announce=lambda m: None)
    b = cal.machine_calibration_path({**KEY, **change}, probe=probe, announce=lambda m: None)
    assert a != b and len(probe.calls) == 2


def test_without_torch_the_reference_is_used_and_said(cache):
    said = []
    path = cal.machine_calibration_path({**KEY, "torch": None}, announce=said.append)
    assert path == cal.PACKAGED["cpu"] and "torch is not installed" in said[0]
    assert not cache.exists()


def test_default_for_cpu_is_this_machine(cache, monkeypatch):
    seeded = cache / f"cpu-{cal._key_digest(cal.machine_key())}.json"
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
    assert cal.calibration_path("machine", "H100-SXM") is None


def test_machine_key_names_what_rates_depend_on():
    key = cal.machine_key()
    assert set(key) == {"cpu", "flags", "cores", "torch", "ranks"} and key["cores"] >= 1 and key["ranks"] == 2
    json.dumps(key)  # recorded in the probe's file


def test_a_failed_probe_is_an_error_naming_it(cache, monkeypatch):
    def broken(out, key):
        raise cal.CalibrationInputError("probing this machine failed (exit 1): boom")

    with pytest.raises(cal.CalibrationInputError, match="probing this machine failed"):
        cal.machine_calibration_path(KEY, probe=broken, announce=lambda m: None)
