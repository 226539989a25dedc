"""What the host pays to issue a block's work on a GPU rank (split from estimate.cluster_model): the kernels and
parameter tensors a block has, counted from its structure, the fixed launch gap per kernel, and the measured host
seconds per kernel, per parameter tensor, per micro step and per optimizer step (benchmarks/host_overhead.py).
The GPU runs asynchronously, so host time is a floor under a stage's micro batch, not a cost on top of it
(pipeline_stages.pipeline_compute_s). No torch import."""
from __future__ import annotations

from typing import Optional

from dstoolkit.estimate.megatron_softmax import softmax_kernels
from dstoolkit.estimate.pipeline_stages import stage_layers
from dstoolkit.runplan import RunPlan

KERNEL_LAUNCH_S = 5e-6
"""Fixed seconds per kernel a block runs, per micro batch (issue 24): the gap between dependent kernels of one
stream (launch latency, prologue, tail), of the order of a CUDA kernel launch, ~4-6 us per kernel submitted through
the driver and runtime (NVIDIA technical blog "Getting Started with CUDA Graphs", 2019: for short kernels the
launch overhead of several us dominates; pegainfer "From Launch Overhead to CUDA Graph", 4-6 us per launch).
Cited, not fitted: `layer_kernels(plan, i)` of them per block and micro batch (cluster_model.layer_compute_s);
the host pays the same call per ATen op it launches (host_layer_s). Checked by
leave-one-source-out (benchmarks/estimator_fit.py, the fitted constants refitted with it on): published runs
8.5% -> 8.4% MAPE in sample and out of source, layout sweeps 9.8% -> 9.5%, within-group Spearman 0.395 -> 0.396.
Tried and not kept in issue 24 (worse out of source): the shape fall-off on each of m, n, k instead of the
smallest (published LOSO 8.6%, sweep Spearman 0.330); tile/wave quantisation over the SMs (NVIDIA "Matrix
Multiplication Background User's Guide" ch. 3; on top of the fall-off: published LOSO 10.0-12.6%; instead of it, the
best of 256x128/128x256/128x128/64x128/128x64 tiles: published LOSO 8.7%, efficiency Spearman 0.924, sweeps MAPE
9.8%, Spearman 0.435, regret mean 3.1%: better order, worse MAPE; kept later in issue 24 in another form:
gemm.GEMM_WAVE_QUANTISATION, with the fall-off on k only, each projection at its own shape and an expert layer's
grouped GEMM as one launch); a fixed per-micro-batch cost per
pipeline stage (3 ms: sweep Spearman 0.446 but efficiency Spearman 0.921; 10 ms: 0.480 but published MAPE 8.8%,
and the published rows, which fit it, prefer 0; re-screened after the wave and NCCL-latency terms as a fourth fitted
constant on a 0/1/3/10 ms grid, per micro batch and stage: published LOSO 8.0% either way, efficiency Spearman out of
source 0.927 -> 0.923, sweeps LOSO MAPE 8.3% -> 9.0%, Spearman 0.509 -> 0.531: not kept)."""


