"""Activation memory: Korthikanti et al.'s published formulas, and an itemised count of what autograd saves.

`korthikanti_layer_bytes` is the paper (arXiv 2205.05198, eq. 1-2 and Table 2) for a GPT layer with 16-bit
activations and dropout. `layer_activation_bytes` itemises the tensors autograd really saves for one
Llama-style block (RMSNorm, RoPE, GQA, SwiGLU or GELU MLP, DeepSpeed top-k MoE) the way
`dstoolkit.runtime.model` / Hugging Face implement it, using the same reasoning as the paper (each
operation keeps the inputs its backward needs) — that is what the fidelity benchmark measures with
`torch.autograd.graph.saved_tensors_hooks`. What one rank holds across a pipeline stage's blocks, micro batches
in flight, head and loss is `dstoolkit.estimate.stage_activations`'s. No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate.dtype_bytes import FP32_BYTES
from dstoolkit.estimate.megatron_softmax import plan_fused_softmax
from dstoolkit.estimate.moe_activations import fused_moe_block_bytes, moe_block_bytes
from dstoolkit.estimate.timeline import is_cpu_device
from dstoolkit.runplan import RunPlan


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, *, sequence_parallel: bool = False,
    recompute: str = "none", flash_attention: bool = False,
) -> float:
    """Activation bytes of one transformer layer, Korthikanti et al. 2022 (eq. 1, Table 2).

    Args:
        s: sequence length; b: micro batch; h: hidden size; a: heads; t: tensor-parallel degree.
        sequence_parallel: Megatron sequence parallelism (shards the 10sbh non-TP part by t).
        recompute: "none", "selective" (attention core recomputed) or "full" (layer input kept only).
        flash_attention: flash/fused attention removes the 5as/h score term, as selective recompute does.

    Returns:
        Bytes for 16-bit activations.
    """
    if min(s, b, h, a, t) <= 0:
        raise ValueError(f"s, b, h, a, t must be > 0, got s={s} b={b} h={h} a={a} t={t}")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh  # Table 2, full recompute: the layer input only
    score = 0.0 if (recompute == "selective" or flash_attention) else 5.0 * a * s / h
    if t == 1:
        return sbh * (34.0 + score)  # eq. 1
    if sequence_parallel:
        return sbh * (34.0 + score) / t  # Table 2, TP + SP
    return sbh * (10.0 + 24.0 / t + score / t)  # Table 2, TP (selective: score term dropped)


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one block saves for backward on one rank for one micro batch."""

    full: float
    """Everything the block keeps when it is not recomputed."""
    checkpointed: float
    """What a recomputed block keeps: its input (DeepSpeed / reentrant checkpoint `save_for_backward`)."""
    attention_core: float
    """The part that selective recompute drops (scores/probabilities or flash's log-sum-exp, and with GQA the
    head-repeated k/v copies)."""


def _is_cpu(plan: RunPlan) -> bool:
    """CPU ranks (the hardware table's cpu rows): the itemisation stays what the CPU fidelity benchmarks measure."""

    return is_cpu_device(plan.gpu)


def _act_bytes(plan: RunPlan, layer: int | None = -1) -> tuple[int, float]:
    """(activation element bytes, GEMM-input element bytes). fp8 stores GEMM inputs in fp8 (1 byte); with an FP8
    selection (RunPlan.fp8_selection) only the swapped share of block `layer`'s (None: the LM head's; -1: any
    block, as a plan without a selection) GEMM inputs, the rest in the activation dtype."""
    p = 4 if plan.precision == "fp32" else 2
    if plan.precision != "fp8":
        return p, p
    share = 1.0 if plan.fp8_selection is None or layer == -1 else plan.fp8_share(layer)
    return p, 1 if share == 1.0 else p - (p - 1) * share


def eager_score_bytes(plan: RunPlan, micro_batch: float) -> float:
    """Bytes of the score matrices an eager attention core keeps for backward on one rank, per block: the softmax
    output (kept for the softmax backward and for probs @ V) over local queries x all keys (cp) or a/u heads x the
    whole square (Ulysses), split over TP; with dropout also its mask and the dropped probabilities (Korthikanti et
    al. 2022's 5as/h term with p = 2). When Megatron's softmax falls back to torch ops
    (megatron_softmax.plan_fused_softmax) with 16-bit scores, torch's softmax keeps its fp32 output and probs @ V
    the 16-bit cast of it (or, with dropout, the dropped probabilities)."""
    a, s = plan.shape.num_attention_heads, plan.seq_len
    p = _act_bytes(plan)[0]
    elements = a * s * s * micro_batch / (plan.cp * plan.ulysses) / plan.tp
    dropout = (1 + p) if plan.attention_dropout else 0
    if p != FP32_BYTES and not plan_fused_softmax(plan):
        return elements * (FP32_BYTES + (0 if plan.attention_dropout else p) + dropout)
    return elements * (p + dropout)


