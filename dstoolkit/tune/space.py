"""The search space `dstoolkit tune` explores: the sweep's candidates plus the DeepSpeed knobs the sweep fixes.

No torch import. A `TunePoint` is one fully specified configuration: a `dstoolkit.generate` `Candidate`
(ZeRO stage, offload, ZeRO++, TP/PP/EP, micro-batch, recompute policy) plus `overlap_comm` and a bucket
scale applied to the generated bucket sizes. `TuneSpace` lists the choices per dimension, maps an optuna
trial's parameters to a point, and runs the pre-run checks (structural rules, `validate_config`, the memory
estimate) that turn a point into a pruned trial with a reason before anything is launched.

Everything from `dstoolkit.generate` comes through its planner API (`dstoolkit.generate.planner`:
`candidates_for`, `zero_modes`, `check_candidate`, `ds_config_for`, `estimate_candidate`); what it does not
expose (bucket scaling, overlap_comm as a choice, point labels and keys) is wrapped here.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from pydantic import BaseModel, ConfigDict, Field

from dstoolkit.generate.planner import (MICRO_BATCH_CHOICES, Candidate, CandidateEstimate, EstimateInputError,
                                        candidates_for, check_candidate, checkpoint_choices, ds_config_for,
                                        estimate_candidate, is_cpu_cluster, zero_modes)
from dstoolkit.generate.costing import only_peak_fits, peak_only_caution
from dstoolkit.layout import data_parallel_size
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.validate.engine import validate_config

GiB = 2**30

# Bucket sizes are tuned as a multiple of what `ds_config_for` emits (DeepSpeed's 5e8-element default,
# clamped to the parameters one rank holds): smaller buckets start communication earlier and reserve less
# memory, at the cost of more collective calls (DeepSpeed docs, zero_optimization.reduce_bucket_size).
DEFAULT_BUCKET_SCALES = (0.25, 1.0)
MIN_BUCKET_ELEMENTS = 100_000  # never scale a bucket below this (tiny buckets only add call overhead)
# The bucket keys scaled together; DeepSpeed reads each as a number of elements.
BUCKET_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size")


class TuneInputError(ValueError):
    """A request the tuner cannot serve (bad budget, a spec the chosen mode cannot run); exit code 2."""


class TunePoint(BaseModel):
    """One configuration the tuner can try."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    candidate: Candidate
    """ZeRO stage, offload, ZeRO++, TP/PP/EP, micro-batch and recompute policy (the sweep's unit)."""
    overlap_comm: Optional[bool] = None
    """zero_optimization.overlap_comm; None keeps what `ds_config_for` emits (off on CPU, on on GPU)."""
    bucket_scale: float = Field(default=1.0, gt=0)
    """Multiplier on the generated reduce/all-gather/prefetch bucket sizes (stage >= 1 only)."""

    @property
    def key(self) -> str:
        """Stable identity (two trials with the same key measure the same thing)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @property
    def label(self) -> str:
        parts = [self.candidate.label]
        if self.candidate.zero_stage >= 1:
            if self.overlap_comm is not None:
                parts.append(f"overlap={'on' if self.overlap_comm else 'off'}")
            if self.bucket_scale != 1.0:
                parts.append(f"bucket x{self.bucket_scale:g}")
        return " ".join(parts)


@dataclass(frozen=True)
class PointCheck:
    """Outcome of the pre-run checks for one point: either pruned (code + reason) or runnable."""

    point: TunePoint
    ds_config: Optional[dict]
    estimate: Optional[CandidateEstimate]
    pruned_code: Optional[str] = None
    pruned_reason: Optional[str] = None
    warnings: tuple = ()

    @property
    def pruned(self) -> bool:
        return self.pruned_code is not None


def _zero_label(mode: tuple[int, bool, bool, bool]) -> str:
    stage, off_opt, off_par, zpp = mode
    if zpp:
        return "3++"
    if off_par:
        return f"{stage}+opt+param"
    if off_opt:
        return f"{stage}+opt"
    return str(stage)


def _checkpoint_label(p: CheckpointPolicy) -> str:
    if p.kind == "every-k":
        return f"every-{p.every_k}"
    if p.kind == "ratio":
        return f"ratio-{p.ratio:g}"
    return p.kind


@dataclass
class TuneSpace:
    """Choices per dimension. Dimensions with one choice are fixed (not suggested to optuna)."""

    spec: Spec
    shape: ModelShape
    zero: dict[str, tuple[int, bool, bool, bool]]
    micro_batch: list[int]
    checkpoint: dict[str, CheckpointPolicy]
    tp: list[int]
    pp: list[int]
    ep: list[int]
    overlap_comm: list[Optional[bool]]
    bucket_scale: list[float]
    fixed_reasons: dict[str, str] = field(default_factory=dict)
    """Why a dimension has a single choice (shown in the report)."""
    shrunk: Any = None
    """`dstoolkit.runtime.shrink_run.ShrunkRun` when real trials train the spec's architecture shrunk (`shape` is
    then the shrunk shape)."""
    user_seq_len: Optional[int] = None
    """The spec file's training.seq_len (a shrunk run caps `spec`'s); best_spec.yaml keeps it."""

    @classmethod
    def from_spec(cls, spec: Spec, shape: ModelShape, *, bucket_scales: tuple[float, ...] = DEFAULT_BUCKET_SCALES,
                  tune_overlap: Optional[bool] = None, data_parallel_only: bool = False,
                  expert_parallel: bool = True) -> "TuneSpace":
        """The space a spec leaves open ("auto" fields) plus the tuned DeepSpeed knobs.

        Args:
            spec: The loaded spec; fixed fields stay fixed, "auto" ones become dimensions.
            shape: Its model shape.
            bucket_scales: Multipliers tried on the generated bucket sizes ((1.0,) fixes them).
            tune_overlap: Whether overlap_comm is a dimension; None: only on GPU clusters (on CPU DeepSpeed's
                overlap path only adds copies: there are no CUDA streams to overlap on).
            data_parallel_only: Restrict TP and PP to 1 (the example trainer used by real mode is pure
                DeepSpeed data parallel, with expert parallelism for MoE).
            expert_parallel: False restricts EP to 1 (a shrunk transformers model: its experts are plain
                modules, there are no DeepSpeed expert groups to split them over).
        """
        if not bucket_scales or any(s <= 0 for s in bucket_scales):
            raise TuneInputError(f"bucket_scales={bucket_scales!r}: need at least one positive multiplier")
        t, c = spec.training, spec.cluster
        fixed: dict[str, str] = {}
        zero = {_zero_label(m): m for m in zero_modes(spec, None)}
        # Same degree choices as the sweep (enumerate_candidates), read off the candidates it yields.
        cands = list(candidates_for(spec, shape))
        tps = sorted({x.tp for x in cands})
        pps = sorted({x.pp for x in cands})
        eps = sorted({x.ep for x in cands})
        if data_parallel_only:
            if t.tp != "auto" and int(t.tp) > 1 or t.pp != "auto" and int(t.pp) > 1:
                raise TuneInputError(
                    f"training.tp={t.tp}, training.pp={t.pp}: real mode runs the example trainer, which is pure "
                    "DeepSpeed data parallel (tp=pp=1); use --mode estimate for TP/PP layouts")
            tps, pps = [1], [1]
            fixed["tp"] = fixed["pp"] = "real mode: the example trainer is data parallel only"
        if not expert_parallel and eps != [1]:
            if t.ep != "auto" and int(t.ep) > 1:
                raise TuneInputError(f"training.ep={t.ep} with --shrink: the shrunk transformers model's experts are "
                                     "plain modules (no DeepSpeed expert groups); set ep: 1 or auto")
            eps = [1]
            fixed["ep"] = "--shrink: the transformers experts are plain modules, trained data-parallel"
        world = c.world_size
        if t.micro_batch == "auto":
            # Keep the micro-batches that give an integer gradient accumulation for some data-parallel degree.
            dps = {dp for tp in tps for pp in pps if (dp := data_parallel_size(world, tp, pp)) is not None}
            mbs = [m for m in MICRO_BATCH_CHOICES if any(t.global_batch % (m * dp) == 0 for dp in dps)]
            if not mbs:
                raise TuneInputError(
                    f"training.global_batch={t.global_batch}: no micro-batch in {list(MICRO_BATCH_CHOICES)} divides "
                    f"it at data-parallel degrees {sorted(dps)}; use a multiple of the world size {world}")
        else:
            mbs = [int(t.micro_batch)]
        ckpts = {_checkpoint_label(p): p for p in checkpoint_choices(spec)}
        cpu = is_cpu_cluster(spec)
        if tune_overlap is None:
            tune_overlap = not cpu
        overlap: list[Optional[bool]] = [False, True] if tune_overlap else [None]
        if not tune_overlap:
            fixed["overlap_comm"] = ("CPU cluster: no CUDA streams to overlap on (generated default kept)" if cpu
                                     else "fixed by the caller")
        return cls(spec=spec, shape=shape, zero=zero, micro_batch=mbs, checkpoint=ckpts, tp=tps, pp=pps, ep=eps,
                   overlap_comm=overlap, bucket_scale=sorted(set(float(s) for s in bucket_scales)),
                   fixed_reasons=fixed)

    # ------------------------------------------------------------------------------------------------------
    def dimensions(self) -> dict[str, list]:
        """Every dimension and its choices (as optuna categorical choices: str/int/float/bool/None)."""
        return {"zero": list(self.zero), "micro_batch": self.micro_batch, "checkpoint": list(self.checkpoint),
                "tp": self.tp, "pp": self.pp, "ep": self.ep, "overlap_comm": self.overlap_comm,
                "bucket_scale": self.bucket_scale}

    def _conditional_dims(self, stage: int) -> list[str]:
        """Dimensions that exist for a ZeRO stage (stage 0 has no buckets and nothing to overlap)."""
        return ["overlap_comm", "bucket_scale"] if stage >= 1 else []

    def suggest(self, trial) -> TunePoint:
        """Ask an optuna trial for one point (conditional: overlap/buckets only exist at stage >= 1)."""
        params: dict[str, Any] = {}
        for name in ("zero", "micro_batch", "checkpoint", "tp", "pp", "ep"):
            choices = self.dimensions()[name]
            params[name] = trial.suggest_categorical(name, choices) if len(choices) > 1 else choices[0]
        stage = self.zero[params["zero"]][0]
        for name in self._conditional_dims(stage):
            choices = self.dimensions()[name]
            params[name] = trial.suggest_categorical(name, choices) if len(choices) > 1 else choices[0]
        return self.point_from_params(params)

    def point_from_params(self, params: dict[str, Any]) -> TunePoint:
        """Build a point from dimension values (missing dimensions take their first choice)."""
        dims = self.dimensions()
        get = (lambda k: params[k] if k in params else dims[k][0])
        stage, off_opt, off_par, zpp = self.zero[get("zero")]
        tp = int(get("tp"))
        cand = Candidate(zero_stage=stage, offload_optimizer=off_opt, offload_param=off_par, zeropp=zpp, tp=tp,
                         pp=int(get("pp")), ep=int(get("ep")), micro_batch=int(get("micro_batch")),
                         checkpoint=self.checkpoint[get("checkpoint")],
                         sequence_parallel=bool(self.spec.training.sequence_parallel and tp > 1),
                         cp=self.spec.training.cp, ulysses=self.spec.training.ulysses)
        if stage == 0:
            return TunePoint(candidate=cand)
        return TunePoint(candidate=cand, overlap_comm=get("overlap_comm"), bucket_scale=float(get("bucket_scale")))

    def params_of(self, point: TunePoint) -> dict[str, Any]:
        """The optuna parameters that produce `point` (for enqueue_trial); only dimensions with a choice."""
        c = point.candidate
        zero_label = _zero_label((c.zero_stage, c.offload_optimizer, c.offload_param, c.zeropp))
        full = {"zero": zero_label, "micro_batch": c.micro_batch, "checkpoint": _checkpoint_label(c.checkpoint),
                "tp": c.tp, "pp": c.pp, "ep": c.ep}
        if c.zero_stage >= 1:
            full["overlap_comm"] = point.overlap_comm
            full["bucket_scale"] = point.bucket_scale
        dims = self.dimensions()
        return {k: v for k, v in full.items() if len(dims[k]) > 1}

    def points(self) -> Iterator[TunePoint]:
        """Every point of the space (the exhaustive grid), pruned ones included."""
        base = ["zero", "micro_batch", "checkpoint", "tp", "pp", "ep"]
        dims = self.dimensions()
        for combo in itertools.product(*(dims[k] for k in base)):
            params = dict(zip(base, combo))
            stage = self.zero[params["zero"]][0]
            extra = self._conditional_dims(stage)
            for ex in itertools.product(*(dims[k] for k in extra)):
                yield self.point_from_params({**params, **dict(zip(extra, ex))})

    @property
    def size(self) -> int:
        return sum(1 for _ in self.points())

    # ------------------------------------------------------------------------------------------------------
    def ds_config(self, point: TunePoint) -> dict:
        """The DeepSpeed JSON for a point: `ds_config_for` plus the tuned overlap and bucket sizes."""
        cfg = ds_config_for(self.spec, self.shape, point.candidate)
        z = cfg.get("zero_optimization", {})
        if point.candidate.zero_stage >= 1:
            if point.overlap_comm is not None:
                z["overlap_comm"] = bool(point.overlap_comm)
            if point.bucket_scale != 1.0:
                for k in BUCKET_KEYS:
                    if k in z:
                        z[k] = max(MIN_BUCKET_ELEMENTS, int(z[k] * point.bucket_scale))
        return cfg

    def check(self, point: TunePoint, *, world_size: Optional[int] = None) -> PointCheck:
        """Pre-run checks, cheapest first: structural rules, `validate_config`, then the memory estimate.

        Returns:
            A `PointCheck`; `pruned_code`/`pruned_reason` say why the point must not run.
        """

        spec, shape, cand = self.spec, self.shape, point.candidate
        v = check_candidate(spec, shape, cand)
        if v is not None:
            return PointCheck(point, None, None, f"rule:{v.code}", v.message)
        cfg = self.ds_config(point)
        findings = list(validate_config(
            cfg, source=f"tune:{point.label}", world_size=world_size or spec.cluster.world_size,
            gpus_per_node=spec.cluster.nvlink_domain, tp=cand.tp, pp=cand.pp,
            num_experts=shape.num_experts if shape.is_moe else None, ep_size=cand.ep if shape.is_moe else None,
            mode="strict"))
        errors = [f for f in findings if str(getattr(f, "severity", "")).lower().endswith("error")]
        warns = tuple(f"{getattr(f, 'pointer', '')}: {getattr(f, 'message', f)}" for f in findings if f not in errors)
        if errors:
            f = errors[0]
            return PointCheck(point, cfg, None, "validate", f"validate_config: {f.code} at {f.pointer}: {f.message}",
                              warns)
        gpu = spec.cluster.gpu_spec
        try:
            est = estimate_candidate(spec, shape, cand, gpu, ds_config=cfg)
        except EstimateInputError as exc:
            return PointCheck(point, cfg, None, "estimate", f"the estimator refused it: {exc}", warns)
        if not est.fits:
            alive = ", ".join(est.peak_alive[:4])
            return PointCheck(point, cfg, est, "memory",
                              f"estimated peak {est.memory_per_rank_bytes / GiB:.2f} GiB per rank > "
                              f"{est.device_memory_bytes / GiB:.2f} GiB on {gpu.name} less "
                              f"{est.allowance_bytes / GiB:.2f} GiB allowance (peak in {est.peak_phase}: {alive})", warns)
        if only_peak_fits(est, gpu):
            warns = warns + (f"memory: {peak_only_caution(est)}",)
        return PointCheck(point, cfg, est, warnings=warns)


def estimated_tokens_per_s(spec: Spec, est: CandidateEstimate) -> float:
    """Global tokens per second from an estimate: global_batch * seq_len / step time."""
    tokens = spec.training.global_batch * spec.training.seq_len
    return tokens / est.step_time_s if est.step_time_s > 0 else 0.0


def trial_spec_dict(spec: Spec, point: TunePoint) -> dict:
    """The spec with this point's fixed fields (for the trainer, which reads the recompute policy and ep
    from the spec). hf_config paths are made absolute so the copy can live anywhere."""
    data = spec.model_dump(mode="json", exclude_unset=True, by_alias=True)
    model = dict(data.get("model", {}))
    if spec.model.hf_config:
        src = Path(spec.model.hf_config).expanduser()
        if not src.is_absolute() and spec.source_path is not None:
            src = spec.source_path.parent / src
        model["hf_config"] = str(src.resolve())
    data["model"] = model
    c = point.candidate
    tr = dict(data.get("training", {}))
    tr.update(micro_batch=c.micro_batch, zero_stage=c.zero_stage, tp=c.tp, pp=c.pp, ep=c.ep,
              activation_checkpointing=c.checkpoint.kind, offload=c.offload_optimizer or c.offload_param,
              zeropp=c.zeropp)
    tr.pop("checkpoint_every_k", None)
    tr.pop("checkpoint_ratio", None)
    if c.checkpoint.kind == "every-k":
        tr["checkpoint_every_k"] = c.checkpoint.every_k
    if c.checkpoint.kind == "ratio":
        tr["checkpoint_ratio"] = c.checkpoint.ratio
    data["training"] = tr
    return data
