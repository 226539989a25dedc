"""The GPU cluster model behind the step time (issue 16): attention and memory-bound work per block, per-block kernel
gaps and MoE host syncs; overlap defaults per framework; MoE expert-parallel traffic. One GEMM's rate by shape,
precision and GPU generation is estimate.gemm's; the stages and their bubble estimate.pipeline_stages'; what the
host pays to issue a block estimate.host_cost's. No torch import.

Every constant cites its source. The constants marked "fitted" (gemm.GEMM_HALF_DIM, FRAMEWORK_EFFICIENCY and
MEGATRON_MOE_HOST_SYNC_S) are the grid point (benchmarks/estimator_fit.py GRID) with the lowest throughput MAPE over
all of benchmarks/data/published_runs.yaml; benchmarks/published_runs.py reports beside it the leave-one-source-out
figures (each source predicted with the constants refitted without it) and, per constant, whether it helps out of
source at all (issue 24). The GPU path only: CPU step times
come from the machine's calibration."""
from __future__ import annotations

import math
from dataclasses import dataclass

from dstoolkit.estimate.activations import eager_score_bytes, op_sac_recomputed_weights, uses_op_sac
from dstoolkit.estimate.moe_activations import moe_capacity
from dstoolkit.estimate import host_cost
from dstoolkit.estimate.attention_core import eager_core, windowed_core_keys
from dstoolkit.estimate.dtype_bytes import param_bytes
from dstoolkit.estimate.gemm import (SMS_BY_COMPUTE_CAPABILITY, LinearSeconds, gemm_rate, linear_s, precision_factor,
                                     projection_s)
from dstoolkit.estimate.layout import param_layout
from dstoolkit.hardware.table import GpuSpec
from dstoolkit.runplan import RunPlan

