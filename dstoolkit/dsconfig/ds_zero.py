"""`zero_optimization` and its offload sub-sections, mirroring deepspeed 0.19.8
``runtime/zero/config.py`` (DeepSpeedZeroConfig) and ``runtime/zero/offload_config.py``.

Field names are DeepSpeed's pydantic field names; the ``stage3_`` spellings are aliases, exactly as in
DeepSpeed (both spellings are accepted; DeepSpeed's own docs use the prefixed ones).
Defaults and ranges are DeepSpeed's. Deprecated keys are modelled so they parse, and declared deprecated on
the field (`deprecated`: the replacement travels in the exported schema); `validate_config` warns about them
and names the replacement.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError
from typing_extensions import Annotated

from dstoolkit.dsconfig.base import Bool, DSModel, Float, Int, NonNegIntOrAuto, PosInt, PosIntOrAuto, deprecated

OffloadDevice = Literal["none", "cpu", "nvme"]


def _stage_not_bool(value):
    # Literal[0, 1, 2, 3] would take False/True as 0/1; a boolean stage is a mistake (the pre-0.3 boolean form
    # is zero_optimization: true, not stage: true).
    if isinstance(value, bool):
        raise PydanticCustomError("literal_error", "Input should be 0, 1, 2 or 3, not a boolean")
    # DeepSpeed 0.19.8's lax pydantic turns "1" into stage 1 (measured: deepspeed.initialize on 2 gloo ranks
    # builds DeepSpeedZeroOptimizer); we accept the four digit strings too and rule DS222 warns about them.
    if isinstance(value, str) and value in STAGE_STRINGS:
        return int(value)
    return value


STAGE_STRINGS = ("0", "1", "2", "3")
Stage = Annotated[Literal[0, 1, 2, 3], BeforeValidator(_stage_not_bool),
                  WithJsonSchema({"enum": [0, 1, 2, 3, *STAGE_STRINGS], "x-shown-enum": [0, 1, 2, 3]})]
INT64_MAX = 2**63 - 1  # DeepSpeed's default for model_persistence_threshold is sys.maxsize


class OffloadParamConfig(DSModel):
    """`zero_optimization.offload_param`: parameter offload (ZeRO-Infinity). Valid only with stage 3."""

    device: OffloadDevice = "none"
    """Where parameters live between uses: none, cpu or nvme (nvme needs nvme_path and the aio section)."""
    nvme_path: Optional[str] = None
    """Directory on the NVMe device for parameter swap files; required when device is nvme."""
    buffer_count: Int = Field(5, ge=0)
    """NVMe only: number of swap buffers in the pool (>= 0)."""
    buffer_size: Int = Field(100_000_000, ge=0)
    """NVMe only: elements per swap buffer (>= 0); must hold the largest parameter."""
    max_in_cpu: Int = Field(1_000_000_000, ge=0)
    """NVMe only: parameter elements kept in CPU memory (>= 0)."""
    pin_memory: Bool = True
    """Use page-locked CPU memory (faster copies; counts against ulimit -l)."""


class OffloadOptimizerConfig(DSModel):
    """`zero_optimization.offload_optimizer`: optimizer-state offload (ZeRO-Offload). Stages 1-3."""

    device: OffloadDevice = "none"
    """Where optimizer states live: none, cpu or nvme. The optimizer step runs on CPU for cpu and nvme."""
    nvme_path: Optional[str] = None
    """Directory on the NVMe device for optimizer swap files; required when device is nvme."""
    buffer_count: Int = Field(4, ge=0)
    """NVMe only: swap buffers; at least the optimizer's states per parameter (Adam: 4)."""
    pin_memory: Bool = True
    """Use page-locked CPU memory."""
    pipeline_read: Bool = False
    """NVMe only: overlap reading the next tile with the current optimizer step."""
    pipeline_write: Bool = False
    """NVMe only: overlap writing the previous tile with the current optimizer step."""
    fast_init: Bool = False
    """NVMe only: faster optimizer initialisation."""
    ratio: Float = Field(1.0, ge=0.0, le=1.0)
    """Fraction of optimizer states offloaded, in [0, 1]; < 1 (partial offload) needs stage 3."""
    super_offload: Bool = False
    """SuperOffload for superchips (GH200/GB200); stage 3 only."""
    cpuadam_cores_perc: Float = Field(0.8, ge=0.0, le=1.0)
    """Fraction of CPU cores used by CPU Adam with super_offload, in [0, 1]."""