def layer_activation_bytes(plan: RunPlan, layer_index: int, micro_batch: int) -> LayerActivations:
    """Itemised saved-tensor bytes of block `layer_index` (see module docstring).

    Terms (s·b tokens, h hidden, d head dim, a heads, i FFN width, t TP, p activation bytes):
    RMSNorm keeps its fp32 upcast (or the fp32 input itself) and the normalised output: (4 + p)·sbh + 4·sb
    (rsqrt); each linear keeps its input; RoPE keeps its cos/sin tables (4·s·d·p); SDPA keeps q and the
    head-repeated k and v (Hugging Face `repeat_kv` materialises a heads) and its output; flash kernels add a
    fp32 log-sum-exp (4·b·a·s) while the math path keeps the probabilities (p·a·s²·b); SwiGLU keeps the
    gate pre-activation, SiLU output and up projection, and the product (down-projection input).
    """
    shape = plan.shape
    s, b = plan.seq_len, micro_batch
    h, a, d = shape.hidden_size, shape.num_attention_heads, shape.head_size
    t = plan.tp
    sp_div = t if plan.sequence_parallel else 1
    p, pl = _act_bytes(plan, layer_index)
    shards = plan.cp * plan.ulysses  # each rank keeps its 1/(cp·ulysses) of the sequence
    tok = s * b / shards
    impl = plan.attention_kind
    if impl == "te":
        return _fused_layer_bytes(plan, layer_index, tok, p, pl, sp_div)
    # -- outside the TP region (replicated across TP ranks unless sequence parallel) --
    norm = (FP32_BYTES + p) * tok * h + FP32_BYTES * tok
    if shape.norm_type == "layernorm" and not _is_cpu(plan):
        # torch's native LayerNorm kernel keeps its low-precision input and fp32 mean and rstd per token
        # (aten native_layer_norm saves input, mean, rstd); the fp32 upcast above is Llama's RMSNorm
        # (`hidden_states.to(torch.float32)`). GPU path only: the CPU fidelity benchmarks measure the runtime's
        # RMSNorm blocks.
        norm = p * tok * h + 2 * FP32_BYTES * tok
    outside = 2 * norm + 2 * pl * tok * h  # two norms, attention input, MLP input
    if plan.attention_dropout:
        outside += 2 * tok * h  # Korthikanti: two hidden-dropout masks (1 byte each)
    outside /= sp_div
    # -- attention (inside TP: heads split by t) --
    if shape.is_mla:
        qk = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
        vd = shape.v_head_dim or d
        q_bytes = p * tok * a * qk
        k_bytes = p * tok * a * qk
        v_bytes = p * tok * a * vd
        o_bytes = p * tok * a * vd
        latent = p * tok * ((shape.q_lora_rank or 0) + (shape.kv_lora_rank or 0)) * 2  # latent + its norm
        rope = 0.0
        attn_heads_dim = a * vd
    else:
        q_bytes = p * tok * a * d
        k_bytes = p * tok * a * d
        v_bytes = p * tok * a * d
        o_bytes = p * tok * a * d
        latent = 0.0
        rope = 4 * s * d * p  # cos and sin, built per call for q and for k
        attn_heads_dim = a * d
    if impl != "eager":
        core = FP32_BYTES * b * a * s / shards  # log-sum-exp
    else:
        core = eager_score_bytes(plan, b) * t
    attention = (q_bytes + k_bytes + v_bytes + o_bytes + core) / t + latent + rope
    del attn_heads_dim
    # Selective recompute checkpoints the attention core (q, k, v -> out): it keeps its inputs, so with GQA it
    # keeps k and v at kv heads instead of the head-repeated copies SDPA would save, and drops the core.
    kv_saving = 0.0
    if not shape.is_mla and shape.kv_heads < a:
        kv_saving = 2 * p * tok * (a - shape.kv_heads) * d / t
        if impl == "flash":  # flash-attn kernels read GQA k/v at kv heads: no repeated copies are saved
            attention -= kv_saving
            kv_saving = 0.0
    # -- MLP --
    if shape.is_moe_layer(layer_index):
        mlp = moe_block_bytes(plan, tok, p, pl)
        if p != FP32_BYTES:
            # the router reads input.float() (a copy it keeps) and dispatch keeps only indices, so the
            # low-precision norm output feeding the MoE layer is not kept (fp32: .float() is that tensor)
            outside -= pl * tok * h / sp_div
    else:
        i = shape.intermediate_size
        if shape.mlp_gated:
            mlp = (3 * p + pl) * tok * i / t  # silu input, silu output, up output, down input
        else:
            mlp = (p + pl) * tok * i / t  # gelu input, down input
    full = outside + attention + mlp
    checkpointed = p * tok * h / sp_div
    return LayerActivations(full=full, checkpointed=checkpointed, attention_core=core / t + kv_saving)