HOST_S_PER_KERNEL = 3.7e-05
"""Measured (benchmarks/host_overhead.py -> results/host_overhead_cpu_202612.md; every HOST_S_* constant is
`constants()` of that file, held to it by tests/unit/test_cluster_physics.py): host seconds per kernel that
layer_kernels counts, for a Hugging Face block's forward + backward issued from Python (module calls, autograd, the
ATen dispatcher; tensors so small the kernels take no time). Such a block dispatches ~2.6 ATen kernel ops per
kernel counted here (bias adds, casts, copies, gradient accumulation) at ~9-14 us each. The GPU runs
asynchronously, so this is a floor, not a cost: a stage's micro batch takes max(GPU time, host time)
(pipeline_stages.pipeline_compute_s). It binds for small models at small micro batches, where each kernel's GPU
time is a few us.
The same VM measured 22-33 us per kernel an hour earlier (its CPU's speed varies); the CUDA launch call is not in a
CPU run, so host_layer_s adds KERNEL_LAUNCH_S for each of the HOST_ATEN_OPS_PER_KERNEL ATen ops behind a kernel."""
HOST_ATEN_OPS_PER_KERNEL = 2.6
"""Measured (benchmarks/host_overhead.py): ATen kernel ops a block dispatches per kernel layer_kernels counts (bias
adds, casts, copies, gradient accumulation; 105 / 40 for a Llama block, 81 / 31 for a GPT-2 block). On a GPU each
launches a CUDA kernel, whose launch call the CPU run does not pay: host_layer_s adds KERNEL_LAUNCH_S for each."""
HOST_RECOMPUTE_REPLAY = 0.87
"""Measured (benchmarks/host_overhead.py, the same blocks under torch.utils.checkpoint, reentrant as Megatron's
CheckpointFunction): host seconds a recomputed block adds over its plain forward + backward, as a fraction of that
plain time (GPT-2 0.90, Llama 0.84, the mean; results/host_recompute_cpu_202612.md). The replayed forward is a
third of the block's kernels, but the checkpoint machinery (saving the inputs and RNG states, re-entering autograd
for the block's own backward) costs host time of its own, so a recomputed block's host floor is (1 + this) x its
plain one (host_layer_s)."""
HOST_S_PER_PARAM_TENSOR = {0: 1e-05, 1: 1e-05, 2: 6e-05, 3: 0.00035}
"""Measured (benchmarks/host_overhead.py): extra host seconds per parameter tensor and micro step of a DeepSpeed
engine (bf16, clipping), by ZeRO stage, beyond the plain forward + backward: ZeRO-2's per-parameter gradient hook
(stage_1_and_2.py reduce_ready_partitions_and_remove_grads copies each gradient into the reduce bucket), ZeRO-3's
per-module pre-/post-forward and backward hooks that gather and release each parameter
(partitioned_param_coordinator.py fetch_sub_module / release_sub_module)."""
HOST_S_PER_MICRO_STEP = {0: 0.0004, 1: 0.001, 2: 0.0019, 3: 0.0055}
"""Measured (benchmarks/host_overhead.py): host seconds per micro step outside the blocks: the model's embedding,
LM head and loss, plus the DeepSpeed engine's fixed work per micro step of its ZeRO stage (forward/backward/step
wrappers, bucket bookkeeping, ZeRO-3's parameter coordinator trace); other frameworks take ZeRO 0's."""
HOST_S_PER_STEP = {0: 0.0012, 1: 0.002, 2: 0.002, 3: 0.0012}
"""Measured (benchmarks/host_overhead.py): host seconds a DeepSpeed engine's optimizer step adds at a gradient
accumulation boundary (bf16, gradient clipping), fixed part by ZeRO stage."""
HOST_S_PER_STEP_PER_PARAM_TENSOR = {0: 8e-05, 1: 9e-05, 2: 4e-05, 3: 8e-05}
"""Measured (benchmarks/host_overhead.py): the optimizer step's host seconds per parameter tensor of the rank's
blocks, by ZeRO stage (per-tensor gradient norms for clipping, the overflow check, copies between the parameters
and the flat partition)."""

def _separate_qkv(plan: RunPlan) -> bool:
    """q, k and v as three projections: eager-module stacks (sdpa) whose module has no single qkv weight."""
    return plan.attention_kind == "sdpa" and not plan.shape.qkv_fused


def layer_kernels(plan: RunPlan, i: int, recompute: Optional[bool] = None) -> int:
    """Kernels block i launches per micro batch (forward + backward + recompute), counted from its structure:
    GEMMs (QKV fused in Megatron/TE stacks and in modules with one qkv weight (ModelShape.qkv_fused: GPT-2 c_attn),
    q/k/v separate in other eager-module stacks (sdpa); gated MLP 3, plain 2; MoE:
    router + one grouped GEMM per expert matrix + shared experts), the attention core (flash/fused 1; eager
    QK^T, softmax, PV 3) and the elementwise ops (2 norms, 2 residual adds, the activation (+ the gate product),
    RoPE on q and k unless learned positions; MoE top-k, softmax, permute, unpermute). Backward runs two GEMMs per
    forward GEMM (data and weight gradient), two attention-core kernels per forward one and one kernel per
    elementwise op; a recomputed block runs its forward again."""
    shape = plan.shape
    impl = plan.attention_kind
    gated = 3 if shape.mlp_gated else 2
    gemm = 4 if _separate_qkv(plan) else 2
    elem = 2 + 2 + (2 if shape.mlp_gated else 1) + (0 if shape.learned_positions else 2)
    if shape.is_moe_layer(i) and shape.num_experts:
        gemm += 1 + gated + (gated if (shape.num_shared_experts or shape.shared_expert_intermediate_size) else 0)
        elem += 4
    else:
        gemm += gated
    core = 3 if impl == "eager" else 1
    # Megatron's softmax falling back to torch ops runs more kernels than its one, forward and backward alike
    unfused = softmax_kernels(plan) - 1 if impl == "eager" else 0
    fwd = gemm + core + elem + unfused
    bwd = 2 * gemm + 2 * core + elem + unfused
    if recompute is None:
        recompute = plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)[i]
    return fwd * (2 if recompute else 1) + bwd