# -- kernel efficiency outside one GEMM (gemm.py: how fast one GEMM runs) ----------------------------
CAUSAL_ATTENTION_WORK = 0.5
"""Causal flash/fused kernels skip the masked upper triangle (Dao 2023, FlashAttention-2 §3.1.1), so they run
half the 12·L·H·Q·T attention FLOPs PaLM App. B counts; eager attention computes the full square."""
ATTENTION_FRACTION = {"eager": 0.30, "sdpa": 0.50, "flash": 0.55, "flash1": 0.30, "te": 0.60}
"""Fraction of dense bf16 peak the attention kernels sustain (fwd+bwd). flash: FlashAttention-2 reaches 50-73%
of A100 peak fwd+bwd (Dao 2023, Fig. 5-6) and FlashAttention-3 / cuDNN fused attention 40-75% of H100 peak
(Shah et al. 2024, Fig. 5); te (cuDNN fused attention through Transformer Engine) a little above; sdpa (torch
picks flash or memory-efficient kernels) a little below; eager: separate QK^T, softmax and PV kernels (used only
with EAGER_CORE_BY_KERNEL off; on, the eager core is charged kernel by kernel). flash1:
FlashAttention (v1) "reaching only 25-40% of the theoretical maximum FLOPs/s" on A100 (Dao 2023, FlashAttention-2,
abstract; the same paper's causal FLOPs are counted halved, as CAUSAL_ATTENTION_WORK does); 0.30, toward the low end
of that range for forward + backward (the backward is the slower pass, Fig. 5-6). Not fitted, but chosen after a
hand computation on the 8-GPU MPT rows of the llm-foundry benchmark table (flash-attn 1.0.9) gave ~0.28 on A100
(those rows: benchmarks/results/published_runs_202612.md, source llmfoundry_mpt)."""
HOPPER_FA2_ATTENTION_FRACTION = 0.35
"""On Hopper, the FlashAttention-2 kernels that torch SDPA and the flash-attn package run reach only about 35% of
peak (Shah et al. 2024, FlashAttention-3, abstract: "FlashAttention-2 ... achieving only 35% utilization on the
H100 GPU"): they use no wgmma/TMA. Replaces ATTENTION_FRACTION's sdpa and flash figures (measured on A100) on
compute capability 9.x; te (cuDNN fused attention, Hopper-native) keeps its figure."""
BLACKWELL_ULTRA_ATTENTION_SPEEDUP = 1.35
"""Attention-kernel speed of Blackwell Ultra (B300 / GB300, compute capability 10.3) over Blackwell at the same
dense peak: its special function units run the softmax's exponentials (MUFU.EX2) at twice Blackwell's rate, and
NVIDIA measures ~35% more FP8 forward attention throughput on GB300 than on GB200 for DeepSeek-V3 (NVIDIA
Technical Blog, "Making Softmax More Efficient with NVIDIA Blackwell Ultra", 2026). Applied to the fused
attention kernels' fraction (attention_fraction), forward and backward alike: the backward recomputes the
same exponentials; no backward figure is published. Not fitted."""
ATTENTION_QUERY_TILE = 128
"""Query rows one thread block of a flash-style attention kernel computes. FlashAttention-2 splits the work over
batch x heads x query blocks ("we additionally parallelize over the sequence length dimension", Dao 2023 §3.2; its
forward tiles are 128 rows for the head sizes of these models, flash-attn kernel traits kBlockM = 128), as do
FlashAttention-3 and cuDNN's fused attention on Hopper. FlashAttention (v1) is described there as splitting over
batch x heads only (§3.2: efficient "when batch size x number of heads is large, >= 80"), but the llm-foundry
rows it ran (flash-attn 1.0.x, 8 GPUs, 1-3 sequences of 8192 tokens x 32 heads, 32-96 such blocks on 108 SMs) show
no such loss (predicted 23-60% too slow with one block per head), so it is counted with the query blocks too.
With few blocks the last wave leaves SMs idle (attention_occupancy)."""
EAGER_CORE_BY_KERNEL = True
"""Whether an eager attention core (attention_impl eager) is charged kernel by kernel (attention_core.eager_core_s:
its batched GEMMs at their own shapes, its softmax and dropout passes over the score matrices at HBM bandwidth;
attention_core.eager_core) instead of its FLOPs at ATTENTION_FRACTION["eager"] of peak with its saved scores in the
generic elementwise passes. Issue 24, with the attention dropout of the model config (ModelShape.attention_dropout): the
vTrain sweeps (Megatron-DeepSpeed GPT, eager core with dropout 0.1) moved most: 64-512 GPUs MAPE 10.5% -> 8.1%,
the 3.6B model (32 heads of 96) 18.7% -> 9.9%; one node, 1440 rows, 10.7% -> 10.0%; published runs 5.4% -> 5.5%
(Korthikanti et al. 2022's selective-recompute rows 5.1% -> 8.4%, predicted slower). Not fitted. The switch stays
for that comparison."""
ATTENTION_OCCUPANCY = True
"""Whether the attention core's rate carries attention_occupancy (issue 24). The switch stays for the comparison in
benchmarks/results (published runs and layout sweeps with and without it)."""
NON_GEMM_PASSES_PER_SAVED_BYTE = 3.0
"""Memory-bound work per layer outside the GEMMs and the attention core (norms, activation functions, residual
adds, RoPE): each saved activation byte is written in forward and read in backward, and its gradient is written
once (roofline accounting, Williams et al. 2009); runs at the GPU's HBM bandwidth."""
UNFUSED_NON_GEMM_PASSES_PER_SAVED_BYTE = 10.0
"""The same for blocks whose elementwise ops run as separate eager PyTorch kernels (attention_impl sdpa: Hugging
Face / torchtitan style modules, not compiled): counting each op's reads and writes for a Llama block in bf16,
per token and hidden unit, forward: RMSNorm x2 as x.float(), pow, mean, rsqrt-mul, type_as, weight-mul ~72 bytes,
RoPE through fp32 complex views on q and k ~25, repeat_kv copies ~5, SDPA layout copies ~12, two residual adds 12,
SiLU and the gate product ~10 per FFN unit (35 at i = 3.5h): ~160; backward ~2x that: ~480 bytes against the ~47
the block saves (activations.layer_activation_bytes), i.e. ~10 passes per saved byte. Fused kernels (te) and
flash-attention stacks with fused norms keep NON_GEMM_PASSES_PER_SAVED_BYTE."""
FRAMEWORK_EFFICIENCY = 0.88
"""Fitted. Fraction of the kernel-level rate a whole training step keeps (launch gaps, synchronisation,
stragglers): between the 80% of matmul peak and the 38-56% end-to-end MFU published (docs/anchors.md). Refitted
with gemm.GEMM_HALF_DIM and comm.INTER_NODE_HOP_LATENCY_S after the op-SAC / FA2 / latency revisions (grid: half-dim
0-512, efficiency 0.84-1.00, latency 0-25 us): the training-row MAPE is lowest at 384 / 0.88 / 7.5 us (16.5%;
held-out 9.0%), so both constants kept their values. Issue 24: refit on the whole table with the hop latency removed
(grid half-dim 256/384/512 x efficiency 0.80-0.96): 0.84 with half-dim 256. Refit again after the half depth
follows each GPU's ridge point (gemm.half_depth) and the 65 small-model llm-foundry rows joined the table: 0.88
with half-dim 384, the in-sample best and every leave-one-source-out fold's choice
(benchmarks/results/published_runs_202612.md)."""

