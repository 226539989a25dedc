"""What `dstoolkit estimate`'s flag form reads from the DeepSpeed JSON beyond validate_config's findings (split from
dstoolkit.cli.estimate_flags): the validated config model, the AutoTP degree and the JSON an AutoTP config is estimated
as, and the precision DeepSpeed trains it in, which a --tp / --precision flag must agree with. No torch import.
"""
from __future__ import annotations

from typing import Optional


def config_model(ds: dict, world: int, gpus_per_node: int, tp: int, pp: int):
    """The config as the validated `DeepSpeedConfig` model reads it (the one reader of a DeepSpeed JSON), in the
    layout validate_config checked it in (`tp`: Megatron's; AutoTP is the config's own key)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

    return DeepSpeedConfig.model_validate(ds, context={"world_size": world, "tp": tp, "pp": pp,
                                                       "gpus_per_node": gpus_per_node})


def autotp_size(ds: dict) -> Optional[int]:
    """The config's DeepSpeed AutoTP degree (tensor_parallel.autotp_size, read by the validated model's
    `TensorParallelConfig`; None when unset or <= 1, which shard nothing). Read before validate_config, which needs
    to know whether --tp is Megatron's; a section the model refuses is left to validate_config to report."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from pydantic import ValidationError

    from dstoolkit.dsconfig.ds_misc import TensorParallelConfig

    section = ds.get("tensor_parallel")
    if not isinstance(section, dict):
        return None
    try:
        size = TensorParallelConfig.model_validate(section).autotp_size
    except ValidationError:
        return None
    return size if size > 1 else None


def tp_degree(args, autotp: Optional[int], tp_given: bool) -> int:
    """The run's tensor-parallel degree: --tp, or the config's AutoTP degree, which a --tp must repeat (both set
    means two ways to shard the same layers, DS223) and which has no Megatron sequence parallelism."""
    if autotp is None:
        return args.tp
    key = f"{args.config}: tensor_parallel.autotp_size={autotp}"
    if tp_given and args.tp != autotp:
        raise ValueError(f"--tp {args.tp} disagrees with {key} (DeepSpeed AutoTP, the TP degree this config runs): "
                         f"drop --tp (the estimate takes autotp_size as the TP degree), or for Megatron tensor "
                         f"parallelism at {args.tp} remove tensor_parallel.autotp_size from the config")
    if args.sequence_parallel:
        raise ValueError(f"--sequence-parallel with {key}: AutoTP has no Megatron sequence parallelism (its norms "
                         "and dropouts run on the whole activations on every TP rank): drop --sequence-parallel")
    return autotp


def run_precision(flag: Optional[str], cfg, config: str) -> str:
    """The run's precision: the config's (an enabled bf16 / fp16 section, else fp32, as DeepSpeed trains it); a
    --precision must agree with it. fp8 is FP8 GEMMs over bf16 (the spec form writes bf16.enabled for precision
    fp8, generate.ds_json), so --precision fp8 needs the bf16 section."""
    bf16, key = (cfg.bf16, "bf16") if cfg.bf16 is not None else (cfg.bfloat16, "bfloat16")
    if bf16 is not None and bf16.enabled is True:
        runs, section, allowed = "bf16", f"{key}.enabled is true", ("bf16", "fp8")
    elif cfg.fp16 is not None and cfg.fp16.enabled is True:
        runs, section, allowed = "fp16", "fp16.enabled is true", ("fp16",)
    else:
        runs, section, allowed = "fp32", "neither bf16 nor fp16 is enabled", ("fp32",)
    if flag is None:
        return runs
    if flag in allowed:
        return flag
    if flag == "fp8":
        fix = (f'enable bf16 in {config} ("bf16": {{"enabled": true}}) for FP8 GEMMs over bf16, or drop --precision '
               f"(the config's {runs} is estimated)")
    elif flag == "fp32":
        fix = f"drop --precision (the config's {runs} is estimated), or disable {runs} in {config} for an fp32 run"
    else:
        fix = (f"drop --precision (the config's {runs} is estimated), or enable {flag} in {config}"
               + (f" instead of {runs}" if runs != "fp32" else f' ("{flag}": {{"enabled": true}})'))
    raise ValueError(f"--precision {flag} contradicts {config}: {section}, so DeepSpeed trains {runs}: {fix}")


def autotp_run(ds: dict, cfg, config: str, world: int, ulysses: int, shape) -> tuple[dict, list[str]]:
    """The DeepSpeed JSON the estimate runs an AutoTP config as, and the assumptions that says.

    The estimator's one tensor parallelism is Megatron's (`RunPlan.tp`; its config reader refuses autotp_size beside
    it, DS223), so the plan gets the config without tensor_parallel and tp = autotp_size. DeepSpeed builds the
    config of an AutoTP run without an mpu (deepspeed.initialize; the TP mesh comes later, in the engine's
    _configure_tensor_parallel_states), so its batch triad counts every rank: train_batch_size = micro batch x
    accumulation x world / sequence_parallel_size (runtime/config.py), while the ranks of one TP group read the
    same samples. The plan keeps DeepSpeed's micro batch and accumulation over dp = world / (autotp x ulysses).
    """
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.layout import param_layout
    from dstoolkit.layout import data_parallel_size, resolve_batch

    tp = cfg.tensor_parallel.autotp_size
    triad = resolve_batch(cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps,
                          world // ulysses)  # validate_config checked the triad at this dp
    dp = data_parallel_size(world, tp, 1, ulysses)
    out = {k: v for k, v in ds.items() if k != "tensor_parallel"}
    out.update(train_micro_batch_size_per_gpu=triad.micro_batch, gradient_accumulation_steps=triad.grad_accum,
               train_batch_size=triad.micro_batch * triad.grad_accum * dp)
    vocab = sum(p.numel for p in param_layout(shape) if p.kind in ("embedding", "lm_head") and p.tp_split)
    head = ("with tensor_parallel.vocab_parallel_lm_head the LM head is vocab-parallel with a distributed loss"
            if cfg.tensor_parallel.vocab_parallel_lm_head is True else
            "without tensor_parallel.vocab_parallel_lm_head the loss sees full-vocabulary logits on every TP rank")
    notes = [
        f"tp={tp} is DeepSpeed AutoTP ({config}: tensor_parallel.autotp_size), modelled as Megatron tensor "
        f"parallelism without sequence parallelism: each block's attention and MLP linears split column / row-wise "
        f"over {tp} ranks, 2 all-reduces per block forward and 2 backward (deepspeed 0.19.8 module_inject/"
        "auto_tp.py LinearLayer / LinearAllreduce), norms and the activations between the linears whole on every "
        "TP rank",
        f"AutoTP leaves the input embedding whole on every TP rank unless it is tied to a vocab-parallel LM head, "
        f"shards the LM head's weight only with a Hugging Face tp_plan or vocab_parallel_lm_head, and {head}; the "
        f"estimate splits the embedding and the LM head ({vocab / 1e9:,.3f}B params together) and the logits by "
        f"tp={tp} as Megatron's vocab-parallel layers, so its memory is low by up to {tp - 1}/{tp} of their "
        "weights, gradients, optimizer states and [tokens, vocab] logits",
        f"batch: DeepSpeed counts the AutoTP ranks in the batch triad (train_batch_size = micro batch "
        f"{triad.micro_batch} x accumulation {triad.grad_accum} x {world // ulysses} ranks = {triad.train_batch}); "
        f"the {tp} ranks of a TP group read the same samples, so a step trains "
        f"{triad.micro_batch * triad.grad_accum * dp} sequences over dp={dp}",
    ]
    return out, notes
