"""Training-spec fields of the GPU cluster model (issue 16): overlap, pipeline schedule, context and sequence
parallelism, attention implementation (recompute granularity is activation_checkpointing: none / selective /
every-k / ratio / full).

`TrainingSpec` (dstoolkit.spec.model) inherits them from `ClusterModelFields`, which also validates them, so
the main schema file stays small. The estimator reads them through `dstoolkit.runplan.plan_from_spec`. No torch.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, model_validator

from dstoolkit.common.model import Auto
from dstoolkit.spec.errors import SpecFieldError
from dstoolkit.spec.target_engines import TARGET_ENGINE
from dstoolkit.spec.whole_numbers import WholeNumberFields

Framework = Literal["deepspeed", "megatron", "fsdp"]
PipelineSchedule = Literal["1f1b", "interleaved", "zero-bubble", "dualpipe"]
AttentionImpl = Literal["eager", "sdpa", "flash", "flash1", "te"]
LossImpl = Literal["torch", "fused"]
MoeDispatcher = Literal["alltoall", "deepep"]
RecomputeModule = Literal["layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts"]


class ClusterModelFields(WholeNumberFields):
    """How the run executes on the GPUs (what the step-time, communication and activation models read); its int
    fields, and those of `TrainingSpec`, are whole numbers (`whole_numbers`: no strings, booleans or fractions)."""

    framework: Framework = "deepspeed"
    """The runtime that executes the model; decides the overlap defaults ("auto"): deepspeed = the DeepSpeed
    JSON's zero_optimization.overlap_comm (DeepSpeed's default: false, true at stage 3); megatron = Megatron-LM's
    --overlap-grad-reduce / --overlap-param-gather defaults (both off); fsdp = PyTorch FSDP, whose reduce-scatter
    and backward prefetch run on their own streams by design (both on)."""
    overlap_grad_reduce: Union[bool, Auto] = "auto"
    """Data-parallel gradient reduction overlapped with backward compute (DeepSpeed overlap_comm, Megatron
    --overlap-grad-reduce); "auto" = the framework's default."""
    overlap_param_gather: Union[bool, Auto] = "auto"
    """Data-parallel parameter all-gather overlapped with compute (ZeRO-3 prefetch, Megatron
    --overlap-param-gather with the distributed optimizer); "auto" = the framework's default."""
    tp_comm_overlap: bool = False
    """TP all-reduce / reduce-scatter / all-gather overlapped with the GEMMs (Megatron --tp-comm-overlap,
    Transformer Engine userbuffers). Off by default in Megatron-LM."""
    moe_a2a_overlap: bool = False
    """MoE dispatch/combine all-to-all overlapped with compute (Megatron --overlap-moe-expert-parallel-comm,
    DeepSeek-V3 DualPipe). Off by default."""
    cuda_launch_blocking: bool = False
    """The run sets CUDA_LAUNCH_BLOCKING=1 (a debugging and hang workaround: every kernel launch waits for the GPU
    to finish it), so the host's time to issue the kernels adds to the GPU's instead of running ahead of it
    (estimate.pipeline_stages.pipeline_compute_s). The estimate only: the generated launch scripts do not set it."""
    moe_dispatcher: MoeDispatcher = "alltoall"
    """How MoE tokens reach their experts' ranks: alltoall (one copy per routed expert in one all-to-all over the EP
    group: DeepSpeed MoE, Megatron --moe-token-dispatcher-type alltoall) or deepep (Megatron's flex dispatcher with
    the DeepEP / HybridEP backend, the DeepSeek-V3 §3.2.2 design: a token crosses InfiniBand once per remote node
    that holds one of its experts and is forwarded over NVLink inside that node). Only matters when the EP group
    spans nodes (estimate.comm.ep_a2a_split)."""
    recompute_modules: list[RecomputeModule] = Field(default_factory=list)
    """Blocks' submodules Megatron re-runs in backward instead of keeping their outputs (Megatron-Core
    --recompute-granularity selective --recompute-modules; its default core_attn is activation_checkpointing:
    selective here): layernorm (the norm outputs), moe_act (the routed experts' activation output), mla_up_proj
    (MLA's up-projected q, k, v), mlp (dense MLP blocks), moe (whole MoE layers), shared_experts. framework megatron
    only; with activation_checkpointing none or selective (Megatron-LM gets --recompute-granularity selective
    --recompute-modules, core_attn first under selective), not full / every-k / ratio (its full granularity)."""
    pipeline_schedule: PipelineSchedule = "1f1b"
    """Pipeline schedule: 1f1b (bubble (pp-1)/m), interleaved (virtual stages, bubble (pp-1)/(v·m), Narayanan et
    al. 2021 §2.2), zero-bubble (Qi et al. 2023, ZB-H2: the backward is split into input and weight gradients
    that fill the bubble) or dualpipe (DeepSeek-V3 §3.2.1: bubble (pp/2-1)·(F&B + B - 3W) with the all-to-all
    hidden behind the paired micro batch)."""
    virtual_stages: int = Field(default=1, ge=1)
    """Model chunks per pipeline rank with the interleaved schedule (Megatron --num-layers-per-virtual-pipeline-stage)."""
    cp: int = Field(default=1, ge=1)
    """Context-parallel degree (Megatron-Core context parallelism: each sequence split over cp ranks, ring
    attention exchanging K/V; the ranks come out of the data-parallel ones)."""
    ulysses: int = Field(default=1, ge=1)
    """DeepSpeed-Ulysses sequence-parallel degree (Jacobs et al. 2023: all-to-all of q, k, v and the attention
    output per layer; the ranks come out of the data-parallel ones)."""
    attention_impl: Optional[AttentionImpl] = None
    """Attention / fused-kernel implementation, which decides what activations are saved: eager (HF eager
    kernels: fp32 norm upcasts, repeated K/V, the s² probabilities; its time is charged as Megatron's unfused core,
    baddbmm, scale-mask-softmax, dropout, bmm, with the softmax one fused kernel where Megatron allows it,
    estimate.megatron_softmax), sdpa (HF with torch SDPA: no s² term),
    flash (flash-attention 2 kernels with HF-style modules), flash1 (flash-attn 1.x, e.g. llm-foundry's default
    gpu extra in 2023: flash-attn==1.0.9), te (Transformer Engine / Megatron fused kernels).
    None: sdpa when flash_attention, else eager."""
    loss_impl: LossImpl = "torch"
    """How the cross-entropy over the vocabulary runs, which decides the loss's memory: torch (F.cross_entropy on
    the logits cast to fp32, as Hugging Face causal LMs compute it: log_softmax keeps an fp32 [tokens, vocab] copy
    and its backward makes two more) or fused (a fused kernel on the low-precision logits: flash-attn's
    CrossEntropyLoss, llm-foundry's default loss_fn fused_crossentropy; Apex xentropy: it keeps the logits and one
    fp32 log-sum-exp per token and writes a low-precision gradient). The estimate only: the generated files do not
    switch the loss."""
    @model_validator(mode="after")
    def _check_cluster_fields(self) -> "ClusterModelFields":
        if self.virtual_stages > 1 and self.pipeline_schedule != "interleaved":
            raise SpecFieldError(("virtual_stages",), f"virtual_stages={self.virtual_stages} needs "
                                 f"pipeline_schedule: interleaved (got {self.pipeline_schedule!r})",
                                 "set pipeline_schedule: interleaved, or remove virtual_stages")
        if self.recompute_modules:  # which engine runs them is the targets' to say: check_engine_fields
            ckpt = getattr(self, "activation_checkpointing", None)
            if ckpt == "full":
                raise SpecFieldError(("recompute_modules",), f"recompute_modules={self.recompute_modules} with "
                                     "activation_checkpointing='full': full recompute already re-runs every module",
                                     "remove recompute_modules, or use activation_checkpointing none / selective")
            if ckpt in ("every-k", "ratio"):
                # Megatron-Core reads recompute_modules only under --recompute-granularity selective
                # (transformer_layer.py, attention.py, moe/*.py at d98e8a64); every-k / ratio are its full
                # granularity over some layers (--recompute-method block), which leaves the other layers' modules kept
                raise SpecFieldError(("recompute_modules",), f"recompute_modules={self.recompute_modules} with "
                                     f"activation_checkpointing={ckpt!r}: Megatron-Core recomputes named modules only "
                                     "under --recompute-granularity selective, and every-k / ratio are its full "
                                     "granularity on some layers (--recompute-method block), which ignores them",
                                     "remove recompute_modules, or use activation_checkpointing none / selective")
        if self.tp_comm_overlap and getattr(self, "sequence_parallel", True) is False:
            raise SpecFieldError(("tp_comm_overlap",), "tp_comm_overlap=true without sequence_parallel: Megatron-LM "
                                 "overlaps TP communication with the GEMMs only under sequence parallelism (its "
                                 "validate_args asserts 'Tensor parallel communication/GEMM overlap can happen only "
                                 "when sequence parallelism is enabled')",
                                 "set sequence_parallel: true, or remove tp_comm_overlap")
        if self.cp > 1 and self.ulysses > 1:
            raise SpecFieldError(("ulysses",), f"cp={self.cp} and ulysses={self.ulysses}: one sequence-sharding "
                                 "scheme at a time", "keep cp (Megatron) or ulysses (DeepSpeed), not both")
        return self


