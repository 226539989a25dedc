"""Peak memory per rank against real DeepSpeed engines on 2 gloo ranks (benchmarks/peak_memory.py --grid dist).

One torchrun launch trains two transformers Llama cells (GQA, built from a config, no download) for 3 steps each,
with the allocator tracker (dstoolkit/runtime/alloc_tracker.py) counting every CPU allocation and free on both
ranks: ZeRO-0 fp32, whose peak is DeepSpeed's flattened all-reduce of every gradient at the end of backward
(engine.py allreduce_gradients at MEMORY_OPT_ALLREDUCE_SIZE), and ZeRO-2 bf16, whose peak is torch AdamW's
for-loop temporaries (two fp32 copies of the rank's flat partition) inside the optimizer step. The estimate must be
within the benchmark's goal of the continuous peak, name the phase it was measured in, and account for what the
sampled census (phase points) cannot see.
"""
import importlib.util

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def _bench(repo_root):
    spec = importlib.util.spec_from_file_location("peak_memory", repo_root / "benchmarks" / "peak_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(600)
def test_estimated_peak_matches_the_continuous_measurement(repo_root, tmp_path):
    bench = _bench(repo_root)
    cells = bench.grid("dist")
    # ~140 s at load 11-14 on 2 cores (2 cells x 3 steps x 2 ranks + DeepSpeed start-up)
    recs = bench.launch(cells, tmp_path, timeout_s=560)
    rows = bench.score(recs)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {r["rank"] for r in rows} == {0, 1} and len({r["cell"] for r in rows}) == len(cells)
    expect = {"llama-z0-fp32": "backward_end", "llama-z2-bf16": "optimizer_step"}
    for r in rows:
        where = (r["cell"], r["rank"], r["continuous_phase_max"], r["estimate_phases"])
        assert abs(r["err_peak"]) <= bench.PEAK_GOAL, where
        # a phase whose maximum ties the peak within bench.PHASE_TIE reaches it too (fc1 at 2a26d3f: the step's
        # maximum 124 bytes above the end of backward's, of 100 MB)
        assert expect[r["cell"]] in r["peak_phases"], where
        assert r["estimate_measured_phase"] in r["peak_phases"], where
        # the census between phase points can miss the transient the peak is made of, or catch it when a phase
        # point falls on it (fc3 at e5af1d1: llama-z0-fp32 rank 1 sampled 99,992,992 of 99,993,008 bytes): never above
        assert r["sampled_peak"] <= r["measured_peak"], where
    for r in (r for r in rows if r["cell"] == "llama-z2-bf16"):
        # inside the inner step, beyond the census taken at its entry: the modelled for-loop temporaries (1%)
        assert r["estimate_optimizer_impl"] == "torch_for_loop"
        extra = r["continuous_phase_max"]["optimizer_step"] - r["measured_phases"]["optimizer_step"]
        assert abs(extra - r["estimate_optimizer_temporaries"]) <= 0.01 * r["estimate_optimizer_temporaries"], \
            (extra, r["estimate_optimizer_temporaries"])
