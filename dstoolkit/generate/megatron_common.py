"""What both Megatron targets share (`dstoolkit.generate.megatron_lm`, `dstoolkit.generate.megatron_deepspeed`): the
model's own training constants Megatron would otherwise default (`model_constants`), the batch ramp in samples
(`ramp_plan`), and the flags both spell the same way (dims, vocab, recompute, train length, optimizer, batch, CPU
kernels, checkpoint saving). `UnsupportedTarget`: what a target cannot express. No torch import.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import (ADAM_BETAS, ADAM_EPS, COSINE_MIN_RATIO, GRADIENT_CLIPPING, WEIGHT_DECAY,
                                        is_cpu_cluster)
from dstoolkit.layout import ParallelDims, ramp_increment, stage_layers
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


DEFAULT_TRAIN_ITERS = 20
"""Train length when the spec gives no training.train_steps (the DeepSpeed launch.sh smoke default)."""


MAX_VOCAB_DIVISOR = 128  # Megatron's default --make-vocab-size-divisible-by


class UnsupportedTarget(ValueError):
    """The target cannot express this model or layout; the message says what is missing."""


@dataclass(frozen=True)
class ModelConstants:
    """The model's own training constants that Megatron would otherwise default (and so change the model)."""

    rope_theta: float
    norm_eps: float
    init_std: float
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    moe_aux_loss_coeff: float = 0.01
    moe_topk_scaling_factor: Optional[float] = None
    """DeepSeek routed_scaling_factor: routed expert outputs are scaled by it."""
    moe_router_num_groups: Optional[int] = None
    """DeepSeek n_group: experts are routed in groups (node-limited routing)."""
    moe_router_group_topk: Optional[int] = None
    """DeepSeek topk_group: groups each token may use."""
    source: str = ""


# Published config.json values of the bundled presets (Hugging Face hub configs / papers).
_PRESET_CONSTANTS: dict[str, ModelConstants] = {
    # Meta Llama 3 / 3.1 config.json: rope_theta 500000, rms_norm_eps 1e-5, initializer_range 0.02.
    "llama-3-8b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3 config.json"),
    "llama-3-70b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3 config.json"),
    "llama-3.1-405b": ModelConstants(500000.0, 1e-5, 0.02, source="Llama 3.1 config.json"),
    # Mixtral-8x7B config.json: rope_theta 1e6, rms_norm_eps 1e-5, router_aux_loss_coef 0.02.
    "mixtral-8x7b": ModelConstants(1e6, 1e-5, 0.02, moe_aux_loss_coeff=0.02, source="Mixtral-8x7B config.json"),
    # DeepSeek-V3 config.json: rope_theta 10000, rms_norm_eps 1e-6, initializer_range 0.006; the paper's
    # sequence-wise balance loss alpha = 1e-4 (arXiv 2412.19437 §4.2).
    "deepseek-v3": ModelConstants(10000.0, 1e-6, 0.006, moe_aux_loss_coeff=1e-4, moe_topk_scaling_factor=2.5,
                                  moe_router_num_groups=8, moe_router_group_topk=4, source="DeepSeek-V3 config.json"),
    # dstoolkit's tiny models (dstoolkit/runtime/model.py: ROPE_THETA, RMS_NORM_EPS, INIT_STD, MOE_AUX_LOSS_COEF).
    "tiny": ModelConstants(10000.0, 1e-5, 0.02, source="dstoolkit tiny model"),
    "tiny-moe": ModelConstants(10000.0, 1e-5, 0.02, moe_aux_loss_coeff=0.01, source="dstoolkit tiny model"),
}