def check_engine_fields(spec: Any, *, from_command_line: bool = False) -> None:
    """Refuse a field only one engine has where nothing runs that engine: recompute_modules is Megatron-Core's
    --recompute-modules, so the spec needs a target that runs Megatron-Core (megatron-lm: `TARGET_ENGINE`), or, with
    no targets, framework: megatron (the other targets' estimates and files drop it: generate.targets.spec_for_targets).
    `from_command_line`: the targets came from the command line (--target), which the message and the fix name.

    Raises:
        SpecFieldError: at training.recompute_modules.
    """
    t = spec.training
    if not t.recompute_modules:
        return
    if spec.targets:
        if any(TARGET_ENGINE[x] == "megatron" for x in spec.targets):
            return
        cli = from_command_line
        given = " ".join(f"--target {x}" for x in spec.targets) if cli else f"targets: {', '.join(spec.targets)}"
        raise SpecFieldError(("training", "recompute_modules"), f"recompute_modules={t.recompute_modules} is "
                             f"Megatron's --recompute-modules, and no target runs Megatron-Core ({given})",
                             f"add {'--target megatron-lm' if cli else 'megatron-lm to targets'}, or remove "
                             "recompute_modules")
    if t.framework != "megatron":
        raise SpecFieldError(("training", "recompute_modules"), f"recompute_modules={t.recompute_modules} is "
                             f"Megatron's --recompute-modules (framework={t.framework!r})",
                             "set framework: megatron (or targets: [megatron-lm]), or use activation_checkpointing")


