"""Megatron-LM (NVIDIA, megatron/training/arguments.py) command line for one candidate, as flat words, in the
spelling its parser accepts (checked at d98e8a64: benchmarks/megatron_parsers.py). No torch import.
"""
from __future__ import annotations

from typing import Optional

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import is_cpu_cluster
from dstoolkit.generate.megatron_common import (ModelConstants, UnsupportedTarget, _batch, _checkpoint_saving,
                                               _common_model, _cpu_kernels, _optimizer, _recompute, _train_length,
                                               bias_words, dynamic_rope_is_plain, model_constants, model_gaps,
                                               window_words, windows_below)
from dstoolkit.layout import megatron_split
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


def _precision_lm(spec: Spec) -> list[str]:
    p = spec.training.precision
    if p == "fp16":
        return ["--fp16"]
    if p == "bf16":
        return ["--bf16"]
    if p == "fp8":
        return ["--bf16"] + list(spec.training.fp8_config().to_megatron_args().args)
    return []


CPU_PROBLEM = ("Megatron-LM does not run on CPU ranks (cluster.gpu: cpu): initialize_megatron asserts "
               "torch.cuda.is_available() ('Megatron requires CUDA.', megatron/training/initialize.py at d98e8a64) and "
               "its layers allocate on torch.cuda.current_device()")
CPU_REASON = f"{CPU_PROBLEM}; use --target megatron-deepspeed or deepspeed on CPU, or a GPU in cluster.gpu"
"""Why `generate` writes no Megatron-LM files for a CPU cluster (README's two-host run stops on that assertion).
`megatron_lm_args` itself still spells a CPU spec's arguments (the parser checks, Megatron-Core unit runs on CPU)."""


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
        UnsupportedTarget: what Megatron-LM cannot express (the model's `model_gaps`, an optimizer it lacks, a
            non-SwiGLU gated MLP, a sliding window on some layers only: `_window_lm`).
    """
    gaps = model_gaps(spec, shape)
    if gaps:
        raise UnsupportedTarget(f"cannot express {'; '.join(gaps)}")
    k = model_constants(spec, shape)
    out = ["--tensor-model-parallel-size", str(cand.tp), "--pipeline-model-parallel-size", str(cand.pp)]
    split = megatron_split(shape.num_hidden_layers, cand.pp)
    out += [w for pair in split.args() for w in pair]
    out += _pipeline_schedule_lm(spec, cand, split)
    if cand.sequence_parallel:  # the spec's training.sequence_parallel at tp > 1, as the estimate counts it
        out += ["--sequence-parallel"]
    if cand.cp > 1:
        out += ["--context-parallel-size", str(cand.cp)]  # Megatron-Core CP: the ranks come out of dp
    elif cand.ulysses > 1:  # Ulysses as Megatron-Core's all-to-all CP (targets.SEQUENCE_SHARDING_TARGETS)
        out += ["--context-parallel-size", str(cand.ulysses), "--cp-comm-type", "a2a"]
    out += _common_model(spec, shape, k, cand)
    if shape.is_mla:
        out += ["--multi-latent-attention", "--kv-lora-rank", str(shape.kv_lora_rank),
                "--qk-head-dim", str(shape.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(shape.qk_rope_head_dim),
                "--v-head-dim", str(shape.v_head_dim)]
        if shape.q_lora_rank:
            out += ["--q-lora-rank", str(shape.q_lora_rank)]
    elif shape.kv_heads != shape.num_attention_heads:
        out += ["--group-query-attention", "--num-query-groups", str(shape.kv_heads)]
    out += _positions_lm(spec, shape, k)
    out += ["--normalization", "RMSNorm" if shape.norm_type == "rmsnorm" else "LayerNorm",
            "--norm-epsilon", repr(k.norm_eps)]
    if shape.qk_norm:
        out.append("--qk-layernorm")
    out += _biases_lm(shape)
    # FlashAttention is a CUDA kernel: a CPU cluster runs the unfused attention (the same arithmetic)
    flash = spec.training.flash_attention and not is_cpu_cluster(spec)
    out += ["--attention-backend", "flash" if flash else "unfused"]
    out += _window_lm(spec, shape, cand, flash)
    out += _cpu_kernels(spec)
    out += _moe_lm(shape, cand, k)
    out += _batch(spec, cand, "megatron-lm")
    out += _train_length(spec, cand)
    out += _precision_lm(spec)
    out += _recompute_lm(spec, shape, cand)
    out += _optimizer(spec, "megatron-lm")
    out += _distributed_lm(spec, cand)
    out += _checkpoint_saving(spec)
    return out


LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""The llama3 rope-scaling numbers Megatron-LM's --use-rope-scaling applies (RotaryEmbedding._apply_scaling
defaults, megatron/core/models/common/embeddings/rotary_pos_embedding.py at d98e8a64); only the factor is a flag."""
MLA_YARN = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
"""The YaRN numbers MLATransformerConfig fixes (transformer_config.py at d98e8a64: no flag sets them for MLA;
--rotary-scaling-factor, --mscale and --mscale-all-dim do set theirs)."""


