"""`validate_config`: the public entry point. Parses (when given text), checks every key against the schema,
runs every cross-field rule, and returns a list of `Finding`s. It never raises.

Order of checks: syntax (parse.py) -> "auto" (auto.py) -> removed / deprecated / misplaced / stage-ignored keys
-> pydantic schema (unknown keys with "did you mean", types, ranges) -> cross-field rules (rules.py).
"""
from __future__ import annotations

import copy
from typing import Any, Literal, Optional, Union

from dstoolkit.dsconfig import auto as _auto
from dstoolkit.dsconfig import rules as _rules
from dstoolkit.validate import schema_check as _schema_check
from dstoolkit.dsconfig import versions as _versions
from dstoolkit.dsconfig.facts import (BF16_ONLY_KEYS, FP16_ONLY_KEYS, OFFLOAD_KEYS, STAGE3_ONLY_KEYS,
                                    STAGE12_ONLY_KEYS, ZERO_ALIASES, canonical_zero_key)
from dstoolkit.validate.findings import Finding, pointer_of
from dstoolkit.validate.parse import ParseResult, parse_text

# Deprecated zero_optimization keys -> replacement (deepspeed runtime/zero/config.py json_schema_extra).
DEPRECATED_ZERO: dict[str, str] = {
    "cpu_offload": "offload_optimizer",
    "cpu_offload_param": "offload_param",
    "cpu_offload_use_pin_memory": "offload_param/offload_optimizer pin_memory",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
}
# Deprecated key -> the new key DeepSpeed copies it into (it asserts when both are given).
_DEPRECATED_CONFLICT = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param",
                        "stage3_gather_fp16_weights_on_model_save": "gather_16bit_weights_on_model_save"}
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
}


def _schema_keys() -> tuple[set, set]:
    schema = _schema_check.load_schema()
    return set(schema["properties"]), set(schema["$defs"]["ZeroConfig"]["properties"])


_OPTIMIZER_PARAM_NAMES = {"lr", "betas", "eps", "weight_decay", "momentum", "bias_correction", "amsgrad"}


def validate_config(cfg: Union[dict, str], *, source: str = "<config>", world_size: Optional[int] = None,
                    gpus_per_node: Optional[int] = None, tp: int = 1, pp: int = 1,
                    num_experts: Optional[int] = None, ep_size: Optional[int] = None,
                    mode: Literal["strict", "hf"] = "strict", deepspeed_version: str = "0.19") -> list[Finding]:
    """Validate a DeepSpeed config and return every finding (never raises).

    Args:
        cfg: raw file text (positions are then reported) or an already-parsed dict.
        source: file name shown in findings.
        world_size: total ranks; enables the batch-triad equality check (dp = world_size / (tp * pp)).
        gpus_per_node: enables the ZeRO++ hpZ partition check.
        tp, pp: tensor / pipeline parallel sizes.
        num_experts, ep_size: MoE facts (override the config's ``dstoolkit.moe`` section).
        mode: "strict" reports every "auto"; "hf" accepts "auto" where HF Trainer/Accelerate fill it.
        deepspeed_version: "0.19" (default) or "0.16" (also "0.19.8" style).

    Returns:
        Findings sorted by position. Errors mean DeepSpeed would fail or silently misbehave.
    """
    try:
        return _validate(cfg, source, world_size, gpus_per_node, tp, pp, num_experts, ep_size, mode,
                         deepspeed_version)
    except Exception as exc:  # the contract is "never raises": report instead
        return [Finding(file=source, pointer="", severity="error", code="DS009",
                        message=f"validator could not check this input ({type(exc).__name__}: {exc})"[:500])]


class _Collector:
    def __init__(self, source: str, parsed: Optional[ParseResult]):
        self.source = source
        self.parsed = parsed
        self.findings: list[Finding] = []
        self.seen: set[tuple[str, str]] = set()

    def position(self, pointer: str, value: bool = False) -> tuple[Optional[int], Optional[int]]:
        if self.parsed is None:
            return None, None
        table = self.parsed.value_positions if value else self.parsed.positions
        p = pointer
        while True:
            if p in table:
                return table[p]
            if p in self.parsed.positions:
                return self.parsed.positions[p]
            if not p:
                return 1, 1
            p = p.rsplit("/", 1)[0]

    def add(self, code: str, severity: str, pointer: str, message: str, suggestion: Optional[str] = None,
            at_value: bool = False) -> None:
        if (code, pointer, severity) in self.seen:
            return
        self.seen.add((code, pointer, severity))
        line, col = self.position(pointer, at_value)
        self.findings.append(Finding(file=self.source, pointer=pointer, line=line, column=col, severity=severity,
                                     code=code, message=message, suggestion=suggestion))


