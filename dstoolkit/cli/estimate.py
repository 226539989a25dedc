"""`dstoolkit estimate`: memory per rank, FLOPs, communication, step time and MFU for one run.

    dstoolkit estimate SPEC.yaml [--target T ...] [--format table|json] [--tokens 14.8T [--gpu-hour-price 2.0]]
    dstoolkit estimate --config ds.json --model NAME|config.json --world-size N
                       [--gpus-per-node G] [--gpu NAME] [--seq-len S] [--tp T] [--pp P] [--ep E]
                       [--precision bf16|fp16|fp8|fp32] [--checkpoint none|full|every-k|ratio|selective]
                       [--every-k K] [--checkpoint-ratio R]

The layout flags (--world-size, --gpus-per-node, --gpu, --nvlink-domain-gpus, --seq-len, --tp, --pp, --ep,
--precision, --checkpoint, --every-k, --checkpoint-ratio, --no-flash-attention, --sequence-parallel) belong to the
--config form; beside a SPEC.yaml they are refused (exit 2, naming the spec fields to edit), as --target is
beside --config. The --config form asks the rules the spec form asks: the layout constraints of
`dstoolkit.layout` (LY001-LY024) on what the flags, the model and the JSON's ZeRO stage fix (exit 2, naming the
flag), the FP8 hardware check of `dstoolkit.dsconfig.fp8` for --precision fp8, and `validate_config` with the
model's experts and heads (`dstoolkit.cli.estimate_flags`). The JSON's sequence_parallel_size is the run's
DeepSpeed-Ulysses degree (a spec's training.ulysses; no flag sets it), with the layout rules asked again on it; its
tensor_parallel.autotp_size (DeepSpeed AutoTP) is the TP degree, which a --tp must repeat; its precision (bf16 / fp16
section, else fp32) is the run's, which a --precision must repeat (fp8: FP8 GEMMs over the bf16 section).
--gpus-per-node is at most what one host of --gpu holds (`hardware.table.check_gpus_per_host`).

A spec's "auto" fields are resolved by the sweep (`dstoolkit.generate.planner.resolve_spec`, the same ranking
`dstoolkit sweep` and `dstoolkit generate` use; each choice is printed). A --config JSON is checked first with
`validate_config` (the engine of `dstoolkit validate`): errors stop the estimate (exit 1), warnings are printed
beside it. No torch import. `--target` (repeatable; default: the spec's `targets`) resolves "auto" among the layouts
that launcher runs (`dstoolkit sweep --target`).

A run that does not fit (device memory, or host memory per node with offload: `generate.costing.fit_verdict`, the
sweep's own test) prints why and what would make it fit (the sweep's advice for a spec, `planner.fit_advice` for
--config), no MFU, and exits 1. Host RAM per node is the spec's cluster.host_memory_per_node_gib, else the default
for the GPU; the --config form has no flag for it and applies that default, saying so.

--tokens adds the time and cost to train that many tokens (`dstoolkit.estimate.training_plan`; the spec's
batch_ramp counted step by step). JSON: a `training_plan` object with the stable fields tokens_requested,
tokens_trained, seq_len, gpus, global_batch, steps, ramp_steps, steady_steps, ramp_tokens, steady_tokens,
ramp_wall_s, steady_wall_s, wall_s, wall_days, steady_step_time_s, steady_exposed_comm_share, gpu_hours,
gpu_hours_per_trillion_tokens, gpu_hour_price, cost (null without a price), ramp_step_times and phases (one per
distinct global batch: global_batch, grad_accum, steps, tokens, step_time_s, comm_exposed_s, wall_s).

The optimizer lines follow the plan's engine (`estimate_text.engine_optimizer`; JSON `engine`: framework, engine,
optimizer, implementation, counted_as): DeepSpeed's path (zero12, zero3, bf16_optimizer, ...) and its Adam
implementation, or under Megatron-Core (framework megatron, --target megatron-lm) its DistributedOptimizer /
Megatron-FSDP / HybridDeviceOptimizer and Transformer Engine's FusedAdam, with the DeepSpeed classes the bytes are
counted with as a stand-in (`memory_per_rank_bytes.detail.optimizer_path` and `optimizer_impl` name those).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_OK, MODEL_HELP, InputError, add_calibration_flag,
                                   add_checkpoint_flags, add_format_flag, add_model_class_flag, add_model_kwargs_flag,
                                   add_parallel_flags, add_target_flag, add_training_plan_flags, add_world_flags,
                                   exit_map, input_error, positive_int, targets_of, validation_error_text)
from dstoolkit.cli.estimate_flags import FLAG_FORM_ONLY, ConfigInvalid, FlagCluster, plan_from_args, refuse_layout_flags
from dstoolkit.cli.estimate_text import (GiB, engine_optimizer, offload_notes, offload_placement, pipeline_split_line,
                                         render_findings, render_table)
from dstoolkit.cli.spec_override import apply_model_class
from dstoolkit.hardware.table import known_gpu_names


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("estimate", help="memory / FLOPs / communication / step time / MFU estimate",
                              description=__doc__.splitlines()[0])
    p.add_argument("spec", nargs="?", metavar="SPEC.yaml", help="a training spec (or use --config/--model/--world-size)")
    p.add_argument("--config", metavar="ds.json", help="a DeepSpeed JSON (no 'auto' values)")
    p.add_argument("--model", metavar="NAME|config.json|pkg.mod:fn", help=MODEL_HELP)
    add_model_class_flag(p)
    add_model_kwargs_flag(p)
    add_world_flags(p, gpus_per_node_help="ranks per node, at most what one host of --gpu holds (default: min(that, "
                                          "world size): 8, 4 for GB200 / GB300)")
    p.add_argument("--gpu", default="H100-SXM",
                   help=f"hardware table name ({', '.join(known_gpu_names())}; default H100-SXM)")
    p.add_argument("--nvlink-domain-gpus", type=positive_int, default=None, metavar="D",
                   help="GPUs of the NVLink partition when NVLink joins hosts (GB200/GB300 NVL72: up to 72, hosts of "
                        "--gpus-per-node 4); the spec's cluster.nvlink_domain_gpus")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (default 4096)")
    add_parallel_flags(p, ("tp", "pp", "ep"))
    p.add_argument("--precision", choices=("bf16", "fp16", "fp8", "fp32"), default=None,
                   help="the config's (its enabled bf16 / fp16 section, else fp32), which a --precision must "
                        "repeat; fp8 (FP8 GEMMs over bf16) needs the bf16 section")
    add_checkpoint_flags(p)
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                   help="store the s^2 attention scores (math attention)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with --tp)")
    # The layout flags default to None, so that a flag given beside a SPEC.yaml is seen (and refused) even when it
    # repeats its default; the --config form fills the defaults in from `flag_defaults` (`_with_flag_defaults`).
    p.set_defaults(flag_defaults={dest: p.get_default(dest) for dest in FLAG_FORM_ONLY},
                   **{dest: None for dest in FLAG_FORM_ONLY})
    add_calibration_flag(p,
                         help="measured rates for the step time: a benchmarks/step_time_fidelity.py calibration "
                              "file, 'reference' (the packaged measurement, --gpu cpu only), 'machine' (this "
                              "machine's probed CPU, --gpu cpu only) or 'none'; 'auto' (default): the spec's "
                              "cluster.calibration, else DSTOOLKIT_CALIBRATION, else 'machine' for --gpu cpu, else "
                              "none (the hardware table's nominal rates)")
    add_training_plan_flags(p)
    add_target_flag(p)
    add_format_flag(p)
    p.set_defaults(run=run)


def _err(msg: str) -> int:
    return input_error("estimate", msg)


def _fmt_bytes(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _plan_from_spec(path: str, calibration_arg=None, model_class=None, target=None):
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.planner import resolve_spec
    from dstoolkit.hardware.calibration import calibration_label
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.models.resolve import resolve_spec_model
    from dstoolkit.spec import load_spec

    from dstoolkit.cli.spec_kind import deepspeed_config_problem
    from dstoolkit.generate.io import refuse_megatron_lm_on_cpu

    problem = deepspeed_config_problem(path, "estimate SPEC")
    if problem:
        raise InputError(problem)  # before the spec loader's "required field is missing" + one "unknown key" per key
    spec = load_spec(path, targets=target or ())  # --target: the run's targets for the spec's engine rules
    refuse_megatron_lm_on_cpu(spec, from_flag=bool(target))  # as every verb that loads the spec
    apply_model_class(spec, model_class, path)  # --model-class: as the spec's model.model_class
    if calibration_arg is not None:  # --calibration overrides cluster.calibration (a path relative to the cwd)
        spec.cluster.calibration = _checked_calibration(calibration_arg, spec)
    shape = resolve_spec_model(spec)  # with tp / ep against the model's heads and experts, at the spec's line
    targets = targets_of(argparse.Namespace(target=target), spec)
    resolved = resolve_spec(spec, shape, targets)  # "auto" fields: the sweep's best layout
    label = calibration_label(spec)
    advice = None
    if not resolved.fits:  # what would make it fit: the sweep's own advice (as `dstoolkit sweep` prints)
        # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
        from dstoolkit.generate.sweep import what_would_fit

        advice = what_would_fit(spec, shape, None, targets)
    from dstoolkit.generate.costing import batch_ramp_of_targets

    # the ramp the targets' files train with (none for HF Trainer / Accelerate): what --tokens counts
    return resolved.plan, resolved.assumptions, label, batch_ramp_of_targets(spec, targets), advice, spec.cluster


def _checked_calibration(value: str, spec) -> str:
    """--calibration beside a SPEC.yaml, as the spec's cluster.calibration (a path relative to the cwd, not the
    spec), read here so that a file it cannot use is reported against the flag, not a spec key the spec may not
    have."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.cli.estimate_flags import calibration_error
    from dstoolkit.hardware.calibration import (MACHINE, NONE_VALUES, REFERENCE, CalibrationInputError,
                                                calibration_path, resolve_calibration)

    if str(value).strip().lower() in (*NONE_VALUES, REFERENCE, MACHINE):  # words, not files (as the flag form)
        try:  # a word the spec's GPU row cannot use ('reference' without a packaged file, 'machine' on a GPU)
            calibration_path(value, spec.cluster.gpu, probe=False)
        except CalibrationInputError as exc:
            raise calibration_error(exc) from None
        return value
    path = str(Path(value).expanduser().resolve())
    try:  # probe=False: "machine" is only read from the cache here; the estimate itself probes
        resolve_calibration(path, spec.cluster.gpu, spec.training.precision, probe=False)
    except CalibrationInputError as exc:
        raise calibration_error(exc) from None
    return path


