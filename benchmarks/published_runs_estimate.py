"""Published runs, the estimating side: one spec through the public CLI (`python -m dstoolkit estimate SPEC
--format json`, so a restructuring of estimate/ underneath does not break the benchmark), and the result row of one
run: predicted beside published tokens/s/GPU, efficiency on a bf16-peak basis for both, whether the layout fits and
whether the estimator kept it."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any, Optional

from published_runs_specs import REPO, gpus, is_held_out


def estimate(spec_path: pathlib.Path, timeout: float = 300.0) -> dict[str, Any]:
    """Run the public CLI on one spec; {"ok": True, "json": ...} or {"ok": False, "error": ...}."""
    cmd = [sys.executable, "-m", "dstoolkit", "estimate", str(spec_path), "--format", "json"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    try:
        # exit 1 with the estimate on stdout is a finding (nothing fits): a result, scored as a false OOM
        return {"ok": True, "json": json.loads(proc.stdout)}
    except json.JSONDecodeError as exc:
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            return {"ok": False, "error": err[-1] if err else f"exit {proc.returncode}"}
        return {"ok": False, "error": f"unparsable JSON ({exc})"}


def _num(d: Any, *path: str) -> Optional[float]:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def peak_bf16(gpu: Any) -> float:
    from dstoolkit.hardware.table import GpuSpec, get_gpu

    return get_gpu(GpuSpec.model_validate(gpu) if isinstance(gpu, dict) else gpu).peak_bf16_flops


def layout_changes(spec: dict[str, Any], est: dict[str, Any]) -> list[str]:
    """Where the estimator's resolved layout differs from the one the spec fixed (it should not)."""
    par = est.get("parallel") or {}
    t = spec["training"]
    out = []
    for key, want in (("micro_batch", t["micro_batch"]), ("zero_stage", t["zero_stage"])):
        got = par.get(key)
        if got is not None and got != want:
            out.append(f"{key} {want} -> {got}")
    dp = gpus_of_spec(spec) // (t["tp"] * t["pp"] * t.get("cp", 1))
    if par.get("dp") is not None and par["dp"] != dp:
        out.append(f"dp {dp} -> {par['dp']}")
    return out


def gpus_of_spec(spec: dict[str, Any]) -> int:
    return spec["cluster"]["nodes"] * spec["cluster"]["gpus_per_node"]


def evaluate(run: dict[str, Any], spec: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """One result row (no environment)."""
    n = gpus(run)
    published = float(run["tokens_per_s_per_gpu"])
    row: dict[str, Any] = {
        "id": run["id"], "source": run["source"], "model": run["model_name"], "moe": bool(run.get("moe")),
        "gpu": run["gpu"] if isinstance(run["gpu"], str) else run["gpu"].get("name", "custom"), "gpus": n,
        "layout": {k: run["layout"].get(k) for k in ("tp", "pp", "vpp", "ep", "cp", "sp", "zero_stage")},
        "micro_batch": run["micro_batch"], "global_batch": run["global_batch"], "seq_len": run["seq_len"],
        "precision": run["precision"], "recompute": run["recompute"],
        "published_tokens_per_s_per_gpu": published, "published_as": run["published"]["text"],
        "table_index": run.get("_index"), "held_out": is_held_out(run["_index"]) if run.get("_index") is not None else None,
        "assumed": list(run.get("assumed") or []), "inexpressible": list(run.get("inexpressible") or []),
    }
    if not res.get("ok"):
        row.update(estimate_error=res.get("error"), predicted_tokens_per_s_per_gpu=None, error=None, fits=None)
        return row
    est = res["json"]
    step = _num(est, "step_time_s")
    tokens = _num(est, "tokens_per_step")
    fpt = _num(est, "flops_per_token")
    pred = tokens / step / n if step and tokens else None
    peak = peak_bf16(run["gpu"])
    mem = _num(est, "memory_per_rank_bytes", "total")
    cap = _num(est, "gpu_memory_bytes")
    row.update(
        predicted_tokens_per_s_per_gpu=pred,
        error=(pred / published - 1.0) if pred else None,
        fits=est.get("fits"),
        memory_per_rank_gib=mem / 2**30 if mem is not None else None,
        gpu_memory_gib=cap / 2**30 if cap is not None else None,
        step_time_s=step,
        step_time_breakdown_s=est.get("step_time_breakdown_s"),
        flops_per_token=fpt,
        published_efficiency=published * fpt / peak if fpt else None,
        predicted_efficiency=pred * fpt / peak if (fpt and pred) else None,
        estimator_mfu=_num(est, "mfu"),
        layout_changed=layout_changes(spec, est),
        estimator_assumptions=est.get("assumptions") or [],
    )
    return row
