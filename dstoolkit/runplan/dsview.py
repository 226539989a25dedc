"""`DsView`: the one reader of a DeepSpeed JSON on the estimate side.

The JSON is parsed with `dstoolkit.dsconfig.DeepSpeedConfig` (the pydantic models of the whole DeepSpeed
0.19.8 config: unknown keys, wrong types and out-of-range values are refused, and its cross-field rules run
with the layout as context), and every key the JSON leaves out takes the default of that model's field, so
the defaults are DeepSpeed's and are written down once (in `dstoolkit.dsconfig`). The batch triad is
completed by `dstoolkit.layout.resolve_batch`. No torch import.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from dstoolkit.dsconfig import DeepSpeedConfig
from dstoolkit.dsconfig.ds_misc import PipelineConfig
from dstoolkit.dsconfig.ds_optim import OptimizerConfig
from dstoolkit.dsconfig.ds_precision import BF16Config, DataTypesConfig, FP16Config
from dstoolkit.dsconfig.ds_zero import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig
from dstoolkit.layout import ParallelDims, resolve_batch

OPTIMIZER_WHEN_UNSET = "adamw"
"""`optimizer` absent: DeepSpeed then trains with the client's optimizer; the estimator assumes AdamW (the
states it counts are Adam's)."""


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
    torch_adam_foreach: Optional[bool] = None
    """optimizer.params.foreach (DeepSpeed hands it to torch.optim.AdamW when torch_adam; None = torch's default)."""
    torch_adam_fused: Optional[bool] = None
    """optimizer.params.fused (passed through to torch.optim.AdamW when torch_adam)."""
    adam_l2_weight_decay: bool = False
    """Adam with adam_w_mode false and weight_decay != 0: L2 decay adds the params to a copy of the gradients."""
    gradient_clipping: float = 0.0
    """gradient_clipping (DeepSpeed 0.19.8 default 1.0; 0 disables)."""
    grad_accum_dtype: Optional[str]
    zeropp_qwz: bool
    zeropp_qgz: bool
    zeropp_hpz: int
    ds_precision: Literal["bf16", "fp16", "fp32"]
    bf16_immediate_grad_update: bool
    pipe_partitioned: bool
    """pipeline.pipe_partitioned (default: dsconfig.ds_misc.PipelineConfig): with tp > 1 the PipelineEngine sends
    each TP rank's 1/tp slice of a stage's activations and all-gathers them over the TP group on the receiving
    stage (runtime/pipe/engine.py `is_pipe_partitioned`, PartitionedTensor)."""
    grad_partitioned: bool
    """pipeline.grad_partitioned (default: PipelineConfig): the same for the activation gradients sent back."""


def _first_auto(node: Any, path: tuple = ()) -> Optional[tuple]:
    if isinstance(node, str) and node == "auto":
        return path
    if isinstance(node, dict):
        for k, v in node.items():
            hit = _first_auto(v, path + (k,))
            if hit is not None:
                return hit
    if isinstance(node, list):
        for i, v in enumerate(node):
            hit = _first_auto(v, path + (i,))
            if hit is not None:
                return hit
    return None


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()))
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "ds_config: " + "; ".join(parts) + " (check it with `dstoolkit validate`)"


def read_ds_config(ds: dict, dims: ParallelDims) -> DsView:
    """Read the estimator-relevant keys of a DeepSpeed JSON for one layout.

    Args:
        ds: a complete DeepSpeed JSON (no "auto"); the optional `dstoolkit` section is allowed.
        dims: the layout it runs on (dp for the batch triad; world/tp/pp/gpus per node for the rules).

    Raises:
        ValueError: an "auto" value, a config `DeepSpeedConfig` refuses (unknown key, wrong type, a broken
            cross-field rule), or a batch triad that does not fit dp (`dstoolkit.layout.LayoutError`).
    """
    if not isinstance(ds, dict):
        raise ValueError(f"ds_config must be a JSON object, not {type(ds).__name__}")
    key = json.dumps(ds, sort_keys=True, default=repr)
    return _read(key, dims)


