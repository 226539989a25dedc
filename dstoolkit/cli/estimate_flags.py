"""`dstoolkit estimate`'s --config/--model form (split from dstoolkit.cli.estimate): the RunPlan the flags, the
DeepSpeed JSON and the model fix, after the rules the spec form asks (the layout constraints of `dstoolkit.layout`
on what the flags, the model and the JSON's ZeRO stage fix, naming the flag; the FP8 hardware check for
--precision fp8; `validate_config` with the model's experts and heads; the JSON's sequence_parallel_size as the
DeepSpeed-Ulysses degree, as a spec's training.ulysses), and the refusal of those flags beside a SPEC.yaml. The
JSON's own facts are read through the validated `DeepSpeedConfig` model and win over a flag that contradicts them
(refused, naming both): tensor_parallel.autotp_size is the TP degree (DeepSpeed AutoTP, `estimate_config.autotp_run` says how it is
modelled), the enabled bf16 / fp16 section the precision. --gpus-per-node is bounded by the hardware table's GPUs
per host. No torch import.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Optional

from dstoolkit.cli.estimate_config import (autotp_run, autotp_size, config_model, run_precision, tp_degree,
                                           without_ignored_keys)
from dstoolkit.cli.options import checkpoint_policy
from dstoolkit.validate.engine import validate_config


FLAG_FORM_ONLY: dict[str, tuple[str, str]] = {
    "world_size": ("--world-size", "cluster.nodes x cluster.gpus_per_node"),
    "gpus_per_node": ("--gpus-per-node", "cluster.gpus_per_node"),
    "gpu": ("--gpu", "cluster.gpu"),
    "nvlink_domain_gpus": ("--nvlink-domain-gpus", "cluster.nvlink_domain_gpus"),
    "seq_len": ("--seq-len", "training.seq_len"),
    "tp": ("--tp", "training.tp"), "pp": ("--pp", "training.pp"), "ep": ("--ep", "training.ep"),
    "precision": ("--precision", "training.precision"),
    "checkpoint": ("--checkpoint", "training.activation_checkpointing"),
    "every_k": ("--every-k", "training.checkpoint_every_k"),
    "checkpoint_ratio": ("--checkpoint-ratio", "training.checkpoint_ratio"),
    "flash_attention": ("--no-flash-attention", "training.flash_attention: false"),
    "sequence_parallel": ("--sequence-parallel", "training.sequence_parallel"),
}
"""The flags only the --config form reads (argparse dest -> the flag and the spec field that says the same): a spec
is estimated as written, so beside a SPEC.yaml they are refused (`refuse_layout_flags`)."""


def load_shape(model: str, model_class: Optional[str] = None, model_kwargs: Optional[str] = None):
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.models import get_preset, is_module_ref, load_hf_config, load_model

    path = Path(model)
    if is_module_ref(model) or model_kwargs is not None:
        return load_model(model, model_class, model_kwargs)  # the user's nn.Module (UserModelError: exit 2)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"--model {model!r}: file not found (give a preset name, an HF config.json path or "
                             "the folder holding it)")
        return load_hf_config(path, model_class=model_class)  # a folder: its config.json (models.hf_config_file)
    if model_class is not None:
        raise ValueError(f"--model-class {model_class} needs an HF config.json for --model, not the preset {model!r}")
    return get_preset(model)


def refuse_layout_flags(args) -> None:
    """A SPEC.yaml is estimated as written: a layout flag of the --config form beside it would be ignored."""
    given = [(flag, field) for dest, (flag, field) in FLAG_FORM_ONLY.items() if getattr(args, dest, None) is not None]
    if given:
        raise ValueError(f"{args.spec}: {', '.join(f for f, _ in given)} "
                         f"{'is a flag' if len(given) == 1 else 'are flags'} of the --config/--model form, which "
                         f"a spec does not read (it is estimated as written): edit the spec instead "
                         f"({', '.join(field for _, field in given)}), or drop "
                         f"{'it' if len(given) == 1 else 'them'}")


def _with_flag_defaults(args) -> argparse.Namespace:
    """`args` with the layout flags the command line left out at their defaults (`FLAG_FORM_ONLY`)."""
    defaults = getattr(args, "flag_defaults", {})
    return argparse.Namespace(**{**vars(args), **{dest: defaults.get(dest) for dest in FLAG_FORM_ONLY
                                                   if getattr(args, dest, None) is None}})


def plan_from_args(args):
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.megatron_softmax import fallback_note
    from dstoolkit.runplan import RunPlan

    missing = [f for f, v in (("--config", args.config), ("--model", args.model), ("--world-size", args.world_size)) if v is None]
    if missing:
        raise ValueError(f"give a SPEC.yaml, or all of --config, --model and --world-size (missing: {', '.join(missing)})")
    if args.target:  # it picks among a spec's "auto" layouts; the flags fix this one
        raise ValueError(f"--target {' '.join(args.target)}: chooses among a spec's 'auto' layouts, and the "
                         "--config/--model form has none (its layout is the flags'): drop --target, or estimate a "
                         "SPEC.yaml")
    if args.every_k is not None and args.checkpoint != "every-k":
        raise ValueError(f"--every-k is only used with --checkpoint every-k (got --checkpoint "
                         f"{args.checkpoint or 'none'})")
    gpus_per_node_given = args.gpus_per_node is not None
    tp_given = args.tp is not None
    args = _with_flag_defaults(args)
    text, ds = read_config(args.config)
    if args.world_size <= 0:
        raise ValueError(f"--world-size={args.world_size}: must be > 0")
    if args.seq_len <= 0:  # before RunPlan, whose own check names its field (seq_len=...)
        raise ValueError(f"--seq-len={args.seq_len}: the sequence length must be > 0 (e.g. --seq-len 4096)")
    gpu = _gpu(args.gpu)
    # a host holds at most the hardware table's GPUs per host (8 for HGX boards, 4 for a GB200 tray)
    gpus_per_node = args.gpus_per_node or min(gpu.gpus_per_host or 8, args.world_size)
    _check_gpus_per_host(gpus_per_node, gpu)
    _check_whole_nodes(args.world_size, gpus_per_node, gpus_per_node_given, gpu.gpus_per_host or 8)
    domain = _nvlink_domain(args.nvlink_domain_gpus, gpus_per_node, gpu)
    shape = load_shape(args.model, args.model_class, args.model_kwargs)
    from dstoolkit.models.shape import position_table_problem  # start-up time, as above

    table = position_table_problem(shape, args.seq_len, "--seq-len")
    if table is not None:
        raise ValueError(table)
    # DeepSpeed AutoTP (tensor_parallel.autotp_size): the run's TP degree, in place of a Megatron --tp
    autotp = autotp_size(ds)
    tp = tp_degree(args, autotp, tp_given)
    megatron_tp = 1 if autotp else tp  # what validate_config's rules call --tp (DS223: AutoTP is not --tp)
    # the layout rules on what the flags and the model fix (the config's facts are not read yet: no sequence
    # sharding, ZeRO stage unknown)
    facts, names = _flag_facts(args, shape, domain, gpus_per_node_given, gpu, tp)
    if autotp:
        names["tp"] = f"{args.config}: tensor_parallel.autotp_size"
    _check_flag_layout(facts, names)
    findings = _validate(text, args.config, args.world_size, domain, megatron_tp, args.pp, shape, args.ep,
                         facts.native_moe, cpu=facts.cpu)
    ds = without_ignored_keys(ds, findings)  # what validate passes with a DS101 warning, DeepSpeed ignores
    cfg = config_model(ds, args.world_size, domain, megatron_tp, args.pp)
    # the config's DeepSpeed-Ulysses degree (validate_config checked it against the world and the heads, DS219 /
    # DS226): the layout rules again with it (LY009 ep of the dp it leaves, LY019 seq_len, LY020 kv heads per rank,
    # LY023 with --sequence-parallel), naming the config's key
    ulysses = cfg.sequence_parallel_size or 1
    facts = dataclasses.replace(facts, sp=ulysses)
    names["sp"] = f"{args.config}: sequence_parallel_size"
    _check_flag_layout(facts, names)
    precision = run_precision(args.precision, cfg, args.config)
    fp8_cfg = _check_fp8_hardware(precision, ds, args.config, gpu)
    notes: list[str] = []
    autotp_layout = None  # Megatron tensor parallelism (the plan's autotp)
    if autotp:
        ds, autotp_layout, notes = autotp_run(ds, cfg, args.config, args.world_size, ulysses, shape)
    policy = checkpoint_policy(args)  # --checkpoint / --every-k / --checkpoint-ratio
    plan = RunPlan(shape=shape, ds_config=ds, world_size=args.world_size,
                   gpus_per_node=domain, gpu=gpu,
                   seq_len=args.seq_len, tp=tp, pp=args.pp, ep=args.ep, ulysses=ulysses, checkpoint=policy,
                   flash_attention=args.flash_attention, sequence_parallel=args.sequence_parallel,
                   precision=precision, calibration=calibration_of(args.calibration, args.gpu, precision),
                   autotp=autotp_layout)
    if fp8_cfg is not None:  # the layers `fp8 plan` would swap, refused where it refuses
        plan = _with_fp8_selection(plan, fp8_cfg)
    # the rules that cross a flag with the config's ZeRO stage or ZeRO++ (LY006 pp-zero, LY014 zeropp-cpu); the
    # config's own rules (offload, ZeRO++ stage, hpZ partition DS207 / DS221, batch triad, MoE at ZeRO-3) are
    # validate_config's, checked above. ZeRO++ here is qwZ / qgZ, the parts that run DeepSpeed's quantizer kernels:
    # hpZ alone is collectives only (DS221: hpZ trains on gloo CPU ranks), so it is not handed to LY014.
    view = plan.ds
    names["zero_stage"] = f"{args.config}: zero_optimization.stage"
    names["zeropp"] = f"{args.config}: ZeRO++ qwZ / qgZ (zero_quantized_weights / zero_quantized_gradients)"
    _check_flag_layout(dataclasses.replace(facts, zero_stage=view.zero_stage,
                                           zeropp=view.zeropp_qwz or view.zeropp_qgz), names)
    note = fallback_note(plan)  # a spec's plan gets it from generate.planner.resolve_spec
    return plan, notes + ([note] if note else []), findings


def read_config(path: str) -> tuple[str, dict]:
    """The --config file as `dstoolkit validate` reads it (`validate.config_file.read_config_file`: YAML, binary, a
    top level that is not an object refused with validate's own DS00x finding), as (text, data). The text is what
    validate_config checks, so its DS010 / DS011 notes come out as warnings beside the estimate."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.validate.config_file import read_config_file

    try:
        return read_config_file(path)
    except OSError as exc:
        raise ValueError(f"--config {path!r}: cannot read ({exc.strerror or exc})") from None


def _gpu(name: str):
    """The hardware-table row --gpu names (its error names the flag)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.table import get_gpu

    try:
        return get_gpu(name)
    except ValueError as exc:
        raise ValueError(f"--gpu: {exc}") from None


def _check_gpus_per_host(gpus_per_node: int, gpu) -> None:
    """--gpus-per-node above what one host of --gpu holds (`hardware.hosts.check_gpus_per_host`): the network model
    would price all of them as one host's NVLink."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.hosts import GpusPerHostError, check_gpus_per_host

    try:
        check_gpus_per_host(gpus_per_node, gpu)
    except GpusPerHostError as exc:
        beyond = (f"; NVLink across hosts is --nvlink-domain-gpus, up to {gpu.nvlink_domain_gpus}"
                  if gpu.nvlink_domain_gpus else "")
        raise ValueError(f"--gpus-per-node {gpus_per_node} with --gpu {gpu.name}: {exc.problem} (use "
                         f"--gpus-per-node {gpu.gpus_per_host} or fewer: more GPUs are more nodes of --world-size"
                         f"{beyond})") from None


def _check_whole_nodes(world: int, gpus_per_node: int, given: bool, host: int = 8) -> None:
    """A spec's cluster is nodes x gpus_per_node: --world-size above one node is whole nodes of --gpus-per-node
    (the network model would otherwise price world / gpus_per_node nodes, a fraction)."""
    if world <= gpus_per_node or world % gpus_per_node == 0:
        return
    default = "" if given else f" (the default, min({host}, --world-size))"
    lower = world // gpus_per_node * gpus_per_node
    raise ValueError(f"--world-size={world} is not whole nodes of --gpus-per-node={gpus_per_node}{default} "
                     f"({world} / {gpus_per_node} = {world / gpus_per_node:.3g} nodes): use a --world-size that is "
                     f"a multiple of {gpus_per_node} ({lower} or {lower + gpus_per_node}), or a --gpus-per-node "
                     f"that divides {world}")


def _flag_facts(args, shape, domain: int, gpus_per_node_given: bool, gpu, tp: int):
    """The `LayoutFacts` the flags and the model fix (`tp`: --tp, or the config's AutoTP degree), and the names the
    rules' messages give them (the flags)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.layout import LayoutFacts

    facts = LayoutFacts(world=args.world_size, gpus_per_node=domain, tp=tp, pp=args.pp, ep=args.ep,
                        sp=1, cp=1, seq_len=args.seq_len, megatron_sp=args.sequence_parallel,
                        num_heads=shape.num_attention_heads, kv_heads=shape.kv_heads, is_mla=shape.is_mla,
                        num_layers=shape.num_hidden_layers, num_experts=shape.num_experts if shape.is_moe else 0,
                        framework="deepspeed", pipeline_schedule="1f1b", cpu=gpu.name == "cpu",
                        native_moe=native_moe_of(shape, args.model, args.model_kwargs))
    node = ("--nvlink-domain-gpus" if args.nvlink_domain_gpus is not None else
            "--gpus-per-node" if gpus_per_node_given else "the default --gpus-per-node")
    names = {"world": "--world-size", "gpus_per_node": node, "tp": "--tp", "pp": "--pp", "ep": "--ep",
             "seq_len": "--seq-len", "megatron_sp": "--sequence-parallel", "cpu": "--gpu"}
    return facts, names


NATIVE_MOE_MODULE = "deepspeed_moe"
"""The attribute deepspeed.moe.layer.MoE keeps its MOELayer under (deepspeed 0.19.8 moe/layer.py
`self.deepspeed_moe = MOELayer(...)`): a user module whose linear layers sit below it runs DeepSpeed's own MoE."""


def native_moe_of(shape, model: str, model_kwargs: Optional[str] = None) -> bool:
    """Whether the experts of --model are DeepSpeed's own `deepspeed.moe.layer.MoE` (refused at ZeRO-3, LY010 /
    DS214): a preset's are (dstoolkit.runtime.model builds them with it, fp8.linears names their experts
    `moe.deepspeed_moe.experts...`); a Hugging Face config.json is a transformers model, whose experts are plain
    nn.Modules (docs/generate-and-targets.md: HF MoE models get ZeRO-3), whether it was counted analytically or built;
    the user's module is native only where its linear layers sit below a `deepspeed_moe` attribute
    (NATIVE_MOE_MODULE)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.models import is_module_ref

    if not shape.is_moe:
        return True  # no experts: LY010 has nothing to refuse either way
    if is_module_ref(model) or model_kwargs is not None:
        linears = shape.measured.linears if shape.measured is not None else ()
        return any(NATIVE_MOE_MODULE in g.pattern.split(".") for g in linears)
    return not (Path(model).suffix == ".json" or Path(model).exists())  # as load_shape tells a config from a preset


def _check_flag_layout(facts, names: dict) -> None:
    """The first layout constraint (`dstoolkit.layout`, every code) the facts break, as a ValueError naming the flag,
    its value and the fix (exit 2)."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.layout import first_violation

    v = first_violation(facts, None, names)
    if v is not None:
        raise ValueError(f"{v.message} ({v.fix}; layout rule {v.code}, `dstoolkit validate --explain {v.code}`)")


def _with_fp8_selection(plan, cfg):
    """The plan with the FP8 layer selection `dstoolkit fp8 plan` makes for its model, layout and micro batch
    (`fp8.selection.fp8_selection`: skipped layers stay bf16 for time and memory); a selection `fp8 plan` refuses
    (skips that leave no block in FP8, tokens per micro-batch Transformer Engine refuses) is refused with its
    message."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.fp8.selection import fp8_selection

    names = {"micro_batch": "train_micro_batch_size_per_gpu", "seq_len": "--seq-len"}
    sel = fp8_selection(plan.shape, cfg, micro_batch=plan.ds.micro_batch, seq_len=plan.seq_len, tp=plan.tp,
                        pp=plan.pp, ep=plan.ep, names=names)
    return plan.model_copy(update={"fp8_selection": sel})


def _check_fp8_hardware(precision: str, ds: dict, config: str, gpu):
    """--precision fp8 on a GPU whose tensor cores cannot run the FP8 recipe (`dsconfig.fp8.check_fp8_hardware`,
    the check the spec's training.precision fp8 runs; the recipe: the config's dstoolkit.fp8 section, else
    Transformer Engine's default), or with that section disabled. Returns that `Fp8Config` (None unless fp8)."""
    if precision != "fp8":
        return None
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.dsconfig.fp8 import Fp8Config, check_fp8_hardware

    section = (ds.get("dstoolkit") or {}).get("fp8") if isinstance(ds.get("dstoolkit"), dict) else None
    cfg = Fp8Config.model_validate(section or {})
    if not cfg.enabled:  # no layer in FP8: the bf16 run, which an fp8 estimate would report as FP8
        raise ValueError(f"--precision fp8 with {config}: dstoolkit.fp8.enabled is false, so no layer runs in FP8: "
                         "drop --precision fp8, or enable dstoolkit.fp8")
    problems = check_fp8_hardware(cfg, gpu)
    if problems:
        where = f" (the recipe of {config}: dstoolkit.fp8)" if section else ""
        raise ValueError(f"--precision fp8 with --gpu {gpu.name}{where}: {'; '.join(problems)}")
    return cfg


def _nvlink_domain(domain: Optional[int], gpus_per_node: int, gpu) -> int:
    """The node the network model sees for the flag form: --nvlink-domain-gpus checked by the spec's own rule
    (`spec.cluster.checked_nvlink_domain`), else the host."""
    from dstoolkit.spec.cluster import checked_nvlink_domain
    from dstoolkit.spec.errors import SpecFieldError

    try:
        return checked_nvlink_domain(domain, gpus_per_node, gpu)
    except SpecFieldError as exc:  # its problem names the field: nvlink_domain_gpus=<value>...
        raise ValueError(f"--nvlink-domain-gpus{exc.problem.removeprefix('nvlink_domain_gpus')} ({exc.fix})") from None


class ConfigInvalid(Exception):
    """`validate_config` found errors in --config: nothing is estimated (exit 1)."""

    def __init__(self, path: str, findings: list):
        super().__init__(f"{path}: {len(findings)} finding(s)")
        self.path = path
        self.findings = findings


def _validate(text: str, path: str, world_size: int, gpus_per_node: int, tp: int, pp: int, shape=None,
              ep: int = 1, native_moe: bool = True, cpu: bool = False) -> list:
    """`dstoolkit validate`'s engine on the --config text, with the layout and the model as context (strict mode: no
    "auto"): the model's attention / key-value heads, and for a native MoE model (`native_moe_of`) its experts and
    --ep (so DS213 / DS214 see the MoE the estimate runs; a dense model, or one whose experts are plain modules,
    leaves them to the config's dstoolkit.moe section, as validate and generate.core for a non-native target).

    Returns the warnings; raises `ConfigInvalid` when there is an error."""
    moe = shape is not None and shape.is_moe and native_moe
    findings = validate_config(text, source=path, world_size=world_size, gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                               num_experts=shape.num_experts if moe else None, ep_size=ep if moe else None,
                               num_heads=shape.num_attention_heads if shape is not None else None,
                               num_kv_heads=shape.kv_heads if shape is not None else None, mode="strict", cpu=cpu)
    if any(f.severity == "error" for f in findings):
        raise ConfigInvalid(path, findings)
    return findings


def calibration_of(value, gpu: str, precision: str):
    """--calibration (a file or none), else the packaged reference for the hardware row."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.hardware.calibration import CalibrationInputError, resolve_calibration

    try:
        return resolve_calibration(value, gpu, precision)
    except CalibrationInputError as exc:
        raise calibration_error(exc) from None


def calibration_error(exc: Exception) -> ValueError:
    """A calibration file --calibration names that cannot be used, as the flag's error with the fix (the flag and
    the spec form alike; a file that is there but incomplete already says which fields it needs)."""
    text = str(exc)
    fix = ("--calibration none for the hardware table's nominal rates" if "step_time_fidelity" in text else
           "give a calibration JSON written by benchmarks/step_time_fidelity.py, 'auto' (the spec's own), "
           "'reference' or 'machine' (--gpu cpu), or --calibration none for the hardware table's nominal rates")
    return ValueError(f"--calibration: {text} ({fix})")


class FlagCluster:
    """The cluster facts `generate.costing.fit_verdict` reads, for the --config form: no flag sets a node's host RAM,
    so it is the default for --gpu (`spec.cluster_fields.host_memory_per_node_bytes`); `SOURCE_NOTE` says so."""

    SOURCE_NOTE = "; the --config form has no flag for it: a spec's cluster.host_memory_per_node_gib sets it"
    host_memory_per_node_gib = None  # no flag: the default of spec.cluster_fields applies

    def __init__(self, plan):
        self.gpu_spec = plan.gpu
        self.gpus_per_node = plan.gpus_per_node
