"""Megatron-DeepSpeed (deepspeedai, megatron/arguments.py + deepspeed.add_config_arguments) command line for one
candidate, as flat words, in the spelling its parser accepts (checked at 4efb479d: benchmarks/megatron_parsers.py).
No torch import.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import is_cpu_cluster
from dstoolkit.generate.megatron_common import (ModelConstants, UnsupportedTarget, _batch, _checkpoint_saving,
                                               _common_model, _cpu_kernels, _optimizer, _recompute, _train_length,
                                               bias_words, dynamic_rope_is_plain, model_constants, model_gaps,
                                               window_words, windows_below)
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


def megatron_deepspeed_args(spec: Spec, shape: ModelShape, cand: Candidate, *, ds_config_path: Union[str, Path]) -> list[str]:
    """Megatron-DeepSpeed (megatron/arguments.py + deepspeed.add_config_arguments) command line, flat words.

    Args:
        ds_config_path: Absolute path of the strategy's ds_config.json (the script may run from any folder),
            or the bare name ``ds_config.json`` for files that must not name this machine's paths (committed
            goldens); the launch script passes the absolute path at run time in both cases.

    Raises:
        UnsupportedTarget: what Megatron-DeepSpeed's GPT model cannot build (the model's `model_gaps`,
            multi-latent attention, shared experts, biases on some linears only, rope scaling, QK-norm, expert
            width != dense width, FP8, a sliding attention window below seq_len: it has no window flag) or a
            pipelined ZeRO-2/3.
        ValueError: ds_config_path is neither absolute nor the bare ``ds_config.json``.
    """
    if not Path(ds_config_path).is_absolute() and str(ds_config_path) != "ds_config.json":
        raise ValueError(f"--deepspeed_config must be an absolute path, got {str(ds_config_path)!r}")
    t = "megatron-deepspeed"
    missing = model_gaps(spec, shape)
    if shape.is_mla:
        missing.append("multi-latent attention (no MLA in its GPT model)")
    if shape.num_shared_experts or shape.shared_expert_intermediate_size:
        missing.append("shared experts (its residual MoE is a different layer)")
    biases = (shape.attention_bias, shape.o_proj_bias, shape.mlp_bias)
    if any(biases) and not all(biases):
        missing.append(f"biases on {bias_words(shape)} only (--disable-bias-linear turns all of them off; there is no "
                       "--add-qkv-bias)")
    if shape.rope_scaling is not None and not shape.learned_positions and shape.position_encoding == "rope" \
            and not dynamic_rope_is_plain(shape, spec.training.seq_len):
        r = shape.rope_scaling
        missing.append(f"rope_scaling {r.rope_type} (factor {r.factor}): its RoPE has no scaling flags (only "
                       "--rotary-position-embeddings-theta and --rotary-percent)")
    if shape.is_moe and not shape.norm_topk_prob:
        missing.append("norm_topk_prob false (DeepSpeed MoE's top-k gate renormalises the chosen experts' weights: "
                       "deepspeed/moe/sharded_moe.py top2gating / topkgating)")
    if shape.qk_norm:
        missing.append("QK layer norm")
    if shape.is_moe and shape.expert_ffn_size != shape.intermediate_size:
        missing.append("an expert FFN width different from the dense FFN width (experts reuse --ffn-hidden-size)")
    if shape.router_score_correction_bias:
        missing.append("sigmoid routing with expert-bias balancing")
    if windows_below(shape, spec.training.seq_len):
        missing.append(f"{window_words(shape, spec.training.seq_len)} (megatron/arguments.py has no window flag: "
                       "its attention would attend to every earlier token, a different model)")
    if spec.training.precision == "fp8":
        missing.append("FP8 (dstoolkit emits FP8 only for Megatron-LM)")
    if cand.pp > 1 and cand.zero_stage >= 2:
        missing.append(f"ZeRO-{cand.zero_stage} with pipeline parallelism (DeepSpeed: incompatible)")
    if cand.pp > 1 and spec.training.pipeline_schedule != "1f1b":
        missing.append(f"pipeline_schedule {spec.training.pipeline_schedule!r} (DeepSpeed's pipeline engine runs "
                       "1F1B only, rule LY022)")
    if missing:
        raise UnsupportedTarget(f"{t}: cannot express {'; '.join(missing)}")
    k = model_constants(spec, shape)
    out = ["--tensor-model-parallel-size", str(cand.tp), "--pipeline-model-parallel-size", str(cand.pp)]
    if cand.pp == 1:
        out.append("--no-pipeline-parallel")  # plain GPTModel + DeepSpeedEngine (ZeRO-2/3 need it)
    if cand.ulysses > 1:
        # DeepSpeed-Ulysses (megatron/arguments.py); megatron/initialize.py refuses it beside --sequence-parallel (LY023)
        out += ["--ds-sequence-parallel-size", str(cand.ulysses)]
    if cand.sequence_parallel:  # the spec's training.sequence_parallel at tp > 1, as the estimate counts it
        out.append("--sequence-parallel")
    # Its NullTokenizer (megatron/tokenizer/tokenizer.py:514) adds the end-of-document id on top of --vocab-size, so
    # V - 1 gives the model's V rows; a real tokenizer ignores --vocab-size (the embedding follows the tokenizer).
    out += _common_model(spec, shape, k, cand, vocab_flag=shape.vocab_size - 1)
    if shape.kv_heads != shape.num_attention_heads:
        out += ["--num-key-value-heads", str(shape.kv_heads)]
    if not shape.learned_positions and shape.position_encoding == "none":
        out.append("--no-position-embedding")
    elif not shape.learned_positions:
        out += ["--use-rotary-position-embeddings", "--no-position-embedding",
                "--rotary-position-embeddings-theta", str(int(k.rope_theta))]
        if shape.rotary_fraction < 1.0:  # megatron/model/language_model.py: rotary_dim *= args.rotary_percent
            out += ["--rotary-percent", repr(shape.rotary_fraction)]
    out += ["--normalization", "rmsnorm" if shape.norm_type == "rmsnorm" else "layernorm",
            "--layernorm-epsilon", repr(k.norm_eps)]
    if not (shape.o_proj_bias or shape.mlp_bias or shape.attention_bias):
        out.append("--disable-bias-linear")
    if spec.training.flash_attention and not is_cpu_cluster(spec):
        # its --use-flash-attn is FlashAttention v1; on CPU the op builder has no implementation
        # (megatron/model/transformer.py:536 -> deepspeed/ops/op_builder/cpu/no_impl.py), so the unfused attention
        out.append("--use-flash-attn-v2")
    out += _cpu_kernels(spec)
    if shape.is_moe:
        out += _moe_mds(shape, cand, k)
    out += _batch(spec, cand, t)
    out += _train_length(spec, cand)
    p = spec.training.precision
    out += ["--fp16"] if p == "fp16" else ["--bf16"] if p == "bf16" else []
    recompute = _recompute(shape, cand)
    if recompute:
        # DeepSpeed's checkpoint function: Megatron's own (megatron/core/tensor_parallel/random.py:329) hands the
        # RoPE [cos, sin] list to save_for_backward, which refuses it (transformer.py:1945: "argument 8 is of type
        # tuple"); DeepSpeed's separates non-tensor arguments (activation_checkpointing/checkpointing.py
        # extract_tensors). Found by running the generated files (benchmarks/megatron_deepspeed_runs.py).
        recompute.append("--deepspeed-activation-checkpointing")
    out += recompute
    out += _optimizer(spec, t)
    if cand.offload_optimizer:
        if spec.training.optimizer not in ("adam", "adamw"):
            raise UnsupportedTarget(f"{t}: --cpu-optimizer is Adam only")
        out.append("--cpu-optimizer")  # DeepSpeedCPUAdam as the client optimizer ZeRO-Offload needs
    out += _checkpoint_saving(spec)
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


FPDT_COMMIT = "676a482c"
"""Megatron-DeepSpeed's "Adding the new feature of FPDT" (#441, 2024-12-04), which rewrote how
megatron/model/transformer.py ParallelAttention.forward splits the fused QKV output (`QKV_THIRDS`, `ULYSSES_MHA`);
f4157bea, the tree benchmarks/megatron_parsers.py checks the argument files against, has it."""
QKV_THIRDS = "each_hidden_size = mixed_x_layer.shape[-1] // 3"
"""The line that splits the fused QKV output into three equal thirds when DeepSpeed sequence parallelism is off (or
Megatron's sequence parallelism is on). With fewer key/value heads than query heads the output is
(heads + 2 x kv heads) x head dim wide, and the first forward fails ("shape '[128, 4, -1, 32]' is invalid",
measured: benchmarks/megatron_deepspeed_runs.py, which patches it back to the split by key/value group, PATCH_GQA)."""
ULYSSES_MHA = "assert self.projection_size == self.kv_projection_size"
"""With DeepSpeed sequence parallelism on (--ds-sequence-parallel-size > 1) the same commit asserts equal query and
key/value projections: a GQA model fails this assert at its first forward."""


def tree_check_lines(shape: ModelShape, cand: Candidate, script: str) -> list[str]:
    """Bash lines for launch_megatron_deepspeed.sh that stop the launch (exit 2, before any rank starts) when the
    Megatron-DeepSpeed tree next to $PRETRAIN has a QKV split this model cannot train with: a GQA model (fewer
    key/value heads than query heads) under `QKV_THIRDS`, or under `ULYSSES_MHA` with a Ulysses degree. A tree from
    before `FPDT_COMMIT`, or one patched back to the split by key/value group, passes. Nothing for an MHA model."""
    kv, heads = shape.kv_heads, shape.num_attention_heads
    if kv == heads:
        return []
    checks = []
    if cand.ulysses > 1:
        checks.append((ULYSSES_MHA, f"asserts equal query and key/value projections under DeepSpeed sequence "
                                    f"parallelism (--ds-sequence-parallel-size {cand.ulysses})"))
    if cand.ulysses <= 1 or cand.sequence_parallel:
        checks.append((QKV_THIRDS, "splits the fused QKV output into three equal thirds"))
    lines = ['TRANSFORMER="$(dirname "$PRETRAIN")/megatron/model/transformer.py"']
    for needle, what in checks:
        lines += [
            f"if [[ -f \"$TRANSFORMER\" ]] && grep -qF -- '{needle}' \"$TRANSFORMER\"; then",
            f'    echo "{script}: $TRANSFORMER {what} (Megatron-DeepSpeed since {FPDT_COMMIT}), so this model\'s '
            f'{kv} key/value heads for {heads} query heads (GQA) fail at the first forward: use a tree from before '
            f'{FPDT_COMMIT}, one that splits the QKV output by key/value group (split_tensor), or generate '
            f'--target megatron-lm" >&2; exit 2',
            "fi",
        ]
    return lines
