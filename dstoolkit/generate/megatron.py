"""Megatron argument files per target: Megatron-LM (NVIDIA) and Megatron-DeepSpeed (deepspeedai), each in the
spelling its own argument parser accepts. No torch import.

`megatron_lm_args` / `megatron_deepspeed_args` return the command line as a flat list of words (flags and values,
no quoting). `render_args_file` writes one word per line, unquoted; pass it as an array, never through word
splitting, so a value with brackets or spaces (``--moe-layer-freq [0,0,0,1,...]``,
``--step-batch-size-schedule 0:3072 ...``) reaches the parser as one word::

    mapfile -t ARGS < megatron_lm_args.txt
    torchrun ... pretrain_gpt.py "${ARGS[@]}"

`write_megatron_targets` writes the files of one strategy folder: the argument file and a launch script per
target (the launch script does exactly the above, plus the data/tokenizer arguments from ``DATA_ARGS``).

Checked against the real parsers (``parse_args`` + ``validate_args``) of Megatron-LM at d98e8a64 and of
Megatron-DeepSpeed at 4efb479d; see benchmarks/results/megatron_parsers_*.md for the per-file results and
benchmarks/megatron_parsers.py for the check. What each target cannot express is refused with
`UnsupportedTarget` (a reason, no file), never approximated silently.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from dstoolkit.generate.candidates import Candidate
from dstoolkit.layout import ParallelDims, pipeline_first_stage_layers, ramp_increment, stage_layers
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

TARGETS = ("megatron-lm", "megatron-deepspeed")
ARGS_FILE = {"megatron-lm": "megatron_lm_args.txt", "megatron-deepspeed": "megatron_deepspeed_args.txt"}
LAUNCH_FILE = {"megatron-lm": "launch_megatron_lm.sh", "megatron-deepspeed": "launch_megatron_deepspeed.sh"}
DEFAULT_PRETRAIN = {"megatron-lm": "Megatron-LM/pretrain_gpt.py", "megatron-deepspeed": "Megatron-DeepSpeed/pretrain_gpt.py"}
DEFAULT_DATA_ARGS = {"megatron-lm": "--mock-data --tokenizer-type NullTokenizer",
                     "megatron-deepspeed": "--tokenizer-type NullTokenizer"}
"""What the launch scripts pass when DATA_ARGS is unset: Megatron-LM's synthetic data; Megatron-DeepSpeed has no
mock dataset, so a real run sets DATA_ARGS to its --data-path (and tokenizer)."""

DEFAULT_TRAIN_ITERS = 20
"""Train length when the spec gives no training.train_steps (the DeepSpeed launch.sh smoke default)."""
MIN_LR_RATIO = 0.1  # cosine decay to 10% of the peak LR (as the DeepSpeed JSON's WarmupCosineLR)
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
    "gpt2": ModelConstants(10000.0, 1e-5, 0.02, attention_dropout=0.0, hidden_dropout=0.0,
                           source="transformers GPT2Config defaults (dropout 0 for pre-training here)"),
}
_CONFIG_KEYS = {"rope_theta": ("rope_theta",), "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
                "init_std": ("initializer_range",), "attention_dropout": ("attention_dropout",),
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
    the transformers defaults of the model_type. Dropout is 0 unless the config says otherwise.
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
    src = base.source + (f"; from the config: {', '.join(used)}" if used else "")
    return ModelConstants(source=src, **vals)


# ----------------------------------------------------------------------------------------------- helpers


def _num(x: float) -> str:
    """A float as Megatron's argparse reads it back exactly (repr; integers without a fraction)."""
    return str(int(x)) if float(x).is_integer() and abs(x) >= 1 else repr(float(x))


