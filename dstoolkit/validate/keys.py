"""The per-key passes of `validate_config` that the JSON Schema alone cannot express: "auto" values (who fills
them), removed / deprecated / renamed / misplaced keys, and keys a ZeRO stage ignores.

Deprecations are declared on the model fields (``json_schema_extra={"deprecated": True, "new_param": ...}``,
dstoolkit.dsconfig.base.deprecated) and read here from the committed JSON Schema, so no pydantic is imported.
"""
from __future__ import annotations

from typing import Any, Optional

from dstoolkit.dsconfig import auto as _auto
from dstoolkit.dsconfig import versions as _versions
from dstoolkit.dsconfig.facts import (BF16_ONLY_KEYS, FP16_ONLY_KEYS, OFFLOAD_KEYS, STAGE3_ONLY_KEYS,
                                      STAGE12_ONLY_KEYS, ZERO_ALIASES, canonical_zero_key)
from dstoolkit.dsconfig import rules as _rules  # noqa: F401  (declares the rules in registry order before rules_optim)
from dstoolkit.dsconfig.registry import zero_stage
from dstoolkit.dsconfig.rules_optim import optimizer_build
from dstoolkit.validate import schema_check as _schema_check
from dstoolkit.validate.findings import Collector, pointer_of

# Names people use for sections DeepSpeed calls something else.
TOP_LEVEL_RENAMES: dict[str, str] = {
    "comms_config": "comms_logger",
    "monitor_config": "top-level tensorboard / wandb / csv_monitor / comet sections",
    "autotuning_config": "autotuning",
    "zero_optimisation": "zero_optimization",
    "zero_config": "zero_optimization",
    "zero": "zero_optimization",
    "lr_scheduler": "scheduler",
    "optim": "optimizer",
    "amp_config": "fp16 / bf16",
    # HF TrainingArguments / Megatron names for DeepSpeed settings (a did-you-mean would pick the wrong key:
    # per_device_train_batch_size is closest to train_batch_size, the global batch)
    "per_device_train_batch_size": "train_micro_batch_size_per_gpu",
    "micro_batch_size": "train_micro_batch_size_per_gpu",
    "global_batch_size": "train_batch_size",
    "max_grad_norm": "gradient_clipping",
    "learning_rate": "optimizer.params.lr",
    "warmup_steps": "scheduler.params.warmup_num_steps",
}

OPTIMIZER_PARAM_NAMES = {"lr", "betas", "eps", "weight_decay", "momentum", "bias_correction", "amsgrad"}
"""optimizer.params keys people put at the top level."""


def schema_keys() -> tuple[set, set]:
    """(top-level keys, zero_optimization keys) of the committed schema."""
    schema = _schema_check.load_schema()
    return set(schema["properties"]), set(schema["$defs"]["ZeroConfig"]["properties"])


def deprecated_keys(where: Optional[str] = "ZeroConfig") -> dict[str, dict]:
    """key -> {"new_param": ..., "use": ...} for the fields declared deprecated in a section of the committed
    schema (None: the top level)."""
    schema = _schema_check.load_schema()
    props = schema["properties"] if where is None else schema["$defs"][where]["properties"]
    return {k: p for k, p in props.items() if isinstance(p, dict) and p.get("deprecated") is True}


def _delete(root: Any, path: tuple) -> None:
    node = root
    for p in path[:-1]:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and p < len(node):
            node = node[p]
        else:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def zero_auto_default(path: tuple) -> Optional[int]:
    """DeepSpeed's default for a zero_optimization size / threshold / count key written "auto", or None for any
    other pointer. DeepSpeed 0.19.8 drops every "auto" before its pydantic ZeRO config sees it
    (runtime/config_utils.py DeepSpeedConfigModel.__init__: ``v != "auto"``), so the field's default applies; for these
    integer knobs the default is a working value (measured with DeepSpeedConfig: sub_group_size "auto" reads as
    1000000000). `stage` is excluded: "auto" there silently turns ZeRO off. Defaults from the committed schema
    (our ZeroConfig mirrors DeepSpeedZeroConfig's)."""
    if len(path) != 2 or path[0] != "zero_optimization" or path[1] == "stage":
        return None
    prop = _schema_check.load_schema()["$defs"]["ZeroConfig"]["properties"].get(str(path[1]), {})
    default = prop.get("default") if isinstance(prop, dict) else None
    return default if isinstance(default, int) and not isinstance(default, bool) else None


