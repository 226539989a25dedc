"""Cross-rank diagnosis (dstoolkit.runtime.train.crossrank.diagnose) on hand-built windows, the monitor's measured
comm share beside the estimate's, and the collective timer on a 1-rank gloo group (no launcher)."""
from __future__ import annotations

import pytest

from dstoolkit.runtime.train.crossrank import Persistence, RankWindow, diagnose, own_work_excess
from dstoolkit.runtime.train.monitor import Monitor, StepSample


def _w(rank, node, compute, comm, inp=0.0, probe=None):
    return RankWindow(rank=rank, node=node, host=f"h{node}", step_s=compute + comm + inp, compute_s=compute,
                      comm_s=comm, input_s=inp, mem_bytes=1e9, probe_s=probe,
                      probe_from_node=None if probe is None else 1 - node)


def test_balanced_ranks_name_nobody():
    ranks = [_w(0, 0, 0.100, 0.05), _w(1, 0, 0.110, 0.04), _w(2, 1, 0.105, 0.045), _w(3, 1, 0.120, 0.03)]
    assert diagnose(ranks) is None
    i, excess = own_work_excess(ranks)
    assert i == 3 and excess == pytest.approx(0.120 / 0.105 - 1)  # median of the other three: 0.105


def test_slow_compute_host_is_named_with_evidence():
    # host 1 computes 0.3 s per step, host 0 0.1 s and waits 0.2 s in collectives for it
    ranks = [_w(0, 0, 0.10, 0.20), _w(1, 0, 0.10, 0.20), _w(2, 1, 0.30, 0.0), _w(3, 1, 0.32, 0.0)]
    b = diagnose(ranks)
    assert (b.kind, b.rank, b.node, b.host) == ("compute", 3, 1, "h1")
    assert b.slower_pct == pytest.approx((0.32 / 0.10 - 1) * 100)  # median of ranks 0, 1, 2: 0.10
    assert "compute 320 ms/step vs median 100 ms" in b.evidence and "wait 200 ms/step" in b.evidence
    assert "rank 3 on host h1 (node 1) is 220% slower than the median rank: compute-bound host" in b.line(9)


def test_one_slow_rank_beside_healthy_ones_is_a_rank_not_a_host():
    ranks = [_w(0, 0, 0.10, 0.20), _w(1, 0, 0.30, 0.0), _w(2, 1, 0.10, 0.20), _w(3, 1, 0.11, 0.19)]
    b = diagnose(ranks)
    assert (b.kind, b.rank, b.whole_host) == ("compute", 1, False)
    assert "compute-bound rank (its host's other ranks are not slow)" in b.line(5)


def test_input_wait_is_named_input_bound():
    ranks = [_w(0, 0, 0.10, 0.30), _w(1, 0, 0.10, 0.30), _w(2, 1, 0.10, 0.30), _w(3, 1, 0.10, 0.0, inp=0.30)]
    b = diagnose(ranks)
    assert (b.kind, b.rank) == ("input", 3)
    assert "input wait 300 ms/step vs median 0 ms" in b.evidence


def test_slow_uplink_is_named_from_the_probe():
    # everyone waits in collectives; the probe out of host 1 (received on host 0) takes 150 ms, out of host 0 2 ms
    ranks = [_w(0, 0, 0.10, 0.60, probe=0.150), _w(1, 0, 0.10, 0.60, probe=0.160),
             _w(2, 1, 0.11, 0.59, probe=0.002), _w(3, 1, 0.10, 0.60, probe=0.002)]
    b = diagnose(ranks)
    assert (b.kind, b.node, b.rank, b.host) == ("link", 1, 2, "h1")
    assert "out of this host 155 ms" in b.evidence and "(86%)" in b.evidence
    assert "host h1 (node 1) its uplink is 77.5x slower than the other hosts': slow link" in b.line(3)


def test_probe_jitter_on_a_healthy_link_is_no_link():
    # 9 ms vs 2 ms (measured unthrottled) is 4.5x, but 7 ms of a 300 ms step: below MIN_LINK_STEP_SHARE
    ranks = [_w(0, 0, 0.12, 0.18, probe=0.009), _w(1, 0, 0.12, 0.18, probe=0.009),
             _w(2, 1, 0.12, 0.18, probe=0.002), _w(3, 1, 0.12, 0.18, probe=0.002)]
    assert diagnose(ranks) is None


