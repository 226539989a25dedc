"""What both Megatron targets share (`dstoolkit.generate.megatron_lm`, `dstoolkit.generate.megatron_deepspeed`): the
batch ramp in samples (`ramp_plan`) and the flags both spell the same way (dims, vocab, recompute, train length,
optimizer, batch, CPU kernels, checkpoint saving). The model's constants and what Megatron cannot build
(`model_constants`, `model_gaps`, `UnsupportedTarget`) live in `dstoolkit.generate.megatron_model` and are
re-exported here. No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import (ADAM_BETAS, ADAM_EPS, COSINE_MIN_RATIO, GRADIENT_CLIPPING, WEIGHT_DECAY,
                                        is_cpu_cluster)
from dstoolkit.generate.megatron_model import (ModelConstants, UnsupportedTarget,  # noqa: F401 (re-exported)
                                               architecture_gaps, model_constants, model_gaps)
from dstoolkit.layout import ParallelDims, ramp_increment, stage_layers
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


DEFAULT_TRAIN_ITERS = 20
"""Train length when the spec gives no training.train_steps (the DeepSpeed launch.sh smoke default)."""


MAX_VOCAB_DIVISOR = 128  # Megatron's default --make-vocab-size-divisible-by


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


def kv_channels(shape: ModelShape) -> int:
    """The --kv-channels value, always written: Megatron-LM's validate_args fills a missing one with
    hidden_size // num_attention_heads after `assert hidden_size % num_attention_heads == 0` (megatron/training/
    arguments.py:1331-1333 at d98e8a64; Megatron-DeepSpeed megatron/arguments.py:298-300 the same), a bare
    AssertionError at start-up for GLM-4.7-Flash (2048 / 20) or Kimi-K3 (7168 / 96).

    Standard attention: the per-head width (config head_dim, else hidden / heads). Multi-latent attention sizes
    its heads from --qk-head-dim / --qk-pos-emb-head-dim / --v-head-dim (megatron/core/transformer/
    multi_latent_attention.py) and GPTModel builds no model-level RoPE from kv_channels for it (gpt_model.py: rope
    `and not multi_latent_attention`), so the value only has to be given: qk_nope_head_dim (Megatron's
    --qk-head-dim), what Megatron-LM's own MLA recipes pass (examples/post_training/modelopt/conf/deepseek-ai/
    DeepSeek-R1.sh, moonshotai/Kimi-K2-Instruct.sh, examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh:
    --kv-channels 128 = --qk-head-dim 128) and THUDM slime's GLM-4.7-Flash recipe (scripts/models/
    glm4.7-30B-A3B.sh: --kv-channels 192 = --qk-head-dim 192, --v-head-dim 256)."""
    if shape.is_mla:  # ModelShape._check_mla_fields_complete: MLA has all four widths
        assert shape.qk_nope_head_dim is not None
        return shape.qk_nope_head_dim
    return shape.head_size


def _common_model(spec: Spec, shape: ModelShape, k: ModelConstants, cand: Candidate, *,
                  vocab_flag: Optional[int] = None) -> list[str]:
    """Dims, lengths, dropout, init and vocab: the flags both targets spell the same way.

    `vocab_flag`: the --vocab-size value when it differs from the model's vocabulary (see
    `megatron_deepspeed_args`); the divisor is always computed for the model's own vocabulary.
    """
    out = ["--num-layers", str(shape.num_hidden_layers), "--hidden-size", str(shape.hidden_size),
           "--ffn-hidden-size", str(shape.intermediate_size), "--num-attention-heads", str(shape.num_attention_heads)]
    out += ["--kv-channels", str(kv_channels(shape))]
    seq = spec.training.seq_len
    out += ["--seq-length", str(seq), "--max-position-embeddings", str(max(seq, shape.max_position_embeddings or 0))]
    out += ["--attention-dropout", repr(float(k.attention_dropout)), "--hidden-dropout", repr(float(k.hidden_dropout)),
            "--init-method-std", repr(k.init_std),
            "--vocab-size", str(shape.vocab_size if vocab_flag is None else vocab_flag),
            "--make-vocab-size-divisible-by", str(vocab_divisor(shape.vocab_size, cand.tp))]
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
