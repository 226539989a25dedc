"""A strategy whose only generated target is megatron-lm (megatron-deepspeed skipped for a sliding window it cannot
express) gets its summary.md instead of an IndexError from the sentence that names the targets sharing the folder's
layout. Since 92980c4 (estimate / sweep / generate share target_refusal) the refused group no longer picks the
folder's layout, so the folder's layout is megatron-lm's own and the summary says so."""
import pathlib

from dstoolkit.generate import generate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron import TARGETS
from dstoolkit.generate.summary import shared_targets

SPEC = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/specs/megatron_parsers/mistral_7b_v01_sliding_window.yaml"


def test_summary_when_no_target_runs_the_chosen_layout():
    spec, shape = load_spec_and_shape(SPEC)
    (out,) = generate(spec, shape, targets=TARGETS).generated
    assert list(out.targets_skipped) == ["megatron-deepspeed"] and list(out.per_target) == ["megatron-lm"]
    assert shared_targets(out) == ["megatron-lm"]
    lines = out.files["summary.md"].splitlines()
    assert "No target's files run this layout: each target's own layout and figures are under Layout per target " \
           "below." not in lines
    assert not [line for line in lines if line.startswith("For , under")]
