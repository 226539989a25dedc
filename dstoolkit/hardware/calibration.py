"""Which measured rates (a `Calibration`) an estimate uses, and reading them from JSON files.

No torch import. A calibration replaces the hardware table's nominal rates in the step-time model
(`dstoolkit.estimate.step_time`). Where it comes from, in order:

1. `cluster.calibration` in the spec: a path (relative to the spec file) to a calibration JSON, "none" for
   the hardware table's nominal rates, "reference" for the packaged reference measurement, or "machine";
2. otherwise the environment variable DSTOOLKIT_CALIBRATION (same values);
3. otherwise, for ``gpu: cpu``, this machine ("machine"): a calibration probed once per CPU model, core count
   and torch version, and cached under ~/.cache/dstoolkit/calibration/ (`hardware.machine_calibration`). A CPU's
   rates differ by up to 60x between machines (bf16 without native support), so no packaged number can stand in
   for them. Without torch installed there is nothing to probe with, and the packaged reference
   (dstoolkit/data/calibration_cpu_reference.json, measured on a 2-core machine with native bf16) is used, and
   named so. GPU rows have no default calibration: their datasheet peaks with published efficiencies are the
   default.

A calibration JSON holds `Calibration` fields, bare or under a "calibration" key; files written by the probe
and by benchmarks/step_time_fidelity.py keep one set per clock ("wall", "cpu") and per precision
(``matmul_flops_per_s_<precision>[_large]``): the wall clock and the spec's precision are picked.
"""
from __future__ import annotations

import functools
import json
import math
import os
import pathlib
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from dstoolkit.hardware import machine_calibration as machine
from dstoolkit.hardware.table import GpuSpec, lookup_gpu_name