TE_NORM_STATS_BYTES = FP32_BYTES
"""Transformer Engine's fused LayerNorm/RMSNorm keeps one fp32 rsigma (and mu) per token."""
TE_FP8_CACHED_GEMM_INPUTS = True
"""With FP8, a Transformer Engine Linear saves for its weight-gradient GEMM the FP8 cast of its input (1 byte per
element), not the bf16 tensor (TE `Linear`/`LayerNormLinear` forward: the quantized input is what
`save_for_backward` keeps when fp8 is on; DeepSeek-V3 §3.3.2 caches GEMM inputs in FP8 the same way). Tensors a
non-GEMM backward also reads (the attention output, the SwiGLU input) stay in the activation dtype."""


def _fused_layer_bytes(plan: RunPlan, layer_index: int, tok: float, p: int, pl: int, sp_div: int) -> LayerActivations:
    """Saved bytes of one block with fused kernels (Transformer Engine / Megatron-Core, attention_impl 'te').

    Per token (h hidden, a heads, g kv heads, d head dim, i FFN width, t TP): each fused norm+linear keeps its
    input and its normalised output in the activation dtype plus fp32 norm statistics (2·(2p·h + 4), outside the
    TP region unless sequence parallel); attention keeps q (a·d), k and v at kv heads (2·g·d: fused attention
    reads GQA natively), its output (a·d, also the out-projection input) and the fp32 log-sum-exp; the MLP keeps
    the FC1 output and the FC2 input (3i gated, 2i GELU). Korthikanti et al. 2022 eq. 1 with the dropout masks
    and the s² term gone: 34 -> 32 bytes per token x hidden for GPT (i = 4h); ~34 for Llama 3 8B (GQA, i = 3.5h),
    against ~47 for the Hugging Face eager itemisation.
    """
    shape = plan.shape
    h, a, t = shape.hidden_size, shape.num_attention_heads, plan.tp
    pl = pl if TE_FP8_CACHED_GEMM_INPUTS else p
    mods = set(plan.recompute_modules)
    # each fused norm+linear keeps its input (p, norm backward) and its normalised output, the GEMM input, which
    # an FP8 Linear keeps as its FP8 cast (pl = 1 byte; TE_FP8_CACHED_GEMM_INPUTS); Megatron's layernorm recompute
    # module drops the normalised output and re-runs the norm in backward (--recompute-modules layernorm)
    norm_out = 0 if "layernorm" in mods else pl
    outside = 2 * ((p + norm_out) * h + TE_NORM_STATS_BYTES) * tok
    if plan.attention_dropout:
        outside += 2 * tok * h
    outside /= sp_div
    if shape.is_mla:
        qk = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
        vd = shape.v_head_dim or shape.head_size
        # mla_up_proj recompute: the up-projected q, k, v are re-made from the kept latents in backward (Megatron
        # --recompute-modules mla_up_proj; DeepSeek-V3 §3.2.3 "Recomputation of ... MLA Up-Projection")
        qkv = 0.0 if "mla_up_proj" in mods else p * tok * a * (2 * qk + vd)
        out = p * tok * a * vd
        latent = p * tok * ((shape.q_lora_rank or 0) + (shape.kv_lora_rank or 0)) * 2
    else:
        d, g = shape.head_size, shape.kv_heads
        qkv = p * tok * (a + 2 * g) * d
        out = p * tok * a * d
        latent = 0.0
    if pl != p:
        out += out * pl / p  # the out-projection's FP8 input copy beside the bf16 output attention backward reads
    core = FP32_BYTES * tok * a
    attention = (qkv + out + core) / t + latent
    if shape.is_moe_layer(layer_index):
        # moe recompute: the whole MoE layer re-runs from its input, which the block keeps anyway
        mlp = 0.0 if "moe" in mods else fused_moe_block_bytes(plan, tok, p, pl) / sp_div
    elif "mlp" in mods:
        mlp = 0.0  # mlp recompute: the dense MLP re-runs from its input (the kept norm output or its input)
    else:
        i = shape.intermediate_size
        # FC1 output (gate and up when gated: the activation's backward reads it) in p, FC2 input in pl
        mlp = (((2 if shape.mlp_gated else 1) * p + pl) * tok * i) / t
    full = outside + attention + mlp
    return LayerActivations(full=full, checkpointed=p * tok * h / sp_div, attention_core=core / t)


