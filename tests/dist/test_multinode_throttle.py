"""`dstoolkit bench comm` across two test hosts reports the rate a tbf throttle imposes on the link.

2 hosts x 2 gloo ranks; ranks 0,1 on host 0 and 2,3 on host 1, so gloo's ring all-reduce crosses the link
once in each direction and its busbw (nccl-tests convention) is the per-direction link rate.
Needs root (network namespaces, tc); skips otherwise.
"""
from __future__ import annotations

import pytest

from dstoolkit.runtime.testhosts import scenarios
from tests.dist.multinode.fixtures import two_hosts  # noqa: F401  (fixture)

pytestmark = [pytest.mark.dist, pytest.mark.slow]

THROTTLE = "200mbit"
"""25 MB/s: far enough below what 4 gloo ranks on 2 busy cores move unthrottled over the veth pair
(0.16-0.9 GB/s measured, depending on load) that the limiter, not the CPU, sets the rate."""
LOW_MEDIAN, LOW_BEST, HIGH = 0.75, 0.85, 1.02
"""busbw / throttle bounds. Above 1.02 the limiter would not be binding. Below: TCP/IP headers take ~4.5% of
a 1500-byte frame (1448 payload bytes), and 4 ranks on 2 shared cores lose some reps to CPU contention, so the
best rep must reach 0.85 of the rate and the reported median 0.75 (measured here: 0.86-0.95)."""


def test_bench_comm_across_hosts_reports_throttled_rate(two_hosts, tmp_path):  # noqa: F811
    two_hosts.throttle(THROTTLE)
    try:
        rows = scenarios.bench_comm_across_hosts(two_hosts, tmp_path, "throttled", ops="all_reduce", sizes="4M",
                                                  reps=5)
    finally:
        two_hosts.unthrottle()
    limit = scenarios.rate_bytes_per_s(THROTTLE)
    (row,) = rows
    busbw = row["busbw"] * 1e9  # bench comm prints GB/s = 1e9 B/s
    print({"throttle_bytes_per_s": limit, "busbw_bytes_per_s": busbw, "ratio": busbw / limit, "row": row})
    assert row["#wrong"] == 0 and row["world_size"] == 4
    best = row["busbw_stats"]["max"] * 1e9
    assert LOW_MEDIAN * limit <= busbw <= HIGH * limit, (busbw, limit)
    assert LOW_BEST * limit <= best <= HIGH * limit, (best, limit)