class LeafModuleConfig(DSModel):
    """`zero_optimization.leaf_module`: modules ZeRO-3 treats as leaves (fetched whole)."""

    classes: Union[list[str], str] = Field(default_factory=lambda: [
        "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
        "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
    ])
    """Fully qualified class names."""
    names: Union[list[str], str] = Field(default_factory=list)
    """Module names (as in named_modules())."""
    name_suffixes: Union[list[str], str] = Field(default_factory=list)
    """Module name suffixes."""


class ZenFlowConfig(DSModel):
    """`zero_optimization.zenflow`: ZenFlow stall-free offloading (stage 1/2 with CPU optimizer offload)."""

    topk_ratio: Float = Field(0.1, gt=0.0, lt=1.0)
    """Fraction of gradient columns updated on GPU each step, strictly between 0 and 1 (DeepSpeed's ZenFlowConfig)."""
    select_strategy: Literal["auto", "step", "epoch"] = "auto"
    """When to re-select the important columns."""
    select_interval: Union[Int, Literal["auto"]] = "auto"
    """Steps or epochs between re-selection."""
    update_interval: Union[PosInt, Literal["auto"]] = "auto"
    """Steps between CPU optimizer updates (>= 1; DeepSpeed's ZenFlowConfig refuses 0); <= select_interval (DS244)."""
    overlap_step: Bool = False
    """Overlap the CPU optimizer step with the next forward/backward."""
    offload: Bool = False
    """Offload optimizer states of unimportant columns."""
    auto_ratio: Float = Field(0.99, ge=0.0, le=1.0)
    """Threshold for automatic update-interval selection."""
    full_warm_up_rounds: Int = Field(0, ge=0)
    """Initial steps that update all columns on GPU."""
    steps_per_epoch: Optional[Int] = None
    """Steps per epoch (needed for select_strategy epoch)."""
    pt_reserved_cores_perc: Float = Field(0.5, ge=0.0, le=1.0)
    """Fraction of CPU cores reserved for PyTorch."""