MEGATRON_MOE_HOST_SYNC_S = 4.5e-3
"""Fitted. Seconds a Megatron-Core MoE block adds per micro batch (forward + backward) beyond its kernels' time.
Megatron-Core's training token dispatchers need the per-expert token counts on the host (the developer guide's
core.transformer.moe.token_dispatcher_inference page: the CUDA-graph inference dispatcher keeps "all metadata
GPU-resident to avoid host synchronizations", which the training alltoall / flex-DeepEP dispatchers do), and
Transformer Engine's GroupedLinear takes its m_splits as a host list of ints (TransformerEngine
benchmarks/linear/benchmark_grouped_linear.py; a device-tensor path arrived only with NVIDIA/TransformerEngine PR
#3038). Each such device-to-host sync drains the launch queue, so the CPU's kernel launches for the rest of the
block stop overlapping GPU work, except while an exposed EP all-to-all transfers (the CPU launches the rest of the
block meanwhile): without moe_a2a_overlap only what outlasts the block's all-to-all time (ep_a2a_layer_s)
shows. No source gives the size (as a plausibility check, not a measurement: 4.5 ms is of the order of the CPU
time to launch a few hundred eager kernels at ~15 us each, what one MoE block's forward and backward run). Chosen by a grid search over 0, 3, 4, 4.5, 5, 5.5, 6 and 7 ms on
the training rows of benchmarks/published_runs.py (i % 3 != 2), the other fitted constants held: training MAPE
13.2% at 0, 7.5% at 4 ms, 7.1% at 4.5 ms, 7.2% at 5 ms (held-out 13.7% -> 9.4% at 4.5 ms). Applies to every MoE
block a Megatron run executes, whatever the model."""

def attention_fraction(gpu: GpuSpec, impl: str) -> float:
    """Fraction of dense bf16 peak the attention core sustains for this kernel family on this GPU
    (ATTENTION_FRACTION; HOPPER_FA2_ATTENTION_FRACTION for FA2-based kernels on compute capability 9.x, and for
    flash-attn 1.x there the same ratio to FA2 as on A100: no H100 figure of v1 is published; fused kernels on
    Blackwell Ultra, compute capability 10.3, x BLACKWELL_ULTRA_ATTENTION_SPEEDUP)."""
    cc = str(gpu.compute_capability or "")
    if impl in ("sdpa", "flash", "flash1") and cc.startswith("9."):
        v1_ratio = ATTENTION_FRACTION["flash1"] / ATTENTION_FRACTION["flash"] if impl == "flash1" else 1.0
        return HOPPER_FA2_ATTENTION_FRACTION * v1_ratio
    if impl != "eager" and cc == "10.3":
        return ATTENTION_FRACTION[impl] * BLACKWELL_ULTRA_ATTENTION_SPEEDUP
    return ATTENTION_FRACTION[impl]


