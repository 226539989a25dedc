"""The monitor's cross-rank view names the rank and host that hold a job back, on two test hosts x 2 ranks
(example trainer, ZeRO-2 bf16, gloo; dstoolkit.runtime.train.crossrank):

(d) nothing throttled -> no bottleneck named (none beyond the noise threshold in PERSIST_WINDOWS windows in a row);
(a) host 1's CPU capped (a cgroup holding its processes at 0.1 CPU) -> host 1, compute;
(b) host 1's uplink throttled (tbf 100 Mbit/s on its egress) -> host 1, slow link / collective wait;
(c) a data-iterator delay on rank 3 only -> rank 3, input-bound.
(d), (a), (b) are phases of ONE job (the throttle is applied and lifted while it runs; one window after each change
is skipped, and three are kept: a culprit is named from its second window in a row on); (c) is a second job. Needs root (network namespaces, tc, cgroups); skips otherwise.
"""
from __future__ import annotations

import pytest

from dstoolkit.runtime.testhosts import scenarios
from dstoolkit.runtime.train.crossrank import NOISE_FRACTION, PERSIST_WINDOWS, RankWindow, own_work_excess
from tests.dist.multinode.fixtures import two_hosts  # noqa: F401  (fixture)

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

CPU_CAP = 0.1
"""CPUs left to host 1's two ranks together: their compute runs several times slower than host 0's."""
LINK_RATE = "100mbit"
INPUT_DELAY_S = 0.3
"""Per micro-batch on rank 3 (one micro-batch per step): above a step's compute (~0.1-0.2 s here)."""


def _found(events):
    return [e["bottleneck"] for e in events if e.get("bottleneck")]


def _print(name, events):
    for e in events:
        print(name, e["step"], e.get("bottleneck_line"))
        for r in e["ranks"]:
            print("   ", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})


def test_throttled_host_and_link_are_named(two_hosts, tmp_path):  # noqa: F811
    h = two_hosts
    out = scenarios.bottleneck_phases(h, tmp_path, "phases", [
        ("none", None, None),
        ("cpu", lambda: h.limit_cpu(1, CPU_CAP), lambda: h.unlimit_cpu(1)),
        ("link", lambda: h.throttle_host(1, LINK_RATE), lambda: h.unthrottle_host(1)),
    ], windows_per_phase=3)
    for name in ("none", "cpu", "link"):
        _print(name, out[name])
    print("\n".join(out["lines"]))
    noise = [own_work_excess([RankWindow(**r) for r in e["ranks"]])[1] for e in out["none"]]
    print("unthrottled own-work excess over the other ranks' median, per window:", [round(x, 3) for x in noise])
    # every window has the per-rank table of all 4 ranks, 2 per host
    for name in ("none", "cpu", "link"):
        for e in out[name]:
            assert [r["node"] for r in e["ranks"]] == [0, 0, 1, 1]
            assert all(r["step_s"] > 0 and r["mem_bytes"] > 0 for r in e["ranks"])
            assert e["comm_share"] is not None  # measured by the comm timer
    assert _found(out["none"]) == [], f"nothing throttled, yet: {_found(out['none'])}"
    cpu = _found(out["cpu"])
    assert cpu and all(b["kind"] == "compute" and b["node"] == 1 and b["rank"] in (2, 3) for b in cpu), cpu
    assert all(b["slower_pct"] > NOISE_FRACTION * 100 and b["windows"] >= PERSIST_WINDOWS for b in cpu)
    link = _found(out["link"])
    assert link and all(b["kind"] == "link" and b["node"] == 1 for b in link), link
    assert any("bottleneck:" in line and "compute-bound host" in line for line in out["lines"])
    assert any("bottleneck:" in line and "slow link" in line for line in out["lines"])


def test_slow_input_on_one_rank_is_named(two_hosts, tmp_path):  # noqa: F811
    out = scenarios.bottleneck_phases(two_hosts, tmp_path, "input", [("input", None, None)],
                                      extra=["--data-delay-s", str(INPUT_DELAY_S), "--data-delay-rank", "3"])
    _print("input", out["input"])
    print("\n".join(out["lines"]))
    found = _found(out["input"])
    assert found and all(b["kind"] == "input" and b["rank"] == 3 and b["node"] == 1 for b in found), found
    assert any("bottleneck: rank 3" in line and "input-bound" in line for line in out["lines"])
