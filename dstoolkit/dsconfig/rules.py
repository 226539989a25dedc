"""Cross-field rules. Each rule is one function ``_check_<rule>(cfg, ctx)`` that raises `RuleViolation`
(a ValueError naming the field paths and values) and returns None when the config is fine.

Rules read the raw config dict (as parsed, "auto" left in place), never assume types (a wrong type is the
per-key validator's finding, not the rule's) and take the cluster shape from `RuleContext`.
`DeepSpeedConfig` calls each one from a model validator of the same name; `validate_config` calls them all
and collects every violation.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from dstoolkit.dsconfig.facts import (ONEBIT_OPTIMIZER_PARAMS, OPTIMIZER_PARAMS, SCHEDULER_PARAMS, SCHEDULER_REQUIRED,
                                    TORCH_OPTIMIZERS, TORCH_SCHEDULERS, canonical_zero_key)


class RuleViolation(ValueError):
    """A broken cross-field rule: code, JSON pointer, message, suggestion and severity."""

    def __init__(self, code: str, pointer: str, message: str, suggestion: Optional[str] = None,
                 severity: str = "error"):
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
    mode: str = "strict"
    deepspeed_version: str = "0.19"
    skip: bool = False
    """True when the caller runs the rules itself (validate_config), so model validators stay quiet."""

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any]) -> "RuleContext":
        keys = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in m.items() if k in keys and v is not None})


# -- tolerant getters ------------------------------------------------------------------------------------
def _as_int(v: Any) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v and abs(v) != float("inf") and v == int(v):
        return int(v)
    return None


def _section(cfg: Mapping, key: str) -> dict:
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
    """The ZeRO stage (0 when unset); None when it is not a valid stage."""
    s = zero_section(cfg).get("stage", 0)
    s = _as_int(s)
    return s if s in (0, 1, 2, 3) else None


def _bf16_section(cfg: Mapping) -> tuple[str, dict]:
    if "bf16" in cfg:
        return "bf16", _section(cfg, "bf16")
    return "bfloat16", _section(cfg, "bfloat16")


def _enabled(sec: dict, ctx: RuleContext) -> bool:
    v = sec.get("enabled", False)
    if v == "auto":
        # 0.16 read `enabled` with get_scalar_param, so "auto" is truthy there; 0.19's pydantic drops it.
        return ctx.deepspeed_version.startswith("0.16") and ctx.mode == "strict"
    return v is True


def _dp_size(cfg: Mapping, ctx: RuleContext) -> Optional[int]:
    if ctx.world_size is None:
        return None
    sp = _as_int(cfg.get("sequence_parallel_size")) or 1
    denom = max(ctx.tp, 1) * max(ctx.pp, 1) * max(sp, 1)
    if ctx.world_size % denom:
        return None
    return ctx.world_size // denom


def _moe_facts(cfg: Mapping, ctx: RuleContext) -> tuple[Optional[int], Optional[int], Optional[int]]:
    moe = _section(_section(cfg, "dstoolkit"), "moe")
    n = ctx.num_experts if ctx.num_experts is not None else _as_int(moe.get("num_experts"))
    ep = ctx.ep_size if ctx.ep_size is not None else _as_int(moe.get("ep_size"))
    k = _as_int(moe.get("top_k"))
    return n, ep, k


def did_you_mean(word: str, choices, cutoff: float = 0.75) -> Optional[str]:
    """Closest choice to ``word``: same letters ignoring case, same words in another order
    (comm_overlap -> overlap_comm), or a close spelling (difflib ratio >= cutoff). None when nothing is close."""
    lowered = {str(c).lower(): c for c in choices}
    w = str(word).lower().strip()
    if w in lowered:
        return lowered[w]
    tokens = sorted(w.replace("-", "_").split("_"))
    for low, orig in lowered.items():
        if sorted(low.split("_")) == tokens:
            return orig
    hit = difflib.get_close_matches(w, list(lowered), n=1, cutoff=cutoff)
    return lowered[hit[0]] if hit else None


# -- rules ------------------------------------------------------------------------------------------------
def _check_parallel_sizes(cfg: Mapping, ctx: RuleContext) -> None:
    """world size must be a multiple of tp * pp (* sequence_parallel_size)."""
    if ctx.world_size is None:
        return
    sp = _as_int(cfg.get("sequence_parallel_size")) or 1
    denom = max(ctx.tp, 1) * max(ctx.pp, 1) * max(sp, 1)
    if ctx.world_size % denom:
        raise RuleViolation("DS219", "", f"world size {ctx.world_size} is not divisible by tp({ctx.tp}) x pp({ctx.pp})"
                            f" x sequence_parallel_size({sp}) = {denom}, so there is no whole data-parallel size",
                            "choose tp/pp that divide the number of GPUs")


def _check_batch_triad(cfg: Mapping, ctx: RuleContext) -> None:
    """train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp_size
    (deepspeed runtime/config.py _set_batch_related_parameters + _batch_assertion), dp = world / (tp*pp)."""
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    raw = [cfg.get(n) for n in names]
    autos = [v == "auto" for v in raw]
    tb, mb, gas = (_as_int(v) for v in raw)
    present = [v is not None for v in raw]
    if not present[0] and not present[1]:
        raise RuleViolation("DS202", "", "neither train_batch_size nor train_micro_batch_size_per_gpu is set; "
                            "DeepSpeed refuses the config ('Either train_batch_size or train_micro_batch_size_per_gpu "
                            "needs to be provided')", 'add "train_micro_batch_size_per_gpu": 1 (or train_batch_size)')
    if any(autos):
        return  # HF fills these from its own arguments (see dstoolkit.dsconfig.auto); checked after `resolve`
    if any(p and v is None for p, v in zip(present, (tb, mb, gas))) or any(v is not None and v <= 0 for v in (tb, mb, gas)):
        return  # wrong type / range is reported per key
    dp = _dp_size(cfg, ctx)
    dp_text = (f"data-parallel size {dp} (world size {ctx.world_size}"
               + (f" / (tp {ctx.tp} x pp {ctx.pp})" if (ctx.tp, ctx.pp) != (1, 1) else "") + ")")
    if dp is None:
        if tb is not None and mb is not None and gas is not None and tb % (mb * gas):
            raise RuleViolation("DS201", "/train_batch_size",
                                f"train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu {mb} x "
                                f"gradient_accumulation_steps {gas} = {mb * gas}, so no data-parallel size fits",
                                "pass --world-size to get the exact fix")
        return
    if tb is not None and mb is not None and gas is not None:
        if tb != mb * gas * dp:
            fix = (f'set "gradient_accumulation_steps": {tb // (mb * dp)}' if tb % (mb * dp) == 0 else
                   f'set "train_batch_size": {mb * gas * dp}')
            raise RuleViolation("DS201", "/train_batch_size",
                                f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
                                f"gradient_accumulation_steps {gas} x {dp_text} = {mb * gas * dp}", fix)
    elif tb is not None and mb is not None:
        g = tb // mb // dp
        if g <= 0 or tb != mb * g * dp:
            raise RuleViolation("DS201", "/train_batch_size",
                                f"train_batch_size {tb} is not a multiple of train_micro_batch_size_per_gpu {mb} x "
                                f"{dp_text} = {mb * dp}; DeepSpeed would derive gradient_accumulation_steps {g} and fail",
                                f'use a train_batch_size that is a multiple of {mb * dp}')
    elif tb is not None and gas is not None:
        m = tb // dp // gas
        if m <= 0 or tb != m * gas * dp:
            raise RuleViolation("DS201", "/train_batch_size",
                                f"train_batch_size {tb} is not a multiple of gradient_accumulation_steps {gas} x "
                                f"{dp_text} = {gas * dp}", f'use a train_batch_size that is a multiple of {gas * dp}')
    elif tb is not None:
        if tb % dp or tb // dp == 0:
            raise RuleViolation("DS201", "/train_batch_size",
                                f"train_batch_size {tb} is not a multiple of {dp_text}",
                                f'use a multiple of {dp}, or set train_micro_batch_size_per_gpu')


def _check_fp16_bf16_exclusive(cfg: Mapping, ctx: RuleContext) -> None:
    """fp16.enabled and bf16.enabled cannot both be true (DeepSpeed asserts in _initialize_params)."""
    bname, bf16 = _bf16_section(cfg)
    fp16 = _section(cfg, "fp16")
    if _enabled(fp16, ctx) and _enabled(bf16, ctx):
        raise RuleViolation("DS203", f"/{bname}/enabled",
                            f"fp16.enabled={fp16.get('enabled')!r} and {bname}.enabled={bf16.get('enabled')!r}: "
                            "DeepSpeed refuses both ('bfloat16 and fp16 modes cannot be simultaneously enabled')",
                            "keep one: bf16 on Ampere or newer, fp16 otherwise")


def _check_fp16_dynamic_loss_scale(cfg: Mapping, ctx: RuleContext) -> None:
    """With dynamic loss scaling (fp16.enabled, loss_scale 0) loss_scale_window and min_loss_scale must be > 0
    (deepspeed 0.19 precision_config.py: the window is a modulus, min_loss_scale the floor)."""
    fp16 = _section(cfg, "fp16")
    if fp16.get("enabled") is not True or fp16.get("loss_scale", 0) != 0:
        return
    for name in ("loss_scale_window", "min_loss_scale"):
        v = fp16.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
            raise RuleViolation("DS220", f"/fp16/{name}", f"fp16.{name}={v} must be > 0 when dynamic loss scaling "
                                "is on (fp16.enabled true, fp16.loss_scale 0); DeepSpeed refuses it",
                                f"use the default ({1000 if name == 'loss_scale_window' else 1})")


def _check_offload_param_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """zero_optimization.offload_param only acts at stage 3 (stage3.py is its only reader)."""
    z = zero_section(cfg)
    op = z.get("offload_param")
    stage = zero_stage(cfg)
    if isinstance(op, dict) and op.get("device", "none") not in ("none", None) and stage is not None and stage != 3:
        raise RuleViolation("DS204", "/zero_optimization/offload_param",
                            f"offload_param.device={op.get('device')!r} needs ZeRO stage 3, but "
                            f"zero_optimization.stage={stage}; DeepSpeed ignores it and keeps parameters on GPU",
                            'set "stage": 3, or offload only the optimizer (offload_optimizer)')
    if z.get("cpu_offload_param") is True and stage is not None and stage != 3:
        raise RuleViolation("DS204", "/zero_optimization/cpu_offload_param",
                            f"cpu_offload_param=true needs ZeRO stage 3, but zero_optimization.stage={stage}",
                            'set "stage": 3 and use offload_param {"device": "cpu"}')


def _check_nvme_path(cfg: Mapping, ctx: RuleContext) -> None:
    """NVMe offload needs nvme_path; without an aio section DeepSpeed uses aio defaults (warning)."""
    z = zero_section(cfg)
    nvme_sections = []
    for key in ("offload_param", "offload_optimizer"):
        sec = z.get(key)
        if isinstance(sec, dict) and sec.get("device") == "nvme":
            nvme_sections.append(key)
            if not sec.get("nvme_path"):
                raise RuleViolation("DS205", f"/zero_optimization/{key}/device",
                                    f'zero_optimization.{key}.device="nvme" but {key}.nvme_path is not set',
                                    f'add "nvme_path": "/local_nvme" to {key}')
    if nvme_sections and "aio" not in cfg:
        raise RuleViolation("DS206", f"/zero_optimization/{nvme_sections[0]}/device",
                            f"NVMe offload ({', '.join(nvme_sections)}) without an aio section: DeepSpeed uses "
                            "block_size 1 MiB, queue_depth 8, intra_op_parallelism 1, which is rarely tuned for the drive",
                            'add "aio": {"block_size": 1048576, "queue_depth": 16, "intra_op_parallelism": 4, '
                            '"single_submit": false, "overlap_events": true} and tune with ds_nvme_tune',
                            severity="warning")


def _check_zeropp_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """ZeRO++ (hpZ, qwZ, qgZ) is implemented only in stage 3 (runtime/zero/stage3.py reads these keys)."""
    z = zero_section(cfg)
    stage = zero_stage(cfg)
    if stage is None or stage == 3:
        return
    for key in ("zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights"):
        if z.get(key) is True:
            raise RuleViolation("DS208", f"/zero_optimization/{key}",
                                f"zero_optimization.{key}=true needs ZeRO stage 3 (ZeRO++), but stage={stage}; "
                                "DeepSpeed ignores it", 'set "stage": 3 or remove the key')
    hpz = _as_int(z.get("zero_hpz_partition_size"))
    if hpz is not None and hpz > 1:
        raise RuleViolation("DS208", "/zero_optimization/zero_hpz_partition_size",
                            f"zero_optimization.zero_hpz_partition_size={hpz} needs ZeRO stage 3 (ZeRO++ hpZ), "
                            f"but stage={stage}; DeepSpeed ignores it", 'set "stage": 3 or remove the key')


def _check_hpz_divides_node(cfg: Mapping, ctx: RuleContext) -> None:
    """hpZ's secondary partition lives inside a node: zero_hpz_partition_size must divide GPUs per node."""
    hpz = _as_int(zero_section(cfg).get("zero_hpz_partition_size"))
    if hpz is None or hpz <= 1:
        return
    if ctx.gpus_per_node is not None and ctx.gpus_per_node % hpz:
        raise RuleViolation("DS207", "/zero_optimization/zero_hpz_partition_size",
                            f"zero_hpz_partition_size={hpz} does not divide --gpus-per-node {ctx.gpus_per_node}; "
                            "the secondary partition must fit inside one node",
                            f'use "zero_hpz_partition_size": {ctx.gpus_per_node}')
    if ctx.world_size is not None and ctx.world_size % hpz:
        raise RuleViolation("DS207", "/zero_optimization/zero_hpz_partition_size",
                            f"zero_hpz_partition_size={hpz} does not divide world size {ctx.world_size}",
                            "use the number of GPUs per node")