def _accelerate_refuses(path: tuple) -> str:
    """Why HF mode refuses an "auto" nothing fills: Accelerate walks the config's nested dicts and raises for every
    "auto" left (accelerate utils/dataclasses.py DeepSpeedPlugin.fill_match, called by Accelerator._prepare_deepspeed
    with the model, as HF Trainer does; measured with accelerate 1.15: "`zero_optimization.sub_group_size` not found
    in kwargs"). An "auto" inside a list is not walked: DeepSpeed then gets it."""
    if any(isinstance(p, int) for p in path):
        return "DeepSpeed gets it as written and fails on it or drops it"
    dotted = ".".join(str(p) for p in path)
    return f"Accelerate raises ValueError ('`{dotted}` not found in kwargs') when HF Trainer prepares the model"


def check_auto(data: dict, clean: dict, mode: str, out: Collector) -> None:
    """"auto" values. strict (DeepSpeed reads the file itself): an error where DeepSpeed fails on it or drops it
    for a default that changes what runs; a warning naming the default on zero_optimization's size / threshold keys
    (`zero_auto_default`), which run as written (OpenRLHF's configs). hf: accepted where HF Trainer / Accelerate
    fill it, an error elsewhere (`_accelerate_refuses`)."""
    for path in _auto.find_auto(data):
        ptr = pointer_of(path)
        if ptr in _auto.DEEPSPEED_OWN_AUTO:
            continue  # DeepSpeed's own "auto" (e.g. pipeline.stages, its default): valid in every mode
        filler = _auto.HF_AUTO_FILLERS.get(ptr)
        default = zero_auto_default(path)
        if mode == "strict" and default is not None:
            out.add("DS110", "warning", ptr, f'"auto" at {ptr}: DeepSpeed drops it and uses its default {default} '
                    "(runtime/config_utils.py DeepSpeedConfigModel)"
                    + (f"; only HF fills it ({filler})" if filler else ""),
                    f'write "{path[1]}": {default} to say what runs, or validate with --mode hf if HF launches '
                    "this config", at_value=True)
        elif mode == "strict":
            who = f"filled by {filler}" if filler else "filled by nothing (HF does not fill this key)"
            out.add("DS110", "error", ptr, f'"auto" at {ptr} is {who}; DeepSpeed itself '
                    + ("drops it and uses the default" if path[0] in ("zero_optimization", "fp16", "bf16")
                       else "fails on it"),
                    "run `dstoolkit resolve` to fill it, or validate with --mode hf if HF launches this config",
                    at_value=True)
        elif filler is None:
            hint = ""
            if path and path[0] == "zero_optimization" and len(path) == 2:
                alias = {v: k for k, v in ZERO_ALIASES.items()}
                if alias.get(str(path[1])) in ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
                    hint = f"HF fills only the spelling {alias[str(path[1])]!r}"
            out.add("DS111", "error", ptr, f'"auto" at {ptr}: HF Trainer/Accelerate do not fill this key, so '
                    + _accelerate_refuses(path), hint or "write the value" + (
                        f" (DeepSpeed's default is {default})" if default is not None else ""), at_value=True)
        # Reported above: keep "auto" out of the type check so it is not reported twice.
        _delete(clean, path)


def check_sections(data: dict, clean: dict, version: str, out: Collector, cpu: bool = False) -> None:
    """Section-level key checks. `cpu`: the ranks are known to be CPU (gloo), where some GPU-only failures train."""
    removed = _versions.removed_top_level(version)
    for key in list(data):
        if key in removed:
            out.add("DS107", "error", f"/{key}", f"section {key!r} was removed from DeepSpeed {version}: "
                    f"{removed[key]}; DeepSpeed refuses the config",
                    "delete the section" + (" or target --deepspeed-version 0.16" if version != "0.16" else ""))
            clean.pop(key, None)
        elif key in _versions.REMOVED_TOP_LEVEL_019:
            clean.pop(key, None)  # valid in 0.16; contents not modelled
    if version == "0.16" and isinstance(data.get("compile"), dict):
        for k in data["compile"]:
            if k not in _versions.COMPILE_KEYS_016:
                out.add("DS101", "error", f"/compile/{k}", f"unknown key {k!r} in compile (DeepSpeed 0.16 accepts "
                        f"{', '.join(sorted(_versions.COMPILE_KEYS_016))})")
        clean.pop("compile", None)
    # top-level keys that belong elsewhere
    _TOP_KEYS, _ZERO_KEYS = schema_keys()
    for key in list(data):
        if key in _TOP_KEYS:
            continue
        if key in TOP_LEVEL_RENAMES:
            out.add("DS101", "error", f"/{key}", f"unknown top-level key {key!r}: DeepSpeed ignores it",
                    f"DeepSpeed reads {TOP_LEVEL_RENAMES[key]}")
            clean.pop(key, None)
        elif key in _ZERO_KEYS and key != "stage":
            out.add("DS104", "error", f"/{key}", f"{key!r} belongs inside zero_optimization; at the top level "
                    "DeepSpeed ignores it", f'move it into "zero_optimization"')
            clean.pop(key, None)
        elif key in OPTIMIZER_PARAM_NAMES:
            out.add("DS104", "error", f"/{key}", f"{key!r} belongs in optimizer.params; at the top level DeepSpeed "
                    "ignores it", 'move it into "optimizer": {"params": {...}}')
            clean.pop(key, None)
        elif key.startswith("_") or key in ("comment", "_comment", "description"):
            out.add("DS101", "warning", f"/{key}", f"key {key!r} is not a DeepSpeed key (looks like a comment); "
                    "DeepSpeed 0.19 ignores it", "fine to keep; strict JSON tools accept it")
            clean.pop(key, None)
    _check_precision_sections(data, clean, version, out)
    _check_zero_keys(data, clean, version, out, cpu)
    for key, prop in deprecated_keys(None).items():
        new = prop.get("new_param")
        if isinstance(data.get(key), dict) and data.get(new) is None:  # DeepSpeed reads it when bf16 is absent / null
            out.add("DS106", "warning", f"/{key}", f"section name {key!r} is the legacy spelling", f'rename to "{new}"')
        elif key in data and data.get(new) is not None:
            out.add("DS105", "warning", f"/{key}", f"{key!r} is ignored because {new!r} is present",
                    f"delete the {key} section")


