"""`dstoolkit resolve CONFIG --world-size N --hidden-size H [...] -o OUT`: fill Hugging Face "auto" values
the way HF Trainer does (see dstoolkit.dsconfig.auto), so DeepSpeed can be run on the config directly.

Refuses to overwrite OUT without --force, and an OUT that is a folder (or ends with a separator). A flag value that
is not a finite number (nan, inf) or a negative --warmup-steps is refused naming the flag; optimizer flags are checked
with the config rules they fill (--lr, --betas, --eps, --weight-decay: DS230; --max-grad-norm: DS231). Exit 0 when
everything was filled and the result validates, 1 when something could not be filled (OUT is written with those
"auto" values left for HF Trainer to fill) or when the result has errors (OUT is not written: DeepSpeed would
refuse it), 2 on bad input (flag values included) and when a flag contradicts a value CONFIG fixes (not "auto"),
as HF Trainer refuses it (one line per key: set the key to "auto" or drop the flag; OUT is not written).
"""
from __future__ import annotations

import json
import math
import os
import sys

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_INPUT, EXIT_OK, InputError, add_force_flag, add_format_flag,
                                   add_out_flag, add_parallel_flags, add_world_flags, exit_map, positive_int)
from dstoolkit.cli.schema import write_atomic
from dstoolkit.common.atomic import check_output_path
from dstoolkit.common.paths import A_FOLDER, input_file_problem
from dstoolkit.dsconfig.auto import HF_MUST_MATCH_FLAGS, resolve_auto
from dstoolkit.dsconfig.rules_optim import (GRADIENT_CLIPPING_FIX, adam_value_problems, adam_values_fix,
                                            gradient_clipping_problem)
from dstoolkit.validate.engine import validate_config
from dstoolkit.validate.parse import decode_bytes, parse_text


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("resolve", help='fill HF "auto" values in a DeepSpeed config',
                              description='Fill every "auto" the way HF Trainer does: batch triad from the world '
                                          "size, reduce_bucket_size = h^2, stage3_prefetch_bucket_size = 0.9 h^2, "
                                          "stage3_param_persistence_threshold = 10 h, optimizer/scheduler values "
                                          "from the flags (HF defaults otherwise).")
    p.add_argument("config", metavar="CONFIG")
    add_out_flag(p, required=True, metavar="OUT", help="where to write the resolved config", dest="output")
    add_force_flag(p, help="overwrite OUT if it exists")
    add_world_flags(p, required=True, gpus_per_node=False, world_help="total ranks")
    p.add_argument("--hidden-size", type=positive_int, help="model hidden size (ZeRO bucket sizes)")
    add_parallel_flags(p, ("tp", "pp"))
    p.add_argument("--micro-batch", type=positive_int, help="per-GPU micro batch (HF per_device_train_batch_size)")
    p.add_argument("--grad-accum", type=positive_int, help="gradient accumulation steps")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), help="Adam betas")
    p.add_argument("--eps", type=float, help="Adam epsilon")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--max-grad-norm", type=float, help="gradient clipping")
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--total-steps", type=positive_int, help="total optimizer steps (scheduler total_num_steps)")
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), help="fills fp16/bf16 enabled")
    add_format_flag(p)
    p.set_defaults(run=run)


_VALUE_FLAGS = {k.removeprefix("optimizer.params."): f for k, f in HF_MUST_MATCH_FLAGS.items()
                if k.startswith("optimizer.params.")}
"""optimizer.params key -> the flag that fills it (lr, betas, eps, weight_decay)."""


def _flag_value(v) -> str:
    return " ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


_FLOAT_FLAGS = {**_VALUE_FLAGS, "max_grad_norm": "--max-grad-norm"}
"""argparse dest -> flag, for every float flag (argparse's float() takes nan and inf)."""


def _check_flag_numbers(args) -> None:
    """Refuse a float flag that is not a finite number, and a negative --warmup-steps, naming the flag: they would be
    filled into OUT (JSON cannot hold nan / inf, and the resolved config's own finding would blame CONFIG)."""
    for dest, flag in _FLOAT_FLAGS.items():
        value = getattr(args, dest)
        values = value if isinstance(value, (list, tuple)) else [value]
        for i, v in enumerate(values):
            if v is not None and not math.isfinite(v):
                which = f"--betas B{i + 1}" if dest == "betas" else flag
                raise InputError(f"{which} {v}: not a finite number; JSON cannot hold it and DeepSpeed would not "
                                 f"train with it: give {which} a finite number")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise InputError(f"--warmup-steps {args.warmup_steps}: must be >= 0 (optimizer steps of learning-rate "
                         "warm-up; 0 is raised to 1 as transformers does)")


