"""benchmarks/layout_sweeps.py noise ceiling: the noise sigma from repeated timings of one layout, and the Spearman a
model exact up to that noise would score against one measurement per layout (seeded, so the figure is exact)."""
import math
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import layout_sweeps as ls  # noqa: E402


def test_sigma_pools_the_log_ratio_of_repeated_timings():
    assert ls.repeat_sigma([]) is None
    assert math.isclose(ls.repeat_sigma([{"a_s": 110.0, "b_s": 100.0}]), math.log(1.1) / math.sqrt(2), rel_tol=1e-12)
    two = [{"a_s": 110.0, "b_s": 100.0}, {"a_s": 100.0, "b_s": 130.0}]
    want = math.sqrt((math.log(1.1) ** 2 + math.log(1.3) ** 2) / 4)
    assert math.isclose(ls.repeat_sigma(two), want, rel_tol=1e-12)


def test_ceiling_is_one_without_noise_and_falls_as_layouts_crowd_together():
    spread = [1.0, 1.5, 2.0, 3.0, 4.5]
    assert math.isclose(ls.noise_ceiling(spread, 0.0, draws=50), 1.0, rel_tol=1e-12)
    assert ls.noise_ceiling(spread[:2], 0.05) is None  # fewer than 3 layouts: no order to score
    far = ls.noise_ceiling(spread, 0.05, draws=500)
    close = ls.noise_ceiling([1.00, 1.01, 1.02, 1.03, 1.04], 0.05, draws=500)
    assert far > 0.99 and close < 0.5 and close < far
    # seeded: the same call gives the same figure
    assert ls.noise_ceiling([1.00, 1.01, 1.02, 1.03, 1.04], 0.05, draws=500) == close


def test_mape_floor_is_zero_without_noise_and_near_its_closed_form():
    assert ls.mape_floor(None) is None
    assert ls.mape_floor(0.0, draws=50) == 0.0
    # E|exp(-sigma z) - 1| for z ~ N(0, 1): for small sigma about sigma * E|z| = sigma * sqrt(2 / pi)
    got = ls.mape_floor(0.047, draws=20000)
    assert abs(got - 0.047 * math.sqrt(2 / math.pi)) < 0.0015
    assert ls.mape_floor(0.1, draws=500) > ls.mape_floor(0.05, draws=500)
    assert ls.mape_floor(0.047, draws=500) == ls.mape_floor(0.047, draws=500)  # seeded