def _check_precision_sections(data: dict, clean: dict, version: str, out: Collector) -> None:
    for bname in ("bf16", "bfloat16"):
        sec = data.get(bname)
        if not isinstance(sec, dict):
            continue
        for k in sec:
            if k in FP16_ONLY_KEYS:
                if _versions.bf16_foreign_keys_are_errors(version):
                    out.add("DS104", "error", f"/{bname}/{k}", f"{bname}.{k} is an fp16 loss-scaling key; bf16 has "
                            f"fp32's exponent range and needs no loss scaling. DeepSpeed {version} refuses it",
                            f"delete {k} from {bname} (or move it to fp16)")
                else:
                    out.add("DS104", "warning", f"/{bname}/{k}", f"{bname}.{k} is an fp16 loss-scaling key; "
                            f"DeepSpeed {version} ignores it in {bname}", f"delete {k} from {bname}")
                clean.get(bname, {}).pop(k, None) if isinstance(clean.get(bname), dict) else None
    sec = data.get("fp16")
    if isinstance(sec, dict):
        for k in sec:
            if k in BF16_ONLY_KEYS:
                out.add("DS104", "error", f"/fp16/{k}", f"fp16.{k} is a bf16 key; DeepSpeed refuses it in fp16",
                        f"move {k} to bf16")
                clean["fp16"].pop(k, None)
            elif k == "fp16":
                out.add("DS104", "error", "/fp16/fp16", "fp16.fp16 is not a key; the switch is fp16.enabled",
                        'use "enabled": true')
                clean["fp16"].pop(k, None)


def _check_zero_keys(data: dict, clean: dict, version: str, out: Collector, cpu: bool = False) -> None:
    z = data.get("zero_optimization")
    if isinstance(z, bool):
        out.add("DS106", "warning", "/zero_optimization", f"zero_optimization: {str(z).lower()} is the deprecated "
                "boolean form (true = stage 1)", f'use "zero_optimization": {{"stage": {1 if z else 0}}}')
        clean["zero_optimization"] = {"stage": 1 if z else 0}
        return
    if not isinstance(z, dict):
        return
    _TOP_KEYS, _ZERO_KEYS = schema_keys()
    cz = clean.get("zero_optimization") if isinstance(clean.get("zero_optimization"), dict) else {}
    removed = _versions.removed_zero_keys(version)
    canon = {canonical_zero_key(k) for k in z}
    deprecated = deprecated_keys("ZeroConfig")
    for k in z:
        ptr = f"/zero_optimization/{k}"
        if k in removed:
            out.add("DS107", "error", ptr, f"zero_optimization.{k} was removed from DeepSpeed {version}: "
                    f"{removed[k]}; DeepSpeed refuses the config", "delete the key")
            cz.pop(k, None)
        if k in deprecated:
            new = deprecated[k].get("new_param")
            out.add("DS106", "warning", ptr, f"zero_optimization.{k} is deprecated",
                    f"use {deprecated[k].get('use') or new}")
            if new and canonical_zero_key(new) in canon:
                out.add("DS106", "error", ptr, f"zero_optimization.{k} and its replacement {new} are both set; "
                        "DeepSpeed asserts ('Cannot provide deprecated parameter ... and replacing parameter ... "
                        "together')", f"delete {k}")
        if k in OFFLOAD_KEYS - _ZERO_KEYS:
            out.add("DS104", "error", ptr, f"{k!r} belongs inside zero_optimization.offload_optimizer or "
                    "offload_param, not directly in zero_optimization", "move it into the offload section")
            cz.pop(k, None)
        elif k in _TOP_KEYS and k not in _ZERO_KEYS:
            out.add("DS104", "error", ptr, f"{k!r} is a top-level key, not a zero_optimization key",
                    "move it to the top level")
            cz.pop(k, None)
    stage = zero_stage(data)
    if stage is None:
        return
    for k in z:
        c = canonical_zero_key(k)
        ptr = f"/zero_optimization/{k}"
        if c in ("stage", "offload_param", "cpu_offload_param", "zenflow") or c.startswith("zero_"):
            continue  # offload_param / ZeRO++ / ZenFlow have their own rules (DS204, DS208, DS244: at stage 0 it fails)
        if stage == 0 and c not in ("offload_optimizer", "cpu_offload") and z[k] != "auto":
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} has no effect at stage 0 (ZeRO disabled)",
                    "set a stage >= 1 or delete the key")
        elif stage == 0 and c in ("offload_optimizer", "cpu_offload") and _offload_on(z[k]):
            _stage0_optimizer_offload(data, k, version, out, cpu)
        elif stage in (1, 2) and c in STAGE3_ONLY_KEYS:
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} only acts at stage 3; ignored at stage {stage}",
                    "delete it or set stage 3")
        elif stage == 3 and c in STAGE12_ONLY_KEYS:
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} only acts at stages 1-2; ignored at stage 3",
                    "delete it")