class Calibration(BaseModel):
    """Measured rates that replace the GPU table's nominal ones in the step-time model
    (benchmarks/step_time_fidelity.py measures them; results in benchmarks/results/calibration_*)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    matmul_flops_per_s: float = Field(gt=0)
    """Achieved training FLOP/s per rank (transformer-block forward+backward probe)."""
    matmul_work: Optional[float] = Field(default=None, gt=0)
    """Size of that probe: tokens per micro batch x hidden size (None: one rate for every size)."""
    matmul_flops_per_s_large: Optional[float] = Field(default=None, gt=0)
    """Rate of a second, larger probe; with it the rate is interpolated in log(size) (GEMM efficiency grows
    with size), and clamped outside the two probes."""
    matmul_work_large: Optional[float] = Field(default=None, gt=0)
    """Size of the larger probe (tokens x hidden)."""
    mem_bw_bytes_per_s: float = Field(gt=0)
    """Achieved elementwise streaming bandwidth per rank (optimizer update, casts, copies)."""
    comm_busbw_bytes_per_s: float = Field(gt=0)
    """Achieved collective bus bandwidth (nccl-tests busbw convention) of groups inside one node; also used
    across nodes when inter_node_busbw_bytes_per_s is None."""
    comm_latency_s: float = Field(default=0.0, ge=0)
    """Fixed cost per collective call."""
    inter_node_busbw_bytes_per_s: Optional[float] = Field(default=None, gt=0)
    """Bus bandwidth one group gets across nodes (e.g. a 2-node all-reduce's busbw in `dstoolkit bench comm`),
    used for collectives whose group spans nodes. None: comm_busbw_bytes_per_s for every collective."""
    inter_node_latency_s: Optional[float] = Field(default=None, ge=0)
    """Fixed cost per call of a collective spanning nodes (None: comm_latency_s)."""
    inter_node_links_per_node: int = Field(default=1, ge=1)
    """Independent inter-node links per node behind that busbw: groups crossing nodes side by side beyond
    this many share one (estimate.collective_time.link_share). 1 = one uplink per node (the CPU test hosts)."""
    peak_flops_per_s: Optional[float] = Field(default=None, gt=0)
    """Dense-GEMM peak FLOP/s per rank for this precision: the best square matmul the probe measured, never
    below the block rates above (so an estimate's MFU is at most 1). The MFU denominator on CPU ranks, for the
    estimator and the training monitor alike (`peak_flops_per_rank`). None: the hardware table's peak."""
    per_layer_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed framework cost per transformer block per micro step (hooks, small kernels)."""
    gemm_rate_flops_per_s: Optional[float] = Field(default=None, gt=0)
    """Op-level CPU model (`dstoolkit.estimate.cpu_compute`): the large-GEMM rate R of the probe's fit
    t = gemm_call_s + 2mnk / (R · d / (d + gemm_half_dim)), d = min(m, n, k). With it, the attention points and
    the elementwise rate, CPU compute is summed op by op instead of one block rate (matmul_flops_per_s)."""
    gemm_half_dim: Optional[float] = Field(default=None, ge=0)
    """GEMM dimension at which the fitted rate is half of gemm_rate_flops_per_s."""
    gemm_call_s: Optional[float] = Field(default=None, ge=0)
    """Fixed seconds per GEMM call of that fit."""
    attention_points: Optional[list[tuple[float, float, float, float]]] = None
    """Causal attention core (torch SDPA) on a full (seq, head dim) grid: [seq, head_dim, fwd+bwd seconds per
    query row and head, forward seconds per query row and head]."""
    grad_bw_bytes_per_s: Optional[float] = Field(default=None, gt=0)
    """Rate of the memory-bound gradient path (DeepSpeed's gradient hooks, bucket copies and casts, parameter
    write-back), measured by the probe on a real ZeRO-2 engine step (`runtime.probe.grad_path_fields`).
    None: mem_bw_bytes_per_s."""
    elementwise_s_per_byte: Optional[float] = Field(default=None, ge=0)
    """Seconds of a block's elementwise work (norms, RoPE, activations, casts) per byte it saves for backward."""

    @property
    def has_op_rates(self) -> bool:
        """True when the op-level CPU model's rates are all there (else the block rate is used)."""
        return bool(self.gemm_rate_flops_per_s and self.attention_points and self.elementwise_s_per_byte is not None)
    step_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed framework cost per optimizer step (DeepSpeed bookkeeping)."""

    def rate_at(self, work: float) -> float:
        """FLOP/s for a micro batch of `work` = tokens x hidden, interpolated between the probes."""
        if not (self.matmul_work and self.matmul_flops_per_s_large and self.matmul_work_large):
            return self.matmul_flops_per_s
        x0, x1 = math.log(self.matmul_work), math.log(self.matmul_work_large)
        x = min(max(math.log(work), min(x0, x1)), max(x0, x1))
        frac = (x - x0) / (x1 - x0) if x1 != x0 else 0.0
        return self.matmul_flops_per_s + frac * (self.matmul_flops_per_s_large - self.matmul_flops_per_s)



DATA_DIR = pathlib.Path(__file__).resolve().parents[1] / "data"
PACKAGED = {"cpu": DATA_DIR / "calibration_cpu_reference.json"}
"""Hardware-table rows (by name) with a packaged reference calibration."""
NONE_VALUES = ("none", "off", "false")
"""cluster.calibration values that switch calibration off (use the table's nominal rates)."""
REFERENCE = "reference"
"""cluster.calibration value for the packaged reference measurement of the hardware row."""
MACHINE = "machine"
"""cluster.calibration value for this machine's probed (and cached) calibration; the default for gpu: cpu."""
ENV_VAR = "DSTOOLKIT_CALIBRATION"
"""Environment variable giving the calibration for specs that name none (same values as cluster.calibration)."""
CLOCKS = ("wall", "cpu")
"""Per-clock sections a step_time_fidelity calibration file holds; estimates use wall-clock rates."""


class CalibrationInputError(ValueError):
    """A calibration file that cannot be used; the message names the file and what is wrong."""


def read_calibration_file(path: Union[str, pathlib.Path]) -> dict[str, Any]:
    """Raw calibration fields from a JSON file (the "calibration" section when there is one; the last
    record of a list). The source path is kept under "_source".

    Raises:
        CalibrationInputError: missing, unreadable or not-JSON file, or no object inside.
    """
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CalibrationInputError(f"{p}: no such calibration file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationInputError(f"{p}: cannot read calibration JSON ({exc})") from None
    if isinstance(data, list) and data:
        data = data[-1]
    if not isinstance(data, dict):
        raise CalibrationInputError(f"{p}: expected a JSON object of Calibration fields, got {type(data).__name__}")
    section = data.get("calibration", data)
    if not isinstance(section, dict):
        raise CalibrationInputError(f"{p}: 'calibration' must be an object of Calibration fields")
    return {**section, "_source": str(p)}


def calibration_from_raw(raw: dict[str, Any], precision: str, clock: str = "wall") -> Calibration:
    """A `Calibration` from raw fields: the `clock` section when the file has per-clock sets, and the
    ``matmul_flops_per_s_<precision>`` rates when it has per-precision ones (fp16/fp8 fall back to bf16).

    Raises:
        CalibrationInputError: a field is missing or out of range (message names the file and the field).
    """
    fields = dict(raw)
    if isinstance(fields.get(clock), dict):
        fields = {**fields[clock], "_source": raw.get("_source")}
    prec = precision if f"matmul_flops_per_s_{precision}" in fields else (
        "bf16" if precision in ("fp16", "fp8") else precision)
    for suffix in ("", "_large"):
        per_prec = fields.get(f"matmul_flops_per_s_{prec}{suffix}")
        if per_prec:
            fields[f"matmul_flops_per_s{suffix}"] = per_prec
    for name in Calibration.model_fields:  # any other field measured per precision: <field>_<precision>
        if f"{name}_{prec}" in fields and not name.startswith("matmul_flops_per_s"):
            fields[name] = fields[f"{name}_{prec}"]
    gemm_peak = fields.get(f"gemm_peak_flops_per_s_{prec}")
    if gemm_peak:
        fields["peak_flops_per_s"] = max(gemm_peak, *(fields.get(f"matmul_flops_per_s{s}") or 0 for s in ("", "_large")))
    kept = {k: v for k, v in fields.items() if k in Calibration.model_fields}
    try:
        return Calibration(**kept)
    except Exception as exc:  # pydantic ValidationError: name the fields
        errors = getattr(exc, "errors", lambda: [])()
        detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ()))}: {e.get('msg')}" for e in errors) or str(exc)
        raise CalibrationInputError(
            f"{raw.get('_source', 'calibration')}: not a usable calibration ({detail}); it needs at least "
            "matmul_flops_per_s, mem_bw_bytes_per_s and comm_busbw_bytes_per_s (benchmarks/step_time_fidelity.py "
            "writes such a file)") from None


@functools.lru_cache(maxsize=32)
def _cached(path: str, mtime_ns: int, precision: str) -> Calibration:
    return calibration_from_raw(read_calibration_file(path), precision)


def load_calibration(path: Union[str, pathlib.Path], precision: str) -> Calibration:
    """`read_calibration_file` + `calibration_from_raw`, cached per file version and precision."""
    p = pathlib.Path(path)
    try:
        mtime = p.stat().st_mtime_ns
    except OSError:
        mtime = -1  # read_calibration_file raises the readable error
    return _cached(str(p), mtime, precision)


def packaged_calibration_path(gpu_name: str) -> Optional[pathlib.Path]:
    """The packaged reference calibration for a hardware-table row, if it has one."""
    key = lookup_gpu_name(gpu_name) if isinstance(gpu_name, str) else None
    return PACKAGED.get(key) if key else None


def calibration_path(value: Optional[str], gpu, base_dir: Optional[pathlib.Path] = None,
                     probe: bool = True) -> Optional[pathlib.Path]:
    """The calibration file for `value` (a path relative to `base_dir`, "none", "reference" or "machine"); when
    `value` is None, DSTOOLKIT_CALIBRATION's value, else this machine's for a CPU row ("machine"), else none.
    `probe=False`: "machine" is only ever a cached calibration (None when there is none): what a training rank
    asks, since a probe started beside the job's ranks would measure the job, not the machine."""
    given = value is not None  # the caller's own value (a flag or cluster.calibration), not a default
    if value is None:
        value = os.environ.get(ENV_VAR) or None
        base_dir = None if value is not None else base_dir  # the variable's relative paths are the cwd's
    if value is None:
        value = MACHINE if isinstance(gpu, str) and lookup_gpu_name(gpu) == "cpu" else None
    if value is None:
        return None
    word = str(value).strip().lower()
    if word in NONE_VALUES:
        return None
    name = gpu if isinstance(gpu, str) else getattr(gpu, "name", str(gpu))
    if word == REFERENCE:
        path = packaged_calibration_path(gpu) if isinstance(gpu, str) else None
        if path is None and given:
            raise CalibrationInputError(
                f"'reference': there is no packaged reference calibration for {name} (only for "
                f"{', '.join(sorted(PACKAGED))}); a GPU row's default is the hardware table's nominal rates")
        return path
    if word == MACHINE:
        if not (isinstance(gpu, str) and lookup_gpu_name(gpu) == "cpu"):
            if given:
                raise CalibrationInputError(f"'machine' probes this machine's CPU, which does not time {name}")
            return None
        if not probe:
            return machine.cached_machine_calibration_path()
        try:
            path = machine.machine_calibration_path()
        except machine.ProbeError as exc:
            raise CalibrationInputError(str(exc)) from None
        return PACKAGED["cpu"] if path is None else path  # None: no torch to probe with (it said so)
    p = pathlib.Path(str(value)).expanduser()
    return p if p.is_absolute() or base_dir is None else base_dir / p


def calibration_path_for(spec, probe: bool = True) -> Optional[pathlib.Path]:
    """The calibration file an estimate of `spec` uses (None: the table's nominal rates).

    `cluster.calibration` (relative paths resolve against the spec file's folder), else the packaged reference
    for the spec's hardware row.
    """
    return calibration_path(getattr(spec.cluster, "calibration", None), spec.cluster.gpu, spec.base_dir, probe)


def resolve_calibration(value: Optional[str], gpu, precision: str,
                        base_dir: Optional[pathlib.Path] = None, probe: bool = True) -> Optional[Calibration]:
    """The `Calibration` for an explicit `value` (path or "none") or the hardware row's packaged reference
    (`calibration_path`), loaded for `precision`; None = the table's nominal rates.

    Raises:
        CalibrationInputError: the file is missing or unusable.
    """
    path = calibration_path(value, gpu, base_dir, probe)
    return None if path is None else load_calibration(path, precision)


def calibration_for_spec(spec, probe: bool = True) -> Optional[Calibration]:
    """The `Calibration` for estimates of `spec` (see the module docstring), or None (`probe`: see
    `calibration_path`).

    Raises:
        SpecError: cluster.calibration names a file that is missing or unusable (located at its YAML line).
    """
    try:
        return resolve_calibration(getattr(spec.cluster, "calibration", None), spec.cluster.gpu,
                                   spec.training.precision, spec.base_dir, probe)
    except CalibrationInputError as exc:
        if getattr(spec.cluster, "calibration", None) is None:
            raise  # the packaged file itself is broken: an installation problem, not the user's spec
        raise spec.error(("cluster", "calibration"), str(exc),
                         "point cluster.calibration at a JSON written by benchmarks/step_time_fidelity.py, or "
                         "'none' for the hardware table's nominal rates") from None


def path_label(path: Optional[pathlib.Path]) -> str:
    """How a calibration file is named in summaries: packaged ones by package path; None = nominal rates."""
    if path is None:
        return "nominal hardware-table rates"
    if path.parent == machine.cache_dir():
        return f"this machine's calibration {path}"
    try:
        shown = "dstoolkit/" + path.resolve().relative_to(DATA_DIR.parent).as_posix()
        return f"reference calibration {shown}"
    except ValueError:
        return f"calibration {path}"


def calibration_label(spec) -> str:
    """How estimates of `spec` are calibrated, for summaries (`path_label` of `calibration_path_for`), with
    `oversubscribed_note` where this machine's calibration is applied to more ranks per node than it has cores."""
    path = calibration_path_for(spec)
    label = path_label(path)
    if path is not None and path.parent == machine.cache_dir():
        label += oversubscribed_note(spec.cluster.gpus_per_node, _recorded_cores(path))
    return label


def _recorded_cores(path: pathlib.Path) -> Optional[int]:
    """The usable cores a machine calibration file records (its `machine.cores`, `machine_key`)."""
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["machine"]["cores"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def oversubscribed_note(ranks_per_node: int, cores: Optional[int]) -> str:
    """What a machine calibration's per-rank rates mean when a spec puts more CPU ranks on one node than the
    calibrated machine has cores: the probe measured ranks that each had a core of their own (PROBE_RANKS side by
    side), so the rates hold on hosts with a core per rank, not on the calibrated machine itself (its ranks would
    share its cores: ~ranks / cores slower each). Empty when every rank has a core."""
    if not cores or ranks_per_node <= cores:
        return ""
    return (f" (measured with a core per rank; this machine has {cores} cores, so {ranks_per_node} ranks per node "
            f"would share them here, ~{ranks_per_node / cores:.0f}x slower per rank: the step time holds on hosts "
            f"with at least {ranks_per_node} cores)")


def peak_flops_per_rank(gpu: GpuSpec, precision: str, calibration: Optional[Calibration]) -> tuple[float, str]:
    """The MFU denominator of one rank and what it is: the calibration's measured GEMM peak when it has one
    (CPU ranks: the probe's best square matmul, at least its block rates), else the hardware table's peak for
    the precision (fp8 uses peak_fp8_flops where the GPU has one; other precisions the bf16 tensor peak, as in
    PaLM App. B's MFU, docs/anchors.md). The estimator and the training monitor both divide by this. The step-time
    model's fp8 GEMM rate is capped by the same fp8 peak (estimate.gemm.precision_factor) and GpuSpec refuses an fp8
    peak below the bf16 one, so an estimate's GEMMs never run above the peak its MFU divides by."""
    if calibration is not None and calibration.peak_flops_per_s:
        return calibration.peak_flops_per_s, f"measured {precision} GEMM peak of the calibration"
    if precision == "fp8" and gpu.peak_fp8_flops:
        return gpu.peak_fp8_flops, f"{gpu.name} fp8 peak (hardware table)"
    return gpu.peak_bf16_flops, f"{gpu.name} bf16 peak (hardware table)"
