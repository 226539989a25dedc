"""`dstoolkit fp8 plan SPEC|MODEL`: which layers FP8 would swap, memory change per rank, GEMM speed class.

SPEC is a spec YAML (model, cluster.gpu, micro_batch, seq_len, tp/pp/ep are read from it); MODEL is a preset
name (`tiny`, `llama-3-8b`, `deepseek-v3`, ...), a Hugging Face config.json (`--model-class` for a type
transformers builds by class only) or the user's module `package.module:callable` (`--model-kwargs`). The plan
is computed from the model shape, with the same layer rules as `dstoolkit.runtime.fp8.convert`; the linear
layers are the model's own where it was built (transformers on the meta device, or the user's module: torch
is imported only on those paths).

Exit codes: 0 ok, 1 the GPU cannot run the recipe (hardware gate), 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_OK, MODEL_HELP, InputError, add_format_flag,
                                   add_model_class_flag, add_model_kwargs_flag, add_parallel_flags, exit_map,
                                   non_negative_int, positive_int as _positive_int, pydantic_error_text)
from dstoolkit.cli.spec_override import apply_model_class

SPEC_SUFFIXES = (".yaml", ".yml")
DEFAULT_SEQ_LEN = 4096
"""Sequence length for a bare MODEL target (DeepSeek-V3 pre-training used 4K; docs/anchors.md)."""


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("fp8", help="FP8 planning (which layers swap, memory, speed class)",
                              description="FP8 tools. `fp8 plan SPEC|MODEL` lists the linear layers FP8 would swap.")
    sub = p.add_subparsers(dest="fp8_cmd", metavar="CMD")
    sub.required = True
    pl = sub.add_parser("plan", help="layers to swap, memory change per rank, expected GEMM speedup class",
                        description=__doc__.splitlines()[0])
    pl.add_argument("target", metavar="SPEC|MODEL", help="spec YAML, or " + MODEL_HELP)
    add_model_class_flag(pl, model_arg="SPEC|MODEL as a")
    add_model_kwargs_flag(pl, model_arg="SPEC|MODEL as a")
    pl.add_argument("--config", metavar="FILE",
                    help="FP8 settings: JSON/YAML with Fp8Config fields, or a DeepSpeed JSON with dstoolkit.fp8")
    pl.add_argument("--recipe", choices=("delayed", "current", "block", "mxfp8"), help="override fp8.recipe")
    pl.add_argument("--fp8-format", choices=("e4m3", "hybrid"), help="override fp8.format")
    pl.add_argument("--skip-first", type=non_negative_int, metavar="N", help="override fp8.layers.skip_first_layers")
    pl.add_argument("--skip-last", type=non_negative_int, metavar="N", help="override fp8.layers.skip_last_layers")
    pl.add_argument("--gpu", help="hardware-table GPU (default: the spec's cluster.gpu, else H100-SXM)")
    pl.add_argument("--cuda", type=_cuda_version, metavar="VER", help="CUDA version for the hardware gates, e.g. 12.8")
    pl.add_argument("--micro-batch", type=_positive_int, help="sequences per micro-batch (default: spec, else 1)")
    pl.add_argument("--seq-len", type=_positive_int, help=f"tokens per sequence (default: spec, else {DEFAULT_SEQ_LEN})")
    add_parallel_flags(pl, ("tp", "pp", "ep"), default=None, help_suffix=" (default: spec, else 1)")
    pl.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), help="ZeRO stage (default: spec, else 1)")
    add_format_flag(pl)
    pl.set_defaults(run=run)


def _cuda_version(text: str) -> str:
    """argparse type of --cuda: a version the hardware gates can compare (`dsconfig.fp8.parse_version`, MAJOR.MINOR,
    major >= 1, minor >= 0); refused naming the flag and the value, not later as 'cannot read version' or as a
    hardware finding for CUDA -1."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the flag is given
    from dstoolkit.dsconfig.fp8 import parse_version

    try:
        major, minor = parse_version(text)
    except ValueError:
        major, minor = -1, -1
    if major < 1 or minor < 0:
        raise argparse.ArgumentTypeError(f"expected a CUDA version MAJOR.MINOR such as 12.8, got {text!r}")
    return text


