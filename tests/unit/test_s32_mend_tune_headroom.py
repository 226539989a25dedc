"""Tune's headroom pick, edge cases (review s32 #13): a record without `within_headroom` counts as leaving it; under
--shrink there is no headroom pick (the estimates are the shrunk model's); the seed band is measured on #1's side of
the headroom, not against a better point outside it."""
from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest

pytest.importorskip("optuna")

from dstoolkit.tune.options import TuneOptions  # noqa: E402
from dstoolkit.tune.records import REC_ATTR, collect_result  # noqa: E402
from dstoolkit.tune.seeding import seed_band_size  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
GiB = 2**30


def _trial(n, value, mem_gib, within):
    est = {"memory_per_rank_bytes": int(mem_gib * GiB), "device_memory_bytes": 80 * GiB, "headroom_bytes": 24 * GiB}
    if within is not None:
        est["within_headroom"] = within
    return SimpleNamespace(number=n, state=SimpleNamespace(name="COMPLETE"), values=[value], value=value, params={},
                           user_attrs={REC_ATTR: {"label": f"L{n}", "status": "ok", "counted": True, "estimate": est}})


def _study(*trials):
    return SimpleNamespace(get_trials=lambda deepcopy=False: list(trials))


def _opts(tmp_path, **kw):
    return TuneOptions(spec_path=ROOT / "ds_configs" / "tiny_cpu.yaml", out_dir=tmp_path / "o", budget=3,
                       mode=kw.pop("mode", "estimate"), progress=False, **kw)


def test_record_without_the_field_counts_as_leaving_the_headroom(tmp_path):
    # an older study's trial (no within_headroom) beats a new one marked outside
    res = collect_result(_study(_trial(0, 100.0, 50, None), _trial(1, 120.0, 78.9, False)), _opts(tmp_path), True,
                         "budget", 2)
    assert res.best["number"] == 0
    assert res.notes and res.notes[0].startswith("passed over for the 30% memory headroom")


def test_shrink_run_has_no_headroom_pick(tmp_path):
    res = collect_result(_study(_trial(0, 100.0, 50, True), _trial(1, 120.0, 78.9, False)),
                         _opts(tmp_path, mode="real", shrink="auto"), False, "budget", 2)
    assert res.best["number"] == 1  # the best measured, the shrunk estimate's headroom not applied
    assert res.notes == []


def _check(mem_gib, within):
    return SimpleNamespace(estimate=SimpleNamespace(memory_per_rank_bytes=int(mem_gib * GiB),
                                                    within_headroom=within))


def test_seed_band_from_the_headroom_side_of_number_one():
    # memory objective: #1 (inside the headroom) 50 GiB, two more within 5% of it; one outside at 10 GiB ranked last
    head = [_check(50, True), _check(51, True), _check(52, True), _check(10, False)]
    assert seed_band_size(head, "memory", None) == 3
    assert seed_band_size([_check(10, False), _check(10.2, False)], "memory", None) == 2
    assert seed_band_size([], "memory", None) == 0