@functools.lru_cache(maxsize=4096)
def _read(key: str, dims: ParallelDims) -> DsView:
    ds = json.loads(key)
    auto = _first_auto(ds)
    if auto is not None:
        where = "".join(f"[{k!r}]" for k in auto)
        raise ValueError(f"ds_config{where} is 'auto': resolve it first (dstoolkit resolve) before estimating")
    try:
        cfg = DeepSpeedConfig.model_validate(ds, context={
            "world_size": dims.world, "tp": dims.tp, "pp": dims.pp, "gpus_per_node": dims.gpus_per_node})
    except ValidationError as exc:
        raise ValueError(_validation_message(exc)) from None
    triad = resolve_batch(cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps,
                          dims.dp)
    z = cfg.zero_optimization
    if isinstance(z, bool):  # the pre-0.3 boolean form: true = stage 1
        z = ZeroConfig(stage=1 if z else 0)
    elif z is None:
        z = ZeroConfig()
    off_opt = z.offload_optimizer or OffloadOptimizerConfig()
    off_par = z.offload_param or OffloadParamConfig()
    # overlap_comm: DeepSpeed's default is False, but True for stage 3 (zero/config.py overlap_comm validator);
    # the model keeps None for "unset".
    overlap = z.overlap_comm if z.overlap_comm is not None else z.stage == 3
    opt = cfg.optimizer or OptimizerConfig()
    bf16 = cfg.bf16 if cfg.bf16 is not None else (cfg.bfloat16 or BF16Config())
    fp16 = cfg.fp16 or FP16Config()
    ds_precision = "bf16" if bf16.enabled is True else ("fp16" if fp16.enabled is True else "fp32")
    dtypes = cfg.data_types or DataTypesConfig()
    pipe = cfg.pipeline or PipelineConfig()
    return DsView(
        micro_batch=triad.micro_batch,
        grad_accum=triad.grad_accum,
        zero_stage=z.stage,
        offload_optimizer=off_opt.device in ("cpu", "nvme"),
        offload_param=off_par.device in ("cpu", "nvme"),
        overlap_comm=bool(overlap),
        contiguous_gradients=z.contiguous_gradients,
        reduce_scatter=z.reduce_scatter,
        use_multi_rank_bucket_allreduce=z.use_multi_rank_bucket_allreduce,
        reduce_bucket_size=z.reduce_bucket_size,
        allgather_bucket_size=z.allgather_bucket_size,
        prefetch_bucket_size=z.prefetch_bucket_size,
        max_live_parameters=z.max_live_parameters,
        param_persistence_threshold=z.param_persistence_threshold,
        sub_group_size=z.sub_group_size,
        optimizer_type=(opt.type or OPTIMIZER_WHEN_UNSET).lower(),
        torch_adam=bool(opt.params.get("torch_adam", False)),
        torch_adam_foreach=opt.params.get("foreach") if isinstance(opt.params.get("foreach"), bool) else None,
        torch_adam_fused=opt.params.get("fused") if isinstance(opt.params.get("fused"), bool) else None,
        # engine.py _configure_basic_optimizer: type "adamw" forces decoupled decay; "adam" uses adam_w_mode
        # (default true)
        adam_l2_weight_decay=((opt.type or OPTIMIZER_WHEN_UNSET).lower() == "adam"
                              and opt.params.get("adam_w_mode", True) is False
                              and float(opt.params.get("weight_decay", 0.0) or 0.0) != 0.0),
        gradient_clipping=float(cfg.gradient_clipping),
        grad_accum_dtype=dtypes.grad_accum_dtype,
        zeropp_qwz=z.zero_quantized_weights,
        zeropp_qgz=z.zero_quantized_gradients,
        zeropp_hpz=z.zero_hpz_partition_size,
        ds_precision=ds_precision,
        bf16_immediate_grad_update=bf16.immediate_grad_update,
        pipe_partitioned=bool(pipe.pipe_partitioned),
        grad_partitioned=bool(pipe.grad_partitioned),
    )
