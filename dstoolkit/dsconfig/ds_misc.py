"""The remaining DeepSpeed sections (deepspeed 0.19.8): activation checkpointing, aio, checkpoint, compile,
tensor parallel, hybrid engine, autotuning, pipeline, expert_parallel (AutoEP). Sources are named per class.
The monitors, comms logger, flops profiler and timers are in ``ds_monitor`` (re-exported here).

Several of these DeepSpeed reads with ``get_scalar_param`` (no validation, unknown keys silently ignored):
activation_checkpointing, aio, checkpoint, autotuning. We reject unknown keys there too,
because an ignored key is a setting the user believes is on.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field

from dstoolkit.dsconfig.base import Bool, DSModel, Float, Int
from dstoolkit.dsconfig.ds_monitor import (CometConfig, CommsLoggerConfig, CSVConfig, FlopsProfilerConfig,  # noqa: F401
                                           TensorBoardConfig, ThroughputTimerConfig, TimersConfig, WandbConfig)


class ActivationCheckpointingConfig(DSModel):
    """`activation_checkpointing` (runtime/activation_checkpointing/config.py). Used by
    deepspeed.checkpointing / Megatron; HF models ignore it."""

    partition_activations: Bool = False
    """Partition checkpointed activations across model-parallel ranks."""
    number_checkpoints: Optional[Int] = None
    """Number of checkpoints kept in contiguous memory (with contiguous_memory_optimization)."""
    contiguous_memory_optimization: Bool = False
    """Copy checkpoints into a contiguous buffer (needs number_checkpoints)."""
    cpu_checkpointing: Bool = False
    """Offload checkpointed activations to CPU (needs partition_activations)."""
    profile: Bool = False
    """Time the checkpoint functions."""
    synchronize_checkpoint_boundary: Bool = False
    """Synchronise the device at each checkpoint boundary."""


class AioConfig(DSModel):
    """`aio` (runtime/swap_tensor/constants.py): async I/O for NVMe offload."""

    block_size: Int = Field(1_048_576, gt=0)
    """I/O block size in bytes."""
    queue_depth: Int = Field(8, gt=0)
    """I/O queue depth."""
    intra_op_parallelism: Int = Field(1, gt=0)
    """I/O threads per operation (0.19 name; older releases called it thread_count)."""
    single_submit: Bool = False
    """Submit requests one by one."""
    overlap_events: Bool = True
    """Overlap submission and completion."""
    use_gds: Bool = False
    """Use NVIDIA GPUDirect Storage (CUDA only)."""


class CheckpointWriterConfig(DSModel):
    """`checkpoint.writer` (runtime/model_checkpointing/constants.py)."""

    type: Literal["MOCK", "PYTHON", "FAST", "mock", "python", "fast"] = "FAST"
    """Writer implementation."""
    io_buffer_size: Int = Field(64 * 1024**2, gt=0)
    """I/O buffer bytes."""
    io_buffer_double: Bool = True
    """Double buffering."""
    show_statistics: Bool = False
    """Print write statistics."""
    data_parallel: Optional[Literal["SOCKET", "MACHINE", "REPLICA", "socket", "machine", "replica"]] = None
    """Data-parallel write unit."""
    decoupled: Bool = False
    """Write in a separate process."""
    io_multiplier: Int = 1
    """I/O multiplier."""


class CheckpointParallelWriteConfig(DSModel):
    """`checkpoint.parallel_write`."""

    pipeline_stage: Bool = False
    """Each pipeline stage writes its own layers."""


class CheckpointConfig(DSModel):
    """`checkpoint` (runtime/config.py, runtime/model_checkpointing/config.py)."""

    tag_validation: Literal["Warn", "Ignore", "Fail", "WARN", "IGNORE", "FAIL", "warn", "ignore", "fail"] = "Warn"
    """Check that all ranks save the same checkpoint tag."""
    load_universal: Bool = False
    """Load a universal checkpoint."""
    use_node_local_storage: Bool = False
    """Each node writes to local storage."""
    parallel_write: CheckpointParallelWriteConfig = Field(default_factory=CheckpointParallelWriteConfig)
    """Parallel write settings."""
    checkpoint_serialization: Bool = True
    """torch.save serialization (false: legacy zipfile off)."""
    writer: Optional[CheckpointWriterConfig] = None
    """Checkpoint writer engine."""


class CompileConfig(DSModel):
    """`compile` (compile/config.py CompileConfig). The torch.compile backend is chosen in code
    (engine.compile(backend=...)), not here."""

    deepcompile: Bool = False
    """Enable DeepCompile."""
    autoep_non_moe: Bool = False
    """Compile non-MoE modules with AutoEP."""
    free_activation: Bool = False
    """Free activations early."""
    free_activation_threshold: Int = 10 * 1024 * 1024
    """Bytes above which activations are freed."""
    offload_activation: Bool = False
    """Offload activations to host."""
    offload_activation_pin_memory: Bool = True
    """Pinned memory for activation offload."""
    offload_opt_states: Bool = False
    """Offload optimizer states during forward/backward."""
    double_buffer: Bool = True
    """Double buffering."""
    symmetric_memory: Bool = False
    """Symmetric memory."""
    debug_log: Bool = False
    """Debug log."""
    offload_parameters: Bool = False
    """Offload parameters."""
    sync_before_reduce: Bool = False
    """Synchronise before reduce."""
    sync_after_reduce: Bool = False
    """Synchronise after reduce."""
    sync_before_allgather: Bool = False
    """Synchronise before all-gather."""
    sync_after_allgather: Bool = False
    """Synchronise after all-gather."""
    keep_int_input_tensors: Bool = True
    """Keep integer input tensors."""
    keep_all_input_tensors: Bool = False
    """Keep all input tensors."""
    passes: Optional[list[Literal["z1", "z3", "autosp", "autotp"]]] = None
    """DeepCompile passes."""


class TensorParallelConfig(DSModel):
    """`tensor_parallel` (runtime/tensor_parallel/config.py TPTrainingConfig): AutoTP training."""

    dtype: Optional[str] = None
    """Model dtype for AutoTP."""
    autotp_size: Int = Field(0, ge=0)
    """AutoTP degree; 0 disables AutoTP."""
    tp_overlap_comm: Bool = False
    """Overlap TP communication."""
    vocab_parallel_lm_head: Optional[Bool] = None
    """Vocab-parallel lm_head."""
    vocab_parallel_ce_backend: Literal["torch", "liger"] = "torch"
    """Cross-entropy backend for the vocab-parallel head."""
    tp: Optional[dict[str, Any]] = Field(default=None, alias="tensor_parallel")
    """TPConfig: tp_size, tp_grain_size."""
    injection_policy_tuple: Optional[list[Any]] = None
    """Injection policy."""
    partition_config: Optional[dict[str, Any]] = None
    """Custom AutoTP layer partitioning."""
    preset_model: Optional[str] = None
    """Built-in preset (llama, bloom, chatglm, mixtral, deepseek_v2, qwen2, phi3)."""
    keep_module_on_host: Bool = False
    """Keep loaded checkpoint tensors on host."""
    replace_with_kernel_inject: Bool = Field(False, alias="kernel_inject")
    """Inject inference kernels."""


class HybridEngineConfig(DSModel):
    """`hybrid_engine` (runtime/config.py HybridEngineConfig): RLHF train/generate switching."""

    enabled: Bool = False
    """Enable the hybrid engine."""
    max_out_tokens: Int = Field(512, gt=0)
    """Maximum generated tokens."""
    inference_tp_size: Int = 1
    """TP degree for generation."""
    release_inference_cache: Bool = False
    """Free the KV cache after generation."""
    pin_parameters: Bool = True
    """Pin parameters."""
    tp_gather_partition_size: Int = 8
    """Gather partition size."""
    enable_cuda_graph: Bool = False
    """CUDA graphs for generation."""


class AutotuningConfig(DSModel):
    """`autotuning` (autotuning/config.py, autotuning/constants.py)."""

    enabled: Bool = False
    """Run the autotuner."""
    fast: Bool = True
    """Fast mode (micro-batch sizes only)."""
    results_dir: str = "autotuning_results"
    """Results directory."""
    exps_dir: str = "autotuning_exps"
    """Experiments directory."""
    overwrite: Bool = True
    """Overwrite previous results."""
    start_profile_step: Int = 3
    """First profiled step."""
    end_profile_step: Int = 5
    """Last profiled step."""
    metric_path: Optional[str] = None
    """Metric output file."""
    tuner_type: Literal["gridsearch", "random", "model_based"] = "gridsearch"
    """Search strategy."""
    tuner_early_stopping: Int = 5
    """Trials without improvement before stopping."""
    tuner_num_trials: Int = 50
    """Maximum trials."""
    arg_mappings: Optional[dict[str, str]] = None
    """DeepSpeed key -> training-script argument."""
    max_train_batch_size: Optional[Int] = None
    """Upper bound on train_batch_size."""
    min_train_batch_size: Int = 1
    """Lower bound on train_batch_size."""
    max_train_micro_batch_size_per_gpu: Int = 1024
    """Upper bound on the micro batch."""
    min_train_micro_batch_size_per_gpu: Int = 1
    """Lower bound on the micro batch."""
    num_tuning_micro_batch_sizes: Int = 3
    """Micro-batch sizes tried per stage."""
    mp_size: Int = 1
    """Model-parallel size."""
    metric: Literal["latency", "throughput", "flops", "forward", "step"] = "throughput"
    """Metric to optimise."""
    model_info_path: Optional[str] = None
    """Model info file."""
    model_info: Optional[dict[str, Any]] = None
    """Model info (profile, num_params, hidden_size, num_layers)."""


class PipelineConfig(DSModel):
    """`pipeline` (runtime/config.py get_pipeline_config)."""

    stages: Union[Int, Literal["auto"]] = "auto"
    """Pipeline stages (PipelineModule decides when auto)."""
    partition: str = "best"
    """Layer partition method: parameters, uniform, type:<regex>, best."""
    seed_layers: Bool = False
    """Different seed per layer."""
    activation_checkpoint_interval: Int = Field(0, ge=0)
    """Layers between activation checkpoints (0: off)."""
    pipe_partitioned: Bool = True
    """Partition activations between stages."""
    grad_partitioned: Bool = True
    """Partition gradients between stages."""


class ExpertParallelConfig(DSModel):
    """`expert_parallel` (module_inject/auto_ep_config.py parse_autoep_config): AutoEP for HF MoE models."""

    enabled: Bool = False
    """Replace HF MoE blocks with AutoEP layers."""
    autoep_size: Int = Field(1, ge=1)
    """Expert-parallel degree."""
    expert_tensor_parallel_size: Int = Field(1, ge=1)
    """Tensor parallelism inside experts."""
    validate_folding_routing: Bool = False
    """Check routing after folding."""
    async_split_plan: Bool = False
    """Asynchronous split plan."""
    preset_model: Optional[str] = None
    """Model preset."""
    moe_layer_pattern: Optional[str] = None
    """Regex of MoE layers."""
    expert_pattern: Optional[str] = None
    """Regex of experts."""
    router_pattern: Optional[str] = None
    """Regex of the router."""
    use_grouped_mm: Bool = True
    """Grouped GEMM for experts."""
    disable_triton_grouped_mm: Bool = False
    """Disable the Triton grouped GEMM."""
    route_norm: Optional[Bool] = None
    """Normalise routing weights."""
    route_scale: Float = 1.0
    """Routing weight scale."""
    score_apply: str = "auto"
    """Where scores are applied."""
    combine_impl: str = "auto"
    """Combine implementation."""
    row_weighting_impl: str = "auto"
    """Row weighting implementation."""
    gate_up_impl: str = "separate"
    """Gate/up projection implementation."""
    comm_backend: str = "comm"
    """All-to-all backend."""
    comm_num_sm: Int = 12
    """SMs for communication kernels."""
    comm_qp_margin: Int = 4
    """Queue-pair margin."""
    comm_max_tokens_per_rank: Int = 0
    """Token cap per rank (0: none)."""
    num_expert_groups: Optional[Int] = None
    """Expert groups (DeepSeek group-limited routing)."""
    num_limited_groups: Optional[Int] = None
    """Groups each token may use."""
    score_func: str = "auto"
    """Router score function."""
    top_k: Union[Int, Literal["auto"]] = "auto"
    """Experts per token."""
    routed_scaling_factor: Union[Float, Literal["auto"]] = "auto"
    """Routed-expert output scale."""
    num_experts_attr: Optional[str] = None
    """Model config attribute holding the expert count."""
    top_k_attr: Optional[str] = None
    """Model config attribute holding top-k."""
    has_shared_experts: Optional[Bool] = None
    """Model has shared experts."""
    shared_experts_pattern: Optional[str] = None
    """Regex of shared experts."""
    shared_experts_gate_pattern: Optional[str] = None
    """Regex of the shared-expert gate."""
    expert_activation: Optional[str] = None
    """Expert activation function."""
