"""The registry of DeepSpeed cross-field rules: each rule is declared once, ruff-style, with a decorator::

    @rule("DS204", "offload_param needs ZeRO stage 3")
    def _check_offload_param_stage(cfg, ctx):
        # docstring: the explanation (`--explain DS204`, docs/rules.md)
        ...
        raise RuleViolation("/zero_optimization/offload_param", message, 'set "stage": 3')

The decorator carries the code and the title, the docstring is the explanation (``--explain``, docs/rules.md),
and the function is the check. A check raises `RuleViolation` (the registry stamps the rule's code and
severity on it) and returns None when the config is fine. Everything else reads this registry, through
``dstoolkit.dsconfig.rules`` (which declares the rules): `run_rules` (validate_config), `enforce_all`
(DeepSpeedConfig's one model validator), the codes table in ``dstoolkit.validate.findings``,
``dstoolkit validate --explain`` and docs/rules.md.

Checks read the raw config dict (as parsed, "auto" left in place), never assume types (a wrong type is the
per-key validator's finding, not the rule's) and take the cluster shape from `RuleContext`. Pure Python: no
pydantic, so `dstoolkit validate` runs the rules without importing it.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from dstoolkit.dsconfig.facts import canonical_zero_key


class RuleViolation(ValueError):
    """A broken cross-field rule: JSON pointer, message, suggestion; `code` and `severity` come from the rule."""

    def __init__(self, pointer: str, message: str, suggestion: Optional[str] = None, *, code: str = "",
                 severity: Optional[str] = None):
        super().__init__(f"{pointer or '/'}: {message}")
        self.code = code
        self.pointer = pointer
        self.message = message
        self.suggestion = suggestion
        self.severity = severity


@dataclass(frozen=True)
class RuleContext:
    """What the rules know about the job beyond the file."""

    world_size: Optional[int] = None
    gpus_per_node: Optional[int] = None
    tp: int = 1
    pp: int = 1
    num_experts: Optional[int] = None
    ep_size: Optional[int] = None
    num_heads: Optional[int] = None
    """Attention heads of the model, when known (AutoTP / Ulysses head-divisibility rules)."""
    num_kv_heads: Optional[int] = None
    """Key-value heads (GQA), when known."""
    mode: str = "strict"
    deepspeed_version: str = "0.19"
    skip: bool = False
    """True when the caller runs the rules itself (validate_config), so the model validator stays quiet."""

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "RuleContext":
        keys = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in m.items() if k in keys and v is not None})


Check = Callable[[Mapping, RuleContext], None]


@dataclass(frozen=True)
class Rule:
    """One declared rule."""

    code: str
    title: str
    explanation: str
    check: Check
    severity: str = "error"
    """The severity of its findings: error (DeepSpeed fails or misbehaves) or warning."""

    @property
    def name(self) -> str:
        return self.check.__name__


RULES: dict[str, Rule] = {}
"""code -> rule, in declaration order (the order DeepSpeedConfig checks them). Filled when
``dstoolkit.dsconfig.rules`` is imported: read it from there (``rules.RULES``), which guarantees every rule
module is loaded."""


def rule(code: str, title: str, *, severity: str = "error") -> Callable[[Check], Check]:
    """Register the decorated check under `code`; its docstring is the explanation."""

    def deco(fn: Check) -> Check:
        if code in RULES:
            raise RuntimeError(f"rule {code} declared twice ({RULES[code].name} and {fn.__name__})")
        if not fn.__doc__:
            raise RuntimeError(f"rule {code} ({fn.__name__}) needs a docstring: it is the rule's explanation")
        RULES[code] = Rule(code, title, inspect.cleandoc(fn.__doc__), fn, severity)
        return fn

    return deco


def _run(r: Rule, cfg: Mapping, ctx: RuleContext) -> Optional[RuleViolation]:
    try:
        r.check(cfg, ctx)
    except RuleViolation as v:
        v.code = v.code or r.code
        v.severity = v.severity or r.severity
        return v
    return None


def run_rules(cfg: Mapping, ctx: RuleContext) -> list[RuleViolation]:
    """Run every rule; return all violations (never raises on malformed input)."""
    out: list[RuleViolation] = []
    for r in RULES.values():
        try:
            v = _run(r, cfg, ctx)
        except Exception:  # a malformed config must not crash a rule; the per-key pass reports it
            continue
        if v is not None:
            out.append(v)
    return out


def enforce_all(cfg: Mapping, ctx: RuleContext) -> None:
    """For a model validator: raise the first error-severity violation (warnings are dropped)."""
    if ctx.skip:
        return
    for r in RULES.values():
        v = _run(r, cfg, ctx)
        if v is not None and v.severity == "error":
            raise v


# -- tolerant getters the rules share ----------------------------------------------------------------------
def as_int(v: Any) -> Optional[int]:
    """An int for an int or an integral float; None otherwise (bools included)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v and abs(v) != float("inf") and v == int(v):
        return int(v)
    return None


HJSON_INT_BELOW = 1e10
"""hjson 3.1 (hjson/decoder.py scantfnns), DeepSpeed's reader of a config file, turns a number written with a
fraction or an exponent into an int when it is integral and below this in magnitude: 1000.0, 1e3 and 2e0 reach
DeepSpeed as 1000, 1000 and 2; 1e10 and 1e30 as floats."""


def as_deepspeed_reads(v: Any, mode: str) -> Any:
    """`v` as DeepSpeed's engine receives it. In strict mode DeepSpeed reads the file itself (deepspeed.initialize
    with a path, --deepspeed_config: hjson.load in runtime/config.py and tensor_parallel/init_utils.py
    load_ds_config), so an integral float below `HJSON_INT_BELOW` arrives as an int (measured: "warmup_num_steps":
    1000.0 and 1e3 build WarmupLR from a file, 1e10 and 1e30 are refused). In hf mode HF Trainer / Accelerate read
    the file with json.load (accelerate/utils/deepspeed.py HfDeepSpeedConfig) and hand DeepSpeed the dict, floats
    kept (measured: 1000.0 in a dict is refused)."""
    if mode == "strict" and isinstance(v, float) and v.is_integer() and abs(v) < HJSON_INT_BELOW:
        return int(v)
    return v


def section(cfg: Mapping, key: str) -> dict:
    """cfg[key] when it is a dict, else {}."""
    v = cfg.get(key) if isinstance(cfg, Mapping) else None
    return v if isinstance(v, dict) else {}


def zero_section(cfg: Mapping) -> dict:
    """zero_optimization with stage3_* aliases folded to field names; {} when absent or malformed."""
    z = cfg.get("zero_optimization") if isinstance(cfg, Mapping) else None
    if isinstance(z, bool):
        return {"stage": 1 if z else 0}
    if not isinstance(z, dict):
        return {}
    return {canonical_zero_key(k): v for k, v in z.items()}


def zero_stage(cfg: Mapping) -> Optional[int]:
    """The ZeRO stage (0 when unset); None when it is not a valid stage. The digit strings "0".."3" count as
    their stage, as in DeepSpeed 0.19.8 (its lax pydantic converts them; rule DS222 warns)."""
    raw = zero_section(cfg).get("stage", 0)
    if isinstance(raw, str) and raw in ("0", "1", "2", "3"):
        return int(raw)
    s = as_int(raw)
    return s if s in (0, 1, 2, 3) else None