def uses_op_sac(plan: RunPlan) -> bool:
    """Whether "selective" recompute is torchtitan's op-level selective activation checkpointing: framework fsdp
    (torchtitan is PyTorch's FSDP2 reference trainer; its Llama 3 train configs set activation_checkpoint.mode
    'selective' with selective_ac_option 'op'). Megatron and DeepSpeed "selective" recompute the attention core.
    GPU path only: on CPU ranks "selective" stays what dstoolkit.runtime runs (the attention core)."""
    return plan.framework == "fsdp" and plan.checkpoint.recomputes_attention_core and not _is_cpu(plan)


def block_matmuls(plan: RunPlan, layer_index: int) -> list[tuple[str, float, float]] | None:
    """(name, output width per token, weight elements) of each matmul of a dense, non-MLA block in forward order,
    on one TP rank: q, k, v, o, then gate, up, down (SwiGLU) or fc1, fc2 (GELU). None for MoE or MLA blocks.
    Column-parallel outputs are split by t; row-parallel outputs (o, down/fc2) by t only with sequence parallelism."""
    shape = plan.shape
    if shape.is_mla or shape.is_moe_layer(layer_index):
        return None
    h, a, d, g, t = shape.hidden_size, shape.num_attention_heads, shape.head_size, shape.kv_heads, plan.tp
    i = shape.intermediate_size
    row = t if plan.sequence_parallel else 1
    mms = [("q", a * d / t, h * a * d / t), ("k", g * d / t, h * g * d / t), ("v", g * d / t, h * g * d / t),
           ("o", h / row, a * d * h / t)]
    if shape.mlp_gated:
        mms += [("gate", i / t, h * i / t), ("up", i / t, h * i / t), ("down", h / row, i * h / t)]
    else:
        mms += [("fc1", i / t, h * i / t), ("fc2", h / row, i * h / t)]
    return mms


def op_sac_layer_bytes(plan: RunPlan, layer_index: int, micro_batch: int) -> float | None:
    """Bytes one block keeps under torchtitan's op-level SAC (None where `block_matmuls` is None).

    torchtitan's policy (parallelize_llama.py `_custom_policy`, the `_save_list`): MUST_SAVE the outputs of
    aten.mm except every second mm of the block (the count restarts per checkpointed block), of the SDPA flash /
    efficient kernels (output and fp32 log-sum-exp) and of the TP reduce-scatter; everything else (norms, RoPE,
    SiLU, the other mm outputs) is recomputed from the block input, which the checkpoint wrapper keeps. So a
    Llama block keeps its input, q, v, gate and down (mm 1, 3, 5, 7), the attention output and its log-sum-exp.
    """
    mms = block_matmuls(plan, layer_index)
    if mms is None:
        return None
    shape = plan.shape
    p, _ = _act_bytes(plan)
    tok = plan.seq_len * micro_batch / (plan.cp * plan.ulysses)
    t, a, d = plan.tp, shape.num_attention_heads, shape.head_size
    sp_div = t if plan.sequence_parallel else 1
    kept = p * shape.hidden_size / sp_div  # block input (checkpoint wrapper)
    kept += sum(p * width for n, (_, width, _) in enumerate(mms, start=1) if n % 2 == 1)
    kept += (p * a * d + FP32_BYTES * a) / t  # SDPA output and log-sum-exp
    return kept * tok


def op_sac_recomputed_weights(plan: RunPlan, layer_index: int) -> float:
    """Weight elements (one TP rank) of the matmuls torchtitan's op-level SAC re-runs in backward: every second mm
    of the block (k, o, up for SwiGLU Llama; k, o, fc2 for GELU); 0 where `block_matmuls` is None."""
    mms = block_matmuls(plan, layer_index)
    if mms is None:
        return 0.0
    return float(sum(w for n, (_, _, w) in enumerate(mms, start=1) if n % 2 == 0))
