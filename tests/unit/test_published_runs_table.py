"""benchmarks/data/published_runs.yaml (and held_out_runs.yaml, the rows no constant is fitted on): every run cites
its source, carries a normalised figure, and that figure follows from the published one by the formula the row names
(recomputed here from the row's own fields)."""
from __future__ import annotations

import math
import pathlib
import sys
import typing

import pytest
import yaml

from dstoolkit.spec.cluster_fields import AttentionImpl, LossImpl

TABLE = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "published_runs.yaml"
sys.path.insert(0, str(TABLE.parents[1]))
import published_runs_specs as prs  # noqa: E402

DOC = prs.load_table(TABLE)  # `gpu: {cluster: NAME}` resolved from benchmarks/data/clusters.yaml
RUNS = DOC["runs"]
SOURCES = DOC["sources"]
HELD_TABLE = TABLE.parent / "held_out_runs.yaml"
HELD = prs.load_table(HELD_TABLE)
ALL_RUNS = RUNS + HELD["runs"]
ALL_SOURCES = {**SOURCES, **HELD["sources"]}


def _ids(runs):
    return [r["id"] for r in runs]


def recompute(run: dict) -> float:
    """tokens/s per GPU from the published figure, with the formula the row names."""
    norm, pub = run["normalisation"], run["published"]
    p, x = norm["params"], float(pub["value"])
    f = norm["formula"]
    if f == "identity":
        assert pub["metric"] == "tokens_per_s_per_gpu"
        return x
    if f == "megatron_96":  # X TFLOP/s per GPU, 96·B·s·l·h²(1 + s/6h + V/16lh) FLOPs per iteration of B·s tokens
        assert pub["metric"] == "tflops_per_gpu"
        l, h, s, V = p["l"], p["h"], p["s"], p["V"]
        return x * 1e12 / (96 * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h)))
    if f == "korthikanti_mfu_72":  # MFU %, 72·B·s·l·h²(1 + s/6h + V/12lh) model FLOPs per iteration
        assert pub["metric"] == "mfu_pct"
        l, h, s, V = p["l"], p["h"], p["s"], p["V"]
        return x / 100 * p["peak_tflops"] * 1e12 / (72 * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h)))
    if f == "llama3_6n_attn":  # X TFLOP/s per GPU over 6N + 12·l·h·s FLOPs per token
        assert pub["metric"] == "tflops_per_gpu"
        return x * 1e12 / (6 * p["N"] + 12 * p["l"] * p["h"] * p["s"])
    if f == "step_time":
        assert pub["metric"] == "step_time_s"
        return p["global_batch"] * p["seq_len"] / (x * p["gpus"])
    if f == "gpu_hours_per_trillion_tokens":
        assert pub["metric"] == "gpu_hours_per_trillion_tokens"
        return 1e12 / (x * 3600)
    if f == "tokens_per_s_total":
        assert pub["metric"] == "tokens_per_s_total"
        return x / p["gpus"]
    raise AssertionError(f"{run['id']}: unknown normalisation formula {f!r}")


def test_table_size_and_spread():
    assert len(RUNS) >= 25
    used = {r["source"] for r in RUNS}
    assert len(used) >= 6
    assert len({SOURCES[s]["publisher"].split(" (")[0] for s in used}) >= 6, "at least 6 independent publishers"
    gpus = {(r["gpu"] if isinstance(r["gpu"], str) else r["gpu"]["name"]) for r in RUNS}
    assert {"A100-80G", "H100-SXM", "H800"} <= gpus
    assert any(r["moe"] for r in RUNS) and any(not r["moe"] for r in RUNS)
    assert len(set(_ids(RUNS))) == len(RUNS), "run ids are unique"


@pytest.mark.parametrize("key", sorted(ALL_SOURCES))
def test_source_citation(key):
    src = ALL_SOURCES[key]
    for field in ("publisher", "title", "url", "where", "flop_formula", "verification"):
        assert isinstance(src.get(field), str) and src[field].strip(), f"{key}: {field}"
    assert src["url"].startswith("https://")