def _offload_on(v: Any) -> bool:
    return v is True or (isinstance(v, dict) and v.get("device") not in (None, "none"))


_STAGE0_FIX = 'set "stage": 1 or higher to offload the optimizer, or remove the offload'


def _stage0_optimizer_offload(data: dict, k: str, version: str, out: Collector, cpu: bool = False) -> None:
    """offload_optimizer (or cpu_offload) at ZeRO stage 0. ZeRO is off, so the parameters stay on the accelerator,
    but engine.py zero_use_cpu_optimizer reads only the offload device, whatever the stage: Adam / AdamW / Lion /
    Adagrad from the config become DeepSpeedCPUAdam / CPULion / CPUAdagrad (get_optimizer_configuration,
    _configure_basic_optimizer), whose step asserts "... param is on cuda:0 and must be 'cpu'" (ops/adam/cpu_adam.py)
    at the first step on GPUs; and an optimizer from code must be one of those unless zero_force_ds_cpu_optimizer
    is false (ZeRORuntimeException at initialize). Only CPU ranks (gloo), whose parameters are on the CPU already,
    train: with `cpu` (the caller knows the ranks are CPU) those findings are warnings. Other optimizer classes
    (SGD, Lamb, torch_adam) run on the accelerator: the offload does nothing."""
    ptr = f"/zero_optimization/{k}"
    where = f"zero_optimization.{k} at stage 0: ZeRO is off, so the parameters stay on the accelerator"
    severity = "warning" if cpu else "error"
    trains = "; these ranks are CPU (gloo), where it trains" if cpu else "; only CPU ranks (gloo) train"
    opt = data.get("optimizer")
    if isinstance(opt, dict) and isinstance(opt.get("type"), str):
        params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
        build = optimizer_build(opt["type"], params, data, version)
        if build is not None and build.cls.startswith("DeepSpeedCPU"):
            out.add("DS105", severity, ptr, f"{where}, yet the offload makes DeepSpeed build {build.cls} for "
                    f"optimizer.type {opt['type']!r} (engine.py zero_use_cpu_optimizer ignores the stage): on GPUs its "
                    f"first step asserts ('{build.cls.replace('DeepSpeed', '')} param is on cuda:0 and must be "
                    f"'cpu''){trains}", _STAGE0_FIX)
            return
        if build is not None:
            out.add("DS105", "warning", ptr, f"{where} and {build.cls} runs there: the offload has no effect",
                    _STAGE0_FIX)
            return
    elif opt is None and data.get("zero_force_ds_cpu_optimizer", True) is not False:
        out.add("DS105", severity, ptr, f"{where}, yet DeepSpeed requires the optimizer from code to be "
                "DeepSpeedCPUAdam or DeepSpeedCPULion (ZeRORuntimeException at initialize otherwise, "
                "zero_force_ds_cpu_optimizer), and on GPUs their first step asserts (param is on cuda:0 and must be "
                f"'cpu'){trains}", _STAGE0_FIX)
        return
    out.add("DS105", "warning", ptr, f"zero_optimization.{k} has no effect at stage 0: optimizer offload needs ZeRO "
            "stage 1-3", "set a stage >= 1")
