"""`DeepSpeedConfig`: the whole DeepSpeed JSON config (deepspeed 0.19.8), plus our optional `dstoolkit` section.

Top-level keys are exactly the ones deepspeed 0.19.8 reads (``runtime/config.py``
``DeepSpeedConfig._initialize_params`` and the section readers it calls). Everything else is an unknown key.

The ``dstoolkit`` section
-------------------------
DeepSpeed sets MoE up in code (``deepspeed.moe.layer.MoE(num_experts, ep_size, k, ...)``), not in its JSON,
so the facts the validator needs about experts live in our own optional top-level section::

    "dstoolkit": {"moe": {"num_experts": 8, "ep_size": 2, "top_k": 2}, "fp8": {...}}

(or come from ``dstoolkit validate --num-experts N --ep-size E``). DeepSpeed 0.19 itself accepts an unknown
top-level key silently, but we never hand it ours: **generated DeepSpeed JSON is emitted without the section**
(`strip_dstoolkit_section`), and the generator passes the MoE facts to `validate_config` as arguments. A
hand-written config that carries the section validates here; strip it before giving it to DeepSpeed.

Cross-field rules are declared once, in the registry (``dstoolkit.dsconfig.registry``, rules in
``dstoolkit.dsconfig.rules``); the one model validator below runs them all (`validate_config` runs the same
rules and collects every finding, while ``DeepSpeedConfig.model_validate`` stops at the first error). Pass
``context={"world_size": N, ...}`` to ``model_validate`` for the rules that need the cluster shape.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dstoolkit.dsconfig import rules
from dstoolkit.dsconfig.base import Bool, DSModel, Float, FloatOrAuto, Int, PosInt, PosIntOrAuto, deprecated
from dstoolkit.dsconfig.ds_misc import (ActivationCheckpointingConfig, AioConfig, AutotuningConfig, CheckpointConfig,
                                        CompileConfig, ExpertParallelConfig, HybridEngineConfig, PipelineConfig,
                                        TensorParallelConfig)
from dstoolkit.dsconfig.ds_monitor import (CSVConfig, CometConfig, CommsLoggerConfig, FlopsProfilerConfig,
                                           TensorBoardConfig, TimersConfig, WandbConfig)
from dstoolkit.dsconfig.ds_optim import OptimizerConfig, SchedulerConfig
from dstoolkit.dsconfig.ds_precision import BF16Config, DataTypesConfig, FP16Config, TorchAutocastConfig
from dstoolkit.dsconfig.ds_zero import ZeroConfig



class MoeFacts(DSModel):
    """`dstoolkit.moe`: the expert layout DeepSpeed is given in code (deepspeed.moe.layer.MoE)."""

    num_experts: PosInt
    """Total experts per MoE layer (MoE(num_experts=...))."""
    ep_size: PosInt = 1
    """Expert-parallel degree (MoE(ep_size=...)); must divide num_experts and the world size."""
    top_k: PosInt = 1
    """Experts per token (MoE(k=...)); <= num_experts."""


class DstoolkitSection(DSModel):
    """`dstoolkit`: our facts that DeepSpeed's JSON has no place for. Stripped before DeepSpeed sees the config."""

    moe: Optional[MoeFacts] = None
    """Expert-parallel layout."""
    fp8: Optional[dict[str, Any]] = None
    """FP8 settings, validated as dstoolkit.dsconfig.fp8.Fp8Config (imported only when the key is present,
    to keep `dstoolkit validate` start-up fast)."""

    @field_validator("fp8", mode="after")
    @classmethod
    def _check_fp8_section(cls, value: Optional[dict]) -> Optional[dict]:
        """Checked against Fp8Config; the field keeps the dict it is typed as (returning the Fp8Config made every
        model_dump, e.g. the rules' in DeepSpeedConfig, warn 'PydanticSerializationUnexpectedValue' on stderr).
        Readers that need the model validate the dict themselves (estimate, fp8 plan)."""
        if value is None:
            return None
        try:  # start-up time: the FP8 model is built only when a config has an fp8 section
            from dstoolkit.dsconfig.fp8 import Fp8Config
        except ImportError:  # pragma: no cover - fp8 module missing: accept the dict as is
            return value
        Fp8Config.model_validate(value)
        return value