# ----------------------------------------------------------------------------------------------------------
# Node-level memory facts of ClusterSpec (host RAM per node, device headroom): defaults and their sources
# ----------------------------------------------------------------------------------------------------------

GiB = 2**30
DEFAULT_GPU_NODE_HOST_MEMORY_BYTES = 2 * 1000**4
"""Host RAM of one 8-GPU node when cluster.host_memory_per_node_gib is not given: 2 TB, the system memory of an
NVIDIA DGX H100 / H200 (DGX H100/H200 user guide, hardware overview: 2 TB DDR5)."""
DEFAULT_MEMORY_HEADROOM_FRACTION = 0.10
"""Share of device memory a pick should leave free when cluster.memory_headroom_fraction is not given: 10%, the
planning margin of vLLM's default gpu_memory_utilization 0.9 (vLLM engine arguments), the one published default
for how much of a GPU an engine may plan to fill. Caching-allocator fragmentation itself has no published
fraction (dstoolkit.estimate.timeline); reported extremes are larger: ZeRO (Rajbhandari et al. 2020) §3.2 saw
out-of-memory with over 30% of memory free, PyTorch PR #44742 an OOM with 13 GB of a 32 GB card in split free
blocks. It is a preference of the ranking, not a limit: a layout above it still fits when the peak does."""


def host_memory_per_node_bytes(cluster) -> int:
    """Host RAM of one node: cluster.host_memory_per_node_gib, else DEFAULT_GPU_NODE_HOST_MEMORY_BYTES on GPU
    nodes and, for gpu: cpu (the ranks are host processes), the ranks' own memory (gpus_per_node x the cpu row)."""
    if cluster.host_memory_per_node_gib is not None:
        return int(cluster.host_memory_per_node_gib * GiB)
    gpu = cluster.gpu_spec
    if str(getattr(gpu, "name", "")).lower() == "cpu":
        return int(gpu.memory_bytes) * cluster.gpus_per_node
    return DEFAULT_GPU_NODE_HOST_MEMORY_BYTES


def host_memory_source(cluster) -> str:
    """Where `host_memory_per_node_bytes` comes from, for summaries."""
    if cluster.host_memory_per_node_gib is not None:
        return "cluster.host_memory_per_node_gib"
    if str(getattr(cluster.gpu_spec, "name", "")).lower() == "cpu":
        return "gpu: cpu, the ranks' own memory (gpus_per_node x the cpu row of the hardware table)"
    return "default: 2 TB, an NVIDIA DGX H100/H200 node's system memory (cluster.host_memory_per_node_gib sets it)"


def memory_headroom_fraction(cluster) -> float:
    """cluster.memory_headroom_fraction, else DEFAULT_MEMORY_HEADROOM_FRACTION."""
    f = cluster.memory_headroom_fraction
    return DEFAULT_MEMORY_HEADROOM_FRACTION if f is None else float(f)


def memory_headroom_source(cluster) -> str:
    """Where `memory_headroom_fraction` comes from, for summaries."""
    if cluster.memory_headroom_fraction is not None:
        return "cluster.memory_headroom_fraction"
    return ("default 10%: vLLM's default gpu_memory_utilization 0.9; no published caching-allocator fragmentation "
            "fraction (dstoolkit.spec.cluster_fields.DEFAULT_MEMORY_HEADROOM_FRACTION)")
