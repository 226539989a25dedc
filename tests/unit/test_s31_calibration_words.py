"""--calibration / cluster.calibration words a GPU row cannot use are refused, naming the row; the environment
variable's global default stays quiet for GPU rows (before: 'reference' and 'machine' on a GPU fell back to the
nominal rates without a word)."""
from __future__ import annotations

import pytest

from dstoolkit.hardware.calibration import ENV_VAR, PACKAGED, CalibrationInputError, calibration_path


def test_reference_on_a_gpu_row_is_refused_naming_it():
    with pytest.raises(CalibrationInputError, match="no packaged reference calibration for H100-SXM \\(only for cpu\\)"):
        calibration_path("reference", "H100-SXM")


def test_machine_on_a_gpu_row_is_refused_naming_it():
    with pytest.raises(CalibrationInputError, match="'machine' probes this machine's CPU, which does not time H100-SXM"):
        calibration_path("machine", "H100-SXM")


def test_reference_on_cpu_is_the_packaged_file_and_none_is_nominal():
    assert calibration_path("reference", "cpu") == PACKAGED["cpu"]
    assert calibration_path("none", "H100-SXM") is None


def test_the_environment_default_stays_quiet_on_gpu_rows(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "machine")
    assert calibration_path(None, "H100-SXM") is None
    monkeypatch.setenv(ENV_VAR, "reference")
    assert calibration_path(None, "H100-SXM") is None