def attention_occupancy(plan: RunPlan) -> float:
    """Fraction of the SMs a flash-style attention kernel keeps busy over its waves (ATTENTION_QUERY_TILE): thread
    blocks = micro batch x the rank's query heads (heads / tp / Ulysses) x query blocks of its sequence share
    (seq / cp, in ATTENTION_QUERY_TILE rows), run in ceil(blocks / SMs) waves
    (NVIDIA "Matrix Multiplication Background User's Guide" ch. 3, wave quantization, the same arithmetic as
    gemm.wave_utilisation). 1 for eager attention (batched GEMMs over the whole s x s scores), where the SM count is
    unknown, or with ATTENTION_OCCUPANCY off. Binds at small micro batches with high TP: 32 heads at tp 8, mb 1,
    seq 2048 give 64 blocks on an A100's 108 SMs."""
    impl = plan.attention_kind
    sms = SMS_BY_COMPUTE_CAPABILITY.get(str(plan.gpu.compute_capability or ""))
    if not ATTENTION_OCCUPANCY or impl == "eager" or not sms:
        return 1.0
    heads = max(1, math.ceil(plan.shape.num_attention_heads / (plan.tp * plan.ulysses)))
    q_blocks = math.ceil(plan.seq_len / plan.cp / ATTENTION_QUERY_TILE)
    blocks = plan.ds.micro_batch * heads * q_blocks
    return blocks / (math.ceil(blocks / sms) * sms)


def hbm_bw(gpu: GpuSpec, fallback: float) -> float:
    """HBM bandwidth of the GPU (`GpuSpec.hbm_bw_bytes_per_s`), else the fallback."""
    return gpu.hbm_bw_bytes_per_s or fallback


# -- overlap defaults -------------------------------------------------------------------------------------
def resolved_overlap(plan: RunPlan) -> tuple[bool, bool]:
    """(gradient reduction overlapped, parameter gather overlapped) after the framework defaults.

    deepspeed: the JSON's overlap_comm (DeepSpeed default false, true at stage 3: runtime/zero/config.py) for the
    gradients; stage 3 prefetches parameters (stage3_prefetch_bucket_size), stages 1/2 gather after the step.
    megatron: Megatron-LM --overlap-grad-reduce / --overlap-param-gather default off (arguments.py).
    fsdp: PyTorch FSDP runs reduce-scatter and the backward prefetch on separate streams (FSDP docs).
    deepspeed with pp > 1 (its PipelineEngine): the gradients are reduced after the pipeline flush, never behind
    backward, whatever overlap_comm says (pipeline_reduces_after_flush).
    """
    g, p = plan.overlap_grad_reduce, plan.overlap_param_gather
    if plan.framework == "deepspeed":
        dg, dpg = plan.ds.overlap_comm, plan.ds.zero_stage == 3
    elif plan.framework == "fsdp":
        dg, dpg = True, True
    else:
        dg, dpg = False, False
    grads = dg if g is None else g
    if pipeline_reduces_after_flush(plan):
        grads = False
    return grads, (dpg if p is None else p)


def pipeline_reduces_after_flush(plan: RunPlan) -> bool:
    """DeepSpeed's PipelineEngine (framework deepspeed, pp > 1) reduces the data-parallel gradients only after the
    last micro batch's backward: its TrainSchedule issues ReduceTiedGrads / ReduceGrads once, in the step after
    the final BackwardPass (deepspeed/runtime/pipe/schedule.py TrainSchedule.steps), and `_exec_reduce_grads`
    (pipe/engine.py) sets the accumulation boundary only for that call, so ZeRO-1's backward hooks
    (stage_1_and_2.py reduce_ready_partitions_and_remove_grads) have nothing to reduce while backward runs. The
    reduction is therefore in the critical path even with overlap_comm (ZeRO-2/3 are refused with pipelines)."""
    return plan.framework == "deepspeed" and plan.pp > 1


# -- MoE expert-parallel traffic (comm.comm_plan adds it to the step's collectives) ----------------------
def ep_a2a_layer_bytes(plan: RunPlan) -> float:
    """Bytes one rank passes to the EP all-to-alls of one MoE block and micro batch: dispatch and combine, forward
    and backward (4), of its routed copies x h in the model dtype, per TP rank (DeepSpeed drops the tokens
    duplicated across TP ranks, deepspeed/moe/mappings.py drop_tokens; Megatron with sequence parallelism holds
    tokens/tp per rank). Routed copies: DeepSpeed's capacity-padded (E, C, h) buffer (sharded_moe.py), Megatron's
    dropless tokens x top-k (Megatron-Core alltoall dispatcher)."""

    shape = plan.shape
    tok = tokens_per_micro(plan)
    if plan.framework == "deepspeed":
        routed = shape.num_experts * moe_capacity(plan, int(tok))
    else:
        routed = tok * max(1, shape.num_experts_per_tok)
    return 4 * routed * shape.hidden_size * param_bytes(plan.precision) / plan.tp