@pytest.mark.parametrize("run", ALL_RUNS, ids=_ids(ALL_RUNS))
def test_run_fields(run):
    assert run["source"] in ALL_SOURCES, "cites a listed source"
    assert run["model"] and ("preset" in run["model"] or "model_type" in run["model"])
    assert run["nodes"] >= 1 and run["gpus_per_node"] >= 1
    lay = run["layout"]
    for k in ("tp", "pp", "ep", "cp", "zero_stage"):
        assert isinstance(lay[k], int) and lay[k] >= 0, k
    assert run["global_batch"] >= 1 and run["micro_batch"] >= 1 and run["seq_len"] >= 1
    assert run["precision"] in {"bf16", "fp16", "fp8"}
    assert run["recompute"] in {"none", "selective", "full"}
    pub = run["published"]
    assert pub["value"] > 0 and pub["text"].strip() and pub["metric"]
    assert run["normalisation"]["text"].strip()
    assert isinstance(run["tokens_per_s_per_gpu"], (int, float)) and run["tokens_per_s_per_gpu"] > 0
    assert isinstance(run["assumed"], list) and isinstance(run["inexpressible"], list)
    assert lay.get("vpp") is None or (isinstance(lay["vpp"], int) and lay["vpp"] >= 2), "vpp: null or >= 2"
    ex = run["execution"]
    assert ex["framework"] in {"deepspeed", "megatron", "fsdp"}, "every row records the framework it ran on"
    assert ex["attention_impl"] in typing.get_args(AttentionImpl)
    assert ex.get("loss_impl", "torch") in typing.get_args(LossImpl)
    assert set(ex) <= {"framework", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap",
                       "moe_a2a_overlap", "moe_dispatcher", "recompute_modules", "pipeline_schedule", "attention_impl",
                       "loss_impl", "grad_accum_dtype", "cuda_launch_blocking"}
    assert ex.get("cuda_launch_blocking", False) in (False, True)
    assert ex.get("grad_accum_dtype") in (None, "fp32") and (ex.get("grad_accum_dtype") is None or run["precision"] == "bf16")
    if ex.get("tp_comm_overlap"):
        assert lay["tp"] > 1, "TP communication overlap needs tp > 1"
    if ex.get("moe_a2a_overlap"):
        assert run["moe"], "all-to-all overlap only on MoE rows"
    if "moe_dispatcher" in ex:
        assert run["moe"] and ex["moe_dispatcher"] in {"alltoall", "deepep"}, "a dispatcher only on MoE rows"
    if ex.get("recompute_modules"):
        assert ex["framework"] == "megatron" and run["recompute"] != "full", "Megatron's --recompute-modules"


@pytest.mark.parametrize("run", ALL_RUNS, ids=_ids(ALL_RUNS))
def test_normalisation_reproduces_stored_figure(run):
    assert recompute(run) == pytest.approx(run["tokens_per_s_per_gpu"], rel=1e-3, abs=0.01)


@pytest.mark.parametrize("run", ALL_RUNS, ids=_ids(ALL_RUNS))
def test_layout_consistent(run):
    """The expressible layout divides the world, and the batch triad holds (global = micro x dp x accumulation)."""
    lay = run["layout"]
    world = run["nodes"] * run["gpus_per_node"]
    assert world % (lay["tp"] * lay["pp"]) == 0
    dp = world // (lay["tp"] * lay["pp"])
    assert dp % lay["ep"] == 0
    assert run["global_batch"] % (run["micro_batch"] * dp) == 0, "global batch = micro x dp x accumulation"
    if run["normalisation"]["formula"] == "step_time":
        p = run["normalisation"]["params"]
        assert (p["global_batch"], p["seq_len"], p["gpus"]) == (run["global_batch"], run["seq_len"], world)
    if run["normalisation"]["formula"] == "tokens_per_s_total":
        assert run["normalisation"]["params"]["gpus"] == world


CROSS = [r for r in RUNS if "cross_check" in r["normalisation"]]


@pytest.mark.parametrize("run", CROSS, ids=_ids(CROSS))
def test_llmfoundry_mfu_cross_check(run):
    """llm-foundry publishes both T/s/GPU and MFU: its own MFU formula turns one into the other within 1%."""
    cc = run["normalisation"]["cross_check"]
    assert cc["formula"] == "llmfoundry_mfu"
    p = cc["params"]
    assert p["s"] == run["seq_len"]
    tps = run["published"]["mfu_pct"] / 100 * p["peak_tflops"] * 1e12 / (6 * p["N"] + 12 * p["l"] * p["h"] * p["s"])
    assert tps == pytest.approx(run["tokens_per_s_per_gpu"], rel=0.01)