def layer_param_tensors(plan: RunPlan, i: int) -> int:
    """Parameter tensors of block i on one rank, counted from its structure: the projection weights as
    layer_kernels counts its forward GEMMs (q/k/v separate in eager-module stacks unless qkv_fused), their biases,
    the norms (weight, + bias for LayerNorm; + q/k norms) and, in an MoE block, the router and each local expert's matrices.
    DeepSpeed's ZeRO-2 hooks and ZeRO-3 gathers run once per tensor (HOST_S_PER_PARAM_TENSOR)."""
    shape = plan.shape
    sep = _separate_qkv(plan)
    gated = 3 if shape.mlp_gated else 2
    n = (4 if sep else 2) + (((3 if sep else 1) if shape.attention_bias else 0) + (1 if shape.o_proj_bias else 0))
    norm = 2 if shape.norm_type == "layernorm" else 1
    n += 2 * norm + (2 if shape.qk_norm else 0)
    if shape.is_moe_layer(i) and shape.num_experts:
        n += 1 + gated * max(1, shape.num_experts // max(1, plan.ep))
        if shape.num_shared_experts or shape.shared_expert_intermediate_size:
            n += gated
    else:
        n += gated + (gated if shape.mlp_bias else 0)
    return n


def host_layer_s(plan: RunPlan, i: int) -> float:
    """Host seconds block i takes to issue one micro batch's forward + backward (+ recompute) on a GPU rank: its
    kernels without recompute (layer_kernels) x (HOST_S_PER_KERNEL + the CUDA launch call, KERNEL_LAUNCH_S, of each
    of the HOST_ATEN_OPS_PER_KERNEL ATen ops behind one), x (1 + HOST_RECOMPUTE_REPLAY) for a recomputed block, and
    for DeepSpeed the engine's per-tensor work of its ZeRO stage (layer_param_tensors x HOST_S_PER_PARAM_TENSOR).
    Measured by benchmarks/host_overhead.py but for the launch call (cited at KERNEL_LAUNCH_S)."""
    recomputed = plan.checkpoint.checkpointed_layers(plan.shape.num_hidden_layers)[i]
    per_kernel = HOST_S_PER_KERNEL + HOST_ATEN_OPS_PER_KERNEL * KERNEL_LAUNCH_S
    s = layer_kernels(plan, i, recompute=False) * per_kernel * (1.0 + (HOST_RECOMPUTE_REPLAY if recomputed else 0.0))
    if plan.framework == "deepspeed":
        s += layer_param_tensors(plan, i) * HOST_S_PER_PARAM_TENSOR[plan.ds.zero_stage]
    return s


def host_micro_step_s(plan: RunPlan) -> float:
    """Host seconds of one micro batch outside the blocks on a GPU rank (HOST_S_PER_MICRO_STEP): the model's
    embedding, head and loss, with the DeepSpeed engine's fixed work of its ZeRO stage when DeepSpeed runs it."""
    return HOST_S_PER_MICRO_STEP[plan.ds.zero_stage if plan.framework == "deepspeed" else 0]


def host_step_s(plan: RunPlan) -> float:
    """Host seconds of the optimizer step on a GPU rank beyond its memory-bound update, paid once per step and
    exposed (the step ends in host syncs: the gradient norm and overflow checks): a DeepSpeed engine's
    HOST_S_PER_STEP + HOST_S_PER_STEP_PER_PARAM_TENSOR x the parameter tensors of the rank's heaviest stage.
    Other frameworks: 0 (not measured here)."""
    if plan.framework != "deepspeed":
        return 0.0
    z = plan.ds.zero_stage
    tensors = max(sum(layer_param_tensors(plan, i) for i in stage_layers(plan, st))
                  for st in range(plan.pp))
    return HOST_S_PER_STEP[z] + tensors * HOST_S_PER_STEP_PER_PARAM_TENSOR[z]