def _validate(cfg, source, world_size, gpus_per_node, tp, pp, num_experts, ep_size, mode, version) -> list[Finding]:
    parsed: Optional[ParseResult] = None
    if isinstance(cfg, (bytes, bytearray)):
        cfg = bytes(cfg).decode("utf-8", errors="replace")
    if isinstance(cfg, str):
        parsed = parse_text(cfg, source)
        if parsed.fatal:
            return parsed.findings
        data = parsed.data
    elif isinstance(cfg, dict):
        problems: list[Finding] = []
        data = _normalize(cfg, "", 0, source, problems)
        if any(f.code == "DS003" for f in problems):
            return problems
    else:
        return [Finding(file=source, pointer="", severity="error", code="DS007",
                        message=f"config must be a JSON object (dict) or its text, got {type(cfg).__name__}")]
    out = _Collector(source, parsed)
    if parsed is not None:
        out.findings.extend(parsed.findings)
    else:
        out.findings.extend(problems)
    try:
        version = _versions.normalize_version(version)
    except ValueError as exc:
        return [Finding(file=source, pointer="", severity="error", code="DS009", message=str(exc))]
    if mode not in ("strict", "hf"):
        return [Finding(file=source, pointer="", severity="error", code="DS009",
                        message=f"mode must be 'strict' or 'hf', got {mode!r}")]
    ctx = _rules.RuleContext(world_size=world_size, gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                             num_experts=num_experts, ep_size=ep_size, mode=mode, deepspeed_version=version)
    clean = copy.deepcopy(data)
    _check_auto(data, clean, mode, out)
    _check_sections(data, clean, version, out)
    _check_schema(clean, version, out)
    for v in _rules.run_rules(data, ctx):
        out.add(v.code, v.severity, v.pointer, v.message, v.suggestion)
    return sorted(out.findings, key=lambda f: (f.line or 0, f.column or 0, f.code))


def _normalize(node: Any, ptr: str, depth: int, source: str, problems: list) -> Any:
    """Make a caller's dict look like parsed JSON: str keys, lists for tuples, str() for other objects; note
    non-finite floats (DS002) and excessive depth (DS003) instead of failing later."""
    from dstoolkit.validate.parse import MAX_DEPTH

    if depth > MAX_DEPTH:
        if not any(f.code == "DS003" for f in problems):
            problems.append(Finding(file=source, pointer=ptr, severity="error", code="DS003",
                                    message=f"nesting deeper than {MAX_DEPTH} levels; not a DeepSpeed config"))
        return None
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            key = k if isinstance(k, str) else str(k)
            child = ptr + "/" + key.replace("~", "~0").replace("/", "~1")
            out[key] = _normalize(v, child, depth + 1, source, problems)
        return out
    if isinstance(node, (list, tuple)):
        return [_normalize(v, f"{ptr}/{i}", depth + 1, source, problems) for i, v in enumerate(node)]
    if isinstance(node, float) and (node != node or node in (float("inf"), float("-inf"))):
        problems.append(Finding(file=source, pointer=ptr, severity="error", code="DS002",
                                message=f"{ptr or '/'} = {node!r}: not a finite number; JSON cannot hold it and "
                                        "DeepSpeed's hjson reader would read the literal as a string",
                                suggestion="write a finite number"))
        return node
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    return str(node)


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


def _check_auto(data: dict, clean: dict, mode: str, out: _Collector) -> None:
    for path in _auto.find_auto(data):
        ptr = pointer_of(path)
        filler = _auto.HF_AUTO_FILLERS.get(ptr)
        if mode == "strict":
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
                    "DeepSpeed drops it (default applies) or fails on it", hint or "write the value", at_value=True)
        # Reported above: keep "auto" out of the type check so it is not reported twice.
        _delete(clean, path)


