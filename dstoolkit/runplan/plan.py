"""`RunPlan`: everything an estimate needs about one run (model shape + DeepSpeed JSON + cluster + parallelism).

Micro batch, gradient accumulation, ZeRO stage, offload and bucket sizes are read from the DeepSpeed JSON
(`ds_config`), so the estimate describes the config the user will actually launch. No torch import.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dstoolkit.models.shape import ModelShape
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.hardware.calibration import Calibration, calibration_for_spec
from dstoolkit.hardware.table import GpuSpec, get_gpu
from dstoolkit.spec import Spec

Precision = Literal["bf16", "fp16", "fp8", "fp32"]

# DeepSpeed 0.19.8 defaults (deepspeed/runtime/zero/config.py), used when the JSON leaves a key out.
DS_DEFAULT_REDUCE_BUCKET_SIZE = 500_000_000
"""zero_optimization.reduce_bucket_size default (elements)."""
DS_DEFAULT_ALLGATHER_BUCKET_SIZE = 500_000_000
"""zero_optimization.allgather_bucket_size default (elements)."""
DS_DEFAULT_PREFETCH_BUCKET_SIZE = 50_000_000
"""zero_optimization.stage3_prefetch_bucket_size default (elements)."""
DS_DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
"""zero_optimization.stage3_max_live_parameters default (elements)."""
DS_DEFAULT_PARAM_PERSISTENCE_THRESHOLD = 100_000
"""zero_optimization.stage3_param_persistence_threshold default: smaller params stay gathered (elements)."""
DS_DEFAULT_SUB_GROUP_SIZE = 1_000_000_000
"""zero_optimization.sub_group_size default (elements per stage-3 optimizer sub-group)."""


class DsView(BaseModel):
    """The parts of a DeepSpeed JSON the estimator reads, with DeepSpeed 0.19.8's defaults filled in."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    micro_batch: int
    grad_accum: int
    zero_stage: int
    offload_optimizer: bool
    offload_param: bool
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_scatter: bool
    """zero_optimization.reduce_scatter (DeepSpeed default true)."""
    use_multi_rank_bucket_allreduce: bool
    """zero_optimization.use_multi_rank_bucket_allreduce (DeepSpeed 0.19.8 default true: ZeRO-1/2 gradients
    are all-reduced per bucket, not reduce-scattered; estimate.comm.zero12_grad_collective)."""
    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    max_live_parameters: int
    param_persistence_threshold: int
    sub_group_size: int
    optimizer_type: str
    torch_adam: bool
    grad_accum_dtype: Optional[str]
    zeropp_qwz: bool
    zeropp_qgz: bool
    zeropp_hpz: int
    ds_precision: Literal["bf16", "fp16", "fp32"]
    bf16_immediate_grad_update: bool


def _num(v: Any, default: int) -> int:
    if v is None:
        return default
    if isinstance(v, str):
        raise ValueError(f"ds_config value {v!r} must be a number, not a string (resolve every 'auto' first)")
    return int(v)