class DeepSpeedConfig(DSModel):
    """A DeepSpeed 0.19 config file. Batch triad: train_batch_size = micro_batch * grad_accum * dp_size.

    The sections DeepSpeed's own parser fails on when they are an explicit JSON null (facts.NULL_REFUSED_TOP_LEVEL:
    zero_optimization, fp16, optimizer, scheduler, ...) are typed without None, so null is a type error here and in
    the exported schema; an absent key is still None. Optional keys take null as unset, as DeepSpeed does."""

    train_batch_size: Optional[PosIntOrAuto] = None
    """Global batch in samples per optimizer step (> 0) = micro * grad_accum * data-parallel size."""
    train_micro_batch_size_per_gpu: Optional[PosIntOrAuto] = None
    """Samples per GPU per forward/backward (> 0)."""
    gradient_accumulation_steps: Optional[PosIntOrAuto] = None
    """Micro-batches accumulated per optimizer step (> 0)."""
    managed_gradient_accumulation: Bool = True
    """Let the engine manage accumulation boundaries."""
    steps_per_print: Optional[Int] = None
    """Print progress every N steps (None: never)."""
    dump_state: Bool = False
    """Print the engine state after initialisation."""
    disable_python_gc: Bool = False
    """Disable Python's cyclic GC during training."""
    disable_allgather: Bool = False
    """Disable all-gather (legacy)."""
    communication_data_type: Optional[Literal["fp32", "fp16", "bf16", "FP32", "FP16", "BF16"]] = None
    """Dtype of gradient communication (default: the training dtype)."""
    seq_parallel_communication_data_type: Optional[Literal["fp32", "fp16", "bf16", "FP32", "FP16", "BF16"]] = None
    """Dtype of Ulysses sequence-parallel communication."""
    prescale_gradients: Bool = False
    """Divide gradients before all-reduce instead of after."""
    gradient_predivide_factor: Float = 1.0
    """Divide gradients by this before all-reduce, the rest after."""
    gradient_allreduce_op: Literal["mean", "sum", "MEAN", "SUM", "Mean", "Sum"] = "mean"
    """Reduction of data-parallel gradients; 'sum' is not allowed at ZeRO stage 3."""
    zero_optimization: Union[ZeroConfig, Bool] = None
    """ZeRO settings (a bare boolean is the deprecated pre-0.3 form: true = stage 1)."""
    activation_checkpointing: ActivationCheckpointingConfig = None
    """Activation checkpointing (deepspeed.checkpointing)."""
    comms_logger: CommsLoggerConfig = None
    """Collective-call logging."""
    tensorboard: TensorBoardConfig = None
    """TensorBoard monitor."""
    wandb: WandbConfig = None
    """Weights & Biases monitor."""
    csv_monitor: CSVConfig = None
    """CSV monitor."""
    comet: CometConfig = None
    """Comet monitor."""
    gradient_clipping: FloatOrAuto = 1.0
    """Clip the global gradient norm to this (0 disables). HF fills "auto" from --max_grad_norm."""
    fp16: FP16Config = None
    """fp16 mixed precision. Exclusive with bf16."""
    bf16: Optional[BF16Config] = None
    """bf16 mixed precision. Exclusive with fp16."""
    bfloat16: BF16Config = Field(None, json_schema_extra=deprecated("bf16"))
    """Legacy name of bf16 (read only when bf16 is absent)."""
    torch_autocast: TorchAutocastConfig = None
    """torch.autocast mixed precision."""
    optimizer: OptimizerConfig = None
    """Optimizer built by DeepSpeed (omit when passing one from code)."""
    zero_allow_untested_optimizer: Bool = False
    """Allow a client optimizer DeepSpeed has not tested with ZeRO."""
    zero_force_ds_cpu_optimizer: Bool = True
    """Require DeepSpeedCPUAdam when offloading the optimizer."""
    scheduler: SchedulerConfig = None
    """LR scheduler built by DeepSpeed."""
    flops_profiler: FlopsProfilerConfig = None
    """FLOPs profiler."""
    wall_clock_breakdown: Bool = False
    """Time forward/backward/step separately."""
    memory_breakdown: Bool = False
    """Print memory use per stage."""
    autotuning: AutotuningConfig = None
    """Autotuner settings."""
    use_data_before_expert_parallelism: Bool = False
    """Rank order: data-parallel before expert-parallel."""
    hybrid_engine: HybridEngineConfig = None
    """RLHF hybrid engine."""
    pipeline: PipelineConfig = None
    """Pipeline engine settings."""
    data_efficiency: dict[str, Any] = None
    """Data efficiency library (data_sampling incl. curriculum_learning, data_routing incl. random_ltd).
    Contents are not modelled here."""
    checkpoint: CheckpointConfig = None
    """Checkpoint settings."""
    data_types: DataTypesConfig = None
    """Accumulation / parameter / buffer dtypes."""
    aio: Optional[AioConfig] = None
    """Async I/O for NVMe offload."""
    dataloader_drop_last: Bool = False
    """Drop the last incomplete batch in deepspeed_io()."""
    log_level: Optional[str] = None
    """DeepSpeed logger level."""
    datastates_ckpt: Optional[Any] = None
    """DataStates-LLM asynchronous checkpointing settings (passed through)."""
    weight_quantization: dict[str, Any] = None
    """Weight quantisation for inference (post_init_quant / quantized_initialization)."""
    compile: CompileConfig = None
    """DeepCompile settings."""
    timers: TimersConfig = None
    """Timers."""
    tensor_parallel: TensorParallelConfig = None
    """AutoTP training."""
    expert_parallel: Optional[ExpertParallelConfig] = None
    """AutoEP for Hugging Face MoE models."""
    vocabulary_size: Optional[Int] = None
    """Only used for a tensor-core alignment warning."""
    sequence_parallel_size: PosInt = None
    """Ulysses degree when no mpu is given (HF zero.init path)."""
    dstoolkit: Optional[DstoolkitSection] = None
    """Our section (MoE facts, FP8). Not DeepSpeed's: stripped before DeepSpeed sees the config."""

    # -- cross-field rules: generated from the registry (dstoolkit.dsconfig.registry) --------------------------
    @model_validator(mode="after")
    def _check_rules(self, info: ValidationInfo) -> "DeepSpeedConfig":
        """Every registered cross-field rule, in registry order; the first error raises (warnings are dropped)."""
        ctx = rules.RuleContext.from_mapping(info.context if isinstance(info.context, dict) else {})
        rules.enforce_all(self.model_dump(by_alias=True, exclude_unset=True), ctx)
        return self


from dstoolkit.dsconfig.strip import DSTOOLKIT_SECTION, strip_dstoolkit_section  # noqa: E402,F401  (re-export)