def _positions_lm(spec: Spec, shape: ModelShape, k: ModelConstants) -> list[str]:
    """--position-embedding-type and the RoPE flags: base, --rotary-percent (a partial rotary), and the config's
    rope_scaling: llama3 -> --use-rope-scaling --rope-scaling-factor; linear with a whole factor ->
    --rotary-seq-len-interpolation-factor (positions divided by it, as transformers' linear type);
    dynamic at a seq_len within the original length -> plain RoPE (the same frequencies); YaRN on MLA -> --rope-type
    yarn with its factor and mscales.

    Raises:
        UnsupportedTarget: a rope_scaling Megatron-LM cannot reproduce (naming its type and numbers).
    """
    if shape.learned_positions:
        return ["--position-embedding-type", "learned_absolute"]
    if shape.position_encoding == "none":
        return ["--position-embedding-type", "none"]
    out = ["--position-embedding-type", "rope", "--rotary-base", str(int(k.rope_theta))]
    if shape.rotary_fraction < 1.0:
        out += ["--rotary-percent", repr(shape.rotary_fraction)]
    r = shape.rope_scaling
    if r is None or dynamic_rope_is_plain(shape, spec.training.seq_len):
        return out
    what = f"rope_scaling {r.rope_type} (factor {r.factor}{''.join(f', {a} {b}' for a, b in r.params)})"
    if r.rope_type == "llama3":
        odd = {key: r.param(key) for key, v in LLAMA3_ROPE.items() if r.param(key) is not None and float(r.param(key)) != v}
        if r.factor is not None and not odd:
            return out + ["--use-rope-scaling", "--rope-scaling-factor", repr(float(r.factor))]
        raise UnsupportedTarget(f"megatron-lm: {what}: --use-rope-scaling applies only the factor, with "
                                f"{', '.join(f'{a} {b}' for a, b in LLAMA3_ROPE.items())} fixed")
    if r.rope_type == "linear" and r.factor is not None and float(r.factor).is_integer():
        return out + ["--rotary-seq-len-interpolation-factor", str(int(r.factor))]
    if r.rope_type == "yarn" and shape.is_mla and r.factor is not None:
        odd = {key: r.param(key) for key, v in MLA_YARN.items() if r.param(key) is not None and float(r.param(key)) != v}
        if not odd:
            return out + [
                "--rope-type", "yarn", "--rotary-scaling-factor", repr(float(r.factor)),
                "--mscale", repr(float(r.param("mscale", 1.0))),
                "--mscale-all-dim", repr(float(r.param("mscale_all_dim", 0.0)))]
        raise UnsupportedTarget(f"megatron-lm: {what}: multi-latent attention's YaRN fixes "
                                f"{', '.join(f'{a} {b}' for a, b in MLA_YARN.items())} (no flags)")
    why = {"linear": "--rotary-seq-len-interpolation-factor takes a whole number",
           "dynamic": f"dynamic NTK changes the frequencies past the original length, and training.seq_len="
                      f"{spec.training.seq_len} is past it",
           }.get(r.rope_type, "dstoolkit writes no Megatron-LM flags for it")
    raise UnsupportedTarget(f"megatron-lm: {what}: {why}")