def test_one_noisy_window_is_not_named_two_in_a_row_are():
    # measured on CI with nothing throttled: rank 0 computed 35 ms vs 23 ms in one 3-step window, 27 ms the next
    noisy = [_w(0, 0, 0.0354, 0.0329, 0.0008), _w(1, 0, 0.0245, 0.0448, 0.0009), _w(2, 1, 0.0226, 0.0435, 0.0014),
             _w(3, 1, 0.0230, 0.0445, 0.0011)]
    calm = [_w(0, 0, 0.0268, 0.0424, 0.0009), _w(1, 0, 0.0261, 0.0435, 0.0008), _w(2, 1, 0.0281, 0.0411, 0.0008),
            _w(3, 1, 0.0258, 0.0419, 0.0009)]
    assert diagnose(noisy).kind == "compute" and diagnose(calm) is None  # one window alone would name rank 0
    seen = Persistence()
    assert [seen(diagnose(w)) for w in (noisy, calm, noisy, calm)] == [None, None, None, None]
    # a throttled host: its two ranks take turns being the slowest; the same host in two windows names it
    slow_a = [_w(0, 0, 0.02, 0.58), _w(1, 0, 0.02, 0.58), _w(2, 1, 0.20, 0.43), _w(3, 1, 0.30, 0.33)]
    slow_b = [_w(0, 0, 0.03, 0.50), _w(1, 0, 0.02, 0.51), _w(2, 1, 0.24, 0.23), _w(3, 1, 0.16, 0.37)]
    seen = Persistence()
    first, second, third = seen(diagnose(slow_a)), seen(diagnose(slow_b)), seen(diagnose(slow_a))
    assert first is None
    assert (second.kind, second.node, second.rank, second.windows) == ("compute", 1, 2, 2)
    assert third.windows == 3 and "(3 windows in a row)" in third.line(21)
    assert seen(diagnose(calm)) is None and seen(diagnose(slow_a)) is None  # a calm window starts the count again


def test_another_culprit_starts_the_count_again():
    inp = [_w(0, 0, 0.10, 0.30), _w(1, 0, 0.10, 0.30), _w(2, 1, 0.10, 0.30), _w(3, 1, 0.10, 0.0, inp=0.30)]
    other = [_w(0, 0, 0.10, 0.30), _w(1, 0, 0.10, 0.30), _w(2, 1, 0.10, 0.0, inp=0.30), _w(3, 1, 0.10, 0.30)]
    seen = Persistence()
    assert seen(diagnose(inp)) is None and seen(diagnose(other)) is None  # input on rank 3, then on rank 2
    assert seen(diagnose(other)).rank == 2
    assert Persistence(1)(diagnose(inp)).windows == 1
    with pytest.raises(ValueError, match="persistence windows=0 must be >= 1"):
        Persistence(0)


def test_monitor_line_shows_measured_and_estimated_comm_share():
    mon = Monitor(2, flops_per_token=None, peak_flops=None, estimated_comm_share=0.13)
    rep = None
    for i in range(2):
        rep = mon.record(StepSample(step=i + 1, step_time_s=0.2, input_wait_s=0.0, tokens=100, loss=1.0,
                                    cpu_time_s=0.2, comm_time_s=0.05)) or rep
    assert rep.comm_share == pytest.approx(0.25) and rep.estimated_comm_share == 0.13
    assert "comm 25% measured (estimate 13%)" in rep.line()
    assert rep.ranks is None and rep.bottleneck is None  # no cross-rank view without a CrossRank


def test_comm_timer_counts_blocking_and_waited_collectives(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from dstoolkit.runtime.train.commtime import comm_timer_total_s, install_comm_timer

    timer = install_comm_timer()
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        t0, calls0 = timer.total_s, timer.calls
        x = torch.ones(1000)
        dist.all_reduce(x)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        assert timer.calls == calls0 + 2 and timer.total_s > t0
        assert comm_timer_total_s() == timer.total_s
        with timer.paused():
            before = timer.total_s
            dist.all_reduce(x)
            assert timer.total_s == before  # the monitor's own exchange is not counted
        objs = [None]
        calls = timer.calls
        dist.all_gather_object(objs, {"a": 1})  # calls all_gather inside: counted once
        assert timer.calls == calls + 1 and objs == [{"a": 1}]
    finally:
        dist.destroy_process_group()


def test_bench_train_reports_the_measured_comm_share():
    from dstoolkit.runtime.bench.train_report import format_table, measured_comm_share, summarize_metrics

    rows = [{"step": i, "step_time_s": 0.2, "global_batch": 8, "comm_wait_s": 0.05 * (i > 1)} for i in range(1, 5)]
    m = summarize_metrics(rows, skip_steps=1, seq_len=16)
    assert m["comm_share"] == pytest.approx(0.25)  # 3 x 0.05 s of 3 x 0.2 s
    assert measured_comm_share([{"step_time_s": 0.2, "comm_wait_s": None}]) is None
    text = format_table([{"status": "ok", "config_name": "z2", "measured": m, "estimate": {"comm_share": 0.13}}])
    assert "comm: 25% of the step blocked in collectives, measured (estimate 13%)" in text
