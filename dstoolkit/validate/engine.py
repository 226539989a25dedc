"""`validate_config`: the public entry point. Parses (when given text), checks every key against the schema,
runs every cross-field rule, and returns a list of `Finding`s. It never raises.

Order of checks: syntax (parse.py) -> "auto", removed / deprecated / misplaced / stage-ignored keys (keys.py)
-> the JSON Schema: unknown keys with "did you mean", types, ranges (schema_findings.py) -> cross-field rules
(the registry, dstoolkit.dsconfig.registry).
"""
from __future__ import annotations

import copy
from typing import Any, Literal, Optional, Union

from dstoolkit.dsconfig import versions as _versions
from dstoolkit.dsconfig.rules import RuleContext, run_rules
from dstoolkit.validate.findings import Collector, Finding
from dstoolkit.validate.keys import check_auto, check_sections
from dstoolkit.validate.parse import ParseResult, parse_text
from dstoolkit.validate.schema_findings import check_schema, pydantic_schema_issues  # noqa: F401  (re-export)
from dstoolkit.validate.parse import MAX_DEPTH


def validate_config(cfg: Union[dict, str], *, source: str = "<config>", world_size: Optional[int] = None,
                    gpus_per_node: Optional[int] = None, tp: int = 1, pp: int = 1,
                    num_experts: Optional[int] = None, ep_size: Optional[int] = None,
                    mode: Literal["strict", "hf"] = "strict", deepspeed_version: str = "0.19",
                    num_heads: Optional[int] = None, num_kv_heads: Optional[int] = None,
                    ep_needs_experts: bool = False, cpu: bool = False) -> list[Finding]:
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
        num_heads, num_kv_heads: the model's attention / key-value heads (AutoTP and Ulysses head rules).
        ep_needs_experts: report an ep_size > 1 given without num_experts (and without dstoolkit.moe.num_experts)
            as DS009 (`dstoolkit validate --ep-size` without --num-experts); otherwise such an ep_size is unused.
        cpu: the ranks are known to be CPU (gloo): `estimate --gpu cpu`, `bench` on CPU ranks. A finding that fails
            only on GPUs (DS105 optimizer offload at stage 0) is then a warning; unknown (False) keeps it an error.

    Returns:
        Findings sorted by position. Errors mean DeepSpeed would fail or silently misbehave.
    """
    try:
        return _validate(cfg, source, world_size, gpus_per_node, tp, pp, num_experts, ep_size, mode,
                         deepspeed_version, num_heads, num_kv_heads, ep_needs_experts, cpu)
    except Exception as exc:  # the contract is "never raises": report instead
        return [Finding(file=source, pointer="", severity="error", code="DS009",
                        message=f"validator could not check this input ({type(exc).__name__}: {exc})"[:500])]


def _validate(cfg, source, world_size, gpus_per_node, tp, pp, num_experts, ep_size, mode, version,
              num_heads=None, num_kv_heads=None, ep_needs_experts=False, cpu=False) -> list[Finding]:
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
    out = Collector(source, parsed)
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
    ctx = RuleContext(world_size=world_size, gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                             num_experts=num_experts, ep_size=ep_size, mode=mode, deepspeed_version=version,
                             num_heads=num_heads, num_kv_heads=num_kv_heads)
    moe = data.get("dstoolkit", {}).get("moe") if isinstance(data.get("dstoolkit"), dict) else None
    if ep_needs_experts and ep_size is not None and ep_size > 1 and num_experts is None and not (
            isinstance(moe, dict) and moe.get("num_experts") is not None):
        # the expert-parallel rules (DS213, LY008 / LY009) need the experts: without them --ep-size is silently unused
        out.add("DS009", "error", "", f"--ep-size {ep_size} (ep_size) without --num-experts (num_experts), and the "
                "config has no dstoolkit.moe.num_experts: there are no experts to shard, so the expert-parallel "
                "checks cannot run", "give --num-experts N (or a dstoolkit.moe section), or drop --ep-size")
    clean = copy.deepcopy(data)
    check_auto(data, clean, mode, out)
    check_sections(data, clean, version, out, cpu)
    check_schema(clean, version, out, mode)
    for v in run_rules(data, ctx):
        out.add(v.code, v.severity, v.pointer, v.message, v.suggestion)
    return sorted(out.findings, key=lambda f: (f.line or 0, f.column or 0, f.code))


def _normalize(node: Any, ptr: str, depth: int, source: str, problems: list) -> Any:
    """Make a caller's dict look like parsed JSON: str keys, lists for tuples, str() for other objects; note
    non-finite floats (DS002) and excessive depth (DS003) instead of failing later."""

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
