"""Hugging Face "auto" values: where HF Trainer / Accelerate fill them, and `resolve_auto` to fill them here.

Where HF fills "auto" (transformers ``integrations/deepspeed.py`` ``HfTrainerDeepSpeedConfig.trainer_config_process``
and ``trainer_config_finalize``; Accelerate's ``DeepSpeedPlugin`` fills the same batch/clipping keys):

- batch triad: ``train_micro_batch_size_per_gpu`` <- per_device_train_batch_size,
  ``gradient_accumulation_steps`` <- gradient_accumulation_steps,
  ``train_batch_size`` <- world_size * micro * grad_accum;
- ``gradient_clipping`` <- max_grad_norm;
- ``optimizer.params.{lr, betas, eps, weight_decay}`` <- learning_rate, (adam_beta1, adam_beta2), adam_epsilon,
  weight_decay;
- ``scheduler.params.{warmup_min_lr, warmup_max_lr, warmup_num_steps, total_num_steps}`` <- 0, learning_rate,
  max(1, warmup steps), total training steps;
- ``fp16.enabled`` / ``bf16.enabled`` <- --fp16 / --bf16;
- ``zero_optimization.reduce_bucket_size`` = hidden_size^2,
  ``zero_optimization.stage3_prefetch_bucket_size`` = 0.9 * hidden_size^2,
  ``zero_optimization.stage3_param_persistence_threshold`` = 10 * hidden_size (HF fills these only under the
  ``stage3_`` spelling, from model.config.hidden_size).

Anywhere else, nothing fills "auto": DeepSpeed 0.19 drops it silently inside pydantic sections (the default
applies) and fails on it elsewhere.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Optional

from dataclasses import dataclass, field

from dstoolkit.layout.dims import data_parallel_size

# JSON pointer -> who fills it (shown in findings).
HF_AUTO_FILLERS: dict[str, str] = {
    "/train_micro_batch_size_per_gpu": "HF per_device_train_batch_size",
    "/gradient_accumulation_steps": "HF gradient_accumulation_steps",
    "/train_batch_size": "HF world_size x per_device_train_batch_size x gradient_accumulation_steps",
    "/gradient_clipping": "HF max_grad_norm",
    "/optimizer/params/lr": "HF learning_rate",
    "/optimizer/params/betas": "HF adam_beta1/adam_beta2",
    "/optimizer/params/eps": "HF adam_epsilon",
    "/optimizer/params/weight_decay": "HF weight_decay",
    "/scheduler/params/warmup_min_lr": "HF (0)",
    "/scheduler/params/warmup_max_lr": "HF learning_rate",
    "/scheduler/params/warmup_num_steps": "HF warmup_steps / warmup_ratio",
    "/scheduler/params/total_num_steps": "HF max_steps (or epochs x steps per epoch)",
    "/fp16/enabled": "HF --fp16",
    "/bf16/enabled": "HF --bf16",
    "/zero_optimization/reduce_bucket_size": "HF hidden_size^2",
    "/zero_optimization/stage3_prefetch_bucket_size": "HF 0.9 x hidden_size^2",
    "/zero_optimization/stage3_param_persistence_threshold": "HF 10 x hidden_size",
    # Accelerate's DeepSpeedPlugin (accelerate/utils/dataclasses.py deepspeed_config_process) also fills:
    "/zero_optimization/stage3_gather_16bit_weights_on_model_save": "Accelerate zero3_save_16bit_model",
}

# "auto" values DeepSpeed itself understands (nothing has to fill them): pipeline.stages (runtime/config.py
# get_pipeline_config default; PipelineModule decides), ZenFlow's select_strategy/intervals
# (runtime/zenflow/zenflow_config.py) and AutoEP's model-derived settings (module_inject/auto_ep_config.py).
DEEPSPEED_OWN_AUTO: frozenset[str] = frozenset({
    "/pipeline/stages",
    "/zero_optimization/zenflow/select_strategy",
    "/zero_optimization/zenflow/select_interval",
    "/zero_optimization/zenflow/update_interval",
    "/expert_parallel/top_k",
    "/expert_parallel/routed_scaling_factor",
    "/expert_parallel/score_func",
    "/expert_parallel/score_apply",
    "/expert_parallel/combine_impl",
    "/expert_parallel/row_weighting_impl",
})

# HF TrainingArguments defaults used when a value is not given on the command line.
HF_DEFAULT_MICRO_BATCH = 8
HF_DEFAULT_GRAD_ACCUM = 1
HF_DEFAULT_LR = 5e-5
HF_DEFAULT_BETAS = (0.9, 0.999)
HF_DEFAULT_EPS = 1e-8
HF_DEFAULT_WEIGHT_DECAY = 0.0
HF_DEFAULT_MAX_GRAD_NORM = 1.0
HF_DEFAULT_WARMUP_STEPS = 0
HF_MIN_WARMUP_NUM_STEPS = 1
"""transformers' DeepSpeed integration fills scheduler.params.warmup_num_steps with max(1, warmup steps)
(transformers/integrations/deepspeed.py, trainer_config_finalize: "deepspeed>=0.19.6 rejects a non-positive
warmup_num_steps"); DS234 refuses 0."""
PREFETCH_FRACTION = 0.9  # transformers: stage3_prefetch_bucket_size = 0.9 * hidden_size * hidden_size
PERSISTENCE_FACTOR = 10  # transformers: stage3_param_persistence_threshold = 10 * hidden_size



def _hf_warmup_num_steps(given) -> tuple[int, str]:
    """(value, source) of warmup_num_steps as HF's Trainer fills it: max(1, --warmup-steps or HF's 0)."""
    steps = given if given is not None else HF_DEFAULT_WARMUP_STEPS
    src = "--warmup-steps" if given is not None else "HF default (warmup-steps)"
    if isinstance(steps, int) and steps < HF_MIN_WARMUP_NUM_STEPS:
        return HF_MIN_WARMUP_NUM_STEPS, f"{src} {steps}, raised to 1 as transformers does (DeepSpeed >= 0.19.6 refuses 0)"
    return steps, src

def find_auto(data: Any, path: tuple = ()) -> list[tuple]:
    """Paths (tuples of keys/indices) of every "auto" string value in ``data``."""
    out: list[tuple] = []
    stack = [(data, path)]
    while stack:
        node, p = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                stack.append((v, p + (k,)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                stack.append((v, p + (i,)))
        elif node == "auto" and isinstance(node, str):
            out.append(p)
    return sorted(out, key=lambda t: [str(x) for x in t])


# Keys HF checks against TrainingArguments when the config fixes them (not "auto"): transformers
# integrations/deepspeed.py HfTrainerDeepSpeedConfig.fill_match with must_match=True, called from
# trainer_config_process / trainer_config_finalize; a fixed value that differs (Python !=) is collected into
# `mismatches` and trainer_config_finalize raises ValueError("Please correct the following DeepSpeed config values
# that mismatch TrainingArguments values: ..."). The zero_optimization bucket keys and scheduler.params.warmup_min_lr
# are fill_only (never checked). train_batch_size is checked against world_size x micro x grad_accum (below).
# Dotted key (as HF names it) -> the resolve flag that carries the TrainingArguments value, in HF's order.
HF_MUST_MATCH_FLAGS: dict[str, str] = {
    "train_micro_batch_size_per_gpu": "--micro-batch",  # per_device_train_batch_size
    "gradient_accumulation_steps": "--grad-accum",  # gradient_accumulation_steps
    "gradient_clipping": "--max-grad-norm",  # max_grad_norm
    "optimizer.params.lr": "--lr",  # learning_rate
    "optimizer.params.betas": "--betas",  # [adam_beta1, adam_beta2]
    "optimizer.params.eps": "--eps",  # adam_epsilon
    "optimizer.params.weight_decay": "--weight-decay",  # weight_decay
    "scheduler.params.warmup_max_lr": "--lr",  # learning_rate
    "fp16.enabled": "--precision",  # fp16 or fp16_full_eval
    "bf16.enabled": "--precision",  # bf16 or bf16_full_eval
    "scheduler.params.total_num_steps": "--total-steps",  # num_training_steps
    "scheduler.params.warmup_num_steps": "--warmup-steps",  # max(1, warmup steps)
}


@dataclass(frozen=True)
class FlagMismatch:
    """A value the config fixes (not "auto") that a flag contradicts: HF Trainer refuses the config."""

    key: str
    """dotted config key, as transformers names it (``optimizer.params.lr``)."""
    config_value: Any
    flag: str
    """the flag(s) that give the other value (``--lr``; ``--micro-batch/--grad-accum`` for train_batch_size)."""
    given: str
    """what the flag says, as shown (``--lr is 0.0003``, ``--precision fp16 makes it false``)."""
    fix: str

    def line(self, source: str) -> str:
        return f"{source}: {self.key} is {json.dumps(self.config_value)} but {self.given}: {self.fix}"


def _fixed_value(cfg: Any, key: str) -> Any:
    """The config's value at dotted ``key`` when it fixes one (present, not None, not "auto"), else None: the values
    HF's fill_match compares (accelerate utils/deepspeed.py HfDeepSpeedConfig.find_config_node walks the dicts)."""
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return None if node is None or (isinstance(node, str) and node == "auto") else node


def flag_mismatches(cfg: dict, *, dp: int, micro_batch: Optional[int] = None, grad_accum: Optional[int] = None,
                    lr: Optional[float] = None, betas: Optional[tuple[float, float]] = None,
                    eps: Optional[float] = None, weight_decay: Optional[float] = None,
                    max_grad_norm: Optional[float] = None, warmup_steps: Optional[int] = None,
                    total_steps: Optional[int] = None, precision: Optional[str] = None) -> list[FlagMismatch]:
    """Values the config fixes that a given flag contradicts, as HF Trainer checks them (`HF_MUST_MATCH_FLAGS`).

    A flag not given is not compared (resolve does not know the TrainingArguments then; the config's value stands),
    and a flag equal to the fixed value (Python ==, as fill_match compares: 1e-4 == 0.0001, 1 == 1.0) is fine.
    train_batch_size is compared when --micro-batch or --grad-accum is given, with micro x grad_accum x dp (each from
    its flag, else the config, else HF's default); dp = world / (tp x pp) as DeepSpeed checks the triad (HF uses its
    world_size, the same without tp / pp). Without those flags a fixed triad that does not add up is the config's own
    (rule DS201).
    """
    given: dict[str, tuple[Any, str]] = {}  # key -> (the value HF would hold, how the flag gives it)

    def direct(key: str, value: Any, shown: Any) -> None:
        if value is not None:
            given[key] = (value, f"{HF_MUST_MATCH_FLAGS[key]} is {shown}")

    direct("train_micro_batch_size_per_gpu", micro_batch, micro_batch)
    direct("gradient_accumulation_steps", grad_accum, grad_accum)
    direct("gradient_clipping", max_grad_norm, max_grad_norm)
    direct("optimizer.params.lr", lr, lr)
    direct("optimizer.params.betas", list(betas) if betas else None, " ".join(map(str, betas or ())))
    direct("optimizer.params.eps", eps, eps)
    direct("optimizer.params.weight_decay", weight_decay, weight_decay)
    direct("scheduler.params.warmup_max_lr", lr, lr)
    if precision is not None:
        for half in ("fp16", "bf16"):
            on = precision == half
            given[f"{half}.enabled"] = (on, f"--precision {precision} makes it {json.dumps(on)}")
    direct("scheduler.params.total_num_steps", total_steps, total_steps)
    if warmup_steps is not None:
        steps, _ = _hf_warmup_num_steps(warmup_steps)
        given["scheduler.params.warmup_num_steps"] = (
            steps, f"--warmup-steps is {warmup_steps}" + (f" (filled as {steps})" if steps != warmup_steps else ""))
    out: list[FlagMismatch] = []
    for key, (value, shown) in given.items():
        fixed = _fixed_value(cfg, key)
        if fixed is not None and fixed != value:
            flag = HF_MUST_MATCH_FLAGS[key]
            out.append(FlagMismatch(key, fixed, flag, shown, f'set {key} to "auto" or drop {flag}'))
    tbs = _fixed_value(cfg, "train_batch_size")
    if tbs is not None and (micro_batch is not None or grad_accum is not None):
        mb = micro_batch if micro_batch is not None else _fixed_value(cfg, "train_micro_batch_size_per_gpu")
        ga = grad_accum if grad_accum is not None else _fixed_value(cfg, "gradient_accumulation_steps")
        mb_text = f"--micro-batch {mb}" if micro_batch is not None else (
            f"micro {mb} (config)" if mb is not None else f"micro {HF_DEFAULT_MICRO_BATCH} (HF default)")
        ga_text = f"--grad-accum {ga}" if grad_accum is not None else (
            f"grad_accum {ga} (config)" if ga is not None else f"grad_accum {HF_DEFAULT_GRAD_ACCUM} (HF default)")
        mb = HF_DEFAULT_MICRO_BATCH if mb is None else mb
        ga = HF_DEFAULT_GRAD_ACCUM if ga is None else ga
        if isinstance(mb, int) and isinstance(ga, int) and tbs != mb * ga * dp:
            fix = 'set train_batch_size to "auto"' + (
                f" or give --micro-batch x --grad-accum = {tbs // dp}" if isinstance(tbs, int) and tbs % dp == 0
                else f" ({tbs} is not a multiple of data-parallel {dp})")
            at = sum(m.key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps") for m in out)
            out.insert(at, FlagMismatch(
                "train_batch_size", tbs, "--micro-batch/--grad-accum",
                f"{mb_text} x {ga_text} x data-parallel {dp} is {mb * ga * dp}", fix))
    return out


@dataclass
class ResolveReport:
    """Result of `resolve_auto`: the filled config and what was (not) filled, with reasons."""

    config: dict
    filled: list[tuple[str, Any, str]]
    """(pointer, value, where the value came from)."""
    unfilled: list[tuple[str, str]]
    """(pointer, why it could not be filled)."""
    mismatches: list[FlagMismatch] = field(default_factory=list)
    """values the config fixes that a flag contradicts (`flag_mismatches`): HF Trainer refuses the config."""


def resolve_auto(cfg: dict, *, world_size: int, hidden_size: Optional[int] = None, tp: int = 1, pp: int = 1,
                 micro_batch: Optional[int] = None, grad_accum: Optional[int] = None, lr: Optional[float] = None,
                 betas: Optional[tuple[float, float]] = None, eps: Optional[float] = None,
                 weight_decay: Optional[float] = None, max_grad_norm: Optional[float] = None,
                 warmup_steps: Optional[int] = None, total_steps: Optional[int] = None,
                 precision: Optional[str] = None) -> ResolveReport:
    """Fill every "auto" the way HF Trainer does; values not given fall back to HF's TrainingArguments defaults.

    Args:
        cfg: parsed config (not modified).
        world_size: number of ranks; the data-parallel size is world_size / (tp * pp).
        hidden_size: model hidden size (for the three ZeRO bucket values).
        precision: "bf16", "fp16" or "fp32" (fills fp16/bf16 enabled).

    Returns:
        ResolveReport with the new config, the filled values, what was left, and the fixed values a flag
        contradicts (`flag_mismatches`; HF Trainer refuses such a config, so `dstoolkit resolve` writes nothing).
    """
    out = copy.deepcopy(cfg)
    filled: list[tuple[str, Any, str]] = []
    unfilled: list[tuple[str, str]] = []
    dp = data_parallel_size(world_size, tp, pp) or 1  # dstoolkit.layout; 1 when tp*pp does not divide

    def pick(given, default, flag):
        return (given, f"--{flag}") if given is not None else (default, f"HF default ({flag})")

    mb, mb_src = pick(micro_batch, HF_DEFAULT_MICRO_BATCH, "micro-batch")
    ga, ga_src = pick(grad_accum, HF_DEFAULT_GRAD_ACCUM, "grad-accum")
    if out.get("train_micro_batch_size_per_gpu") not in (None, "auto"):
        mb, mb_src = out["train_micro_batch_size_per_gpu"], "config"
    if out.get("gradient_accumulation_steps") not in (None, "auto"):
        ga, ga_src = out["gradient_accumulation_steps"], "config"
    lr_v, lr_src = pick(lr, HF_DEFAULT_LR, "lr")
    values: dict[str, tuple[Any, str]] = {
        "/train_micro_batch_size_per_gpu": (mb, mb_src),
        "/gradient_accumulation_steps": (ga, ga_src),
        "/train_batch_size": (mb * ga * dp if isinstance(mb, int) and isinstance(ga, int) else None,
                              f"micro {mb} x grad_accum {ga} x dp {dp}"),
        "/gradient_clipping": pick(max_grad_norm, HF_DEFAULT_MAX_GRAD_NORM, "max-grad-norm"),
        "/optimizer/params/lr": (lr_v, lr_src),
        "/optimizer/params/betas": (list(betas) if betas else list(HF_DEFAULT_BETAS),
                                    "--betas" if betas else "HF default (adam_beta1, adam_beta2)"),
        "/optimizer/params/eps": pick(eps, HF_DEFAULT_EPS, "eps"),
        "/optimizer/params/weight_decay": pick(weight_decay, HF_DEFAULT_WEIGHT_DECAY, "weight-decay"),
        "/scheduler/params/warmup_min_lr": (0, "HF (0)"),
        "/scheduler/params/warmup_max_lr": (lr_v, lr_src),
        "/scheduler/params/warmup_num_steps": _hf_warmup_num_steps(warmup_steps),
        "/scheduler/params/total_num_steps": (total_steps, "--total-steps"),
    }
    values["/zero_optimization/stage3_gather_16bit_weights_on_model_save"] = (
        False, "Accelerate default (zero3_save_16bit_model false)")
    if precision is not None:
        values["/fp16/enabled"] = (precision == "fp16", f"--precision {precision}")
        values["/bf16/enabled"] = (precision == "bf16", f"--precision {precision}")
    if hidden_size is not None:
        h = int(hidden_size)
        values["/zero_optimization/reduce_bucket_size"] = (h * h, f"hidden_size^2 = {h}^2")
        values["/zero_optimization/stage3_prefetch_bucket_size"] = (int(PREFETCH_FRACTION * h * h),
                                                                    f"0.9 x hidden_size^2 = 0.9 x {h}^2")
        values["/zero_optimization/stage3_param_persistence_threshold"] = (PERSISTENCE_FACTOR * h,
                                                                           f"10 x hidden_size = 10 x {h}")
    for path in find_auto(out):
        ptr = "".join(f"/{p}" for p in path)
        parent = out
        for p in path[:-1]:
            parent = parent[p]
        if ptr in values and values[ptr][0] is not None:
            value, src = values[ptr]
            parent[path[-1]] = value
            filled.append((ptr, value, src))
        elif ptr in HF_AUTO_FILLERS:
            need = {"/scheduler/params/total_num_steps": "--total-steps (HF derives it from the dataset length)",
                    "/fp16/enabled": "--precision", "/bf16/enabled": "--precision"}.get(ptr, "--hidden-size")
            unfilled.append((ptr, f"needs {need}"))
        else:
            unfilled.append((ptr, "HF does not fill 'auto' here; DeepSpeed would drop it or fail"))
    mismatches = flag_mismatches(cfg, dp=dp, micro_batch=micro_batch, grad_accum=grad_accum, lr=lr, betas=betas,
                                 eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm,
                                 warmup_steps=warmup_steps, total_steps=total_steps, precision=precision)
    return ResolveReport(config=out, filled=filled, unfilled=unfilled, mismatches=mismatches)