def _load_fp8_config(args, spec_fp8: dict | None):
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from pydantic import ValidationError

    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.dsconfig.fp8 import Fp8Config

    data: dict = dict(spec_fp8 or {})
    if args.config:
        path = Path(args.config)
        loaded = _read_settings(path)
        if isinstance(loaded, dict) and "fp8" in loaded and _is_deepspeed_config(loaded):
            raise InputError(f"{path} is a DeepSpeed config with a top-level 'fp8' section, which neither DeepSpeed "
                             'nor dstoolkit reads there: move it under dstoolkit.fp8 ("dstoolkit": {"fp8": {...}})')
        if isinstance(loaded, dict) and isinstance(loaded.get("dstoolkit"), dict) and "fp8" in loaded["dstoolkit"]:
            _check_ds_precision(loaded, path)
            loaded = loaded["dstoolkit"]["fp8"]
        elif isinstance(loaded, dict) and isinstance(loaded.get("fp8"), dict):
            loaded = loaded["fp8"]
        elif isinstance(loaded, dict) and _is_deepspeed_config(loaded):
            raise InputError(f"{path} is a DeepSpeed config without a dstoolkit.fp8 section: add one "
                             '("dstoolkit": {"fp8": {"recipe": "delayed"}}, fields of Fp8Config), or drop --config '
                             "and pass --recipe / --fp8-format / --skip-first / --skip-last")
        if not isinstance(loaded, dict):
            raise InputError(f"{path}: expected a mapping of Fp8Config fields (or dstoolkit.fp8 in a DeepSpeed JSON)")
        data.update(loaded)
    if args.recipe:
        data["recipe"] = args.recipe
    if args.fp8_format:
        data["format"] = args.fp8_format
    layers = dict(data.get("layers") or {})
    if args.skip_first is not None:
        layers["skip_first_layers"] = args.skip_first
    if args.skip_last is not None:
        layers["skip_last_layers"] = args.skip_last
    if layers:
        data["layers"] = layers
    if data.get("recipe") in ("block", "mxfp8") and "format" not in data:
        data["format"] = "e4m3"  # TE's default for its block recipes (Float8BlockScaling, MXFP8BlockScaling)
    try:
        return Fp8Config.model_validate(data)
    except ValidationError as exc:
        msgs = "; ".join(pydantic_error_text(e, "fp8.") for e in exc.errors())
        raise InputError(f"invalid FP8 settings: {msgs}") from None


def _read_settings(path: Path):
    """--config's data: a .json as `dstoolkit validate` reads a DeepSpeed JSON (`validate.config_file`: BOM, hjson
    comments and trailing commas, its DS00x finding when unreadable), anything else as YAML."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.validate.config_file import read_config_file
    from dstoolkit.validate.parse import decode_bytes

    try:
        if path.suffix == ".json":
            return read_config_file(str(path))[1]
        text, problem = decode_bytes(path.read_bytes(), str(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot read FP8 config: {exc.strerror or exc}") from None
    except ValueError as exc:  # validate's finding
        raise InputError(str(exc)) from None
    if problem is not None:
        raise InputError(problem.format_text())
    try:
        # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
        import yaml

        return yaml.safe_load(text)
    except Exception as exc:
        raise InputError(f"{path}: not valid JSON/YAML: {exc}") from None


def _is_deepspeed_config(data: dict) -> bool:
    """Whether a mapping reads as a DeepSpeed JSON (a top-level key of `DeepSpeedConfig` that Fp8Config lacks)."""
    return bool(_deepspeed_keys(data))


def _deepspeed_keys(data: dict) -> list[str]:
    """The top-level keys of `data` that are DeepSpeed's (`spec_kind.deepspeed_keys`) and not Fp8Config's."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.cli.spec_kind import deepspeed_keys
    from dstoolkit.dsconfig.fp8 import Fp8Config

    return [k for k in deepspeed_keys(data) if k not in Fp8Config.model_fields]


def _deepspeed_target_problem(path: Path) -> str | None:
    """The one line for a SPEC|MODEL .json that Hugging Face could not read because it is a DeepSpeed config
    (`_deepspeed_keys`, the test --config uses), naming the file and what fp8 plan takes; None otherwise."""
    try:
        data = _read_settings(path)
    except InputError:
        return None
    if not isinstance(data, dict) or "model_type" in data:
        return None
    keys = [k for k in _deepspeed_keys(data) if k != "dstoolkit"]  # that section alone: as in _check_ds_precision
    if not keys:
        return None
    shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
    fp8 = isinstance(data.get("dstoolkit"), dict) and "fp8" in data["dstoolkit"]
    then = (f"its dstoolkit.fp8 settings go in with --config, e.g. `dstoolkit fp8 plan llama-3-8b --config {path}`"
            if fp8 else "pass the model it trains, e.g. `dstoolkit fp8 plan llama-3-8b`")
    return (f"{path} is a DeepSpeed config (top-level {shown}), not a model: fp8 plan takes SPEC|MODEL, a spec .yaml, "
            f"a preset name, a Hugging Face config.json or package.module:callable; {then}")


