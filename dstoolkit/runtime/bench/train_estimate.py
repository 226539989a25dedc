"""What `bench train` estimates beside each measured config (split from runtime/bench/train.py so its pre-flight,
runtime/bench/train_precheck.py, and the trainer's HF callback read one estimate without an import circle): the
`--calibration` argument, the estimate for one config as a flat dict, and the spec of a shrunk run."""
from __future__ import annotations

from typing import Any, Optional

from dstoolkit.runtime.bench.harness import BenchInputError


NOMINAL = {"_source": "none"}
"""`--calibration none`: the hardware table's nominal rates (no calibration at all)."""


def load_calibration(path: Optional[str]) -> Optional[dict[str, Any]]:
    """Raw calibration fields for `--calibration`: None for 'auto' or unset, i.e. the spec's own calibration
    (`dstoolkit.hardware.calibration.calibration_for_spec`: cluster.calibration, DSTOOLKIT_CALIBRATION, or this
    machine's for gpu: cpu), the one every other estimate (`estimate`, `tune`, the HF callback, the trainer's
    MFU) uses; `NOMINAL` for 'none'; else the file's fields (`read_calibration_file`).

    'auto' used to mean the newest benchmarks/results/calibration_<cpu|gpu>_*.json of the checkout: a file
    measured on another machine, which made the bench's estimate disagree with the tuner's for the same
    config (the user-script configs: 20,843 vs 7,652 tok/s here)."""
    from dstoolkit.hardware.calibration import CalibrationInputError, read_calibration_file

    if not path or str(path).strip().lower() == "auto":
        return None
    if str(path).strip().lower() in ("none", "off", "false"):
        return NOMINAL
    try:
        return read_calibration_file(path)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def calibration_for(raw: Optional[dict[str, Any]], precision: str):
    """A `dstoolkit.estimate.Calibration` from raw fields (wall clock, the run's precision)."""
    if not raw or raw is NOMINAL:
        return None
    from dstoolkit.hardware.calibration import CalibrationInputError, calibration_from_raw

    try:
        return calibration_from_raw(raw, precision)
    except CalibrationInputError as exc:
        raise BenchInputError(f"--calibration: {exc}") from None


def estimate_for(spec, shape, ds_config: dict, world_size: int, ep_size: int, calibration_raw,
                 probe: bool = True) -> Optional[dict[str, Any]]:
    """The estimate for one config as a flat dict ({"error": ...} when the estimator refuses). `probe=False`
    (inside a training rank): the spec's calibration is never probed for, only read from the cache."""
    try:
        from dstoolkit.estimate import estimate_run
        from dstoolkit.estimate.step_time import peak_flops
        from dstoolkit.runplan import plan_from_spec
        from dstoolkit.hardware.calibration import calibration_for_spec, calibration_label
    except ImportError as exc:  # pragma: no cover - estimator is part of the package
        return {"error": f"estimator unavailable: {exc}"}
    try:
        calibration = calibration_for(calibration_raw, spec.training.precision)
        at = {}  # the bench may run the config on other ranks than the spec's cluster
        if world_size != spec.cluster.world_size:
            at = {"world_size": world_size, "gpus_per_node": min(spec.cluster.gpus_per_node, world_size)}
        if calibration is not None or calibration_raw is NOMINAL:
            at["calibration"] = calibration  # else plan_from_spec's default: the spec's own calibration
        elif not probe:
            at["calibration"] = calibration_for_spec(spec, probe=False)
        plan = plan_from_spec(spec, ds_config, shape, ep=ep_size, **at)
        est = estimate_run(plan)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    peak = peak_flops(plan)  # the estimator's own MFU peak (the monitor divides by the same)
    return {
        "step_time_s": est.step_time_s,
        "tokens_per_step": est.tokens_per_step,
        "tokens_per_s": est.tokens_per_step / est.step_time_s if est.step_time_s > 0 else None,
        "mfu": est.mfu,
        "memory_per_rank_bytes": est.memory.total,
        "flops_per_token": est.flops_per_token,
        "peak_flops_per_rank": peak,
        "calibrated": plan.calibration is not None,
        "calibration_source": ((calibration_raw or {}).get("_source") if calibration is not None
                               else calibration_label(spec) if plan.calibration is not None
                               else "nominal hardware-table rates"),
        "step_time_breakdown_s": est.step_time.model_dump(),
        "comm_share": est.step_time.comm_exposed_s / est.step_time_s if est.step_time_s > 0 else None,
    }


def _describe_shrunk_run(spec, shrunk, world_size: int) -> None:
    """Make `spec` describe what a shrunk run trains, so the estimate beside it is of the same run: the
    capped seq_len, pure data parallelism (the trainer: tp = pp = ep = 1), and this machine's hardware (a
    strategy generated for a GPU cluster runs shrunk on the local CPU ranks)."""
    import torch

    spec.training.seq_len = shrunk.seq_len  # the trainer caps it the same way
    for key in ("tp", "pp", "ep"):
        setattr(spec.training, key, 1)
    if not torch.cuda.is_available() and get_gpu_name(spec) != "cpu":
        from dstoolkit.spec.cluster import ClusterSpec

        spec.cluster = ClusterSpec(nodes=1, gpus_per_node=world_size, gpu="cpu")


def get_gpu_name(spec) -> str:
    gpu = spec.cluster.gpu
    return (gpu if isinstance(gpu, str) else gpu.name).strip().lower()