def known_optimizers(version: str) -> dict[str, set[str]]:
    """Lower-case DeepSpeed optimizer names -> accepted params, for a DeepSpeed version."""
    names = dict(OPTIMIZER_PARAMS)
    if version.startswith("0.16"):
        names = {k: v for k, v in names.items() if k != "muon"}
        names.update(ONEBIT_OPTIMIZER_PARAMS)
    return names


def _optimizer_params_for(name: str, version: str) -> Optional[set[str]]:
    ds = known_optimizers(version)
    if name.lower() in ds:
        return ds[name.lower()]
    if name in TORCH_OPTIMIZERS:
        return TORCH_OPTIMIZERS[name]
    return None


def _check_optimizer_type(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.type must be a DeepSpeed optimizer (any case) or a torch.optim class (exact case)."""
    name = _section(cfg, "optimizer").get("type")
    if name is None or not isinstance(name, str):
        return
    if _optimizer_params_for(name, ctx.deepspeed_version) is not None:
        return
    if name.lower() in ONEBIT_OPTIMIZER_PARAMS:
        raise RuleViolation("DS209", "/optimizer/type",
                            f"optimizer.type {name!r}: the 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) were "
                            f"removed in DeepSpeed 0.19; the engine fails looking up torch.optim.{name}",
                            'use "Adam"/"AdamW", or target --deepspeed-version 0.16')
    choices = list(known_optimizers(ctx.deepspeed_version)) + list(TORCH_OPTIMIZERS)
    hint = did_you_mean(name, choices)
    raise RuleViolation("DS209", "/optimizer/type", f"optimizer.type {name!r} is neither a DeepSpeed optimizer nor a "
                        "torch.optim class; the engine fails at start",
                        f"did you mean {hint!r}?" if hint else "use AdamW, Adam, Lamb, Lion, Adagrad or a torch.optim name")


def _check_optimizer_params(cfg: Mapping, ctx: RuleContext) -> None:
    """optimizer.params are passed as kwargs: no max_grad_norm (engine raises), no unknown keywords."""
    opt = _section(cfg, "optimizer")
    params = opt.get("params")
    if not isinstance(params, dict):
        return
    if "max_grad_norm" in params:
        raise RuleViolation("DS210", "/optimizer/params/max_grad_norm",
                            f"optimizer.params.max_grad_norm={params['max_grad_norm']!r}: DeepSpeed's engine raises "
                            "ValueError ('max_grad_norm' is not supported as an optimizer parameter)",
                            f'remove it and set top-level "gradient_clipping": {params["max_grad_norm"]!r}')
    name = opt.get("type")
    if not isinstance(name, str):
        return
    allowed = _optimizer_params_for(name, ctx.deepspeed_version)
    if allowed is None:
        return
    unknown = [k for k in params if k not in allowed]
    if unknown:
        k = unknown[0]
        hint = did_you_mean(k, allowed)
        raise RuleViolation("DS210", f"/optimizer/params/{k}",
                            f"optimizer.params {', '.join(map(repr, unknown))} not accepted by {name}; the engine "
                            "passes params as keyword arguments and fails with TypeError",
                            f"did you mean {hint!r}?" if hint else f"accepted: {', '.join(sorted(allowed))}")


def _check_scheduler_type(cfg: Mapping, ctx: RuleContext) -> None:
    """scheduler.type must be a DeepSpeed LR schedule or a torch.optim.lr_scheduler class (case-sensitive)."""
    name = _section(cfg, "scheduler").get("type")
    if name is None or not isinstance(name, str):
        return
    if name in SCHEDULER_PARAMS or name in TORCH_SCHEDULERS:
        return
    hint = did_you_mean(name, list(SCHEDULER_PARAMS) + list(TORCH_SCHEDULERS))
    raise RuleViolation("DS211", "/scheduler/type", f"scheduler.type {name!r} is not a DeepSpeed or torch LR scheduler; "
                        "the engine fails ('DeepSpeed does not recognize LR scheduler')",
                        f"did you mean {hint!r}?" if hint else f"use one of {', '.join(SCHEDULER_PARAMS)}")


def _check_scheduler_params(cfg: Mapping, ctx: RuleContext) -> None:
    """scheduler.params are passed as kwargs to the DeepSpeed schedule: no unknown keys, required ones present."""
    sch = _section(cfg, "scheduler")
    name, params = sch.get("type"), sch.get("params", {})
    if not isinstance(name, str) or name not in SCHEDULER_PARAMS or not isinstance(params, dict):
        return
    allowed = SCHEDULER_PARAMS[name]
    unknown = [k for k in params if k not in allowed]
    if unknown:
        hint = did_you_mean(unknown[0], allowed)
        raise RuleViolation("DS212", f"/scheduler/params/{unknown[0]}",
                            f"scheduler.params {', '.join(map(repr, unknown))} not accepted by {name} (TypeError at "
                            "engine start)", f"did you mean {hint!r}?" if hint else f"accepted: {', '.join(sorted(allowed))}")
    missing = sorted(SCHEDULER_REQUIRED.get(name, set()) - set(params))
    if missing:
        raise RuleViolation("DS212", "/scheduler/params", f"{name} needs scheduler.params {', '.join(missing)}",
                            f'add "{missing[0]}"')


def _check_moe_layout(cfg: Mapping, ctx: RuleContext) -> None:
    """ep_size divides num_experts and the data-parallel size (experts are sharded over ep_size ranks,
    and expert groups are carved out of the data-parallel group: deepspeed/utils/groups.py)."""
    n, ep, k = _moe_facts(cfg, ctx)
    if n is None or ep is None:
        return
    ptr = "/dstoolkit/moe/ep_size" if "dstoolkit" in cfg else ""
    if ep <= 0 or n <= 0:
        return
    if n % ep:
        raise RuleViolation("DS213", ptr, f"ep_size {ep} does not divide num_experts {n}",
                            f"use an ep_size that divides {n}")
    dp = _dp_size(cfg, ctx)
    if dp is not None and dp % ep:
        raise RuleViolation("DS213", ptr, f"ep_size {ep} does not divide the data-parallel size {dp} (world size "
                            f"{ctx.world_size} / (tp {ctx.tp} x pp {ctx.pp}))", "use an ep_size that divides it")
    if k is not None and k > n:
        raise RuleViolation("DS213", "/dstoolkit/moe/top_k", f"top_k {k} exceeds num_experts {n}", f"use top_k <= {n}")


def _check_moe_not_stage3(cfg: Mapping, ctx: RuleContext) -> None:
    """Native DeepSpeed MoE is refused at ZeRO stage 3 (engine start; measured on 0.19.8)."""
    n, _, _ = _moe_facts(cfg, ctx)
    if n is not None and zero_stage(cfg) == 3:
        raise RuleViolation("DS214", "/zero_optimization/stage",
                            f"MoE with {n} experts at zero_optimization.stage=3: DeepSpeed raises 'Native DeepSpeed "
                            "MoE is not supported with ZeRO Stage 3' at engine start", 'use "stage": 2 (or 1) for MoE')


def _check_partial_offload_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """offload_optimizer.ratio < 1 (partial offload) is only implemented for stage 3 (zero/config.py asserts)."""
    oo = zero_section(cfg).get("offload_optimizer")
    if not isinstance(oo, dict):
        return
    ratio = oo.get("ratio")
    stage = zero_stage(cfg)
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio < 1.0 and stage is not None and stage != 3:
        raise RuleViolation("DS215", "/zero_optimization/offload_optimizer/ratio",
                            f"offload_optimizer.ratio={ratio} (partial offload) needs ZeRO stage 3, stage={stage}",
                            'set "stage": 3 or "ratio": 1.0')


def _check_master_weights_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """fp16/bf16 master weights and bf16 optimizer states need ZeRO 1-3 (runtime/config.py _do_error_check)."""
    stage = zero_stage(cfg)
    fp16 = _section(cfg, "fp16")
    bname, bf16 = _bf16_section(cfg)
    if bf16.get("bf16_optimizer_states") is True and bf16.get("bf16_master_weights_and_grads") is not True:
        raise RuleViolation("DS216", f"/{bname}/bf16_optimizer_states",
                            "bf16_optimizer_states=true requires bf16_master_weights_and_grads=true",
                            'add "bf16_master_weights_and_grads": true')
    for ptr, sec, key in (("/fp16", fp16, "fp16_master_weights_and_grads"),
                          (f"/{bname}", bf16, "bf16_master_weights_and_grads"),
                          (f"/{bname}", bf16, "bf16_optimizer_states")):
        if sec.get(key) is True and stage == 0:
            raise RuleViolation("DS216", f"{ptr}/{key}", f"{key}=true needs ZeRO stage 1, 2 or 3, but stage=0; "
                                "DeepSpeed asserts at config time", 'set "zero_optimization": {"stage": 1} or remove it')


def _check_compute_grad_norm_stage(cfg: Mapping, ctx: RuleContext) -> None:
    """compute_grad_norm=false is accepted only at stages 1-2 (zero/config.py compute_grad_norm_valid)."""
    z = zero_section(cfg)
    stage = zero_stage(cfg)
    if z.get("compute_grad_norm") is False and stage not in (1, 2, None):
        raise RuleViolation("DS217", "/zero_optimization/compute_grad_norm",
                            f"compute_grad_norm=false needs ZeRO stage 1 or 2, stage={stage}", "remove the key")


def _check_allreduce_sum_stage3(cfg: Mapping, ctx: RuleContext) -> None:
    """gradient_allreduce_op 'sum' is refused at stage 3 (runtime/config.py _do_error_check)."""
    op = cfg.get("gradient_allreduce_op")
    if isinstance(op, str) and op.lower() == "sum" and zero_stage(cfg) == 3:
        raise RuleViolation("DS218", "/gradient_allreduce_op",
                            "gradient_allreduce_op='sum' is not supported with ZeRO stage 3", 'use "mean"')


RULES: list[Callable[[Mapping, RuleContext], None]] = [
    _check_parallel_sizes, _check_batch_triad, _check_fp16_bf16_exclusive, _check_fp16_dynamic_loss_scale,
    _check_offload_param_stage,
    _check_nvme_path, _check_zeropp_stage, _check_hpz_divides_node, _check_optimizer_type, _check_optimizer_params,
    _check_scheduler_type, _check_scheduler_params, _check_moe_layout, _check_moe_not_stage3,
    _check_partial_offload_stage, _check_master_weights_stage, _check_compute_grad_norm_stage,
    _check_allreduce_sum_stage3,
]
"""Every rule, in report order."""


def run_rules(cfg: Mapping, ctx: RuleContext) -> list[RuleViolation]:
    """Run every rule; return all violations (never raises on malformed input)."""
    out: list[RuleViolation] = []
    for rule in RULES:
        try:
            rule(cfg, ctx)
        except RuleViolation as v:
            out.append(v)
        except Exception:  # a malformed config must not crash a rule; the per-key pass reports it
            continue
    return out


def enforce(rule: Callable[[Mapping, RuleContext], None], cfg: Mapping, ctx: RuleContext) -> None:
    """Run one rule from a model validator: errors raise, warnings are dropped."""
    if ctx.skip:
        return
    try:
        rule(cfg, ctx)
    except RuleViolation as v:
        if v.severity == "error":
            raise