def ep_a2a_layer_s(plan: RunPlan) -> float:
    """GPU seconds of one MoE block's EP all-to-alls for one micro batch at the table's link rates: the InfiniBand
    and NVLink shares of ep_a2a_split (inside one node all of it, (ep - 1)/ep, on NVLink: nccl-tests' all-to-all
    factor), as comm.comm_plan splits them; 0 without EP."""
    if not plan.shape.is_moe or plan.ep <= 1:
        return 0.0
    b = ep_a2a_layer_bytes(plan)
    inter, intra = ep_a2a_split(plan, plan.tp * plan.cp * plan.ulysses)
    return b * inter / plan.gpu.inter_node_bw_bytes_per_s + b * intra / plan.gpu.intra_node_bw_bytes_per_s


def ep_a2a_split(plan: RunPlan, stride: int) -> tuple[float, float]:
    """(inter-node, intra-node) bytes per byte of routed copies a rank dispatches, for an EP group whose ranks are
    `stride` apart: G = min(ep, gpus_per_node // stride) of them share a node, N = ceil(ep / G) nodes.

    alltoall: every routed copy goes straight to its expert's rank, and routing is uniform over the group (the
    source tables' force-balanced runs), so (ep - G) / ep of the copies leave the node and (G - 1) / ep go to a
    peer on it (nccl-tests' all-to-all sends (n-1)/n of its size to peers, doc/PERFORMANCE.md; split here by link).
    deepep: DeepEP's normal kernels (deepseek-ai/DeepEP README: "forwarding data from NVLink domain to RDMA
    domain") follow DeepSeek-V3 §3.2.2: a token goes over InfiniBand once to each remote node holding at least
    one of its top-k experts, to the GPU with the same in-node index, which forwards it over NVLink. With the
    E experts spread evenly, a node holds E_n = E·G/ep of them and a token hits it with probability
    1 - C(E - E_n, k) / C(E, k) (top-k without replacement), so (N - 1)·that / k of the copies' bytes cross IB;
    the NVLink share is the copies that end on another GPU of the node, (G - 1) / G."""
    shape = plan.shape
    ep = plan.ep
    g = max(1, min(ep, plan.gpus_per_node // max(1, stride)))
    if g >= ep:
        return 0.0, (ep - 1) / ep
    n = math.ceil(ep / g)
    if plan.moe_dispatcher != "deepep":
        return (ep - g) / ep, (g - 1) / ep
    k = max(1, shape.num_experts_per_tok)
    e = max(k, shape.num_experts)
    e_node = e * g // ep
    hit = 1.0 - math.comb(e - e_node, k) / math.comb(e, k)
    return min((ep - g) / ep, (n - 1) * hit / k), (g - 1) / g


# -- per-stage work ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerWeights:
    """Matmul weights of one block by role (whole model, before TP)."""

    attention: int
    dense_mlp: int
    routed_one: int
    """One routed expert's weights (0 for a dense block)."""
    shared: int
    router: int


def layer_weights(shape, i: int) -> LayerWeights:
    att = dense = routed = shared = router = 0
    for p in param_layout(shape):
        if p.layer != i or p.kind == "norm" or not p.name.endswith("weight"):
            continue
        if p.kind == "attention" and "layernorm" not in p.name and "_norm" not in p.name:
            att += p.numel
        elif p.kind == "dense_mlp":
            dense += p.numel
        elif p.kind == "expert":
            routed += p.numel
        elif p.kind == "shared_expert":
            shared += p.numel
        elif p.kind == "router":
            router += p.numel
    if shape.is_moe_layer(i) and shape.num_experts:
        routed //= shape.num_experts
    return LayerWeights(att, dense, routed, shared, router)


def tokens_per_micro(plan: RunPlan) -> float:
    """Tokens one rank computes per micro batch (the sequence split by cp / Ulysses)."""
    return plan.ds.micro_batch * plan.seq_len / plan.sequence_shards


def attention_work_fraction(plan: RunPlan) -> float:
    """Of the 12·H·Q·T attention FLOPs PaLM App. B counts, the share the plan's GPU kernel runs: all of it for eager
    attention, CAUSAL_ATTENTION_WORK for the causal fused kernels (flash, SDPA, Transformer Engine)."""
    return 1.0 if plan.attention_kind == "eager" else CAUSAL_ATTENTION_WORK


def layer_compute_s(plan: RunPlan, i: int, tok: float, saved_bytes: float, mem_bw: float) -> float:
    """Seconds of forward+backward(+recompute) of block i for `tok` tokens on one rank."""
    shape, gpu, t = plan.shape, plan.gpu, plan.tp
    h = shape.hidden_size
    w = layer_weights(shape, i)
    prec = plan.precision
    # the FP8 selection (RunPlan.fp8_selection, `fp8 plan`'s rule): a block whose linears stay partly or wholly bf16
    # runs its GEMMs at the bf16 rate, the swapped share at the FP8 one (gemm.precision_factor is a rate factor, so
    # the block's GEMM seconds blend linearly in the swapped share of its weights)
    share = plan.fp8_share(i)
    gemm_scale = 1.0
    if prec == "fp8" and share < 1.0:
        prec = "bf16"
        gemm_scale = (1.0 - share) + share / precision_factor("fp8", gpu)
    recompute = 1.0
    if plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)[i]:
        recompute = 4.0 / 3.0  # one more forward (2N of 6N): docs/anchors.md, "Full recompute"
    # each GEMM role's forward and backward seconds (gemm.linear_s: every pass at its own shape)
    role: dict[str, LinearSeconds] = {}
    # attention projections: (tok x h) @ (h x heads·d / t)
    up_share = 2.0 / 3.0 if shape.mlp_gated else 0.5  # gate + up of (gate, up, down); up of (up, down)
    if shape.is_mla:
        role["attention"] = linear_s(gpu, prec, w.attention * tok / t, tok, h / t, h)
    else:
        q, kv = shape.num_attention_heads * shape.head_size, shape.kv_heads * shape.head_size
        qkv_share = (q + 2 * kv) / (2 * q + 2 * kv)  # QKV h x (q + 2kv), output q x h
        role["attention"] = (linear_s(gpu, prec, w.attention * tok / t * qkv_share, tok, (q + 2 * kv) / t, h)
                             + linear_s(gpu, prec, w.attention * tok / t * (1 - qkv_share), tok, h, q / t))
    if w.dense_mlp:
        work = w.dense_mlp * tok / t
        role["mlp"] = projection_s(gpu, prec, work * up_share, work * (1 - up_share), tok,
                                   shape.intermediate_size / t, h)
    if w.routed_one:
        k = max(1, shape.num_experts_per_tok)
        per_expert = tok * k * plan.ep / shape.num_experts  # tokens one local expert receives from its EP group
        local = max(1, shape.num_experts // max(1, plan.ep))  # the rank's experts: one grouped GEMM launch
        work = w.routed_one * k * tok / t
        role["moe"] = projection_s(gpu, prec, work * up_share, work * (1 - up_share), per_expert,
                                   shape.expert_ffn_size / t, h, local)
    if w.shared:
        width = w.shared / ((3 if shape.mlp_gated else 2) * h)
        work = w.shared * tok / t
        role["shared_experts"] = projection_s(gpu, prec, work * up_share, work * (1 - up_share), tok, width / t, h)
    # forward + backward, and a recomputed block's forward once more (docs/anchors.md, "Full recompute")
    s = sum(r.forward_s * (2.0 if recompute > 1.0 else 1.0) + r.backward_s for r in role.values())
    mods = set(plan.recompute_modules) if recompute == 1.0 else set()
    if mods:
        # Megatron --recompute-modules: each recomputed GEMM module runs its forward (2 FLOPs per weight and token)
        # once more in backward; "moe" recomputes the shared experts too
        if "moe" in mods:
            mods.add("shared_experts")
        s += sum(r.forward_s for name, r in role.items() if name in mods)
        if "mla_up_proj" in mods and shape.is_mla:
            s += 2 * mla_up_proj_weights(shape) * tok / t / gemm_rate(gpu, prec, tok, h / t, shape.kv_lora_rank or h)

    op_sac = uses_op_sac(plan) and recompute == 1.0
    if op_sac:
        # torchtitan op-level SAC re-runs every second matmul's forward (2 FLOPs per weight and token) in backward
        # and keeps the SDPA output, so the attention core is not recomputed (activations.op_sac_layer_bytes)
        s += 2 * op_sac_recomputed_weights(plan, i) * tok / gemm_rate(gpu, prec, tok, h / t, h)
    s *= gemm_scale  # everything above is GEMM time
    # attention core: 12·H·Q·S per token (PaLM App. B) over the full sequence (a sliding window's band), each rank
    # its tok queries
    from dstoolkit.estimate.flops import attention_head_dims

    H, Q = attention_head_dims(shape)
    impl = plan.attention_kind
    core_again = (plan.checkpoint.recomputes_attention_core and not op_sac) or recompute > 1
    eager_saved = 0.0
    if impl == "eager" and EAGER_CORE_BY_KERNEL:
        micro_batch = tok / (plan.seq_len / plan.sequence_shards)  # the sequences behind `tok` on this rank
        core = eager_core(plan, micro_batch, mem_bw)
        s += core.forward_s * (2.0 if core_again else 1.0) + core.backward_s
        eager_saved = eager_score_bytes(plan, micro_batch)
    else:
        band = windowed_core_keys(plan, i)  # a sliding window the kernel honours (attention_core)
        work = (12 * H * Q * plan.seq_len * tok / t * attention_work_fraction(plan) if band is None
                else 12 * H * Q * band * tok / t)
        if core_again:
            work *= 4.0 / 3.0
        s += work / (gpu.peak_bf16_flops * attention_fraction(gpu, impl) * attention_occupancy(plan))
    if plan.framework == "megatron" and shape.is_moe_layer(i) and shape.num_experts:
        # the dispatcher's / grouped GEMM's host syncs (MEGATRON_MOE_HOST_SYNC_S): the CPU launches the rest of the
        # block while an exposed all-to-all transfers, so without EP overlap only what outlasts it shows
        sync = MEGATRON_MOE_HOST_SYNC_S
        if not plan.moe_a2a_overlap:
            sync = max(0.0, sync - ep_a2a_layer_s(plan))
        s += sync
    s += host_cost.layer_kernels(plan, i) * host_cost.KERNEL_LAUNCH_S
    passes = UNFUSED_NON_GEMM_PASSES_PER_SAVED_BYTE if impl == "sdpa" else NON_GEMM_PASSES_PER_SAVED_BYTE
    if op_sac:
        passes *= 4.0 / 3.0  # op-level SAC re-runs the block's elementwise forward (1 of its 3 thirds) in backward
    if mods:
        # the elementwise work is that of the block without the recompute modules, plus the forward third of it
        # again for the tensors the modules dropped
        from dstoolkit.estimate.activations import layer_activation_bytes

        kept_all = layer_activation_bytes(plan.model_copy(update={"recompute_modules": ()}), i,
                                          plan.ds.micro_batch).full
        s += (passes * max(0.0, kept_all - eager_saved) + passes / 3.0 * max(0.0, kept_all - saved_bytes)) / mem_bw
    else:
        # an eager core's score matrices are charged kernel by kernel above (attention_core.eager_core)
        s += passes * max(0.0, saved_bytes - eager_saved) / mem_bw
    return s


def mla_up_proj_weights(shape) -> float:
    """Weights of MLA's up-projections (DeepSeek-V2 §2.1.2): W^UQ, W^QR from the query latent (q_lora_rank x heads x
    (qk_nope + qk_rope)) and W^UK, W^UV from the KV latent (kv_lora_rank x heads x (qk_nope + v)); without a query
    latent only the KV ones."""
    a = shape.num_attention_heads
    nope, rope = shape.qk_nope_head_dim or 0, shape.qk_rope_head_dim or 0
    vd = shape.v_head_dim or shape.head_size
    q = (shape.q_lora_rank or 0) * a * (nope + rope)
    return float(q + (shape.kv_lora_rank or 0) * a * (nope + vd))