# transformers config-class defaults per model_type (used when neither a preset nor the config gives a value).
_FAMILY_DEFAULTS: dict[str, ModelConstants] = {
    "llama": ModelConstants(10000.0, 1e-6, 0.02, source="transformers LlamaConfig defaults"),
    "mistral": ModelConstants(10000.0, 1e-6, 0.02, source="transformers MistralConfig defaults"),
    "mixtral": ModelConstants(1e6, 1e-5, 0.02, moe_aux_loss_coeff=0.001, source="transformers MixtralConfig defaults"),
    "qwen2": ModelConstants(10000.0, 1e-6, 0.02, source="transformers Qwen2Config defaults"),
    "qwen2_moe": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers Qwen2MoeConfig defaults"),
    "qwen3": ModelConstants(10000.0, 1e-6, 0.02, source="transformers Qwen3Config defaults"),
    "qwen3_moe": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers Qwen3MoeConfig defaults"),
    "deepseek_v2": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=0.001, source="transformers DeepseekV2Config defaults"),
    "deepseek_v3": ModelConstants(10000.0, 1e-6, 0.02, moe_aux_loss_coeff=1e-4, source="transformers DeepseekV3Config defaults"),
    "gpt2": ModelConstants(10000.0, 1e-5, 0.02, attention_dropout=0.1, hidden_dropout=0.1,
                           source="transformers GPT2Config defaults (attn_pdrop, resid_pdrop 0.1: the model the "
                                  "estimate and the Hugging Face targets train)"),
}


_CONFIG_KEYS = {"rope_theta": ("rope_theta",), "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
                "init_std": ("initializer_range",), "hidden_dropout": ("hidden_dropout", "resid_pdrop"),
                "moe_aux_loss_coeff": ("router_aux_loss_coef", "aux_loss_alpha"),
                "moe_topk_scaling_factor": ("routed_scaling_factor",), "moe_router_num_groups": ("n_group",),
                "moe_router_group_topk": ("topk_group",)}


_INT_FIELDS = ("moe_router_num_groups", "moe_router_group_topk")


def _hf_config_dict(spec: Spec) -> dict[str, Any]:
    """The model's Hugging Face fields as the spec gives them (hf_config file or inline), or {} for a preset."""
    m = spec.model
    if m.form == "inline":
        return dict(m.inline)
    if m.form == "hf_config" and m.hf_config:
        p = Path(m.hf_config).expanduser()
        if not p.is_absolute():
            p = spec.base_dir / p
        if p.is_dir():
            p = p / "config.json"
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
    return {}


def model_constants(spec: Spec, shape: ModelShape) -> ModelConstants:
    """RoPE base, norm epsilon, init std, dropout and aux-loss coefficient of the spec's model.

    The config's own values win (hf_config / inline fields), then the bundled preset's published values, then
    the transformers defaults of the model_type (dropout: 0, but GPT-2's 0.1; the attention dropout is the one
    ModelShape.attention_dropout reads, which the estimate charges).
    """
    base = _PRESET_CONSTANTS.get(spec.model.preset or "", None) if spec.model.form == "preset" else None
    if base is None:
        base = _FAMILY_DEFAULTS.get(shape.model_type, ModelConstants(10000.0, 1e-5, 0.02, source="generic defaults"))
    d = _hf_config_dict(spec)
    vals = {k: getattr(base, k) for k in ("rope_theta", "norm_eps", "init_std", "attention_dropout",
                                          "hidden_dropout", "moe_aux_loss_coeff", "moe_topk_scaling_factor",
                                          "moe_router_num_groups", "moe_router_group_topk")}
    used = []
    for field, keys in _CONFIG_KEYS.items():
        for k in keys:
            if isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool):
                vals[field] = int(d[k]) if field in _INT_FIELDS else float(d[k])
                used.append(k)
                break
    # the attention dropout has one owner: the model shape (models.hf_families: the config's attention_dropout /
    # attn_pdrop, else its family's transformers default), which the estimate charges too
    if shape.attention_dropout != vals["attention_dropout"]:
        vals["attention_dropout"] = float(shape.attention_dropout)
        used.append("attention dropout of the model shape")
    src = base.source + (f"; from the config: {', '.join(used)}" if used else "")
    return ModelConstants(source=src, **vals)


def _num(x: float) -> str:
    """A float as Megatron's argparse reads it back exactly (repr; integers without a fraction)."""
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1 else repr(float(x))


def _dims(spec: Spec, cand: Candidate) -> ParallelDims:
    return ParallelDims(world=spec.cluster.world_size, tp=cand.tp, pp=cand.pp, ep=cand.ep,
                        gpus_per_node=spec.cluster.nvlink_domain)


def vocab_divisor(vocab: int, tp: int) -> int:
    """The largest d <= 128 with vocab % (d * tp) == 0, so Megatron pads the embedding by nothing (1 if none)."""
    for d in range(MAX_VOCAB_DIVISOR, 0, -1):
        if vocab % (d * tp) == 0:
            return d
    return 1


