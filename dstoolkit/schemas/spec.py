"""The training spec: model + cluster + training plan, as a pydantic schema with a YAML file format.

This is the contract between generation, estimation, sweeps and real runs. No torch import.
`load_spec(path)` (in this module) parses YAML and reports errors at the YAML line.
The model section is resolved to a `dstoolkit.models.shape.ModelShape` by `dstoolkit.models.resolve_model`.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

Auto = Literal["auto"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


class GpuSpec(_Strict):
    """One accelerator's facts (explicit form of `cluster.gpu`, or a row of the hardware table)."""

    name: str = "custom"
    """Display name."""
    memory_bytes: int = Field(gt=0)
    """Device memory per GPU in bytes."""
    peak_bf16_flops: float = Field(gt=0)
    """Dense (no sparsity) bf16 peak FLOP/s per GPU."""
    peak_fp8_flops: Optional[float] = Field(default=None, gt=0)
    """Dense fp8 peak FLOP/s per GPU; None when the GPU has no fp8 tensor cores."""
    intra_node_bw_bytes_per_s: float = Field(gt=0)
    """Achievable all-reduce bus bandwidth inside a node (nccl-tests busbw), bytes/s."""
    inter_node_bw_bytes_per_s: float = Field(gt=0)
    """Achievable bus bandwidth per GPU across nodes, bytes/s."""
    compute_capability: Optional[str] = None
    """CUDA compute capability such as "9.0" (gates FP8 recipes); None for non-NVIDIA or CPU."""


class ModelSpec(BaseModel):
    """Exactly one of: `preset`, `hf_config`, or inline Hugging Face config fields (model_type, hidden_size, ...)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    preset: Optional[str] = None
    """Name of a bundled preset (llama-3-8b, llama-3-70b, llama-3.1-405b, mixtral-8x7b, deepseek-v3, tiny, ...)."""
    hf_config: Optional[str] = None
    """Path to a Hugging Face config.json, relative to the spec file."""


class ClusterSpec(_Strict):
    """Where the job runs."""

    nodes: int = Field(default=1, ge=1)
    """Number of nodes."""
    gpus_per_node: int = Field(default=8, ge=1)
    """Ranks (GPUs, or CPU processes for gpu: cpu) per node."""
    gpu: Union[str, GpuSpec] = "H100-SXM"
    """A name from the hardware table (H100-SXM, H200, H800, A100-80G, A100-40G, L40S, MI300X, cpu) or explicit facts."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class BatchRampSpec(_Strict):
    """Batch-size ramp. Either token-based (DeepSeek-style) or Megatron's rampup_batch_size triple."""

    kind: Literal["tokens", "megatron"] = "tokens"
    """tokens: start_batch -> global_batch over ramp_tokens; megatron: start, increment, ramp_samples."""
    start_batch: int = Field(gt=0)
    """Global batch (sequences) at step 0."""
    increment: Optional[int] = Field(default=None, gt=0)
    """Sequences added per ramp step (megatron) or the rounding step (tokens; default micro x dp)."""
    ramp_tokens: Optional[int] = Field(default=None, gt=0)
    """tokens kind: tokens over which the batch ramps to training.global_batch."""
    ramp_samples: Optional[int] = Field(default=None, gt=0)
    """megatron kind: samples over which the batch ramps."""


class TrainingSpec(_Strict):
    """The training plan."""

    seq_len: int = Field(gt=0)
    """Tokens per sequence."""
    global_batch: int = Field(gt=0)
    """Sequences per optimizer step over all data-parallel ranks."""
    micro_batch: Union[int, Auto] = "auto"
    """Sequences per rank per forward/backward; "auto" lets the generator pick the largest that fits."""
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    """Compute precision; fp8 means FP8 GEMMs with bf16 elsewhere."""
    optimizer: Literal["adamw", "adam", "sgd", "lamb", "adafactor"] = "adamw"
    """Optimizer family."""
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear LR warm-up steps."""
    train_steps: Optional[int] = Field(default=None, gt=0)
    """Total optimizer steps (for the scheduler); None leaves the decay open."""
    activation_checkpointing: Literal["none", "full", "every-k", "ratio", "selective", "auto"] = "none"
    """Recompute policy; see checkpoint_every_k / checkpoint_ratio."""
    checkpoint_every_k: int = Field(default=1, ge=1)
    """every-k policy: checkpoint one of every k layers."""
    checkpoint_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """ratio policy: fraction of layers checkpointed."""
    flash_attention: bool = True
    """Fused/flash attention (removes the s^2 score activations)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism alongside TP."""
    tp: Union[int, Auto] = 1
    """Tensor-parallel degree."""
    pp: Union[int, Auto] = 1
    """Pipeline-parallel degree."""
    ep: Union[int, Auto] = 1
    """Expert-parallel degree (MoE only)."""
    zero_stage: Union[Literal[0, 1, 2, 3], Auto] = "auto"
    """ZeRO stage."""
    offload: bool = False
    """Whether CPU offload of optimizer (and at stage 3 parameters) may be used."""
    zeropp: bool = False
    """Whether ZeRO++ (qwZ/hpZ/qgZ) may be used (stage 3)."""
    batch_ramp: Optional[BatchRampSpec] = None
    """Optional batch-size ramp."""


class Spec(_Strict):
    """A whole spec file."""

    name: str = "spec"
    """Short name used for output folders."""
    model: ModelSpec
    """Which model."""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    """Where it runs."""
    training: TrainingSpec
    """How it trains."""
