"""What model a checkpoint holds and how it was trained, beside its ZeRO layout (`resume_check.SavedLayout`): the
precision, the expert-parallel size and the parameters' names and shapes. DeepSpeed 0.19.8 cannot load across any of
them and fails deep in its loader (a bf16 checkpoint under an fp32 config: FileNotFoundError for
zero_pp_rank_*_optim_states.pt, the files being bf16_zero_pp_rank_*; another ep size: the parameter-alignment
RuntimeError; another model: load_state_dict's missing / unexpected keys), so `resume_check` refuses first.

The trainer's manifest records them (`manifest_run`, written by `CheckpointManager.save` under "run"); for a tag saved
before that, they are read from DeepSpeed's own files (`from_meta`: the saved ds_config, the bf16_ optimizer file
prefix, `param_shapes`, `num_experts`) and what cannot be read is not compared. No torch import: the engine is read
duck-typed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

MANIFEST_KEY = "run"
"""The manifest's key for `manifest_run` (dstoolkit_manifest.json, beside "files", "step", "healthy")."""

_EXPERT = re.compile(r"^(?P<layer>.*\.deepspeed_experts)\.(?P<i>\d+)\.")


@dataclass(frozen=True)
class RunMatch:
    """Precision ("bf16" / "fp16" / "fp32"), expert-parallel size and {parameter name: shape} (None: unknown)."""

    precision: Optional[str] = None
    ep: Optional[int] = None
    params: Optional[dict[str, tuple[int, ...]]] = None
    frozen: frozenset[str] = frozenset()
    """A live model's parameters that do not train (requires_grad False)."""
    frozen_unlisted: bool = False
    """A saved list that may leave frozen parameters out: DeepSpeed's param_shapes holds the optimizer's (trainable)
    parameters, and frozen_param_shapes is saved only where ZeRO partitions gradients (stage 2 / 3)."""


def _shape(v: Any) -> Optional[tuple[int, ...]]:
    v = getattr(v, "shape", v)  # a TensorMeta / torch.Size / tuple / list
    try:
        return tuple(int(d) for d in v)
    except (TypeError, ValueError):
        return None


def _params(groups: Any) -> Optional[dict[str, tuple[int, ...]]]:
    """{name: shape} from a list of {name: shape} mappings (DeepSpeed's param_shapes, one per param group)."""
    out: dict[str, tuple[int, ...]] = {}
    for group in groups if isinstance(groups, (list, tuple)) else [groups]:
        if not isinstance(group, dict):
            return None
        for name, shape in group.items():
            s = _shape(shape)
            if not isinstance(name, str) or s is None:
                return None
            out[name] = s
    return out


def precision_of(ds_config: Any) -> Optional[str]:
    """The precision a DeepSpeed config trains in (None: not a config object)."""
    if not isinstance(ds_config, dict):
        return None
    for precision, keys in (("bf16", ("bf16", "bfloat16")), ("fp16", ("fp16",))):  # DeepSpeed reads either name
        if any(isinstance(ds_config.get(k), dict) and ds_config[k].get("enabled") is True for k in keys):
            return precision
    return "fp32"


def local_experts_ep(params: Optional[dict], num_experts: Any) -> Optional[int]:
    """The expert-parallel size from one rank's expert parameter names (`...deepspeed_experts.<local i>.`) and the
    experts per layer (DeepSpeed's `num_experts`); 1 without MoE layers, None when not readable."""
    if params is None:
        return None
    local: dict[str, set[str]] = {}
    for name in params:
        m = _EXPERT.match(name)
        if m:
            local.setdefault(m["layer"], set()).add(m["i"])
    if not local:
        return 1
    n = num_experts[0] if isinstance(num_experts, (list, tuple)) and num_experts else None
    k = len(next(iter(local.values())))
    return n // k if isinstance(n, int) and k and n % k == 0 else None


def from_meta(head: Any, bf16_files: bool) -> RunMatch:
    """A tag saved without the manifest's "run": from the model states' pickled metadata (`head`) and whether its
    optimizer files carry DeepSpeed's bf16_ prefix."""
    head = head if isinstance(head, dict) else {}
    precision = precision_of(head.get("ds_config"))
    if bf16_files:
        precision = "bf16"
    params = _params(head.get("param_shapes")) if head.get("param_shapes") is not None else None
    listed = isinstance(head.get("frozen_param_shapes"), dict)
    if params is not None and listed:
        params.update(_params(head["frozen_param_shapes"]) or {})
    return RunMatch(precision, local_experts_ep(params, head.get("num_experts")), params, frozen_unlisted=not listed)


def from_manifest(manifest: Any) -> Optional[RunMatch]:
    """The manifest's "run" (None: a tag saved before it was recorded, or a damaged record)."""
    run = manifest.get(MANIFEST_KEY) if isinstance(manifest, dict) else None
    if not isinstance(run, dict):
        return None
    params = run.get("params")
    parsed = None
    if isinstance(params, list) and all(isinstance(p, list) and len(p) == 2 for p in params):
        parsed = _params([{n: s for n, s in params}])
    ep = run.get("ep_size")
    return RunMatch(run.get("precision") if run.get("precision") in ("bf16", "fp16", "fp32") else None,
                    ep if isinstance(ep, int) and not isinstance(ep, bool) and ep >= 1 else None, parsed)


