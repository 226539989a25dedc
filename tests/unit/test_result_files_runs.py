"""Results.newest_runs: the pages quote the newest numbered runs of a benchmark, found in the folder (not a list
edited by hand each time a run is added)."""
import pytest

from dstoolkit.runtime.bench.result_files import PageError, Results


def test_newest_runs_orders_by_run_number_not_by_name(tmp_path):
    for k in (2, 9, 10, 3):
        (tmp_path / f"bench_202612_run{k}.md").write_text("x")
    (tmp_path / "bench_202612_runX.md").write_text("x")  # not a numbered run
    (tmp_path / "bench_202612.md").write_text("x")
    assert Results(tmp_path).newest_runs("bench_202612", 3) == [
        "bench_202612_run10.md", "bench_202612_run9.md", "bench_202612_run3.md"]


def test_no_run_names_the_folder_and_the_fix(tmp_path):
    with pytest.raises(PageError, match=r"no bench_202612_run<k>\.md .*rerun its benchmark"):
        Results(tmp_path).newest_runs("bench_202612", 4)