def _dims(spec: Spec, cand: Candidate) -> ParallelDims:
    return ParallelDims(world=spec.cluster.world_size, tp=cand.tp, pp=cand.pp, ep=cand.ep,
                        gpus_per_node=spec.cluster.gpus_per_node)


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
    per_stage = stage_layers(shape.num_hidden_layers, cand.pp)[-1]
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
    out = ["--lr", repr(t.lr), "--min-lr", repr(float(f"{t.lr * MIN_LR_RATIO:.6g}")), "--lr-decay-style", "cosine"]
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
    from dstoolkit.generate.ds_json import ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, WEIGHT_DECAY

    opt = spec.training.optimizer
    if opt in ("adam", "adamw"):  # Megatron's 'adam' is decoupled weight decay (AdamW) in both targets
        out = ["--optimizer", "adam", "--adam-beta1", _num(ADAM_BETAS[0]), "--adam-beta2", _num(ADAM_BETAS[1]),
               "--adam-eps", repr(ADAM_EPS), "--weight-decay", _num(WEIGHT_DECAY)]
    elif opt == "sgd":
        out = ["--optimizer", "sgd", "--weight-decay", _num(WEIGHT_DECAY)]
    else:
        raise UnsupportedTarget(f"{target}: optimizer {opt!r} has no {target} spelling (adam/adamw or sgd)")
    return out + ["--clip-grad", _num(GRADIENT_CLIPPING)]