def _check_sections(data: dict, clean: dict, version: str, out: _Collector) -> None:
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
    _TOP_KEYS, _ZERO_KEYS = _schema_keys()
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
        elif key in _OPTIMIZER_PARAM_NAMES:
            out.add("DS104", "error", f"/{key}", f"{key!r} belongs in optimizer.params; at the top level DeepSpeed "
                    "ignores it", 'move it into "optimizer": {"params": {...}}')
            clean.pop(key, None)
        elif key.startswith("_") or key in ("comment", "_comment", "description"):
            out.add("DS101", "warning", f"/{key}", f"key {key!r} is not a DeepSpeed key (looks like a comment); "
                    "DeepSpeed 0.19 ignores it", "fine to keep; strict JSON tools accept it")
            clean.pop(key, None)
    _check_precision_sections(data, clean, version, out)
    _check_zero_keys(data, clean, version, out)
    if isinstance(data.get("bfloat16"), dict) and "bf16" not in data:
        out.add("DS106", "warning", "/bfloat16", "section name 'bfloat16' is the legacy spelling", 'rename to "bf16"')
    elif "bfloat16" in data and "bf16" in data:
        out.add("DS105", "warning", "/bfloat16", "'bfloat16' is ignored because 'bf16' is present",
                "delete the bfloat16 section")


def _check_precision_sections(data: dict, clean: dict, version: str, out: _Collector) -> None:
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


def _check_zero_keys(data: dict, clean: dict, version: str, out: _Collector) -> None:
    z = data.get("zero_optimization")
    if isinstance(z, bool):
        out.add("DS106", "warning", "/zero_optimization", f"zero_optimization: {str(z).lower()} is the deprecated "
                "boolean form (true = stage 1)", f'use "zero_optimization": {{"stage": {1 if z else 0}}}')
        clean["zero_optimization"] = {"stage": 1 if z else 0}
        return
    if not isinstance(z, dict):
        return
    _TOP_KEYS, _ZERO_KEYS = _schema_keys()
    cz = clean.get("zero_optimization") if isinstance(clean.get("zero_optimization"), dict) else {}
    removed = _versions.removed_zero_keys(version)
    canon = {canonical_zero_key(k) for k in z}
    for k in z:
        ptr = f"/zero_optimization/{k}"
        if k in removed:
            out.add("DS107", "error", ptr, f"zero_optimization.{k} was removed from DeepSpeed {version}: "
                    f"{removed[k]}; DeepSpeed refuses the config", "delete the key")
            cz.pop(k, None)
        if k in DEPRECATED_ZERO:
            out.add("DS106", "warning", ptr, f"zero_optimization.{k} is deprecated", f"use {DEPRECATED_ZERO[k]}")
            new = _DEPRECATED_CONFLICT.get(k)
            if new and new in canon:
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
    stage = _rules.zero_stage(data)
    if stage is None:
        return
    for k in z:
        c = canonical_zero_key(k)
        ptr = f"/zero_optimization/{k}"
        if c in ("stage", "offload_param", "cpu_offload_param") or c.startswith("zero_"):
            continue  # offload_param / ZeRO++ keys have their own rules (DS204, DS208)
        if stage == 0 and c not in ("offload_optimizer", "cpu_offload") and z[k] != "auto":
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} has no effect at stage 0 (ZeRO disabled)",
                    "set a stage >= 1 or delete the key")
        elif stage == 0 and c in ("offload_optimizer", "cpu_offload") and _offload_on(z[k]):
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} has no effect at stage 0: optimizer offload "
                    "needs ZeRO stage 1-3", "set a stage >= 1")
        elif stage in (1, 2) and c in STAGE3_ONLY_KEYS:
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} only acts at stage 3; ignored at stage {stage}",
                    "delete it or set stage 3")
        elif stage == 3 and c in STAGE12_ONLY_KEYS:
            out.add("DS105", "warning", ptr, f"zero_optimization.{k} only acts at stages 1-2; ignored at stage 3",
                    "delete it")


def _offload_on(v: Any) -> bool:
    return v is True or (isinstance(v, dict) and v.get("device") not in (None, "none"))


# -- schema issues -> findings ------------------------------------------------------------------------------
def _check_schema(clean: dict, version: str, out: _Collector) -> None:
    """Unknown keys, types and ranges, against the committed JSON Schema (no pydantic on this path)."""
    fp8 = None
    ds = clean.get("dstoolkit")
    if isinstance(ds, dict) and "fp8" in ds:
        fp8 = ds.pop("fp8")  # Fp8Config has cross-field validators: checked with pydantic below
    for issue in _schema_check.check_config(clean):
        _report_issue(clean, issue, out)
    if fp8 is not None:
        _check_fp8(fp8, out)


