"""Megatron-LM / Megatron-DeepSpeed command-line flags consistent with the generated DeepSpeed JSON.

No torch import. `build_megatron_args` returns a list of (flag, values) pairs; `render_megatron_args` writes
one flag per line with every value shell-quoted, so ``pretrain_gpt.py $(cat megatron_args.txt)`` is safe.
"""
from __future__ import annotations

import shlex
from typing import Sequence

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import layers_per_stage
from dstoolkit.generate.rules import pipeline_first_stage_layers, ramp_increment
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

Arg = tuple[str, tuple[str, ...]]

MIN_LR_RATIO = 0.1  # cosine decay to 10% of the peak LR (same as the DeepSpeed scheduler section)


def _recompute_args(shape: ModelShape, cand: Candidate) -> list[Arg]:
    """Megatron recompute flags for the candidate's policy.

    Megatron's 'uniform' method with --recompute-num-layers 1 checkpoints every layer's input (our 'full');
    'block' with N recomputes the first N layers of each pipeline stage, which keeps the same number of
    layers checkpointed as our every-k / ratio policies (positions differ; memory and FLOPs do not).
    """
    c = cand.checkpoint
    if c.kind == "none":
        return []
    if c.kind == "selective":
        return [("--recompute-granularity", ("selective",))]
    if c.kind == "full":
        return [("--recompute-granularity", ("full",)), ("--recompute-method", ("uniform",)),
                ("--recompute-num-layers", ("1",))]
    per_stage = layers_per_stage(shape.num_hidden_layers, cand.pp)
    n = sum(c.checkpointed_layers(per_stage))
    if n == 0:
        return []
    return [("--recompute-granularity", ("full",)), ("--recompute-method", ("block",)),
            ("--recompute-num-layers", (str(n),))]


def _model_args(spec: Spec, shape: ModelShape) -> list[Arg]:
    out: list[Arg] = [
        ("--num-layers", (str(shape.num_hidden_layers),)),
        ("--hidden-size", (str(shape.hidden_size),)),
        ("--ffn-hidden-size", (str(shape.intermediate_size),)),
        ("--num-attention-heads", (str(shape.num_attention_heads),)),
    ]
    if shape.head_dim and not shape.is_mla:
        out.append(("--kv-channels", (str(shape.head_dim),)))
    if not shape.is_mla and shape.kv_heads != shape.num_attention_heads:
        out += [("--group-query-attention", ()), ("--num-query-groups", (str(shape.kv_heads),))]
    if shape.is_mla:
        out.append(("--multi-latent-attention", ()))
        if shape.q_lora_rank:
            out.append(("--q-lora-rank", (str(shape.q_lora_rank),)))
        out.append(("--kv-lora-rank", (str(shape.kv_lora_rank),)))
        if shape.qk_nope_head_dim:
            out.append(("--qk-head-dim", (str(shape.qk_nope_head_dim),)))
        if shape.qk_rope_head_dim:
            out.append(("--qk-pos-emb-head-dim", (str(shape.qk_rope_head_dim),)))
        if shape.v_head_dim:
            out.append(("--v-head-dim", (str(shape.v_head_dim),)))
    seq = spec.training.seq_len
    out += [("--seq-length", (str(seq),)), ("--max-position-embeddings", (str(max(seq, shape.max_position_embeddings or 0)),))]
    if shape.learned_positions:
        out.append(("--position-embedding-type", ("learned_absolute",)))
    else:
        out += [("--position-embedding-type", ("rope",)), ("--normalization", ("RMSNorm",))]
    if shape.mlp_gated:
        out.append(("--swiglu", ()))
    if not shape.attention_bias:
        out.append(("--disable-bias-linear", ()))
    else:
        out.append(("--add-qkv-bias", ()))
    if not shape.tie_word_embeddings:
        out.append(("--untie-embeddings-and-output-weights", ()))
    if spec.training.flash_attention:
        out.append(("--use-flash-attn", ()))
    return out


def _moe_args(shape: ModelShape, cand: Candidate) -> list[Arg]:
    if not shape.is_moe:
        return []
    out: list[Arg] = [
        ("--num-experts", (str(shape.num_experts),)),
        ("--expert-model-parallel-size", (str(cand.ep),)),
        ("--moe-router-topk", (str(shape.num_experts_per_tok),)),
    ]
    if shape.moe_intermediate_size:
        out.append(("--moe-ffn-hidden-size", (str(shape.moe_intermediate_size),)))
    if shape.num_shared_experts:
        out.append(("--moe-shared-expert-intermediate-size",
                    (str(shape.num_shared_experts * shape.expert_ffn_size),)))
    elif shape.shared_expert_intermediate_size:
        out.append(("--moe-shared-expert-intermediate-size", (str(shape.shared_expert_intermediate_size),)))
    if shape.first_k_dense_replace or shape.moe_layer_freq > 1:
        pattern = [1 if shape.is_moe_layer(i) else 0 for i in range(shape.num_hidden_layers)]
        out.append(("--moe-layer-freq", ("([" + ",".join(map(str, pattern)) + "])",)))
    return out