def _common_model(spec: Spec, shape: ModelShape, k: ModelConstants, cand: Candidate) -> list[str]:
    """Dims, lengths, dropout, init and vocab: the flags both targets spell the same way."""
    out = ["--num-layers", str(shape.num_hidden_layers), "--hidden-size", str(shape.hidden_size),
           "--ffn-hidden-size", str(shape.intermediate_size), "--num-attention-heads", str(shape.num_attention_heads)]
    if not shape.is_mla:
        out += ["--kv-channels", str(shape.head_size)]
    seq = spec.training.seq_len
    out += ["--seq-length", str(seq), "--max-position-embeddings", str(max(seq, shape.max_position_embeddings or 0))]
    out += ["--attention-dropout", repr(float(k.attention_dropout)), "--hidden-dropout", repr(float(k.hidden_dropout)),
            "--init-method-std", repr(k.init_std),
            "--vocab-size", str(shape.vocab_size),
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


def _precision_lm(spec: Spec) -> list[str]:
    p = spec.training.precision
    if p == "fp16":
        return ["--fp16"]
    if p == "bf16":
        return ["--bf16"]
    if p == "fp8":
        return ["--bf16"] + list(spec.training.fp8_config().to_megatron_args().args)
    return []


# ------------------------------------------------------------------------------------------- Megatron-LM


def uses_megatron_fsdp(cand: Candidate) -> bool:
    """ZeRO-3 layouts map to Megatron-FSDP (parameters, gradients and optimizer states sharded)."""
    return cand.zero_stage == 3


def megatron_lm_args(spec: Spec, shape: ModelShape, cand: Candidate) -> list[str]:
    """Megatron-LM (megatron/training/arguments.py) command line for one candidate, as flat words.

    ZeRO mapping: stage 0 = DDP; stages 1-2 = the distributed optimizer (optimizer states sharded over DP,
    gradients reduce-scattered) with grad-reduce / param-gather overlap; stage 3 (and ZeRO++, whose quantized
    collectives Megatron does not have) = Megatron-FSDP optim_grads_params. Optimizer offload =
    --optimizer-cpu-offload (needs the distributed optimizer and the precision-aware optimizer).

    Raises:
        UnsupportedTarget: what Megatron-LM cannot express (an optimizer it lacks, a non-SwiGLU gated MLP).
    """
    k = model_constants(spec, shape)
    out = ["--tensor-model-parallel-size", str(cand.tp), "--pipeline-model-parallel-size", str(cand.pp)]
    first = pipeline_first_stage_layers(shape.num_hidden_layers, cand.pp)
    if first is not None and first >= 1:
        out += ["--decoder-first-pipeline-num-layers", str(first)]
    if cand.tp > 1:
        out += ["--sequence-parallel"]
    out += _common_model(spec, shape, k, cand)
    if shape.is_mla:
        out += ["--multi-latent-attention", "--kv-lora-rank", str(shape.kv_lora_rank),
                "--qk-head-dim", str(shape.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(shape.qk_rope_head_dim),
                "--v-head-dim", str(shape.v_head_dim)]
        if shape.q_lora_rank:
            out += ["--q-lora-rank", str(shape.q_lora_rank)]
    elif shape.kv_heads != shape.num_attention_heads:
        out += ["--group-query-attention", "--num-query-groups", str(shape.kv_heads)]
    if shape.learned_positions:
        out += ["--position-embedding-type", "learned_absolute"]
    else:
        out += ["--position-embedding-type", "rope", "--rotary-base", str(int(k.rope_theta))]
    out += ["--normalization", "RMSNorm" if shape.norm_type == "rmsnorm" else "LayerNorm",
            "--norm-epsilon", repr(k.norm_eps)]
    if shape.qk_norm:
        out.append("--qk-layernorm")
    if not (shape.o_proj_bias or shape.mlp_bias):
        out.append("--disable-bias-linear")
        if shape.attention_bias:
            out.append("--add-qkv-bias")
    out += ["--attention-backend", "flash" if spec.training.flash_attention else "unfused"]
    out += _moe_lm(shape, cand, k)
    out += _batch(spec, cand, "megatron-lm")
    out += _train_length(spec, cand)
    out += _precision_lm(spec)
    out += _recompute(shape, cand)
    out += _optimizer(spec, "megatron-lm")
    out += _distributed_lm(spec, cand)
    return out


def _moe_lm(shape: ModelShape, cand: Candidate, k: ModelConstants) -> list[str]:
    if not shape.is_moe:
        return []
    out = ["--num-experts", str(shape.num_experts), "--expert-model-parallel-size", str(cand.ep),
           "--moe-router-topk", str(shape.num_experts_per_tok), "--moe-ffn-hidden-size", str(shape.expert_ffn_size),
           "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"]
    if shape.num_shared_experts:
        out += ["--moe-shared-expert-intermediate-size", str(shape.num_shared_experts * shape.expert_ffn_size)]
    elif shape.shared_expert_intermediate_size:
        out += ["--moe-shared-expert-intermediate-size", str(shape.shared_expert_intermediate_size)]
    if any(not shape.is_moe_layer(i) for i in range(shape.num_hidden_layers)):
        pattern = [1 if shape.is_moe_layer(i) else 0 for i in range(shape.num_hidden_layers)]
        out += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    if shape.router_score_correction_bias:  # DeepSeek-V3 auxiliary-loss-free balancing + sequence-wise loss
        out += ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                "--moe-router-load-balancing-type", "seq_aux_loss"]
    else:
        out += ["--moe-router-load-balancing-type", "aux_loss"]
    out += ["--moe-aux-loss-coeff", repr(k.moe_aux_loss_coeff)]
    if k.moe_topk_scaling_factor not in (None, 1.0):
        out += ["--moe-router-topk-scaling-factor", repr(float(k.moe_topk_scaling_factor))]
    if k.moe_router_num_groups and k.moe_router_num_groups > 1 and k.moe_router_group_topk:
        out += ["--moe-router-num-groups", str(k.moe_router_num_groups),
                "--moe-router-group-topk", str(k.moe_router_group_topk)]
    return out


def _distributed_lm(spec: Spec, cand: Candidate) -> list[str]:
    out: list[str] = []
    if uses_megatron_fsdp(cand):
        out += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
                "--ckpt-format", "fsdp_dtensor", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif cand.zero_stage >= 1:
        out += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    else:
        out += ["--overlap-grad-reduce"]
    if cand.offload_optimizer:
        out += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    if cand.tp > 1 and not uses_megatron_fsdp(cand):
        out += ["--tp-comm-overlap"]
    return out


# ------------------------------------------------------------------------------------ Megatron-DeepSpeed


def megatron_deepspeed_args(spec: Spec, shape: ModelShape, cand: Candidate, *, ds_config_path: Union[str, Path]) -> list[str]:
    """Megatron-DeepSpeed (megatron/arguments.py + deepspeed.add_config_arguments) command line, flat words.

    Args:
        ds_config_path: Absolute path of the strategy's ds_config.json (the script may run from any folder),
            or the bare name ``ds_config.json`` for files that must not name this machine's paths (committed
            goldens); the launch script passes the absolute path at run time in both cases.

    Raises:
        UnsupportedTarget: what Megatron-DeepSpeed's GPT model cannot build (multi-latent attention, shared
            experts, q/k/v-only biases, QK-norm, expert width != dense width, FP8) or a pipelined ZeRO-2/3.
        ValueError: ds_config_path is neither absolute nor the bare ``ds_config.json``.
    """
    if not Path(ds_config_path).is_absolute() and str(ds_config_path) != "ds_config.json":
        raise ValueError(f"--deepspeed_config must be an absolute path, got {str(ds_config_path)!r}")
    t = "megatron-deepspeed"
    missing = []
    if shape.is_mla:
        missing.append("multi-latent attention (no MLA in its GPT model)")
    if shape.num_shared_experts or shape.shared_expert_intermediate_size:
        missing.append("shared experts (its residual MoE is a different layer)")
    if shape.attention_bias and not (shape.o_proj_bias or shape.mlp_bias):
        missing.append("q/k/v-only biases (no --add-qkv-bias)")
    if shape.qk_norm:
        missing.append("QK layer norm")
    if shape.is_moe and shape.expert_ffn_size != shape.intermediate_size:
        missing.append("an expert FFN width different from the dense FFN width (experts reuse --ffn-hidden-size)")
    if shape.router_score_correction_bias:
        missing.append("sigmoid routing with expert-bias balancing")
    if spec.training.precision == "fp8":
        missing.append("FP8 (dstoolkit emits FP8 only for Megatron-LM)")
    if cand.pp > 1 and cand.zero_stage >= 2:
        missing.append(f"ZeRO-{cand.zero_stage} with pipeline parallelism (DeepSpeed: incompatible)")
    if missing:
        raise UnsupportedTarget(f"{t}: cannot express {'; '.join(missing)}")
    k = model_constants(spec, shape)
    out = ["--tensor-model-parallel-size", str(cand.tp), "--pipeline-model-parallel-size", str(cand.pp)]
    if cand.pp == 1:
        out.append("--no-pipeline-parallel")  # plain GPTModel + DeepSpeedEngine (ZeRO-2/3 need it)
    if cand.tp > 1:
        out.append("--sequence-parallel")
    out += _common_model(spec, shape, k, cand)
    if shape.kv_heads != shape.num_attention_heads:
        out += ["--num-key-value-heads", str(shape.kv_heads)]
    if not shape.learned_positions:
        out += ["--use-rotary-position-embeddings", "--no-position-embedding",
                "--rotary-position-embeddings-theta", str(int(k.rope_theta))]
    out += ["--normalization", "rmsnorm" if shape.norm_type == "rmsnorm" else "layernorm",
            "--layernorm-epsilon", repr(k.norm_eps)]
    if not (shape.o_proj_bias or shape.mlp_bias or shape.attention_bias):
        out.append("--disable-bias-linear")
    if spec.training.flash_attention:
        out.append("--use-flash-attn-v2")  # its --use-flash-attn is FlashAttention v1
    if shape.is_moe:
        out += _moe_mds(shape, cand, k)
    out += _batch(spec, cand, t)
    out += _train_length(spec, cand)
    p = spec.training.precision
    out += ["--fp16"] if p == "fp16" else ["--bf16"] if p == "bf16" else []
    out += _recompute(shape, cand)
    out += _optimizer(spec, t)
    if cand.offload_optimizer:
        if spec.training.optimizer not in ("adam", "adamw"):
            raise UnsupportedTarget(f"{t}: --cpu-optimizer is Adam only")
        out.append("--cpu-optimizer")  # DeepSpeedCPUAdam as the client optimizer ZeRO-Offload needs
    out += ["--deepspeed", "--deepspeed_config", str(ds_config_path), "--zero-stage", str(cand.zero_stage)]
    return out


def _moe_mds(shape: ModelShape, cand: Candidate, k: ModelConstants) -> list[str]:
    """DeepSpeed MoE in Megatron-DeepSpeed: --expert-interval 1 and one --num-experts value per layer when some
    layers are dense (1 = dense), else one value; dropless top-k as in the HF models; MoE param groups."""
    per_layer = [shape.num_experts if shape.is_moe_layer(i) else 1 for i in range(shape.num_hidden_layers)]
    experts = [str(shape.num_experts)] if all(e > 1 for e in per_layer) else [str(e) for e in per_layer]
    out = (["--num-experts"] + experts
           + ["--expert-interval", "1", "--topk", str(shape.num_experts_per_tok),
              "--moe-expert-parallel-size", str(cand.ep), "--moe-loss-coeff", repr(k.moe_aux_loss_coeff),
              "--disable-moe-token-dropping", "--create-moe-param-group"])
    if cand.tp > 1:  # shard the experts over TP as Megatron-LM does by default (else each TP rank holds them whole)
        out.append("--enable-expert-tensor-parallelism")
    return out


# ------------------------------------------------------------------------------------------- files


def render_args_file(words: Sequence[str]) -> str:
    """One word per line, unquoted (read it back with `mapfile -t ARGS < FILE`; never `$(cat FILE)`)."""
    for w in words:
        if "\n" in w or w == "":
            raise ValueError(f"argument word {w!r} cannot be written one per line")
    return "\n".join(words) + "\n"


def read_args_file(text: str) -> list[str]:
    """What `mapfile -t` gives back for a file written by `render_args_file`."""
    return text.splitlines()


def render_launch_script(spec: Spec, cand: Candidate, target: str, *, strategy: str,
                         pretrain_script: Union[str, Path]) -> str:
    """torchrun launch of the target's pretrain_gpt.py with the argument file beside the script."""
    q = shlex.quote
    nodes, g = spec.cluster.nodes, spec.cluster.gpus_per_node
    args_file = ARGS_FILE[target]
    # Megatron-LM wants 1 with TP/SP (its validate_args asserts it); Megatron-FSDP asserts it is NOT 1.
    if target == "megatron-lm":
        cdmc = None if uses_megatron_fsdp(cand) else "1"
    else:
        cdmc = "1"  # Megatron-DeepSpeed refuses sequence parallelism without it; harmless otherwise
    name = "Megatron-LM" if target == "megatron-lm" else "Megatron-DeepSpeed"
    lines = [
        "#!/usr/bin/env bash",
        f"# dstoolkit generate: {name} launch, strategy {strategy}. Regenerate instead of editing.",
        "#",
        f"#   PRETRAIN=/path/to/{name}/pretrain_gpt.py bash {LAUNCH_FILE[target]}   # on every node, NODE_RANK=k",
        "#   DATA_ARGS='--data-path ... --tokenizer-type ... --tokenizer-model ...' overrides the data arguments",
        "#   extra arguments go to pretrain_gpt.py after the file's (argparse: the last occurrence wins)",
        f"# The arguments are read one per line into an array (mapfile), so no value is split or re-quoted.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'PRETRAIN="${{PRETRAIN:-{q(str(pretrain_script))}}}"',
        f'NNODES="${{NNODES:-{nodes}}}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        f'GPUS_PER_NODE="${{GPUS_PER_NODE:-{g}}}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        'MASTER_PORT="${MASTER_PORT:-29500}"',
        f'DATA_ARGS="${{DATA_ARGS:-{DEFAULT_DATA_ARGS[target]}}}"',
    ]
    if cdmc is not None:
        lines.append(f"export CUDA_DEVICE_MAX_CONNECTIONS={cdmc}")
    else:
        lines.append("unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP requires it unset (or > 1)")
    lines += [
        f'mapfile -t ARGS < "$HERE/{args_file}"',
        'read -r -a DATA <<< "$DATA_ARGS"',
    ]
    extra = ""
    if target == "megatron-deepspeed":
        extra = ' --deepspeed_config "$HERE/ds_config.json"'  # absolute at run time, wherever the folder moved
    lines += [
        'exec torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \\',
        '    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
        f'    "$PRETRAIN" "${{ARGS[@]}}" "${{DATA[@]}}"{extra} "$@"',
    ]
    return "\n".join(lines) + "\n"


@dataclass
class TargetFiles:
    """What `megatron_target_files` produced: relative path -> text, and the targets it could not express."""

    files: dict[str, str]
    skipped: dict[str, str]


def megatron_target_files(folder: Union[None, str, Path], spec: Spec, shape: ModelShape, cand: Candidate,
                          targets: Iterable[str] = TARGETS, *, strategy: str = "",
                          pretrain_script: Union[None, str, Path, dict[str, str]] = None) -> TargetFiles:
    """The argument file and launch script of each target for one strategy folder, in memory.

    `folder` is where the folder will live (its absolute path goes into --deepspeed_config); None writes the
    path relative to the strategy folder (committed goldens, which must not name this machine's paths; the
    launch script passes the absolute path at run time either way).
    `pretrain_script`: target -> path of that project's pretrain_gpt.py, or one path for every target.
    """
    ds_config_path = Path("ds_config.json") if folder is None else Path(folder).expanduser().resolve() / "ds_config.json"
    targets = list(targets)
    if isinstance(pretrain_script, (str, Path)):
        pretrain_script = {t: str(pretrain_script) for t in targets}
    scripts = {**DEFAULT_PRETRAIN, **(pretrain_script or {})}
    files: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for target in dict.fromkeys(targets):
        if target not in TARGETS:
            raise ValueError(f"unknown Megatron target {target!r}; known: {', '.join(TARGETS)}")
        try:
            if target == "megatron-lm":
                words = megatron_lm_args(spec, shape, cand)
            else:
                words = megatron_deepspeed_args(spec, shape, cand, ds_config_path=ds_config_path)
        except UnsupportedTarget as exc:
            skipped[target] = str(exc)
            continue
        files[ARGS_FILE[target]] = render_args_file(words)
        files[LAUNCH_FILE[target]] = render_launch_script(spec, cand, target,
                                                          strategy=strategy or Path(folder or ".").resolve().name,
                                                          pretrain_script=scripts[target])
    return TargetFiles(files=files, skipped=skipped)


def write_megatron_targets(folder: Union[str, Path], spec: Spec, shape: ModelShape, cand: Candidate,
                           targets: Iterable[str] = TARGETS, *,
                           pretrain_script: Union[None, str, Path, dict[str, str]] = None) -> TargetFiles:
    """Write each target's argument file and launch script into `folder` (which must exist).

    Args:
        pretrain_script: target -> path of that project's pretrain_gpt.py, or one path for all targets
            (default: a relative placeholder; PRETRAIN=... overrides it when launching).

    Returns:
        The files written and, per target that cannot express this model/layout, the reason (nothing written).
    """
    from dstoolkit.common.atomic import atomic_write_text

    out = megatron_target_files(folder, spec, shape, cand, targets, pretrain_script=pretrain_script)
    base = Path(folder)
    for rel, text in out.files.items():
        atomic_write_text(base / rel, text)
        if rel.endswith(".sh"):
            (base / rel).chmod(0o755)
    return out


__all__ = ["TARGETS", "ARGS_FILE", "LAUNCH_FILE", "UnsupportedTarget", "ModelConstants", "model_constants",
           "RampPlan", "ramp_plan", "vocab_divisor", "megatron_lm_args", "megatron_deepspeed_args",
           "render_args_file", "read_args_file", "render_launch_script", "megatron_target_files",
           "write_megatron_targets", "TargetFiles", "uses_megatron_fsdp"]