def test_llama3_table_is_self_consistent():
    """Llama 3 Table 4: TFLOPs/GPU ÷ 989 matches the stated BF16 MFU to the percent, and 16M tokens per batch."""
    rows = [r for r in RUNS if r["source"] == "llama3_2024"]
    assert len(rows) == 3
    for r in rows:
        mfu = int(r["published"]["text"].split("BF16 MFU ")[1].split("%")[0])
        assert math.floor(100 * r["published"]["value"] / 989) in (mfu, mfu - 1, mfu + 1)
        assert r["global_batch"] * r["seq_len"] == 16 * 2**20


SPECS = TABLE.parents[1] / "specs" / "published"
HELD_SPECS = TABLE.parents[1] / "specs" / "held_out"


def test_held_out_table_is_apart():
    """The held-out table is marked as such, shares no run id or source with the fitted table, and each row that
    `repeats` a fitted row names one with the same model, GPU count, batch and layout (a newer or older container)."""
    assert HELD["held_out"] is True and "held_out" not in DOC
    assert not {r["id"] for r in HELD["runs"]} & {r["id"] for r in RUNS}
    assert not set(HELD["sources"]) & set(SOURCES)
    assert {r["source"] for r in HELD["runs"]} == set(HELD["sources"])
    by_id = {r["id"]: r for r in RUNS}
    for r in HELD["runs"]:
        if "repeats" not in r:
            continue
        twin = by_id[r["repeats"]]
        assert (twin["model"], twin["gpu"], twin["nodes"], twin["micro_batch"], twin["global_batch"],
                twin["seq_len"], twin["layout"]) == (r["model"], r["gpu"], r["nodes"], r["micro_batch"],
                                                    r["global_batch"], r["seq_len"], r["layout"]), r["id"]


@pytest.mark.parametrize("run", ALL_RUNS, ids=_ids(ALL_RUNS))
def test_committed_spec_matches_row_and_loads(run):
    """benchmarks/specs/published/<id>.yaml is the row's spec (regenerated by benchmarks/published_runs.py) and the
    spec schema accepts it: the layout recorded as expressible really is."""
    from dstoolkit.spec import load_spec

    path = (SPECS if run in RUNS else HELD_SPECS) / f"{run['id']}.yaml"
    assert path.exists(), "run benchmarks/published_runs.py to regenerate the specs"
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    lay, t = run["layout"], doc["training"]
    assert doc["model"] == run["model"]
    assert (doc["cluster"]["nodes"], doc["cluster"]["gpus_per_node"], doc["cluster"]["gpu"]) == (
        run["nodes"], run["gpus_per_node"], run["gpu"])
    assert doc["cluster"].get("nvlink_domain_gpus") == run.get("nvlink_domain_gpus")
    assert (t["tp"], t["pp"], t["ep"], t["zero_stage"]) == (lay["tp"], lay["pp"], lay["ep"], lay["zero_stage"])
    assert (t["micro_batch"], t["global_batch"], t["seq_len"], t["precision"], t["activation_checkpointing"]) == (
        run["micro_batch"], run["global_batch"], run["seq_len"], run["precision"], run["recompute"])
    # the facts of how the run was made (dstoolkit/spec/cluster_fields.py): vpp -> interleaved + virtual stages,
    # cp -> cp, the rest from the row's execution: mapping
    ex = run["execution"]
    vpp = lay.get("vpp") or 1
    assert (t["virtual_stages"], t["cp"]) == (vpp, lay["cp"])
    assert t["pipeline_schedule"] == ex.get("pipeline_schedule", "interleaved" if vpp > 1 else "1f1b")
    assert (t["framework"], t["attention_impl"]) == (ex["framework"], ex["attention_impl"])
    assert t["recompute_modules"] == list(ex.get("recompute_modules") or [])
    assert t.get("grad_accum_dtype") == ex.get("grad_accum_dtype")
    for key, default in (("overlap_grad_reduce", "auto"), ("overlap_param_gather", "auto"),
                         ("tp_comm_overlap", False), ("moe_a2a_overlap", False), ("moe_dispatcher", "alltoall")):
        assert t[key] == ex.get(key, default), key
    spec = load_spec(path)
    assert spec.world_size == run["nodes"] * run["gpus_per_node"]
    tr = spec.training
    assert (tr.cp, tr.virtual_stages, tr.framework) == (lay["cp"], vpp, ex["framework"])