def _check_value_flags(args) -> None:
    """Refuse flag values that are not numbers a config can hold (`_check_flag_numbers`), then optimizer / clipping
    flag values the config rules DS230 / DS231 refuse (the same checks, asked of dstoolkit.dsconfig.rules_optim),
    naming the flag: they would be written into OUT."""
    _check_flag_numbers(args)
    given = {k: getattr(args, k) for k in _VALUE_FLAGS if getattr(args, k) is not None}
    problems = adam_value_problems(given)
    if problems:
        listed = ", ".join(f"{_VALUE_FLAGS[p.key]} {p.value!r}" if p.index is None
                           else f"--betas B{p.index + 1} {p.value!r}" for p in problems)
        fix = adam_values_fix(problems, _VALUE_FLAGS.__getitem__, _flag_value)
        raise InputError(f"{listed}: torch.optim.AdamW raises ValueError('{problems[0].torch_error}') "
                         f"(torch/optim/adam.py; rule DS230): {fix}")
    problem = gradient_clipping_problem(args.max_grad_norm)
    if problem:
        raise InputError(f"--max-grad-norm {problem} (rule DS231): {GRADIENT_CLIPPING_FIX}")


def _check_output_path(output: str) -> None:
    """OUT must name a file: not a folder, and one that can be written (`check_output_path`, the check the write
    itself makes: asked here, before any work, to name -o)."""
    if os.path.isdir(output):
        raise InputError(f"-o {output} {A_FOLDER}: give the path of the config file to write, e.g. "
                         f"{os.path.join(output, 'ds_config.json')}")
    check_output_path(output, name=f"-o {output}", suggest="ds_config.json")


@exit_map("resolve")
def run(args) -> int:
    problem = input_file_problem(args.config)
    if problem:
        raise InputError(f"{args.config}: {problem}")
    _check_output_path(args.output)
    _check_value_flags(args)
    if os.path.exists(args.output) and not args.force:
        raise InputError(f"{args.output} exists; pass --force to overwrite it")
    with open(args.config, "rb") as fh:
        text, problem = decode_bytes(fh.read(), args.config)
    if problem is not None:
        print(problem.format_text(), file=sys.stderr)
        return EXIT_INPUT
    parsed = parse_text(text, args.config)
    if parsed.fatal:
        for f in parsed.findings:  # a YAML file: DS006 alone (validate.parse drops the hjson reader's notes)
            print(f.format_text(), file=sys.stderr)
        return EXIT_INPUT
    report = resolve_auto(parsed.data, world_size=args.world_size, hidden_size=args.hidden_size, tp=args.tp,
                          pp=args.pp, micro_batch=args.micro_batch, grad_accum=args.grad_accum, lr=args.lr,
                          betas=tuple(args.betas) if args.betas else None, eps=args.eps,
                          weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
                          warmup_steps=args.warmup_steps, total_steps=args.total_steps, precision=args.precision)
    if report.mismatches:  # HF Trainer refuses these (transformers integrations/deepspeed.py fill_match)
        for m in report.mismatches:
            print(m.line(args.config), file=sys.stderr)
        print(f"{args.output} not written: HF Trainer refuses a DeepSpeed config value that mismatches its "
              f"TrainingArguments (transformers integrations/deepspeed.py trainer_config_finalize); fix the "
              f"{len(report.mismatches)} value(s) above and rerun", file=sys.stderr)
        return EXIT_INPUT
    # errors of the resolved config, named at CONFIG (the input holds them, or the values filled into it):
    # a config DeepSpeed would refuse is not written
    findings = [f for f in validate_config(report.config, source=args.config, world_size=args.world_size,
                                           tp=args.tp, pp=args.pp) if f.severity == "error" and f.code != "DS110"]
    if not findings:
        write_atomic(args.output, json.dumps(report.config, indent=2) + "\n", name=f"-o {args.output}")
    if args.format == "json":
        print(json.dumps({"output": None if findings else args.output,
                          "filled": [{"pointer": p, "value": v, "source": s} for p, v, s in report.filled],
                          "unfilled": [{"pointer": p, "reason": r} for p, r in report.unfilled],
                          "findings": [f.model_dump() for f in findings]}, indent=2))
    else:
        for p, v, s in report.filled:
            print(f"filled   {p} = {json.dumps(v)}  ({s})")
        for p, r in report.unfilled:
            print(f"UNFILLED {p}: {r}")
        for f in findings:
            print(f.format_text())
        if findings:
            print(f"{args.output} not written: the resolved config has {len(findings)} error(s) DeepSpeed would refuse; "
                  f"fix {args.config} (or the flags that filled it) and rerun", file=sys.stderr)
        else:
            print(f"wrote {args.output}: {len(report.filled)} filled, {len(report.unfilled)} not filled",
                  file=sys.stderr)
    return EXIT_FINDINGS if report.unfilled or findings else EXIT_OK