def _calibration_label(value, gpu) -> str:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.calibration import calibration_path, path_label

    return path_label(calibration_path(value, gpu))


def training_plan_from_args(args, plan, ramp, max_estimates=None):
    """The `TrainingPlan` for --tokens / --gpu-hour-price (None without --tokens); `TrainingPlanError` (a
    ValueError naming the flag) on bad input. estimate, sweep and generate all read the flags here."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.training_plan import check_gpu_hour_price, parse_token_count, plan_training

    price = check_gpu_hour_price(args.gpu_hour_price)
    if args.tokens is None:
        if price is not None:
            raise ValueError("--gpu-hour-price needs --tokens (the cost is GPU-hours x price; e.g. --tokens 14.8T)")
        return None
    return plan_training(plan, parse_token_count(args.tokens), ramp=ramp, gpu_hour_price=price,
                         max_estimates=max_estimates)


@exit_map("estimate")
def run(args) -> int:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from pydantic import ValidationError

    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate import estimate_run
    from dstoolkit.estimate.flops import plan_flops_per_token
    from dstoolkit.generate.costing import fit_verdict

    findings: list = []
    try:
        if args.spec:
            if args.config or args.model or args.model_kwargs:
                return _err("give either SPEC.yaml or --config/--model/--world-size, not both")
            refuse_layout_flags(args)
            plan, assumptions, cal_label, ramp, advice, cluster = _plan_from_spec(
                args.spec, args.calibration, args.model_class, args.target)
        else:
            plan, assumptions, findings = plan_from_args(args)
            ramp = advice = None
            cluster = FlagCluster(plan)  # no flag sets host RAM: the default for --gpu (FlagCluster says so)
            cal_label = _calibration_label(args.calibration, plan.gpu.name)
        # what the model reader decided (text_config used, vision tower apart, quantization_config ignored)
        assumptions = list(assumptions) + [f"model: {n}" for n in plan.shape.notes]
        offload = offload_placement(plan)  # what is offloaded where (the header, JSON `offload`)
        assumptions += offload_notes(offload)
        est = estimate_run(plan)
        # the sweep's fit test (generate.costing.fit_verdict): the device peak AND the node's offloaded states
        verdict = fit_verdict(est.memory.total, plan.gpu, est.host_memory_per_rank_bytes, plan.gpus_per_node, cluster,
                              "" if args.spec else FlagCluster.SOURCE_NOTE)
        if not verdict.fits and advice is None:
            # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
            from dstoolkit.generate.planner import fit_advice

            advice = fit_advice(plan, cluster)
        fpt = plan_flops_per_token(plan)  # which FLOPs accounting the estimate used
        train_plan = training_plan_from_args(args, plan, ramp)  # --tokens / --gpu-hour-price, or None
        # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
        from dstoolkit.estimate.checkpoint_bytes import checkpoint_bytes, render_checkpoint_bytes

        ckpt_bytes = checkpoint_bytes(plan)  # what save_checkpoint writes, per rank and in total
    except ConfigInvalid as exc:
        for f in exc.findings:
            print(f.format_text(), file=sys.stderr)
        n_err = sum(f.severity == "error" for f in exc.findings)
        print(f"dstoolkit estimate: {exc.path}: {n_err} error(s) from validate_config: not estimated "
              "(`dstoolkit validate` shows the same findings)", file=sys.stderr)
        return EXIT_FINDINGS
    except ValidationError as exc:
        return _err(validation_error_text(exc) or str(exc))
    except ValueError as exc:
        return _err(str(exc))
    from dstoolkit.layout import pipeline_split, stage_layers

    stage_split = stage_layers(plan.shape.num_hidden_layers, plan.pp, pipeline_split(plan.framework))
    if args.format == "json":
        out = est.to_json()
        out["assumptions"] = assumptions
        out["step_time_calibration"] = cal_label
        out["validation_warnings"] = [f.model_dump() for f in findings]
        out["engine"] = engine_optimizer(plan, est.memory)  # the optimizer as the plan's engine builds it
        out["offload"] = offload  # optimizer / params: cpu, nvme or null; nvme_counted_as_host
        out["checkpoint_bytes"] = ckpt_bytes.to_json()  # dstoolkit.estimate.checkpoint_bytes
        if plan.pp > 1:  # the split the estimate assumed (pipeline_split_line)
            out["pipeline_stage_layers"] = list(stage_split)
        out["fits"] = verdict.fits  # device and host RAM (est.to_json's own is the device test alone)
        out["device_fits"] = verdict.device_fits
        out["host_memory"] = {"per_node_bytes": verdict.host_node_bytes,
                              "node_capacity_bytes": verdict.host_capacity_bytes, "capacity_source": verdict.host_source,
                              "fits": verdict.host_fits}
        out["flops_path"] = {"path": fpt.path, "detail": fpt.detail, "dense_per_token": fpt.dense,
                             "attention_per_token": fpt.attention}
        if train_plan is not None:
            out["training_plan"] = train_plan.to_json()
        if not verdict.fits:
            out["mfu"] = None  # a run that cannot run has no utilisation
            out["what_would_fit"] = advice or []
        print(json.dumps(out, indent=2))
    else:
        print("\n".join([render_table(plan, est, assumptions, verdict), *pipeline_split_line(plan, stage_split),
                         f"FLOPs path: {fpt.path}: {fpt.detail}", f"step time from {cal_label}",
                         *render_findings(findings)]))
        print(render_checkpoint_bytes(ckpt_bytes))
        if train_plan is not None:
            # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
            from dstoolkit.estimate.training_plan import render_training_plan

            print("\n".join(["", *render_training_plan(train_plan)]))
        if not verdict.fits:
            if not verdict.host_fits:
                print("\ndoes not fit: " + verdict.host_reason(plan.gpus_per_node))
            print("\ndoes not fit: " + ("what would make it fit:" if advice else
                                        "nothing tried here makes it fit (ZeRO-3, offload, recompute, micro-batch 1, "
                                        "more GPUs)"))
            for a in advice or []:
                print(f"  - {a}")
    return EXIT_OK if verdict.fits else EXIT_FINDINGS