@dataclass(frozen=True)
class RampPlan:
    """The batch ramp as both targets need it, in samples."""

    start: int
    increment: int
    ramp_samples: int
    final: int

    def batch_at(self, consumed: int) -> int:
        """Megatron's linear ramp: start + increment * floor(consumed / samples_per_increment), capped at final."""
        steps = (self.final - self.start) // self.increment
        if consumed > self.ramp_samples or steps == 0:
            return self.final
        return min(self.final, self.start + (consumed * steps // self.ramp_samples) * self.increment)

    def samples_after(self, steps: int) -> int:
        """Samples consumed by `steps` optimizer steps under the ramp."""
        consumed, n = 0, 0
        while n < steps and consumed <= self.ramp_samples:
            consumed += self.batch_at(consumed)
            n += 1
        return consumed + (steps - n) * self.final

    def step_schedule(self, seq_len: int) -> str:
        """Megatron-LM's --step-batch-size-schedule ("THRESHOLD:BATCH ..." with thresholds in tokens, since
        Megatron-LM passes --seq-length to the schedule) reproducing the ramp: batch start + k*increment from
        sample ceil(k * ramp_samples / increments) on, the final batch from ramp_samples on."""
        steps = (self.final - self.start) // self.increment
        if steps == 0:
            return f"0:{self.final}"
        entries = []
        for k in range(steps + 1):
            samples = -(-k * self.ramp_samples // steps)
            entries.append(f"{samples * seq_len}:{self.start + k * self.increment}")
        return " ".join(entries)


def ramp_plan(spec: Spec, cand: Candidate) -> Optional[RampPlan]:
    """The spec's batch ramp in samples (a tokens ramp counts seq_len tokens per sample), or None."""
    t = spec.training
    r = t.batch_ramp
    if r is None:
        return None
    inc = ramp_increment(r.increment, cand.micro_batch, _dims(spec, cand).dp)
    samples = r.ramp_samples if r.kind == "megatron" and r.ramp_samples else -(-(r.ramp_tokens or 0) // t.seq_len)
    return RampPlan(start=r.start_batch, increment=inc, ramp_samples=samples, final=t.global_batch)


def _recompute(shape: ModelShape, cand: Candidate) -> list[str]:
    """Recompute flags (same spelling in both targets): 'full' = uniform/1, every-k/ratio = block/N per stage."""
    c = cand.checkpoint
    if c.kind == "none":
        return []
    if c.kind == "selective":
        return ["--recompute-granularity", "selective"]
    if c.kind == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    per_stage = max(stage_layers(shape.num_hidden_layers, cand.pp))
    n = sum(c.checkpointed_layers(per_stage))
    if n == 0:
        return []
    return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(n)]


def _train_length(spec: Spec, cand: Candidate) -> list[str]:
    """Train length and LR schedule: iterations without a ramp, samples with one (both targets refuse a ramp
    with iteration-based training)."""

    t = spec.training
    iters = t.train_steps or DEFAULT_TRAIN_ITERS
    warm = min(t.warmup_steps, iters - 1) if iters > 1 else 0
    # The DeepSpeed JSON's schedule (ds_json.scheduler_section, one fact): with train_steps, linear warm-up then
    # cosine to COSINE_MIN_RATIO x lr at train_steps; without, linear warm-up (if any) then a constant LR.
    out = ["--lr", repr(t.lr)]
    if t.train_steps:
        out += ["--min-lr", repr(float(f"{t.lr * COSINE_MIN_RATIO:.6g}")), "--lr-decay-style", "cosine"]
    else:
        out += ["--lr-decay-style", "constant"]
    ramp = ramp_plan(spec, cand)
    if ramp is None:
        out += ["--train-iters", str(iters), "--lr-decay-iters", str(iters)]
        if warm:
            out += ["--lr-warmup-iters", str(warm)]
        return out
    total, warm_s = ramp.samples_after(iters), ramp.samples_after(warm)
    out += ["--train-samples", str(total), "--lr-decay-samples", str(total)]
    if warm_s:
        out += ["--lr-warmup-samples", str(warm_s)]
    return out


def _optimizer(spec: Spec, target: str) -> list[str]:
    opt = spec.training.optimizer
    if opt in ("adam", "adamw"):  # Megatron's 'adam' is decoupled weight decay (AdamW) in both targets
        out = ["--optimizer", "adam", "--adam-beta1", _num(ADAM_BETAS[0]), "--adam-beta2", _num(ADAM_BETAS[1]),
               "--adam-eps", repr(ADAM_EPS), "--weight-decay", _num(WEIGHT_DECAY)]
    elif opt == "sgd":
        out = ["--optimizer", "sgd", "--weight-decay", _num(WEIGHT_DECAY)]
    else:
        raise UnsupportedTarget(f"{target}: optimizer {opt!r} has no {target} spelling (adam/adamw or sgd)")
    return out + ["--clip-grad", _num(GRADIENT_CLIPPING)]


def _common_model(spec: Spec, shape: ModelShape, k: ModelConstants, cand: Candidate, *,
                  vocab_flag: Optional[int] = None) -> list[str]:
    """Dims, lengths, dropout, init and vocab: the flags both targets spell the same way.

    `vocab_flag`: the --vocab-size value when it differs from the model's vocabulary (see
    `megatron_deepspeed_args`); the divisor is always computed for the model's own vocabulary.
    """
    out = ["--num-layers", str(shape.num_hidden_layers), "--hidden-size", str(shape.hidden_size),
           "--ffn-hidden-size", str(shape.intermediate_size), "--num-attention-heads", str(shape.num_attention_heads)]
    if not shape.is_mla:
        out += ["--kv-channels", str(shape.head_size)]
    seq = spec.training.seq_len
    out += ["--seq-length", str(seq), "--max-position-embeddings", str(max(seq, shape.max_position_embeddings or 0))]
    out += ["--attention-dropout", repr(float(k.attention_dropout)), "--hidden-dropout", repr(float(k.hidden_dropout)),
            "--init-method-std", repr(k.init_std),
            "--vocab-size", str(shape.vocab_size if vocab_flag is None else vocab_flag),
            "--make-vocab-size-divisible-by", str(vocab_divisor(shape.vocab_size, cand.tp))]
    gaps = architecture_gaps(shape)
    if gaps:
        raise UnsupportedTarget(f"cannot express {'; '.join(gaps)}")
    if shape.mlp_gated:
        if shape.hidden_act not in ("silu", "swish"):
            raise UnsupportedTarget(f"gated MLP with {shape.hidden_act!r}: only SwiGLU (silu) has a Megatron flag")
        out.append("--swiglu")
    elif shape.hidden_act in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        out.append("--openai-gelu")  # tanh-approximated GeLU (GPT-2); Megatron's default is the exact erf GeLU
    elif shape.hidden_act != "gelu":
        raise UnsupportedTarget(f"MLP activation {shape.hidden_act!r}: only gelu, tanh-gelu or SwiGLU have Megatron flags")
    if not shape.tie_word_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    return out


def architecture_gaps(shape: ModelShape) -> list[str]:
    """What neither Megatron target's GPT model can build, named with the shape's value (checked against the
    parsers benchmarks/megatron_parsers.py runs: Megatron-LM megatron/training/arguments.py + TransformerConfig,
    Megatron-DeepSpeed megatron/arguments.py): neither has a parallel attention+MLP block, a norm after the
    embedding or on a sublayer's output, a bias on the output head, ALiBi, or a norm other than plain LayerNorm /
    RMSNorm."""
    gaps = []
    if shape.parallel_residual:
        gaps.append("a parallel attention + MLP block (parallel_residual: both read the block input; Megatron's "
                    "blocks run attention then MLP)")
    if shape.embedding_norm:
        gaps.append("a LayerNorm after the token embedding (embedding_norm)")
    if shape.qk_norm and shape.qk_norm_scope == "projection":
        gaps.append("q/k norms over the whole q / k projection (qk_norm_scope 'projection'; Megatron-LM's "
                    "--qk-layernorm norms each head)")
    if shape.output_norm:
        gaps.append("a norm on the attention / MLP output before the residual add (output_norm: a post- or "
                    "sandwich-norm block; Megatron's blocks norm the sublayer input only)")
    if shape.lm_head_bias:
        gaps.append("a bias on the output head (lm_head_bias)")
    if not shape.learned_positions and shape.position_encoding == "alibi":
        gaps.append("ALiBi attention biases (position_encoding 'alibi'; no ALiBi position type)")
    if shape.norm_variant is not None:
        gaps.append(f"a {shape.norm_type} that {shape.norm_variant}" if shape.norm_variant.startswith("scales")
                    else f"a norm that is not plain LayerNorm / RMSNorm ({shape.norm_variant})")
    return gaps


def windows_below(shape: ModelShape, seq_len: int) -> dict[int, int]:
    """{layer: window} of the layers whose attention window (ModelShape.attention_window: the config's
    sliding_window, or a layer_types window) is below `seq_len`. A window of seq_len or more keys bounds nothing
    there (every query sees at most seq_len keys), so those layers train as full attention and need no flag."""
    windows = {i: shape.attention_window(i) for i in range(shape.num_hidden_layers)}
    return {i: w for i, w in windows.items() if w is not None and w < seq_len}


def window_words(shape: ModelShape, seq_len: int) -> str:
    """The windows of `windows_below`, for a refusal: "a sliding attention window of 4096 tokens on 32 of 32
    layers, below seq_len 8192"."""
    below = windows_below(shape, seq_len)
    sizes = " / ".join(str(w) for w in sorted(set(below.values())))
    return (f"a sliding attention window of {sizes} tokens on {len(below)} of {shape.num_hidden_layers} layers, "
            f"below seq_len {seq_len}")


def bias_words(shape: ModelShape) -> str:
    """The shape's linear biases in words: 'q/k/v, attention output, MLP'."""
    on = [w for w, b in (("q/k/v", shape.attention_bias), ("attention output", shape.o_proj_bias),
                         ("MLP", shape.mlp_bias)) if b]
    return ", ".join(on) if on else "none"


def dynamic_rope_is_plain(shape: ModelShape, seq_len: int) -> bool:
    """transformers' dynamic NTK RoPE recomputes the frequencies only past original_max_position_embeddings
    (modeling_rope_utils.dynamic_rope_update: `seq_len > original_max_seq_len`); a training run at or below it
    uses the plain frequencies, which Megatron's RoPE computes."""
    r = shape.rope_scaling
    limit = (r.param("original_max_position_embeddings") if r is not None else None) or shape.max_position_embeddings
    return r is not None and r.rope_type == "dynamic" and isinstance(limit, int) and seq_len <= limit


def _batch(spec: Spec, cand: Candidate, target: str) -> list[str]:
    t = spec.training
    out = ["--micro-batch-size", str(cand.micro_batch)]
    ramp = ramp_plan(spec, cand)
    if ramp is None:
        return out + ["--global-batch-size", str(t.global_batch)]
    if target == "megatron-lm":  # the step schedule replaces --global-batch-size (its final entry is the batch)
        return out + ["--step-batch-size-schedule", ramp.step_schedule(t.seq_len)]
    return out + ["--global-batch-size", str(t.global_batch),
                  "--rampup-batch-size", str(ramp.start), str(ramp.increment), str(ramp.ramp_samples)]


def _cpu_kernels(spec: Spec) -> list[str]:
    """On a CPU cluster, the non-fused paths of the CUDA-only kernels both targets default to (found by running the
    generated files on CPU ranks, benchmarks/megatron_deepspeed_runs.py): gradient-accumulation fusion needs
    apex's fused_weight_gradient_mlp_cuda (Megatron-DeepSpeed megatron/core/tensor_parallel/layers.py:592 raises),
    masked-softmax fusion imports scaled_masked_softmax_cuda (megatron/model/fused_softmax.py:211). The same
    arithmetic, unfused."""
    if not is_cpu_cluster(spec):
        return []
    return ["--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion"]


def _checkpoint_saving(spec: Spec) -> list[str]:
    """Saving and resuming from the spec (training.save_dir, relative to where the job is launched as in the HF
    target; TrainingSpec.save_interval() steps apart). --load of a folder without a checkpoint starts fresh."""
    t = spec.training
    return ["--save", t.save_dir, "--load", t.save_dir, "--save-interval", str(t.save_interval())]