def _check_ds_precision(ds: dict, path: Path) -> None:
    """A DeepSpeed JSON (keys beyond dstoolkit) whose dstoolkit.fp8 asks for FP8 must train bf16: the rule `estimate --precision fp8` refuses
    the same config by (`fp8.ds_precision`)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.fp8.ds_precision import fp8_precision_problem, trained_precision_of_dict

    section = ds["dstoolkit"]["fp8"]
    if isinstance(section, dict) and section.get("enabled") is False:
        return  # FP8 off: nothing runs in FP8, the plan says so layer by layer
    if not _is_deepspeed_config({k: v for k, v in ds.items() if k != "dstoolkit"}):
        return  # only the dstoolkit section: a holder of the FP8 settings, no DeepSpeed run to contradict
    problem = fp8_precision_problem(*trained_precision_of_dict(ds), str(path))
    if problem:
        raise InputError(f"dstoolkit.fp8 in {path} asks for FP8 GEMMs, but {problem}, or remove the dstoolkit.fp8 "
                         "section")


def _resolve(args):
    """(shape, gpu, parallel/batch settings, notes) from a spec file or a model name/path."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.models import get_preset, is_module_ref, load_hf_config, load_model
    from dstoolkit.hardware.table import get_gpu

    target = args.target
    path = Path(target)
    notes: list[str] = []
    settings = {"micro_batch": 1, "seq_len": DEFAULT_SEQ_LEN, "tp": 1, "pp": 1, "ep": 1, "zero_stage": 1,
                "activation_checkpointing": "none"}
    gpu_name = "H100-SXM"
    gpu = None
    if path.suffix in SPEC_SUFFIXES:
        # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
        from dstoolkit.models import resolve_model
        from dstoolkit.spec import load_spec

        if args.model_kwargs is not None:
            raise InputError("--model-kwargs is for MODEL package.module:callable; a spec gives model.module_kwargs")
        try:
            spec = load_spec(path)
            apply_model_class(spec, args.model_class, str(path))  # --model-class: as model.model_class
            shape = resolve_model(spec.model, spec.base_dir)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        t = spec.training
        settings["seq_len"] = t.seq_len
        for key in ("micro_batch", "tp", "pp", "ep", "zero_stage"):
            value = getattr(t, key)
            if value == "auto":
                notes.append(f"spec training.{key} is 'auto'; planned with {settings[key]} (pass --{key.replace('_', '-')})")
            else:
                settings[key] = value
        settings["activation_checkpointing"] = t.activation_checkpointing
        gpu = spec.cluster.gpu_spec
        if t.precision != "fp8":
            notes.append(f"spec training.precision is {t.precision!r}: the plan shows what FP8 would change")
    elif args.model_kwargs is not None and not is_module_ref(target):
        raise InputError(f"--model-kwargs is only used with MODEL as package.module:callable (got SPEC|MODEL "
                         f"{target!r}); drop --model-kwargs")
    elif is_module_ref(target):
        try:
            shape = load_model(target, args.model_class, args.model_kwargs, field="MODEL")  # the user's nn.Module
        except ValueError as exc:
            raise InputError(str(exc)) from None
    elif path.suffix == ".json":
        try:
            shape = load_hf_config(path, model_class=args.model_class)
        except (ValueError, OSError) as exc:
            raise InputError(_deepspeed_target_problem(path) or str(exc)) from None
    else:
        if args.model_class is not None:
            raise InputError(f"--model-class {args.model_class} needs an HF config.json, not the preset {target!r}")
        try:
            shape = get_preset(target)
        except ValueError as exc:
            raise InputError(f"{exc}; or pass a spec .yaml, an HF config.json or package.module:callable") from None
    for key in ("micro_batch", "seq_len", "tp", "pp", "ep", "zero_stage"):
        value = getattr(args, key)
        if value is not None:
            settings[key] = value
    if args.gpu or gpu is None:
        try:
            gpu = get_gpu(args.gpu or gpu_name)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    return shape, gpu, settings, notes


def _setting_names(args) -> dict[str, str]:
    """How the errors name tp / pp / ep, seq_len / micro_batch and the layer skips: the flag when one was given, else the spec's field."""
    spec = Path(args.target).suffix in SPEC_SUFFIXES
    names = {key: f"--{key.replace('_', '-')}" if getattr(args, key) is not None else f"training.{key}" if spec
             else f"--{key.replace('_', '-')}" if key in ("seq_len", "micro_batch") else key
             for key in ("tp", "pp", "ep", "seq_len", "micro_batch")}
    for key, flag in (("skip_first_layers", "--skip-first"), ("skip_last_layers", "--skip-last")):
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            names[key] = flag
    return names


@exit_map("fp8 plan")
def run(args) -> int:
    shape, gpu, settings, notes = _resolve(args)
    cfg = _load_fp8_config(args, None)
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.fp8.plan import plan_from_shape

    plan = plan_from_shape(shape, cfg, gpu=gpu, cuda_version=args.cuda, names=_setting_names(args), **settings)
    plan.notes[:0] = notes
    rc = EXIT_FINDINGS if plan.hardware_problems else EXIT_OK
    if args.format == "json":
        d = plan.model_dump()
        d["report"]["swapped_params"] = plan.report.swapped_params
        text = json.dumps(d, indent=2)
    else:
        text = plan.to_table()
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `fp8 plan ... | head`: the reader left; stop quietly (as `ckpt inspect` does)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)
    return rc