def _window_lm(spec: Spec, shape: ModelShape, cand: Candidate, flash: bool) -> list[str]:
    """--window-size for a sliding window below seq_len on every layer; nothing at seq_len <= window (every query
    sees at most seq_len keys: full attention, the same model).

    transformers' window W lets query q attend to keys q-W+1..q (masking_utils.sliding_window_overlay: kv > q - W,
    with the causal mask); Megatron-LM's window_size (left, right) lets it attend to q-left..q+right (flash-attn /
    Transformer Engine convention; the unfused mask, core/transformer/utils.get_sliding_window_causal_mask, keeps
    q-left..q+right too), so W is (W-1, 0). The unfused backend also gets --no-masked-softmax-fusion: its fused
    softmax kernel (core/fusions/fused_softmax.py, taken at <= 4096 keys in fp16/bf16) applies the causal mask only.

    Raises:
        UnsupportedTarget: windows on some layers only or of several sizes (not checked against
            --window-attn-skip-freq), or a window with context parallelism (not checked in Transformer Engine's
            context-parallel attention).
    """
    seq = spec.training.seq_len
    below = windows_below(shape, seq)
    if not below:
        return []
    sizes = set(below.values())
    if len(sizes) > 1 or len(below) != shape.num_hidden_layers:
        raise UnsupportedTarget(f"megatron-lm: {window_words(shape, seq)}: --window-size applies one window to every "
                                "layer (a per-layer pattern, --window-attn-skip-freq, is not written)")
    if cand.cp > 1 or cand.ulysses > 1:
        raise UnsupportedTarget(f"megatron-lm: {window_words(shape, seq)} with context parallelism "
                                f"(cp {max(cand.cp, cand.ulysses)}): not written, its window handling in Transformer "
                                "Engine's context-parallel attention is unchecked; use cp 1")
    w = sizes.pop()
    return ["--window-size", f"{w - 1},0"] + ([] if flash else ["--no-masked-softmax-fusion"])


def _biases_lm(shape: ModelShape) -> list[str]:
    """Megatron-LM's linear biases: all on by default (TransformerConfig.add_bias_linear: QKV, attention output,
    both MLP layers), --disable-bias-linear turns all off, --add-qkv-bias turns q/k/v back on.

    Raises:
        UnsupportedTarget: any other combination (e.g. attention biases without MLP biases)."""
    b = (shape.attention_bias, shape.o_proj_bias, shape.mlp_bias)
    if b == (True, True, True):
        return []
    if b == (False, False, False):
        return ["--disable-bias-linear"]
    if b == (True, False, False):
        return ["--disable-bias-linear", "--add-qkv-bias"]
    raise UnsupportedTarget(f"megatron-lm: cannot express biases on {bias_words(shape)} only (it has all linear "
                            "biases, none, or q/k/v only)")


def _recompute_lm(spec: Spec, shape: ModelShape, cand: Candidate) -> list[str]:
    """The recompute flags with the spec's training.recompute_modules, as the estimate credits them
    (estimate.activations / moe_activations / cluster_model). Megatron-Core reads the list only under
    --recompute-granularity selective, where it replaces the default ["core_attn"] (TransformerConfig at d98e8a64), so
    activation_checkpointing selective writes core_attn first and none writes the named modules alone; full recompute
    re-runs every module in both (the spec refuses the list beside full / every-k / ratio; "auto"'s full pick writes
    full alone).

    Raises:
        UnsupportedTarget: a module TransformerConfig refuses for this model or FP8 recipe (`recompute_modules_reason`).
    """
    mods = list(spec.training.recompute_modules)
    kind = cand.checkpoint.kind
    if not mods or kind == "full":
        return _recompute(shape, cand)
    why = recompute_modules_reason(spec, shape) or (
        None if kind in ("none", "selective") else
        f"megatron-lm: training.recompute_modules={mods} with recompute {cand.checkpoint_label}: Megatron-Core reads "
        "--recompute-modules only under --recompute-granularity selective; use activation_checkpointing none or "
        "selective, or remove recompute_modules")
    if why is not None:
        raise UnsupportedTarget(why)
    core = ["core_attn"] if kind == "selective" else []
    return ["--recompute-granularity", "selective", "--recompute-modules", *core, *mods]


