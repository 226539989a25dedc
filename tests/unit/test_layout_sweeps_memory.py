"""benchmarks/layout_sweeps.py memory check: the estimate beside the device memory a source reports per run (the
peak + allowance that `fits` tests, and the sum of parts + allowance), and which estimate puts the reported OOMs over
the device. Exact on hand-made rows."""
import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402


def _row(mem, peak, parts, oom=False):
    return {"measured_mem_gb": mem, "memory_gib": peak, "sum_of_parts_gib": parts, "allowance_gib": 1.0,
            "device_gib": 80.0, "oom": oom}


def test_ratios_errors_and_oom_counts():
    rows = [_row(30.0, 19.0, 26.0), _row(44.0, 21.0, 39.0), _row(66.0, 43.0, 65.0),
            _row(None, 70.0, 81.0, oom=True), _row(None, 74.0, 76.0, oom=True), _row(None, 82.0, 90.0, oom=True),
            _row(None, 50.0, 60.0)]  # ran, no memory reported: only in the over-device count
    out = ls.memory_check(rows)
    assert out["rows"] == 3
    # measured / (peak + 1): 1.5, 2.0, 1.5 -> median 1.5; / (parts + 1): 30/27, 44/40, 66/66
    assert math.isclose(out["peak"]["median_measured_over_estimate"], 1.5)
    assert math.isclose(out["peak"]["max_ratio"], 2.0) and math.isclose(out["peak"]["min_ratio"], 1.5)
    assert math.isclose(out["sum_of_parts"]["median_measured_over_estimate"], 1.1)
    assert math.isclose(out["sum_of_parts"]["mape"], (abs(27 / 30 - 1) + abs(40 / 44 - 1) + 0.0) / 3)
    assert math.isclose(out["peak"]["mape"], (abs(20 / 30 - 1) + abs(22 / 44 - 1) + abs(44 / 66 - 1)) / 3)
    # OOM rows over 80 GiB: peak + 1 only the third (83); parts + 1: 82 and 91 (77 stays under)
    assert (out["oom_rows"], out["oom_over_device_peak"], out["oom_over_device_sum_of_parts"]) == (3, 1, 2)
    assert out["ran_over_device_sum_of_parts"] == 0


def test_missed_ooms_count_those_the_sum_of_parts_caution_still_marks():
    """A reported OOM the peak says fits is a miss; of the misses, those whose sum of parts + allowance is over the
    device are the ones `sweep` still marks with its '*' caution (estimate.core.upper_bound_exceeds)."""
    def row(i, parts, fits, oom=True):
        return {"id": f"r{i}", "oom": oom, "fits": fits, "measured_step_s": None if oom else 1.0,
                "predicted_step_s": 1.0, "sum_of_parts_gib": parts, "allowance_gib": 1.0, "device_gib": 80.0,
                "tokens_per_step": 1}
    rows = [row(0, 81.0, True), row(1, 78.9, True), row(2, 79.5, True), row(3, 95.0, False),
            row(4, 70.0, True, oom=False)]
    sc = ls.score_group(rows)
    assert sc["missed_oom"] == ["r0", "r1", "r2"]
    assert sc["missed_oom_cautioned"] == ["r0", "r2"]  # 82 and 80.5 > 80; 79.9 is not
    assert ls.summarize({"g": sc})["missed_oom_cautioned"] == 2