def read_ds_config(ds: dict, world_size: int, dp: int) -> DsView:
    """Read the estimator-relevant keys of a DeepSpeed JSON, applying DeepSpeed's defaults and batch rule.

    DeepSpeed's batch rule: train_batch_size = micro_batch * grad_accum * dp; any two of the three determine
    the third (deepspeed/runtime/config.py `_batch_assertion` / `_set_batch_related_parameters`).
    """
    for key, val in ds.items():
        if val == "auto":
            raise ValueError(f"ds_config[{key!r}] is 'auto': resolve it first (dstoolkit resolve) before estimating")
    mb = ds.get("train_micro_batch_size_per_gpu")
    ga = ds.get("gradient_accumulation_steps")
    tb = ds.get("train_batch_size")
    if mb is not None and ga is not None:
        mb, ga = _num(mb, 1), _num(ga, 1)
    elif mb is not None and tb is not None:
        mb = _num(mb, 1)
        ga = max(1, _num(tb, 1) // (mb * dp))
    elif ga is not None and tb is not None:
        ga = _num(ga, 1)
        mb = max(1, _num(tb, 1) // (ga * dp))
    elif tb is not None:
        ga = 1
        mb = max(1, _num(tb, 1) // dp)
    elif mb is not None:
        mb, ga = _num(mb, 1), 1
    else:
        raise ValueError(
            "ds_config sets none of train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps;"
            " set train_micro_batch_size_per_gpu"
        )
    z = ds.get("zero_optimization") or {}
    for key, val in z.items():
        if val == "auto":
            raise ValueError(f"ds_config['zero_optimization'][{key!r}] is 'auto': resolve it first")
    stage = _num(z.get("stage"), 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage={stage}: must be 0, 1, 2 or 3")
    off_opt = z.get("offload_optimizer") or {}
    off_par = z.get("offload_param") or {}
    offload_optimizer = str(off_opt.get("device", "none")).lower() in ("cpu", "nvme")
    offload_param = str(off_par.get("device", "none")).lower() in ("cpu", "nvme")
    # overlap_comm: DeepSpeed's default is False, but True for stage 3 (zero/config.py overlap_comm validator).
    overlap = z.get("overlap_comm")
    overlap = bool(overlap) if overlap is not None else stage == 3
    opt = ds.get("optimizer") or {}
    opt_type = str(opt.get("type", "adamw")).lower()
    opt_params = opt.get("params") or {}
    bf16_section = ds.get("bf16") or ds.get("bfloat16") or {}
    bf16 = bf16_section.get("enabled", False)
    fp16 = (ds.get("fp16") or {}).get("enabled", False)
    ds_precision = "bf16" if bf16 is True else ("fp16" if fp16 is True else "fp32")
    dtypes = ds.get("data_types") or {}
    return DsView(
        micro_batch=mb,
        grad_accum=ga,
        zero_stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        overlap_comm=overlap,
        contiguous_gradients=bool(z.get("contiguous_gradients", True)),
        reduce_scatter=bool(z.get("reduce_scatter", True)),
        use_multi_rank_bucket_allreduce=bool(z.get("use_multi_rank_bucket_allreduce", True)),
        reduce_bucket_size=_num(z.get("reduce_bucket_size"), DS_DEFAULT_REDUCE_BUCKET_SIZE),
        allgather_bucket_size=_num(z.get("allgather_bucket_size"), DS_DEFAULT_ALLGATHER_BUCKET_SIZE),
        prefetch_bucket_size=_num(z.get("stage3_prefetch_bucket_size", z.get("prefetch_bucket_size")),
                                  DS_DEFAULT_PREFETCH_BUCKET_SIZE),
        max_live_parameters=_num(z.get("stage3_max_live_parameters", z.get("max_live_parameters")),
                                 DS_DEFAULT_MAX_LIVE_PARAMETERS),
        param_persistence_threshold=_num(
            z.get("stage3_param_persistence_threshold", z.get("param_persistence_threshold")),
            DS_DEFAULT_PARAM_PERSISTENCE_THRESHOLD),
        sub_group_size=_num(z.get("sub_group_size"), DS_DEFAULT_SUB_GROUP_SIZE),
        optimizer_type=opt_type,
        torch_adam=bool(opt_params.get("torch_adam", False)),
        grad_accum_dtype=dtypes.get("grad_accum_dtype"),
        zeropp_qwz=bool(z.get("zero_quantized_weights", False)),
        zeropp_qgz=bool(z.get("zero_quantized_gradients", False)),
        zeropp_hpz=_num(z.get("zero_hpz_partition_size"), 1),
        ds_precision=ds_precision,
        bf16_immediate_grad_update=bool(bf16_section.get("immediate_grad_update", False)),
    )


class RunPlan(BaseModel):
    """One run to estimate."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=False)

    shape: ModelShape
    """The model architecture."""
    ds_config: dict
    """A complete DeepSpeed JSON (no "auto"): micro batch, accumulation, ZeRO stage, offload, buckets."""
    world_size: int = Field(gt=0)
    """Total ranks (GPUs)."""
    gpus_per_node: int = Field(gt=0)
    """Ranks per node (decides which collectives cross nodes)."""
    gpu: GpuSpec
    """Accelerator facts."""
    seq_len: int
    """Tokens per sequence (> 0)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel degree."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree (MoE only)."""
    num_experts_override: None = None
    """Reserved (always None)."""
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    """Activation recompute policy (the same object the runtime applies)."""
    flash_attention: bool = True
    """Fused/flash attention: no s^2 score tensor is stored."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs tp > 1 to matter)."""
    precision: Precision = "bf16"
    """Compute precision; fp8 = FP8 GEMMs with bf16 weights/activations elsewhere."""
    attention_dropout: bool = False
    """Whether attention/hidden dropout masks are stored (Korthikanti's GPT has them; Llama-style has none)."""
    moe_capacity_factor: float = Field(default=1.0, gt=0)
    """Expert capacity factor: tokens computed per expert = cf * k * tokens / E (1.0 = exactly top-k)."""
    calibration: Optional[Calibration] = None
    """Measured rates for the step-time model; None uses the GPU table with default efficiencies."""

    @model_validator(mode="after")
    def _check_seq_len_positive(self) -> "RunPlan":
        if self.seq_len <= 0:
            raise ValueError(f"seq_len={self.seq_len}: the sequence length must be > 0 (e.g. seq_len=4096)")
        return self

    @model_validator(mode="after")
    def _check_world_divisible(self) -> "RunPlan":
        if self.world_size % (self.tp * self.pp) != 0:
            raise ValueError(
                f"world_size={self.world_size} is not divisible by tp*pp={self.tp}*{self.pp}={self.tp * self.pp};"
                " pick tp and pp whose product divides the world size"
            )
        return self

    @model_validator(mode="after")
    def _check_tp_divides_heads(self) -> "RunPlan":
        a, kv = self.shape.num_attention_heads, self.shape.kv_heads
        if a % self.tp != 0:
            raise ValueError(
                f"tp={self.tp} does not divide num_attention_heads={a}; choose tp from the divisors of {a}"
            )
        if kv % self.tp != 0 and self.tp % kv != 0:
            raise ValueError(
                f"tp={self.tp} and num_key_value_heads={kv}: one must divide the other for GQA head sharding"
            )
        return self

    @model_validator(mode="after")
    def _check_ep_divides_experts(self) -> "RunPlan":
        if self.ep == 1:
            return self
        if not self.shape.is_moe:
            raise ValueError(f"ep={self.ep} but model {self.shape.name!r} has no experts; use ep=1")
        if self.shape.num_experts % self.ep != 0:
            raise ValueError(
                f"ep={self.ep} does not divide num_experts={self.shape.num_experts}; "
                f"choose ep from the divisors of {self.shape.num_experts}"
            )
        if self.dp % self.ep != 0:
            raise ValueError(
                f"ep={self.ep} must divide the data-parallel size dp=world_size/(tp*pp)={self.dp}"
                " (DeepSpeed builds expert groups inside the data-parallel group)"
            )
        return self

    @model_validator(mode="after")
    def _check_pp_layers(self) -> "RunPlan":
        if self.pp > self.shape.num_hidden_layers:
            raise ValueError(
                f"pp={self.pp} exceeds num_hidden_layers={self.shape.num_hidden_layers}; each stage needs a layer"
            )
        return self

    @model_validator(mode="after")
    def _check_ds_config_readable(self) -> "RunPlan":
        self.ds  # raises ValueError with the offending key
        return self

    @property
    def dp(self) -> int:
        """Data-parallel degree: world_size / (tp * pp)."""
        return self.world_size // (self.tp * self.pp)

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: dp / ep (DeepSpeed's expert_data_parallel_group size)."""
        return self.dp // self.ep

    @property
    def ds(self) -> DsView:
        return read_ds_config(self.ds_config, self.world_size, self.dp)

    @property
    def nodes(self) -> int:
        return math.ceil(self.world_size / self.gpus_per_node)


_POLICY_FROM_SPEC = {"none": "none", "full": "full", "every-k": "every-k", "ratio": "ratio", "selective": "selective",
                     "auto": "none"}


def plan_from_spec(spec: Spec, ds_config: dict, shape: ModelShape) -> RunPlan:
    """Build a `RunPlan` from a spec, a resolved DeepSpeed JSON and the resolved model shape.

    Args:
        spec: the training spec (cluster and training sections are read).
        ds_config: a complete DeepSpeed JSON for this run (no "auto").
        shape: the spec's model, resolved (`dstoolkit.models.resolve_model`).

    Returns:
        The plan. "auto" parallel degrees in the spec count as 1 (the DeepSpeed JSON cannot carry them).
        Its calibration is the spec's (`dstoolkit.hardware.calibration.calibration_for_spec`).

    Raises:
        ValueError: impossible combinations (tp not dividing heads, ep not dividing experts, ...), or an
            unusable cluster.calibration file.
    """
    t = spec.training
    kind = _POLICY_FROM_SPEC[t.activation_checkpointing]
    if kind == "every-k":
        policy = CheckpointPolicy(kind="every-k", every_k=t.checkpoint_every_k)
    elif kind == "ratio":
        policy = CheckpointPolicy(kind="ratio", ratio=t.checkpoint_ratio)
    else:
        policy = CheckpointPolicy(kind=kind)

    def deg(v) -> int:
        return 1 if v == "auto" else int(v)

    return RunPlan(
        shape=shape,
        ds_config=ds_config,
        world_size=spec.cluster.world_size,
        gpus_per_node=spec.cluster.gpus_per_node,
        gpu=get_gpu(spec.cluster.gpu),
        seq_len=t.seq_len,
        tp=deg(t.tp),
        pp=deg(t.pp),
        ep=deg(t.ep),
        checkpoint=policy,
        flash_attention=t.flash_attention,
        sequence_parallel=t.sequence_parallel,
        precision=t.precision,
        calibration=calibration_for_spec(spec),
    )
