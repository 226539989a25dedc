"""The precision refusal of a resume names what differs at every ZeRO stage (s35 ckpt finding 3): at ZeRO 0 there are
no bf16_zero_pp_rank_* files, the bf16 wrapper's optimizer state sits in the model-states file and torch's optimizer
raises on it (KeyError, real 2-rank DeepSpeed 0.19.8 loads); the reshard way out holds at ZeRO 1-3 only."""
from __future__ import annotations

from dstoolkit.runtime.train.run_match import RunMatch, run_refusal


def test_precision_refusal_names_both_zero_cases_and_the_fix():
    msg = run_refusal("ckpt", "--resume", "step_00000002", RunMatch(precision="bf16"), RunMatch(precision="fp32"),
                      "--ep-size {ep}", "the saved model")
    assert msg is not None
    assert "saved in bf16, but this run is fp32" in msg
    assert "bf16_zero_pp_rank_* files at ZeRO 1-3" in msg and "model-states file at ZeRO 0" in msg
    assert "Resume with bf16.enabled true" in msg
    assert "at ZeRO 1-3 `dstoolkit ckpt reshard`" in msg


def test_same_precision_is_not_refused():
    assert run_refusal("ckpt", "--resume", "t", RunMatch(precision="fp32"), RunMatch(precision="fp32"), "", "") is None