def _check_fp8(fp8: Any, out: _Collector) -> None:
    try:
        from pydantic import ValidationError

        from dstoolkit.dsconfig.fp8 import Fp8Config
    except ImportError:  # pragma: no cover - fp8 module absent
        return
    if fp8 is None:
        return
    try:
        Fp8Config.model_validate(fp8)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            path = ("dstoolkit", "fp8") + tuple(err["loc"])
            code = "DS101" if err["type"] == "extra_forbidden" else (
                "DS103" if err["type"] in ("literal_error", "greater_than", "greater_than_equal", "less_than",
                                           "less_than_equal", "value_error") else "DS102")
            msg = err["msg"].replace("Value error, ", "").replace("Input should be", "must be")
            out.add(code, "error", pointer_of(path), f"dstoolkit.fp8: {msg}", None)


def _report_issue(clean: dict, issue: "_schema_check.Issue", out: _Collector) -> None:
    path = issue.path
    ptr = pointer_of(path)
    field = ".".join(str(p) for p in path) or "config"
    if issue.kind == "unknown_key":
        key = str(path[-1])
        if len(path) == 1 and key in TOP_LEVEL_RENAMES:
            return
        section = ".".join(str(p) for p in path[:-1]) or "the top level"
        message = f"unknown key {key!r} in {section}"
        if len(path) == 1:
            message += "; DeepSpeed ignores unknown top-level keys silently"
        if path[0] == "zero_optimization" and len(path) == 2:
            message += "; DeepSpeed refuses the config"
        hint = _rules.did_you_mean(key, issue.choices, cutoff=0.72)
        suggestion = f"did you mean {hint!r}?" if hint else None
        if not suggestion and path[0] == "compile":
            suggestion = "the torch.compile backend is set in code (engine.compile(backend=...)), not in the config"
        out.add("DS101", "error", ptr, message, suggestion)
        return
    if issue.kind == "missing":
        out.add("DS108", "error", ptr, f"required key {ptr} is missing", None)
        return
    node = _node_at(clean, path)
    shown = _schema_check._show(node)
    if issue.kind == "range":
        out.add("DS103", "error", ptr, f"{field} = {shown}: {issue.message}", None, at_value=True)
        return
    message = f"{field} = {shown}: {issue.message}"
    if isinstance(node, str) and node.strip() and node.replace(",", "").replace("_", "").isupper():
        message += " (an unfilled template placeholder?)"
    out.add("DS102", "error", ptr, message, _type_hint(node), at_value=True)


def _node_at(root: Any, path: tuple) -> Any:
    node = root
    for p in path:
        node = node[p]
    return node


def _type_hint(node: Any) -> Optional[str]:
    if isinstance(node, str):
        try:
            float(node)
            return f"write the number without quotes: {node}"
        except ValueError:
            pass
        if node.lower() in ("true", "false"):
            return f"write the boolean without quotes: {node.lower()}"
    return None


def pydantic_schema_issues(clean: dict) -> set[tuple[str, str]]:
    """(code, pointer) of the per-key errors pydantic's `DeepSpeedConfig` reports for ``clean`` (the same kinds
    `_check_schema` reports from the JSON Schema). Used by tests to show the two paths agree; imports pydantic."""
    from pydantic import ValidationError

    from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

    try:
        DeepSpeedConfig.model_validate(clean, context={"skip": True})
        return set()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    out: set[tuple[str, str]] = set()
    paths = {_data_path(tuple(e["loc"]), clean) for e in errors}
    for err in errors:
        path = _data_path(tuple(err["loc"]), clean)
        if err["type"] == "extra_forbidden":
            out.add(("DS101", pointer_of(path)))
            continue
        node = _node_at(clean, path)
        if isinstance(node, (dict, list)) and any(p != path and p[:len(path)] == path for p in paths):
            continue
        if err["type"] == "missing":
            out.add(("DS108", pointer_of(path)))
        elif err["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error",
                             "enum") and not (err["type"] == "literal_error" and "'auto'" in str(err.get("ctx"))):
            out.add(("DS103", pointer_of(path)))
        elif err["type"] != "literal_error":
            out.add(("DS102", pointer_of(path)))
    # a pointer reported both as a type and a range error by different union branches counts once, as range
    return {(c, p) for c, p in out if not (c == "DS102" and ("DS103", p) in out)}


def _data_path(loc: tuple, data: Any) -> tuple:
    """Keep the parts of a pydantic loc that address the data (drop union-branch labels)."""
    path: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
    return tuple(path)
