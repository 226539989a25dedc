"""LY014 (ZeRO++ on the CPU accelerator) names the caller's field for the CPU: the spec's cluster.gpu in a sweep's
drop reason, the flag --gpu in `estimate --config`. Before: the message said "(cluster.gpu='cpu')" to a user who
had typed --gpu cpu and had no spec."""
from __future__ import annotations

from dstoolkit.generate.rules import CANDIDATE_NAMES
from dstoolkit.layout import LayoutFacts, check_layout


def ly014(names=None) -> str:
    [v] = check_layout(LayoutFacts(zeropp=True, cpu=True), ("LY014",), names)
    return v.message


def test_the_cpu_is_named_by_the_callers_field():
    assert ly014(CANDIDATE_NAMES).endswith("the CPU accelerator has no QuantizerBuilder (cluster.gpu cpu)")
    assert ly014({"cpu": "--gpu"}).endswith("(--gpu cpu)")
    assert ly014().endswith("has no QuantizerBuilder")  # no caller names: no field claimed
