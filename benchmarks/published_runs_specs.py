"""Published runs, the table side: benchmarks/data/published_runs.yaml read and checked, the held-out rule over its
rows, and one spec per run (its model section verbatim, its cluster, the closest expressible layout and the
execution facts) written where the estimator reads it."""
from __future__ import annotations

import pathlib
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "published_runs.yaml"
SPECS_DIR = REPO / "benchmarks" / "specs" / "published"
HELD_OUT_TABLE = REPO / "benchmarks" / "data" / "held_out_runs.yaml"
"""Published runs no constant is ever fitted on (its top-level `held_out: true`): scored with the shipped constants
only, so its figures are out of sample by construction (estimator_fit reads TABLE alone)."""
HELD_OUT_SPECS_DIR = REPO / "benchmarks" / "specs" / "held_out"
CLUSTERS = REPO / "benchmarks" / "data" / "clusters.yaml"
"""Measured clusters (`gpu: {cluster: NAME}` in a table): the one owner of a cluster's measured figures."""
HELD_OUT_EVERY = 3
"""Held-out rule: the rows whose table index i has i % 3 == 2 are held out; the fitted constants of
estimate.cluster_model and estimate.gemm are chosen on the other two thirds, and the summary reports both parts
apart."""


def is_held_out(table_index: int) -> bool:
    return table_index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def repo_relative(path: pathlib.Path) -> str:
    path = pathlib.Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def load_table(path: pathlib.Path = TABLE) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or "runs" not in doc or "sources" not in doc:
        raise SystemExit(f"{path}: expected a mapping with 'sources' and 'runs'")
    for run in doc["runs"]:
        run["gpu"] = resolve_gpu(run["gpu"], f"{path.name} {run.get('id')}")
    return doc


def resolve_gpu(gpu: Any, where: str, clusters_path: pathlib.Path = CLUSTERS) -> Any:
    """A table's `gpu:` as the spec takes it: a hardware-table name or a GpuSpec mapping unchanged; `{cluster: NAME}`
    replaced by that measured cluster's GpuSpec mapping from benchmarks/data/clusters.yaml."""
    if not (isinstance(gpu, dict) and set(gpu) == {"cluster"}):
        return gpu
    doc = yaml.safe_load(clusters_path.read_text(encoding="utf-8")) or {}
    known = doc.get("clusters") or {}
    if gpu["cluster"] not in known:
        raise SystemExit(f"{where}: gpu.cluster {gpu['cluster']!r} is not in {repo_relative(clusters_path)} "
                         f"(known: {', '.join(sorted(known)) or 'none'})")
    return dict(known[gpu["cluster"]]["gpu"])


def is_held_out_table(doc: dict[str, Any]) -> bool:
    """A table marked `held_out: true` (HELD_OUT_TABLE): nothing is fitted on it, so no leave-one-source-out and no
    split of its rows."""
    return bool(doc.get("held_out"))


def specs_dir_for(doc: dict[str, Any]) -> pathlib.Path:
    return HELD_OUT_SPECS_DIR if is_held_out_table(doc) else SPECS_DIR


def gpus(run: dict[str, Any]) -> int:
    return int(run["nodes"]) * int(run["gpus_per_node"])


def spec_for(run: dict[str, Any]) -> dict[str, Any]:
    """The spec of one run: its model section verbatim, its cluster, and the closest expressible layout."""
    lay = run["layout"]
    tp = int(lay.get("tp", 1))
    training = {
        "seq_len": int(run["seq_len"]),
        "global_batch": int(run["global_batch"]),
        "micro_batch": int(run["micro_batch"]),
        "precision": run["precision"],
        "optimizer": "adamw",
        "activation_checkpointing": run["recompute"],
        "flash_attention": True,
        "sequence_parallel": bool(lay.get("sp")) and tp > 1,
        "tp": tp,
        "pp": int(lay.get("pp", 1)),
        "ep": int(lay.get("ep", 1)),
        "zero_stage": int(lay.get("zero_stage", 0)),
        "offload": False,
        "zeropp": False,
    }
    training.update(execution_fields(run))
    cluster = {"nodes": int(run["nodes"]), "gpus_per_node": int(run["gpus_per_node"]), "gpu": run["gpu"]}
    if run.get("nvlink_domain_gpus"):
        cluster["nvlink_domain_gpus"] = int(run["nvlink_domain_gpus"])
    return {
        "name": run["id"],
        "model": dict(run["model"]),
        "cluster": cluster,
        "training": training,
    }