def engine_precision(engine: Any) -> str:
    """"bf16" / "fp16" / "fp32": what a DeepSpeed engine computes in."""
    return "bf16" if engine.bfloat16_enabled() else ("fp16" if engine.fp16_enabled() else "fp32")


def of_engine(engine: Any) -> Optional[RunMatch]:
    """What a DeepSpeed engine trains (None: not an engine, e.g. a test double)."""
    module = getattr(engine, "module", None)
    if module is None or not hasattr(module, "named_parameters") or not hasattr(engine, "bfloat16_enabled"):
        return None
    precision = engine_precision(engine)
    # ZeRO-3 partitions a parameter; ds_shape is its full shape (what DeepSpeed's param_shapes records)
    params = {n: tuple(int(d) for d in getattr(p, "ds_shape", p.shape)) for n, p in module.named_parameters()}
    frozen = frozenset(n for n, p in module.named_parameters() if not getattr(p, "requires_grad", True))
    ep = max((int(m.ep_size) for m in module.modules() if type(m).__name__ == "MoE"
              and isinstance(getattr(m, "ep_size", None), int)), default=1)  # deepspeed.moe.layer.MoE
    return RunMatch(precision, ep, params, frozen)


def manifest_run(engine: Any) -> Optional[dict]:
    """The manifest's "run" record for what `engine` trains (None: not an engine)."""
    run = of_engine(engine)
    if run is None:
        return None
    return {"precision": run.precision, "ep_size": run.ep, "params": [[n, list(s)] for n, s in run.params.items()]}


def _first_param_difference(saved: dict, current: dict, unlisted: frozenset = frozenset()) -> Optional[str]:
    """The first parameter the two lists disagree on; `unlisted`: this run's parameters the saved list may leave out
    (frozen ones, `RunMatch.frozen_unlisted`)."""
    for name, shape in saved.items():
        if name not in current:
            return f"parameter {name} {list(shape)} is not in this run's model"
        if current[name] != shape:
            return f"parameter {name} is {list(shape)} there and {list(current[name])} in this run's model"
    extra = next((n for n in current if n not in saved and n not in unlisted), None)
    return f"this run's parameter {extra} {list(current[extra])} is not in it" if extra else None


def run_refusal(where: str, resume: str, tag: str, saved: RunMatch, current: RunMatch, ep_fix: str,
                model_fix: str) -> Optional[str]:
    """Why `tag` (saved as `saved`) cannot be resumed by a run that trains `current` (None: it can, as far as both
    are known). `where` / `resume`: how the caller names the folder and the resume; `ep_fix` / `model_fix`: what it
    changes to resume at the saved ep size / model."""
    head = f"{where}: {resume} would load {tag}"
    if None not in (saved.precision, current.precision) and saved.precision != current.precision \
            and "bf16" in (saved.precision, current.precision):
        # ZeRO 1-3: BF16_Optimizer writes bf16_zero_pp_rank_* files; ZeRO 0: the optimizer state inside
        # mp_rank_00_model_states.pt is the bf16 wrapper's, which torch's optimizer cannot load (KeyError 'param_groups'
        # bf16 -> fp32, 'dynamic_loss_scale' fp32 -> bf16: real 2-rank DeepSpeed 0.19.8 loads, s35 ckpt finding 3)
        return (f"{head}, saved in {saved.precision}, but this run is {current.precision}; DeepSpeed's bf16 optimizer "
                f"state is not the fp32 one (bf16_zero_pp_rank_* files at ZeRO 1-3, another optimizer state in the "
                f"model-states file at ZeRO 0) and loads only into its own precision. Resume with "
                f"{'bf16.enabled true' if saved.precision == 'bf16' else 'bf16.enabled false'} in the DeepSpeed config "
                "(at ZeRO 1-3 `dstoolkit ckpt reshard` makes a universal copy, which loads across precision in a "
                "DeepSpeed loop of your own with load_universal_checkpoint; this resume does not load universal "
                "checkpoints)")
    if None not in (saved.ep, current.ep) and saved.ep != current.ep:
        return (f"{head}, saved at expert-parallel size {saved.ep}, but this run's is {current.ep}; DeepSpeed loads "
                f"a MoE checkpoint only at the ep size it was saved at (each rank saved its own experts). "
                f"Resume with {ep_fix.format(ep=saved.ep)}")
    if saved.params is not None and current.params is not None:
        diff = _first_param_difference(saved.params, current.params,
                                       current.frozen if saved.frozen_unlisted else frozenset())
        if diff:
            return (f"{head}, saved from another model: {diff} ({len(saved.params)} parameters saved, "
                    f"{len(current.params)} in this run). {model_fix}")
    return None
