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


def without_ignored_keys(ds: dict, findings) -> dict:
    """`ds` without the top-level keys validate_config reported only as DS101 warnings (`findings`: its warnings):
    keys DeepSpeed 0.19.8 ignores (runtime/config.py reads the keys it knows), such as MS-AMP's `msamp`, that are not
    a near-miss of a known key (those are DS101 errors). The config model forbids unknown keys, so `estimate
    --config` estimates the config DeepSpeed trains, beside validate's warning, where it would otherwise fail on a
    file `dstoolkit validate` passes."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.validate.findings import pointer_of

    ignored = {f.pointer for f in findings if f.code == "DS101" and f.severity == "warning"}
    return {k: v for k, v in ds.items() if pointer_of((k,)) not in ignored}


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
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.fp8.ds_precision import fp8_precision_problem, trained_precision

    bf16, key = (cfg.bf16, "bf16") if cfg.bf16 is not None else (cfg.bfloat16, "bfloat16")
    runs, section = trained_precision(bf16 is not None and bf16.enabled is True, key,
                                      cfg.fp16 is not None and cfg.fp16.enabled is True)
    allowed = ("bf16", "fp8") if runs == "bf16" else (runs,)
    if flag is None:
        return runs
    if flag in allowed:
        return flag
    if flag == "fp8":  # the rule `fp8 plan --config` refuses the same config by (fp8.ds_precision)
        problem = fp8_precision_problem(runs, section, config)
        raise ValueError(f"--precision fp8 contradicts {config}: {problem}, or drop --precision (the config's {runs} "
                         "is estimated)")
    if flag == "fp32":
        fix = f"drop --precision (the config's {runs} is estimated), or disable {runs} in {config} for an fp32 run"
    else:
        fix = (f"drop --precision (the config's {runs} is estimated), or enable {flag} in {config}"
               + (f" instead of {runs}" if runs != "fp32" else f' ("{flag}": {{"enabled": true}})'))
    raise ValueError(f"--precision {flag} contradicts {config}: {section}, so DeepSpeed trains {runs}: {fix}")


def autotp_run(ds: dict, cfg, config: str, world: int, ulysses: int, shape) -> tuple[dict, object, list[str]]:
    """The DeepSpeed JSON the estimate runs an AutoTP config as, what AutoTP does with the embedding, the LM head
    and the logits (`runplan.AutoTp`, the plan's `autotp`), and the assumptions that says.

    The plan gets the config without tensor_parallel (its config reader refuses autotp_size beside a tp, DS223),
    tp = autotp_size and `autotp` = `runplan.autotp_layout` of the config's tensor_parallel section and the model:
    the blocks' linears split as Megatron's, the embedding, the LM head and the logits as DeepSpeed 0.19.8 holds them
    (runtime/engine.py _apply_autotp_partitioning; runplan/autotp.py cites each path). The model's Hugging Face
    tp_plan is `models.tp_plan.tp_plan_of` (none for the user's own module, nor for transformers classes that declare
    none: GPT-2, OPT, Falcon, BLOOM, ...); a plan or model DeepSpeed cannot shard or run sharded is refused
    (`runplan.autotp.tp_plan_refusal`). DeepSpeed builds the config of an AutoTP run without an mpu
    (deepspeed.initialize; the TP mesh comes later, in the engine's _configure_tensor_parallel_states), so its batch
    triad counts every rank:
    train_batch_size = micro batch x accumulation x world / sequence_parallel_size (runtime/config.py), while the
    ranks of one TP group read the same samples. The plan keeps DeepSpeed's micro batch and accumulation over
    dp = world / (autotp x ulysses).
    """
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.layout import data_parallel_size, resolve_batch
    from dstoolkit.models.tp_plan import tp_plan_of
    from dstoolkit.runplan import autotp_layout
    from dstoolkit.runplan.autotp import shape_tp_refusal

    tp = cfg.tensor_parallel.autotp_size
    # a partition_config / preset_model is applied instead of the model's tp_plan (autotp_layout reads it first)
    custom = cfg.tensor_parallel.partition_config is not None or cfg.tensor_parallel.preset_model is not None
    plan = () if custom else tp_plan_of(shape)
    if not custom:
        refusal = shape_tp_refusal(shape, plan, tp, f"{config}: tensor_parallel.autotp_size")
        if refusal:
            raise ValueError(refusal)
    triad = resolve_batch(cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps,
                          world // ulysses)  # validate_config checked the triad at this dp
    dp = data_parallel_size(world, tp, 1, ulysses)
    out = {k: v for k, v in ds.items() if k != "tensor_parallel"}
    out.update(train_micro_batch_size_per_gpu=triad.micro_batch, gradient_accumulation_steps=triad.grad_accum,
               train_batch_size=triad.micro_batch * triad.grad_accum * dp)
    compile_cfg = cfg.compile
    layout = autotp_layout(cfg.tensor_parallel, tied=shape.tie_word_embeddings, model_type=shape.model_type,
                           hf_tp_plan=bool(plan),
                           deepcompile_autotp=bool(compile_cfg is not None and compile_cfg.deepcompile is True
                                                   and "autotp" in (compile_cfg.passes or ())))
    notes = [
        f"tp={tp} is DeepSpeed AutoTP ({config}: tensor_parallel.autotp_size): each block's attention and MLP "
        f"linears split column / row-wise over {tp} ranks as Megatron's, without sequence parallelism, 2 "
        "all-reduces per block forward and 2 backward (deepspeed 0.19.8 module_inject/auto_tp.py LinearLayer / "
        "LinearAllreduce), norms and the activations between the linears whole on every TP rank",
        _vocab_note(layout, shape, tp),
        f"batch: DeepSpeed counts the AutoTP ranks in the batch triad (train_batch_size = micro batch "
        f"{triad.micro_batch} x accumulation {triad.grad_accum} x {world // ulysses} ranks = {triad.train_batch}); "
        f"the {tp} ranks of a TP group read the same samples, so a step trains "
        f"{triad.micro_batch * triad.grad_accum * dp} sequences over dp={dp}",
    ]
    return out, layout, notes


def _vocab_note(layout, shape, tp: int) -> str:
    """The assumption line for the embedding, the LM head and the logits of an AutoTP run (`runplan.AutoTp`)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.layout import param_layout

    entries = param_layout(shape)
    embed = sum(p.numel for p in entries if p.kind == "embedding" and p.tp_split) / 1e9
    head = sum(p.numel for p in entries if p.kind == "lm_head") / 1e9

    def held(split: bool) -> str:
        return f"split over tp={tp}" if split else "whole on every TP rank"

    if shape.tie_word_embeddings:
        parts = f"the tied embedding / LM head ({embed:,.3f}B params) {held(layout.lm_head_split)}"
    else:
        parts = (f"the input embedding ({embed:,.3f}B params) {held(layout.embedding_split)}, the LM head "
                 f"({head:,.3f}B) {held(layout.lm_head_split)}")
    logits = (f"[tokens, vocab/{tp}] logits with DeepSpeed's distributed loss" if layout.vocab_parallel_loss else
              "[tokens, vocab] logits " + ("all-gathered " if layout.logits_gathered else "")
              + "and the loss over them whole on every TP rank")
    model = ("--model is a transformers model whose class declares a Hugging Face tp_plan"
             if layout.path == "hf_tp_plan" else
             "--model has no Hugging Face tp_plan (" + ("your own module" if shape.source == "user" else
                                                        f"transformers declares none for {shape.model_type}") + ")"
             if layout.path == "heuristic" else "the config's partition_config / preset_model decides")
    return (f"embedding, LM head and logits as DeepSpeed 0.19.8 AutoTP training holds them: {parts}, {logits} "
            f"({layout.why}; {model})")