EXECUTION_KEYS = ("framework", "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "moe_a2a_overlap",
                  "moe_dispatcher", "recompute_modules", "pipeline_schedule", "attention_impl", "loss_impl",
                  "grad_accum_dtype", "cuda_launch_blocking")
"""What a row's execution: mapping may set (facts of how the run was made: its framework, the overlap flags its
recipe turns on, its pipeline schedule, its attention and loss kernels, its gradient accumulation dtype, whether it
ran with CUDA_LAUNCH_BLOCKING=1); never fitted values."""


def execution_fields(run: dict[str, Any]) -> dict[str, Any]:
    """The spec's cluster-model fields (dstoolkit/spec/cluster_fields.py) of one run: the row's execution: mapping,
    the interleaved schedule with its virtual stages from layout.vpp, and the context-parallel degree from layout.cp."""
    lay, ex = run["layout"], dict(run.get("execution") or {})
    unknown = sorted(set(ex) - set(EXECUTION_KEYS))
    if unknown:
        raise SystemExit(f"{run['id']}: unknown execution field(s) {unknown}")
    vpp = int(lay.get("vpp") or 1)
    out: dict[str, Any] = {
        "framework": ex.get("framework", "deepspeed"),
        "overlap_grad_reduce": ex.get("overlap_grad_reduce", "auto"),
        "overlap_param_gather": ex.get("overlap_param_gather", "auto"),
        "tp_comm_overlap": bool(ex.get("tp_comm_overlap", False)),
        "moe_a2a_overlap": bool(ex.get("moe_a2a_overlap", False)),
        "moe_dispatcher": ex.get("moe_dispatcher", "alltoall"),
        "recompute_modules": list(ex.get("recompute_modules") or []),
        "pipeline_schedule": ex.get("pipeline_schedule", "interleaved" if vpp > 1 else "1f1b"),
        "virtual_stages": vpp,
        "cp": int(lay.get("cp") or 1),
    }
    if vpp > 1 and out["pipeline_schedule"] != "interleaved":
        raise SystemExit(f"{run['id']}: layout.vpp={vpp} with pipeline_schedule {out['pipeline_schedule']!r}")
    if ex.get("attention_impl") is not None:
        out["attention_impl"] = ex["attention_impl"]
    if ex.get("loss_impl") is not None:
        out["loss_impl"] = ex["loss_impl"]
    if ex.get("grad_accum_dtype") is not None:
        out["grad_accum_dtype"] = ex["grad_accum_dtype"]
    if ex.get("cuda_launch_blocking"):
        out["cuda_launch_blocking"] = True
    return out


def write_spec(run: dict[str, Any], source: dict[str, Any], out_dir: pathlib.Path,
               table: pathlib.Path = TABLE) -> pathlib.Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {run['model_name']}: {run['published']['text']}",
             f"# Source: {source['title']}",
             f"#   {source['url']} ({source['where']})",
             f"# Published figure normalised: {run['tokens_per_s_per_gpu']} tokens/s/GPU ({run['normalisation']['text']})"]
    for a in run.get("assumed") or []:
        lines.append(f"# assumed: {a}")
    for x in run.get("inexpressible") or []:
        lines.append(f"# inexpressible: {x}")
    lines.append(f"# Generated by benchmarks/published_runs.py from {repo_relative(table)}; edit the table, not this file.")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(spec_for(run), sort_keys=False, width=120)
    path = out_dir / f"{run['id']}.yaml"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return path
