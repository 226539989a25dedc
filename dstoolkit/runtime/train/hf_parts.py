"""`DstoolkitCallback`'s pieces: the DeepSpeed engine it finds, the peak memory it reports, and the estimate beside
its measured figures, and the check that the spec describes the model the
Trainer trains: the estimate (tokens/s, MFU, memory, comm share) and the MFU's FLOPs per token come from the spec's
model at the spec's seq_len. When the live model's parameter count differs from the spec's, or a batch's sequence
is longer than its seq_len, those figures would look authoritative and be wrong (a 0.1M-parameter script under a
3.95M-parameter spec showed 30x its MFU): one line says so, the estimate is not shown, and MFU counts 6 x the live
model's parameters per token (`live_flops_per_token`)."""
from __future__ import annotations

from typing import Any, Optional

PARAM_TOLERANCE = 0.05
"""Relative difference of parameter counts above which the spec's model is not the Trainer's (the same
architecture counts within a fraction of a percent: `dstoolkit.models.params.count_params` is exact per family)."""

ESTIMATE_KEYS = ("step_time_s", "tokens_per_s", "mfu", "memory_per_rank_bytes", "comm_share")
DS_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
           "zero_optimization", "bf16", "fp16", "optimizer", "activation_checkpointing")
"""The DeepSpeed config sections the estimate reads (HF adds e.g. steps_per_print=inf, which the config model
refuses)."""


def live_params(model: Any) -> int:
    """Parameters of the live model (ZeRO-3 partitions them: each one's full size is `ds_numel`)."""
    return sum(int(getattr(p, "ds_numel", None) or p.numel()) for p in model.parameters())


def live_flops_per_token(n_params: int) -> float:
    """Training FLOPs per token of a dense model of `n_params` (forward + backward, 6N; attention not counted)."""
    return 6.0 * n_params


def human(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"


def params_mismatch(spec_params: int, n_live: int) -> bool:
    return abs(n_live - spec_params) > PARAM_TOLERANCE * max(spec_params, 1)


def mismatch_line(name: str, what: str, spec_value: str, live_value: str) -> str:
    """The one line for a spec whose model is not the Trainer's."""
    return (f"spec model {name} {what} {spec_value}, the Trainer's {live_value}: the estimate is not shown and MFU "
            "counts 6 x the Trainer model's parameters per token (pass the spec of this model and seq_len for the "
            "estimate)")


def batch_tokens(module: Any, args: tuple, kwargs: Optional[dict]) -> tuple[Any, Any, int]:
    """(input_ids, attention_mask, token positions) of one forward. Positional arguments are matched to the names
    of `module.forward`: a vision model's first argument is pixel_values ([B, C, H, W]), and inputs_embeds
    ([B, S, H]) is not tokens either. The positions are input_ids' elements, else the mask's, else inputs_embeds'
    [B, S]; 0 when the forward has none of them."""
    kw = dict(kwargs or {})
    if args:
        import inspect

        try:
            kw = {**inspect.signature(getattr(module, "forward", module)).bind_partial(*args).arguments, **kw}
        except (TypeError, ValueError):  # no signature, or more positional arguments than it names
            pass
    ids, mask, embeds = (kw.get(k) for k in ("input_ids", "attention_mask", "inputs_embeds"))
    ids = ids if getattr(ids, "ndim", 0) >= 1 else None
    mask = mask if getattr(mask, "ndim", 0) >= 1 else None
    if ids is not None:
        count = int(ids.numel())
    elif mask is not None:
        count = int(mask.numel())
    elif getattr(embeds, "ndim", 0) >= 2:
        count = int(embeds[..., 0].numel())
    else:
        count = 0
    return ids, mask, count


def longest_sequence(ids: Any, mask: Any, seq_len: int) -> Optional[int]:
    """The tokens of the batch's longest sequence when it exceeds `seq_len`, else None. A batch padded to at most
    `seq_len` (its last dimension) is not longer whatever its mask; one padded beyond counts its attention mask's
    ones (a 0/1 mask of the same length), so padding alone is never a mismatch."""
    padded = ids if ids is not None and ids.ndim >= 2 else mask if mask is not None and mask.ndim >= 2 else None
    if padded is None or int(padded.shape[-1]) <= seq_len:
        return None
    longest = int(padded.shape[-1])
    if mask is not None and mask.ndim >= 2 and int(mask.shape[-1]) == longest:
        longest = int(mask.sum(-1).max())
    return longest if longest > seq_len else None


def run_estimate(spec: Any, shape: Any, engine: Any, world: int, say: Any) -> tuple[Optional[dict], Any, Any]:
    """(the estimate's figures, FLOPs per token, peak FLOP/s per rank) for `spec`'s model on the engine's DeepSpeed
    config; (None, None, None) when it cannot be had (said in one line: the estimate is an extra)."""
    try:
        from dstoolkit.runtime.bench.train_estimate import estimate_for

        ds = dict(engine._config._param_dict) if engine is not None else {}
        ds = {k: v for k, v in ds.items() if k in DS_KEYS}
        # inside a training rank: never start a machine probe beside the job (cached calibration only)
        est = estimate_for(spec, shape, ds, world, 1, None, probe=False) if ds else None
        ramp = getattr(spec.training, "batch_ramp", None) or getattr(spec.training, "rampup", None)
        if ramp:
            say(f"batch ramp {ramp!r} in the spec is NOT applied: the HF Trainer fixes the per-device batch and the "
                "accumulation count at train start")
        if est and "error" in est:
            say(f"estimate unavailable: {est['error'].splitlines()[0]}")
        if not est or "error" in est:
            return None, None, None
        return ({k: est.get(k) for k in ESTIMATE_KEYS}, est.get("flops_per_token"),
                est.get("peak_flops_per_rank"))
    except Exception as exc:  # noqa: BLE001 - the estimate is an extra; never break training for it
        say(f"estimate unavailable: {type(exc).__name__}: {exc}")
        return None, None, None


def find_engine(model: Any) -> Any:
    """The DeepSpeedEngine wrapping `model` (the Trainer does not hand it to callbacks)."""
    import gc

    try:
        from deepspeed.runtime.engine import DeepSpeedEngine
    except ImportError:
        return None
    import warnings

    with warnings.catch_warnings():  # isinstance on some torch module objects warns (deprecated aliases)
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, DeepSpeedEngine) and obj.module is model:
                    return obj
            except Exception:
                continue
    return None


def peak_memory() -> Optional[int]:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except Exception:
        return None
