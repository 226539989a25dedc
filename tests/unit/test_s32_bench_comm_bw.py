"""bench comm: algbw / busbw come from the reported median time (nccl-tests: algbw = size / time), also with an even
--reps, where the median of per-rep bandwidths belongs to other reps than the median time (finding 7)."""
from __future__ import annotations

import pytest

from dstoolkit.runtime.bench import comm, harness
from dstoolkit.runtime.bench.comm_options import CommOptions


def test_bandwidths_from_time():
    assert comm.bandwidths(262144, 1244.0, 1.0) == pytest.approx((262144 / 1244e-6 / 1e9, 262144 / 1244e-6 / 1e9))
    assert comm.bandwidths(1000, 0.0, 1.0) == (0.0, 0.0)


def test_even_reps_row_matches_its_time(monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    monkeypatch.setattr(harness, "time_repeated", lambda fn, **k: [0.001, 0.002, 0.004, 0.009])
    monkeypatch.setattr(comm, "_check_wrong", lambda *a, **k: 0)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{harness.free_port()}", rank=0, world_size=1)
    try:
        opts = CommOptions(ops=["all_reduce"], sizes=[65536], reps=4, iters=1, warmup=0, world_size=1)
        row = comm.measure_row(torch, dist, "all_reduce", 65536, opts, 0, 1, torch.device("cpu"))
    finally:
        if started:
            dist.destroy_process_group()
    assert row["time_us"] == pytest.approx(3000.0)  # median of 1, 2, 4, 9 ms
    assert row["algbw"] == pytest.approx(row["size"] / (row["time_us"] * 1e-6) / 1e9)
    assert row["busbw"] == pytest.approx(row["algbw"] * row["busbw_factor"])