def _batch_args(spec: Spec, cand: Candidate) -> list[Arg]:
    t = spec.training
    out: list[Arg] = [("--micro-batch-size", (str(cand.micro_batch),)), ("--global-batch-size", (str(t.global_batch),))]
    ramp = t.batch_ramp
    if ramp is not None:
        inc = ramp_increment(spec, cand)
        if ramp.kind == "megatron" and ramp.ramp_samples:
            samples = ramp.ramp_samples
        else:  # tokens-based ramp: Megatron counts samples, one sample = seq_len tokens
            samples = -(-(ramp.ramp_tokens or 0) // t.seq_len)
        out.append(("--rampup-batch-size", (str(ramp.start_batch), str(inc), str(samples))))
    return out


def _precision_args(spec: Spec) -> list[Arg]:
    p = spec.training.precision
    if p == "fp16":
        return [("--fp16", ())]
    if p == "bf16":
        return [("--bf16", ())]
    if p == "fp8":
        from dstoolkit.dsconfig.fp8 import Fp8Config

        fp8 = Fp8Config().to_megatron_args().args  # Transformer Engine defaults, every knob explicit
        out: list[Arg] = [("--bf16", ())]
        i = 0
        while i < len(fp8):
            flag = fp8[i]
            vals: list[str] = []
            i += 1
            while i < len(fp8) and not fp8[i].startswith("--"):
                vals.append(fp8[i])
                i += 1
            out.append((flag, tuple(vals)))
        return out
    return []


def _optimizer_args(spec: Spec) -> list[Arg]:
    from dstoolkit.generate.ds_json import ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, WEIGHT_DECAY

    t = spec.training
    out: list[Arg] = []
    if t.optimizer in ("adam", "adamw"):
        out += [("--optimizer", ("adam",)), ("--adam-beta1", (str(ADAM_BETAS[0]),)),
                ("--adam-beta2", (str(ADAM_BETAS[1]),)), ("--adam-eps", (str(ADAM_EPS),)),
                ("--weight-decay", (str(WEIGHT_DECAY),))]
    elif t.optimizer == "sgd":
        out += [("--optimizer", ("sgd",))]
    out += [("--lr", (repr(t.lr),)), ("--clip-grad", (str(GRADIENT_CLIPPING),))]
    if t.train_steps:
        out += [("--train-iters", (str(t.train_steps),)), ("--lr-decay-style", ("cosine",)),
                ("--min-lr", (f"{t.lr * MIN_LR_RATIO:.6g}",))]
    if t.warmup_steps:
        out.append(("--lr-warmup-iters", (str(t.warmup_steps),)))
    return out


def build_megatron_args(spec: Spec, shape: ModelShape, cand: Candidate) -> list[Arg]:
    """Megatron flags for one candidate, in a stable order.

    Args:
        spec: The spec.
        shape: The model shape (dims, MoE, MLA).
        cand: The concrete layout (parallel sizes, micro-batch, recompute policy).

    Returns:
        (flag, values) pairs: parallel sizes, model dims, MoE, batch (and ramp), precision (and fp8),
        recompute, optimizer, then the Megatron-DeepSpeed flags (--deepspeed, --zero-stage).
    """
    out: list[Arg] = [
        ("--tensor-model-parallel-size", (str(cand.tp),)),
        ("--pipeline-model-parallel-size", (str(cand.pp),)),
    ]
    first = pipeline_first_stage_layers(shape.num_hidden_layers, cand.pp)
    if first is not None and first >= 1:
        out.append(("--decoder-first-pipeline-num-layers", (str(first),)))
    if cand.sequence_parallel:
        out.append(("--sequence-parallel", ()))
    out += _model_args(spec, shape)
    out += _moe_args(shape, cand)
    out += _batch_args(spec, cand)
    out += _precision_args(spec)
    out += _recompute_args(shape, cand)
    out += _optimizer_args(spec)
    out += [("--deepspeed", ()), ("--deepspeed_config", ("ds_config.json",)),
            ("--zero-stage", (str(cand.zero_stage),))]
    return out


def render_megatron_args(args: Sequence[Arg]) -> str:
    """One flag per line, values shell-quoted (safe for ``$(cat megatron_args.txt)`` and ``xargs``)."""
    lines = []
    for flag, values in args:
        lines.append(" ".join([shlex.quote(flag)] + [shlex.quote(v) for v in values]))
    return "\n".join(lines) + "\n"
