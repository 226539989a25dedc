"""Fuzz fixes in `dstoolkit bench`: values refused instead of replaced or accepted (--seq-len 0, --micro-batch 0,
--time-budget-s -1, --timeout-s 0, an --out folder), the known strategies named, and comm sizes that cannot be
measured as asked said so (and measured once)."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.bench import comm_options, overlap, targets
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.usercmd import _failure

DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
      "zero_optimization": {"stage": 1}}


@pytest.mark.parametrize("flag, value", [("--seq-len", "0"), ("--micro-batch", "0"), ("--seq-len", "-4")])
def test_overlap_refuses_zero_and_negative_overrides(tmp_path, capsys, flag, value):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(DS))
    assert main(["bench", "overlap", str(cfg), "--backend", "gloo", flag, value]) == 2
    assert capsys.readouterr().err == (f"dstoolkit bench: error: {flag} {value}: must be >= 1 (or leave it out for "
                                       "the config's / spec's own)\n")


def test_overlap_keeps_an_explicit_micro_batch():
    assert overlap._normalise(DS, 2)["train_micro_batch_size_per_gpu"] == 2
    assert overlap._normalise(DS, None)["train_micro_batch_size_per_gpu"] == 4


def test_unknown_strategy_lists_the_known_ones(tmp_path):
    items = []
    for name in ("zero1", "zero2"):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(DS))
        items.append(str(p))
    with pytest.raises(BenchInputError) as err:
        targets.resolve_targets(items, None, ["nosuch"], tmp_path, 2)
    assert str(err.value) == "--strategy nosuch: no such strategy among the targets (known: zero1, zero2)"


def test_comm_sizes_are_rounded_out_loud_and_measured_once():
    from dstoolkit.runtime.bench.comm import plan_rows

    plan, notes = plan_rows(["all_reduce", "all_gather"], [3, 7, 8, 12], "float32", 2)
    assert plan == [("all_reduce", 3), ("all_reduce", 8), ("all_reduce", 12), ("all_gather", 8)]
    assert notes == [
        "all_reduce 3 B: measured as 4 B (whole float32 elements: a multiple of 4 B)",
        "all_reduce 7 B: the same 4 B buffer as 3 B; measured once",
        "all_gather 3 B: the same 8 B buffer as 8 B; measured once",
        "all_gather 7 B: the same 8 B buffer as 8 B; measured once",
        "all_gather 12 B: the same 8 B buffer as 8 B; measured once",
    ]
    plan, notes = plan_rows(["all_gather"], [12, 24], "float32", 2)
    assert plan == [("all_gather", 12), ("all_gather", 24)]
    assert notes == [
        "all_gather 12 B: measured as 8 B (whole float32 elements split evenly over 2 ranks: a multiple of 8 B)"]
    assert plan_rows(["all_reduce"], [1024, 2048], "float32", 2) == ([("all_reduce", 1024), ("all_reduce", 2048)], [])


@pytest.mark.parametrize("field, flag, value", [("time_budget_s", "--time-budget-s", -1.0),
                                                ("timeout_s", "--timeout-s", 0.0),
                                                ("time_budget_s", "--time-budget-s", float("nan"))])
def test_comm_refuses_non_positive_times(field, flag, value):
    opts = comm_options.CommOptions(ops=["all_reduce"], sizes=[1024], **{field: value})
    with pytest.raises(BenchInputError) as err:
        opts.check()
    assert str(err.value) == f"{flag} {value}: must be a positive number of seconds"


def test_bench_refuses_a_zero_timeout_and_an_out_folder_before_any_rank(tmp_path, capsys):
    base = ["bench", "comm", "--ops", "all_reduce", "--sizes", "1K", "--backend", "gloo"]
    assert main(base + ["--timeout-s", "0"]) == 2
    assert capsys.readouterr().err == ("dstoolkit bench: error: --timeout-s 0.0: must be a positive number of "
                                       "seconds (default 1800)\n")
    assert main(base + ["-o", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"dstoolkit bench: error: --out {tmp_path}: is a folder; pass the JSON Lines "
                                       f"file to append to, e.g. --out {tmp_path / 'comm.jsonl'}\n")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(base + ["-o", str(afile / "r.jsonl")]) == 2
    assert capsys.readouterr().err == (f"dstoolkit bench: error: --out {afile / 'r.jsonl'}: {afile} is a file, not a "
                                       "folder, so nothing can be written under it; give a path in a folder\n")


def test_a_sub_second_timeout_is_printed_as_given():
    assert _failure(1, "", 0.5, True) == ("timeout", "no result within 0.5 s (--trial-timeout)")


def test_free_ports_are_distinct():
    """Two free_port() calls in a row may return the same port (the kernel reuses a port just released); the overlap
    bench's single-rank groups then failed with EADDRINUSE in CI. free_ports holds every socket until all are chosen."""
    from dstoolkit.runtime.train.launch import free_ports

    for n in (1, 2, 8):
        ports = free_ports(n)
        assert len(ports) == n == len(set(ports)) and all(1024 <= p <= 65535 for p in ports)