def recompute_modules_reason(spec: Spec, shape: ModelShape) -> Optional[str]:
    """Why Megatron-LM refuses the spec's training.recompute_modules for this model, or None: TransformerConfig
    (d98e8a64) raises "moe_act in recompute_modules is only supported with moe_grouped_gemm" (written for MoE models
    only), "mla_up_proj ... only supported with multi_latent_attention", and "Delayed scaling does not support moe_act
    and layernorm recompute for fp8"."""
    t = spec.training
    mods = t.recompute_modules
    bad = []
    if "moe_act" in mods and not shape.is_moe:
        bad.append(f"moe_act needs routed experts, and {shape.name} has none (Megatron-Core takes it only with "
                   "--moe-grouped-gemm, written for MoE models)")
    if "mla_up_proj" in mods and not shape.is_mla:
        bad.append(f"mla_up_proj needs multi-latent attention, and {shape.name} has none")
    delayed = [m for m in ("layernorm", "moe_act") if m in mods]
    fp8 = t.fp8_config() if t.precision == "fp8" else None
    if delayed and fp8 is not None and fp8.enabled and fp8.recipe == "delayed":
        bad.append(f"{' and '.join(delayed)} with the FP8 delayed-scaling recipe (Megatron-Core: 'Delayed scaling "
                   "does not support moe_act and layernorm recompute for fp8'; training.fp8.recipe current / block / "
                   "mxfp8 takes them)")
    if not bad:
        return None
    return (f"megatron-lm: training.recompute_modules={list(mods)}: {'; '.join(bad)}; remove "
            f"{'them' if len(bad) > 1 else 'it'} from training.recompute_modules")


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
    if shape.shared_expert_gate:  # Qwen2-MoE: sigmoid(gate(x)) * shared_expert(x) (TransformerConfig.moe_shared_expert_gate)
        out.append("--moe-shared-expert-gate")
    if not shape.norm_topk_prob and shape.router_score_correction_bias:
        raise UnsupportedTarget("megatron-lm: sigmoid routing with norm_topk_prob false: Megatron-Core renormalises "
                                "the top-k sigmoid scores (moe_utils.topk_routing_with_score_function)")
    if not shape.norm_topk_prob:
        # norm_topk_prob false: softmax over all experts, top-k weights not renormalised; Megatron-Core's default
        # softmaxes the top-k logits (= renormalised), --moe-router-pre-softmax softmaxes first
        # (moe_utils.topk_routing_with_score_function at d98e8a64)
        out.append("--moe-router-pre-softmax")
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


def _pipeline_schedule_lm(spec: Spec, cand: Candidate, split) -> list[str]:
    """The spec's pipeline schedule as Megatron-LM runs it: 1F1B (its default) or interleaved, with
    --num-virtual-stages-per-pipeline-rank V (arguments.py). Megatron-Core builds each rank's layers as V chunks,
    so every stage's layer count must divide by V (TransformerConfig: "must be divisible by virtual pipeline
    parallel degree"); an explicit --pipeline-model-parallel-layout would have to spell the chunks itself.

    Raises:
        UnsupportedTarget: a schedule Megatron-LM does not run (zero-bubble, dualpipe), or chunks that do not divide.
    """
    t, sched = spec.training, spec.training.pipeline_schedule
    if cand.pp <= 1 or sched == "1f1b":
        return []
    if sched != "interleaved":
        raise UnsupportedTarget(f"megatron-lm: pipeline_schedule {sched!r} is not a Megatron-LM schedule (it runs "
                                "1f1b or interleaved); the estimate of this spec describes a run it cannot launch")
    v = t.virtual_stages
    if v <= 1:
        return []
    uneven = [n for n in split.layers if n % v]
    if split.layout is not None or uneven:
        raise UnsupportedTarget(f"megatron-lm: virtual_stages={v} needs every pipeline stage's layer count divisible "
                                f"by {v} (stages of {', '.join(map(str, split.layers))} layers): pick virtual_stages "
                                "dividing them, or another pp")
    return ["--num-virtual-stages-per-pipeline-rank", str(v)]


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
    # the spec's training.tp_comm_overlap, as the estimate counts it; Megatron-LM accepts it only with sequence
    # parallelism (arguments.py validate_args: "Tensor parallel communication/GEMM overlap can happen only when
    # sequence parallelism is enabled"), which cand.sequence_parallel is at tp > 1 (the spec requires it beside)
    if spec.training.tp_comm_overlap and cand.sequence_parallel and not uses_megatron_fsdp(cand):
        out += ["--tp-comm-overlap"]
    return out