class ZeroConfig(DSModel):
    """`zero_optimization`: ZeRO stages 0-3 and their tuning knobs (deepspeed 0.19.8 DeepSpeedZeroConfig)."""

    stage: Stage = 0
    """0 disabled; 1 partitions optimizer states; 2 adds gradients; 3 adds parameters (ZeRO §5)."""
    contiguous_gradients: Bool = True
    """Copy gradients into a contiguous buffer as produced (less fragmentation). Stages 1-3."""
    reduce_scatter: Bool = True
    """Average gradients with reduce/reduce-scatter instead of all-reduce. Stages 1-2."""
    reduce_bucket_size: PosIntOrAuto = 500_000_000
    """Elements reduced per bucket (> 0). HF fills "auto" with hidden_size^2."""
    use_multi_rank_bucket_allreduce: Bool = True
    """Combine reduce buckets across ranks into one all-reduce. Stages 1-2."""
    allgather_partitions: Bool = True
    """All-gather updated partitions (else a series of broadcasts). Stages 1-2."""
    allgather_bucket_size: NonNegIntOrAuto = 500_000_000
    """Elements all-gathered per bucket (>= 0). Stages 1-2."""
    overlap_comm: Optional[Bool] = None
    """Overlap gradient reduction with backward; default true at stage 3, false otherwise."""
    compute_grad_norm: Bool = True
    """Compute the global gradient norm at stages 1-2; false is allowed only at stages 1-2."""
    load_from_fp32_weights: Bool = True
    """Initialise fp32 master weights from the checkpoint's fp32 copy."""
    elastic_checkpoint: Bool = False
    """Legacy elastic checkpoint (not supported at stage 3; use universal checkpointing)."""
    offload_param: Optional[OffloadParamConfig] = None
    """Parameter offload to cpu/nvme; stage 3 only."""
    offload_optimizer: Optional[OffloadOptimizerConfig] = None
    """Optimizer state offload to cpu/nvme; stages 1-3."""
    zenflow: Optional[ZenFlowConfig] = None
    """ZenFlow settings."""
    sub_group_size: Int = Field(1_000_000_000, ge=0)
    """Parameter elements per optimizer-step tile (>= 0). Stage 3 (ZeRO-Offload/Infinity)."""
    cpu_offload_param: Optional[Bool] = Field(None, json_schema_extra=deprecated("offload_param"))
    """Deprecated: use offload_param {"device": "cpu"}."""
    cpu_offload_use_pin_memory: Optional[Bool] = Field(
        None, json_schema_extra=deprecated(use="offload_param/offload_optimizer pin_memory"))
    """Deprecated: use offload_param/offload_optimizer pin_memory."""
    cpu_offload: Optional[Bool] = Field(None, json_schema_extra=deprecated("offload_optimizer"))
    """Deprecated: use offload_optimizer {"device": "cpu"}."""
    prefetch_bucket_size: NonNegIntOrAuto = Field(50_000_000, alias="stage3_prefetch_bucket_size")
    """Stage 3: parameter elements prefetched ahead of use (>= 0). HF "auto" = 0.9 * hidden_size^2."""
    param_persistence_threshold: NonNegIntOrAuto = Field(100_000, alias="stage3_param_persistence_threshold")
    """Stage 3: parameters smaller than this (elements) stay unpartitioned. HF "auto" = 10 * hidden_size."""
    model_persistence_threshold: Int = Field(INT64_MAX, ge=0, alias="stage3_model_persistence_threshold")
    """Stage 3: cap on total unpartitioned parameter elements."""
    max_live_parameters: Int = Field(1_000_000_000, ge=0, alias="stage3_max_live_parameters")
    """Stage 3: parameter elements resident per GPU before release."""
    max_reuse_distance: Int = Field(1_000_000_000, ge=0, alias="stage3_max_reuse_distance")
    """Stage 3: keep a parameter if reused within this many elements."""
    gather_16bit_weights_on_model_save: Bool = Field(False, alias="stage3_gather_16bit_weights_on_model_save")
    """Stage 3: gather full 16-bit weights in save_16bit_model()."""
    module_granularity_threshold: Int = Field(0, alias="stage3_module_granularity_threshold")
    """Stage 3: modules finer than this are fetched as a unit."""
    use_all_reduce_for_fetch_params: Bool = Field(False, alias="stage3_use_all_reduce_for_fetch_params")
    """Stage 3: fetch parameters with all-reduce instead of all-gather."""
    allgather_sequential: Bool = Field(False, alias="stage3_allgather_sequential")
    """Stage 3: all-gather parameters one by one, without bucketing."""
    stage3_gather_fp16_weights_on_model_save: Bool = Field(
        False, json_schema_extra=deprecated("stage3_gather_16bit_weights_on_model_save"))
    """Deprecated: use gather_16bit_weights_on_model_save (stage3_gather_16bit_weights_on_model_save)."""
    ignore_unused_parameters: Bool = True
    """Stage 2: do not fail on parameters that get no gradient."""
    legacy_stage1: Bool = False
    """Old stage-1 implementation (backward compatibility)."""
    round_robin_gradients: Bool = False
    """Stages 1-2 with CPU offload: parallelise gradient copies across ranks."""
    parameter_alignment: Bool = False
    """Stages 1-2: pad flat buffers so each parameter is 16-byte aligned."""
    zero_hpz_partition_size: Int = Field(1, ge=0)
    """ZeRO++ hpZ: ranks in the secondary parameter partition (usually GPUs per node); stage 3."""
    zero_quantized_weights: Bool = False
    """ZeRO++ qwZ: quantise weights for all-gather; stage 3."""
    zero_quantized_nontrainable_weights: Bool = False
    """Store non-trainable weights quantised (LoRA); stage 3."""
    zero_quantized_gradients: Bool = False
    """ZeRO++ qgZ: quantised gradient all-to-all reduce; stage 3."""
    memory_efficient_linear: Bool = True
    """Stage 3: memory-efficient linear implementation."""
    pipeline_loading_checkpoint: Bool = False
    """Stage 3: force checkpoint loading in pipeline mode."""
    override_module_apply: Bool = True
    """Stage 3: override nn.Module.apply."""
    log_trace_cache_warnings: Bool = False
    """Stage 3: log trace-cache invalidation warnings."""
    enable_sanity_checks: Bool = False
    """Internal sanity checks (debugging)."""
    save_muon_momentum_buffer_in_memory: Bool = False
    """Muon at stage 3 with NVMe: keep momentum in memory."""
    leaf_module: LeafModuleConfig = Field(default_factory=LeafModuleConfig)
    """Modules treated as ZeRO-3 leaves."""


from dstoolkit.dsconfig.facts import STAGE3_ONLY_KEYS, STAGE12_ONLY_KEYS, ZERO_ALIASES, canonical_zero_key  # noqa

ALIASES: dict[str, str] = {
    f.alias: name for name, f in ZeroConfig.model_fields.items() if f.alias and f.alias != name
}
"""stage3_* spelling -> field name, from the model (tests check it equals facts.ZERO_ALIASES)."""
