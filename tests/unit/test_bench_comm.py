"""bench comm: argument parsing, nccl-tests factors, buffer layout and the correctness oracle."""
import pytest

from dstoolkit.runtime.bench import comm, comm_options
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.cli import main


@pytest.mark.parametrize("op,n,factor", [
    # nccl-tests doc/PERFORMANCE.md (docs/anchors.md 'Collective bandwidth')
    ("all_reduce", 8, 2 * 7 / 8), ("all_reduce", 2, 1.0),
    ("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4), ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0),
])
def test_busbw_factors_are_nccl_tests(op, n, factor):
    assert comm.busbw_factor(op, n) == pytest.approx(factor)


@pytest.mark.parametrize("op,factor", [("all_reduce", 0.0), ("all_gather", 0.0), ("reduce_scatter", 0.0),
                                       ("all_to_all", 0.0), ("broadcast", 1.0)])
def test_busbw_factor_one_rank_is_the_formula(op, factor):
    # one rank: the docs/anchors.md formulas as written (2(n-1)/n = 0, (n-1)/n = 0, broadcast 1), and the bench
    # uses the estimate's definition, so both sides agree at every n
    from dstoolkit.estimate.collective_time import busbw_factor

    assert comm.busbw_factor is busbw_factor
    assert comm.busbw_factor(op, 1) == factor


def test_parse_sizes_ranges_and_lists():
    assert comm_options.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert comm_options.parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert comm_options.parse_sizes("64M,1K") == [1024, 64 * 2**20]
    assert len(comm_options.parse_sizes("1K:256M")) == 19


@pytest.mark.parametrize("text,match", [("0", "0 bytes"), ("0K", "0 bytes"), ("abc", "cannot parse"),
                                        ("8K:1K", "below MIN"), ("1K:8K:1", "factor")])
def test_parse_sizes_errors(text, match):
    with pytest.raises(BenchInputError, match=match):
        comm_options.parse_sizes(text)


def test_parse_ops():
    assert comm_options.parse_ops("all") == list(comm_options.OPS)
    assert comm_options.parse_ops("broadcast,all-reduce") == ["all_reduce", "broadcast"]
    with pytest.raises(BenchInputError, match="unknown op 'allreduce'.*all_reduce"):
        comm_options.parse_ops("allreduce")


def test_layout_rounds_to_world_size():
    lay = comm.layout("all_gather", 1000, 4, 3)  # 250 elements -> 249 (divisible by 3)
    assert (lay.count, lay.size_bytes, lay.in_numel, lay.out_numel) == (249, 996, 83, 249)
    lay = comm.layout("reduce_scatter", 4096, 2, 2)
    assert (lay.in_numel, lay.out_numel) == (2048, 1024)


def _simulate(op, lay, world, dtype):
    """Independent oracle: compute each rank's output from every rank's input with plain tensor algebra."""
    import torch

    inputs = [comm._pattern(torch, lay.in_numel, r, 0, torch.float64) for r in range(world)]
    total = sum(inputs)
    per = lay.count // world
    outs = []
    for r in range(world):
        if op == "all_reduce":
            outs.append(total)
        elif op == "broadcast":
            outs.append(inputs[0])
        elif op == "all_gather":
            outs.append(torch.cat(inputs))
        elif op == "reduce_scatter":
            outs.append(total[r * per:(r + 1) * per])
        else:
            outs.append(torch.cat([inputs[j][r * per:(r + 1) * per] for j in range(world)]))
    return [o.to(dtype) for o in outs]


@pytest.mark.parametrize("op", comm_options.OPS)
@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "int32"])  # names: no torch import at collection
def test_expected_results_match_simulated_collective(op, world, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    lay = comm.layout(op, 4096, 4, world)
    sim = _simulate(op, lay, world, dtype)
    for r in range(world):
        exp = comm._expected(torch, op, lay, r, world, dtype)
        assert comm.count_wrong(torch, sim[r], exp) == 0


def test_count_wrong_counts_each_bad_element():
    import torch

    exp = torch.arange(10, dtype=torch.float32)
    got = exp.clone()
    got[[1, 5, 7]] += 1
    assert comm.count_wrong(torch, got, exp) == 3
    assert comm.count_wrong(torch, got[:5], exp) == 10


@pytest.mark.parametrize("argv,match", [
    (["--ops", "all_reduce,allgather"], "unknown op 'allgather'"),
    (["--sizes", "0"], "0 bytes"),
    (["--world-size", "100000"], "--world-size 100000: this machine has"),
    (["--world-size", "1"], "at least 2"),
    (["--dtype", "float7"], "unknown dtype"),
])
def test_cli_bad_input_exits_2_with_message(argv, match, capsys):
    rc = main(["bench", "comm", "--backend", "gloo", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert "error:" in err and pytest.importorskip("re").search(match, err), err
