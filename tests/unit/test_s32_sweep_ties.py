"""sweep: one relative-tolerance tie rule (relative to the tie group's leader, review s32 #5) for the ranking and the "same estimated step time" text, out-of-order rows
labelled as ties (finding 6); the undecided count does not depend on --top (finding 5)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from types import SimpleNamespace

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.sweep_explain import STEP_TIME_TIE_TOLERANCE, explain, rank, same_step_time, tie_groups
from dstoolkit.generate.sweep_result import Ranked
from dstoolkit.generate.undecided import undecided_lines

ROOT = pathlib.Path(__file__).resolve().parents[2]
GiB = 2**30


def test_tie_rule_is_relative_to_a_leader_not_buckets():
    # review s32 #5: 0.49% apart ties (fixed 0.5% log buckets split it, or joined across an edge)
    assert same_step_time(0.1432, 0.1439)
    assert same_step_time(0.1436817, 0.1436820)  # straddled a bucket edge before
    assert same_step_time(10.72, 10.7201)
    assert tie_groups([0.1436820, 0.1436817, 0.15]) == [0, 0, 1]


def test_tie_edges_either_side_of_the_tolerance():
    tol = STEP_TIME_TIE_TOLERANCE
    lead = 19.06
    assert same_step_time(lead, lead * (1 + tol) * (1 - 1e-9))
    assert not same_step_time(lead, lead * (1 + tol) * (1 + 1e-9))
    for k in (1, 7, 300):  # the old bucket edges exp(k * log1p(tol)) decide nothing now
        edge = (1 + tol) ** k
        assert tie_groups([edge * (1 - 1e-9), edge * (1 + 1e-9)]) == [0, 0]
    # a chain: each within the tolerance of its neighbour, but the third is past the leader's
    a, b, c = 1.0, 1.0 + 0.8 * tol, 1.0 + 1.6 * tol
    assert tie_groups([c, b, a]) == [1, 0, 0]


def _r(tp, pp, mb, t):
    c = Candidate(zero_stage=0, tp=tp, pp=pp, micro_batch=mb)
    e = SimpleNamespace(step_time_s=t, memory_per_rank_bytes=GiB, within_headroom=True, mfu=0.2,
                        device_memory_bytes=80 * GiB)
    return Ranked(c, e)


def test_out_of_order_row_is_labelled_as_a_tie():
    # 10.7210 ties 10.7200: the simpler (tp*pp 8) ranks above the faster (tp*pp 16)
    rows = rank([_r(2, 4, 1, 9.594), _r(4, 4, 2, 10.7200), _r(4, 2, 2, 10.7210)])
    assert [r.estimate.step_time_s for r in rows] == [9.594, 10.7210, 10.7200]
    out, _ = explain(rows, None, rows, compare_stages=False)
    assert out[1].reason.endswith("pp 2 instead of 4, micro-batch 2 instead of 1")
    assert out[2].reason.endswith("; ties with #2 (10.72 s, same estimated step time within the 0.5% tie rule: the "
                                  "simpler layout ranks first)")


def test_same_text_only_for_a_tie():
    tol = STEP_TIME_TIE_TOLERANCE
    rows = rank([_r(1, 1, 2, 0.1432), _r(1, 1, 4, 0.1432 * (1 + tol) * (1 + 1e-6))])
    out, why = explain(rows, None, rows, compare_stages=False)
    assert [r.candidate.micro_batch for r in rows] == [2, 4]  # not a tie: the faster first
    assert "+0.5% step time vs #1" in why
    rows = rank([_r(1, 1, 2, 0.1432), _r(1, 1, 4, 0.1432 * (1 + tol) * (1 - 1e-6))])
    _, why = explain(rows, None, rows, compare_stages=False)
    assert [r.candidate.micro_batch for r in rows] == [4, 2]  # a tie: the larger micro-batch (simpler) first
    assert "same estimated step time as #1 (0.1432 s, within the 0.5% tie rule; ties go to the simpler layout)" in why


def test_undecided_names_shortened_count_kept():
    lines = undecided_lines(["a", "b", "c"], [1.0, 1.01, 1.02], True, "s.yaml", shown=1)
    assert lines[0].startswith("Cannot decide: 3 layouts lie within 7.9% ")
    assert lines[0].endswith(": #1 a and 2 more below --top 1.")


def _sweep(top):
    out = subprocess.run([sys.executable, "-m", "dstoolkit", "sweep", str(ROOT / "ds_configs" /
                          "mixtral_8x7b_2x8_h100.yaml"), "--top", str(top), "--format", "json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["undecided"]


def test_undecided_count_does_not_depend_on_top():
    a, b = _sweep(2), _sweep(50)
    assert a["positions"] == b["positions"] and len(a["positions"]) > 2
    assert a["tune_command"] == b["tune_command"]
