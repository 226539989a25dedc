"""Time and cost to train a token budget: steps, wall time, GPU-hours and cost, the batch ramp counted step by step.

    from dstoolkit.estimate.training_plan import parse_token_count, plan_training
    tp = plan_training(plan, tokens=parse_token_count("14.8T"), ramp=spec.training.batch_ramp,
                       global_batch=spec.training.global_batch, gpu_hour_price=2.0)
    tp.gpu_hours, tp.wall_days, tp.cost, tp.to_json()

The ramp is the trainer's own schedule (`dstoolkit.estimate.batch_ramp.BatchRamp`, which the runtime re-exports), so
the step count here is the one the trainer runs. Each distinct global batch of the ramp is estimated once with its
own gradient accumulation (`estimate_run`, same micro-batch and layout): a small batch has fewer micro-batches per
step, so the pipeline bubble and the per-step collectives weigh more and the step is not the full step scaled down.

    wall_s     = sum over steps of step_time_s(global_batch of that step)
    gpu_hours  = wall_s * gpus / 3600            (every GPU is held for the whole run)
    cost       = gpu_hours * gpu_hour_price      (in the price's currency)

What it leaves out (say so when comparing with a published total): evaluation, checkpoint stalls, restarts after
failures and lost work, and any phase trained at another sequence length (context extension). No torch import.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict

from dstoolkit.estimate.batch_ramp import BatchRamp
from dstoolkit.estimate.core import estimate_run
from dstoolkit.runplan import RunPlan
from dstoolkit.spec import BatchRampSpec

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
TOKEN_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}
"""Decimal multipliers for token counts (B and G both 1e9: papers write 300B, some tools 300G)."""
_TOKEN_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([A-Za-z]?)\s*$")


class TrainingPlanError(ValueError):
    """Bad input to the training plan: the message names the flag or field, the value and the fix."""


def parse_token_count(text: str, flag: str = "--tokens") -> int:
    """A token count from `14.8T`, `300B`, `2e12`, `469000000000` (decimal suffixes K M B/G T P, case-insensitive).

    Raises:
        TrainingPlanError: the text does not parse, or is not positive.
    """
    m = _TOKEN_RE.match(str(text))
    suffix = m.group(3).upper() if m else None
    if m is None or suffix not in TOKEN_SUFFIXES:
        raise TrainingPlanError(f"{flag} {text!r}: not a token count; give a number with an optional suffix "
                                "K, M, B or T (e.g. 14.8T, 300B, 2e12)")
    value = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else "")) * TOKEN_SUFFIXES[suffix]
    if not math.isfinite(value):
        raise TrainingPlanError(f"{flag} {text!r}: too large to be a token count (e.g. 14.8T)")
    tokens = int(round(value))
    if tokens <= 0:
        raise TrainingPlanError(f"{flag} {text!r}: must be at least one token (e.g. 14.8T)")
    return tokens


def human_tokens(tokens: int) -> str:
    """1.48e13 -> '14.8T' (the largest suffix that leaves a number >= 1, 4 significant digits)."""
    for suffix in ("P", "T", "B", "M", "K"):
        if tokens >= TOKEN_SUFFIXES[suffix]:
            return f"{tokens / TOKEN_SUFFIXES[suffix]:.4g}{suffix}"
    return str(tokens)


def check_gpu_hour_price(price: Optional[float], flag: str = "--gpu-hour-price") -> Optional[float]:
    """The price per GPU-hour, or None; raises `TrainingPlanError` for a negative or non-finite one."""
    if price is None:
        return None
    if not math.isfinite(price) or price < 0:
        raise TrainingPlanError(f"{flag} {price}: a price per GPU-hour must be a finite number >= 0 (e.g. 2.0)")
    return float(price)


@dataclass(frozen=True)
class StepCost:
    """One optimizer step's estimated time at a given global batch."""

    step_time_s: float
    comm_exposed_s: float
    """Communication not hidden behind compute (the estimate's `comm_exposed_s`)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchPhase(_Frozen):
    """The steps run at one global batch."""

    global_batch: int
    """Sequences per optimizer step."""
    grad_accum: int
    """Micro-batches per rank per step (global_batch / (micro_batch x dp))."""
    steps: int
    tokens: int
    """Tokens these steps consume (steps x global_batch x seq_len)."""
    step_time_s: float
    comm_exposed_s: float
    wall_s: float
    """steps x step_time_s."""


class TrainingPlan(_Frozen):
    """How long and how much: `to_json()` is the stable shape of `estimate --tokens --format json` (`training_plan`)."""

    tokens_requested: int
    tokens_trained: int
    """Tokens the steps consume (>= requested: the last step runs a whole batch)."""
    seq_len: int
    gpus: int
    global_batch: int
    """Steady-state global batch (sequences)."""
    steps: int
    ramp_steps: int
    """Steps at a batch below global_batch (0 without a ramp)."""
    steady_steps: int
    ramp_tokens: int
    steady_tokens: int
    ramp_wall_s: float
    steady_wall_s: float
    wall_s: float
    steady_step_time_s: float
    steady_exposed_comm_share: float
    """Estimated exposed communication / step time at the steady-state batch."""
    gpu_hours: float
    gpu_hours_per_trillion_tokens: float
    gpu_hour_price: Optional[float]
    cost: Optional[float]
    """gpu_hours x gpu_hour_price (the price's currency); None without a price."""
    phases: list[BatchPhase]
    """One row per distinct global batch, in schedule order."""
    ramp_step_times: str
    """How the ramp's step times were found: "estimated at every batch" or "interpolated in grad_accum between N
    estimated batches" (the sweep's ranking, to stay fast)."""

    @property
    def wall_days(self) -> float:
        return self.wall_s / SECONDS_PER_DAY

    def to_json(self) -> dict:
        """Stable fields (documented in `dstoolkit estimate --help` and docs/estimate.md): see the class attributes."""
        out = self.model_dump()
        out["wall_days"] = self.wall_days
        return out


def batch_schedule(tokens: int, seq_len: int, global_batch: int, unit: int,
                   ramp: Optional[BatchRamp] = None) -> list[tuple[int, int]]:
    """(global batch, steps) in order for a run of `tokens` tokens: the ramp simulated step by step with the
    trainer's `BatchRamp.batch_at`, then the steady batch counted at once.

    Raises:
        TrainingPlanError: the run ends before the ramp reaches global_batch.
    """
    target = -(-tokens // seq_len)  # samples; the last step runs a whole batch
    out: list[tuple[int, int]] = []
    consumed = 0
    if ramp is not None:
        while True:
            gb = ramp.batch_at(consumed)
            if gb >= global_batch and consumed < target:
                break
            if consumed >= target:  # the run is over before the batch reaches global_batch
                ramp_tokens = ramp.ramp_samples * seq_len
                raise TrainingPlanError(
                    f"--tokens {human_tokens(tokens)}: the run ends inside training.batch_ramp, which reaches "
                    f"global_batch={global_batch} only after {human_tokens(ramp_tokens)} tokens "
                    f"({ramp.ramp_samples:,} samples): "
                    "the ramp is longer than the run; give more --tokens, or shorten the ramp "
                    "(batch_ramp.ramp_tokens / ramp_samples)")
            if out and out[-1][0] == gb:
                out[-1] = (gb, out[-1][1] + 1)
            else:
                out.append((gb, 1))
            consumed += gb
    if consumed < target:
        out.append((global_batch, -(-(target - consumed) // global_batch)))
    return out


def training_plan(tokens: int, *, seq_len: int, global_batch: int, unit: int, gpus: int,
                  step_cost: Callable[[int], StepCost], ramp: Optional[BatchRamp] = None,
                  gpu_hour_price: Optional[float] = None, ramp_step_times: str = "estimated at every batch"
                  ) -> TrainingPlan:
    """The plan from a step-time function of the global batch (called once per distinct batch).

    Args:
        tokens: tokens to train (> 0).
        seq_len: tokens per sequence.
        global_batch: steady-state sequences per step (a multiple of `unit`).
        unit: micro_batch x dp, the batch granularity DeepSpeed runs.
        gpus: GPUs held by the job.
        step_cost: the estimated step at a global batch.
        ramp: the bound batch ramp, or None.
        gpu_hour_price: price per GPU-hour, or None.
    """
    price = check_gpu_hour_price(gpu_hour_price)
    if tokens <= 0:
        raise TrainingPlanError(f"--tokens {tokens}: must be at least one token (e.g. 14.8T)")
    phases = []
    for gb, steps in batch_schedule(tokens, seq_len, global_batch, unit, ramp):
        c = step_cost(gb)
        phases.append(BatchPhase(global_batch=gb, grad_accum=gb // unit, steps=steps, tokens=steps * gb * seq_len,
                                 step_time_s=c.step_time_s, comm_exposed_s=c.comm_exposed_s,
                                 wall_s=steps * c.step_time_s))
    ramp_ph = [p for p in phases if p.global_batch < global_batch]
    steady = [p for p in phases if p.global_batch >= global_batch]
    steady_cost = step_cost(global_batch) if not steady else StepCost(steady[0].step_time_s, steady[0].comm_exposed_s)
    wall = sum(p.wall_s for p in phases)
    trained = sum(p.tokens for p in phases)
    gpu_hours = wall * gpus / SECONDS_PER_HOUR
    return TrainingPlan(
        tokens_requested=tokens, tokens_trained=trained, seq_len=seq_len, gpus=gpus, global_batch=global_batch,
        steps=sum(p.steps for p in phases), ramp_steps=sum(p.steps for p in ramp_ph),
        steady_steps=sum(p.steps for p in steady), ramp_tokens=sum(p.tokens for p in ramp_ph),
        steady_tokens=sum(p.tokens for p in steady), ramp_wall_s=sum(p.wall_s for p in ramp_ph),
        steady_wall_s=sum(p.wall_s for p in steady), wall_s=wall, steady_step_time_s=steady_cost.step_time_s,
        steady_exposed_comm_share=(steady_cost.comm_exposed_s / steady_cost.step_time_s
                                   if steady_cost.step_time_s > 0 else 0.0),
        gpu_hours=gpu_hours, gpu_hours_per_trillion_tokens=gpu_hours / (trained / 1e12),
        gpu_hour_price=price, cost=None if price is None else gpu_hours * price, phases=phases,
        ramp_step_times=ramp_step_times if ramp_ph else "no ramp")


def plan_at_batch(plan: RunPlan, global_batch: int) -> RunPlan:
    """The same run at another global batch: same micro-batch and layout, gradient accumulation changed (what
    DeepSpeed's `set_train_batch_size` does during the ramp)."""
    unit = plan.ds.micro_batch * plan.dp
    if global_batch % unit:
        raise TrainingPlanError(f"global batch {global_batch} is not a multiple of micro_batch x dp = {unit}")
    ds = dict(plan.ds_config)
    ds["train_batch_size"] = global_batch
    ds["gradient_accumulation_steps"] = global_batch // unit
    return RunPlan.model_validate({**dict(plan), "ds_config": ds})


def plan_training(plan: RunPlan, tokens: int, *, ramp: Optional[BatchRampSpec] = None,
                  gpu_hour_price: Optional[float] = None, max_estimates: Optional[int] = None) -> TrainingPlan:
    """The training plan of a resolved run (its DeepSpeed JSON's batch is the steady state), step times from
    `estimate_run` at each batch of the ramp.

    `max_estimates` (None: no limit) caps the `estimate_run` calls: when the ramp has more distinct batches, the
    step time is estimated at that many batches spread over the ramp (the first and the steady one included) and
    interpolated linearly in gradient accumulation between them (the step is compute per micro-batch plus per-step
    terms, so it is close to affine in grad_accum); `ramp_step_times` says which was done.

    Raises:
        TrainingPlanError: bad tokens / price, or a ramp longer than the run (the message names the flag).
    """

    unit = plan.ds.micro_batch * plan.dp
    global_batch = plan.ds.micro_batch * plan.ds.grad_accum * plan.dp
    bound = None
    if ramp is not None:
        try:
            bound = BatchRamp.from_spec(ramp, global_batch=global_batch, micro_batch=plan.ds.micro_batch,
                                        dp_size=plan.dp, seq_len=plan.seq_len)
        except ValueError as exc:
            raise TrainingPlanError(f"training.batch_ramp: {exc}") from None
    cache: dict[int, StepCost] = {}

    def exact(gb: int) -> StepCost:
        if gb not in cache:
            est = estimate_run(plan if gb == global_batch else plan_at_batch(plan, gb))
            cache[gb] = StepCost(est.step_time_s, est.step_time.comm_exposed_s)
        return cache[gb]

    how = "estimated at every batch"
    cost = exact
    batches = sorted({gb for gb, _ in batch_schedule(tokens, plan.seq_len, global_batch, unit, bound)})
    if max_estimates is not None and len(batches) > max(2, max_estimates):
        k = max(2, max_estimates)
        knots = sorted({batches[round(i * (len(batches) - 1) / (k - 1))] for i in range(k)})
        how = f"interpolated in grad_accum between {len(knots)} estimated batches"

        def cost(gb: int) -> StepCost:  # noqa: F811 - the interpolating variant
            if gb in knots:
                return exact(gb)
            hi = next(i for i, b in enumerate(knots) if b > gb)
            b0, b1 = knots[hi - 1], knots[hi]
            c0, c1, w = exact(b0), exact(b1), (gb - b0) / (b1 - b0)
            return StepCost(c0.step_time_s + w * (c1.step_time_s - c0.step_time_s),
                            c0.comm_exposed_s + w * (c1.comm_exposed_s - c0.comm_exposed_s))

    return training_plan(tokens, seq_len=plan.seq_len, global_batch=global_batch, unit=unit, gpus=plan.world_size,
                         step_cost=cost, ramp=bound, gpu_hour_price=gpu_hour_price, ramp_step_times=how)


def render_training_plan(tp: TrainingPlan) -> list[str]:
    """The plan as text lines (estimate, generate's summary)."""
    def hours(s: float) -> str:
        return f"{s / SECONDS_PER_HOUR:,.1f} h"

    lines = [f"training plan for {human_tokens(tp.tokens_requested)} tokens on {tp.gpus} GPUs: {tp.steps:,} steps, "
             f"{tp.wall_days:,.1f} days ({hours(tp.wall_s)}), {tp.gpu_hours:,.0f} GPU-hours "
             f"({tp.gpu_hours_per_trillion_tokens:,.0f} per trillion tokens)"
             + (f", cost {tp.cost:,.0f} at {tp.gpu_hour_price:g} per GPU-hour" if tp.cost is not None else "")]
    if tp.ramp_steps:
        n = len(tp.phases) - 1
        lines.append(f"  ramp: {tp.ramp_steps:,} steps ({n} batch size{'s' if n > 1 else ''} "
                     f"{tp.phases[0].global_batch} -> {tp.phases[-2].global_batch}), {human_tokens(tp.ramp_tokens)} tokens, "
                     f"{hours(tp.ramp_wall_s)}; step {tp.phases[0].step_time_s:.4g} s at batch "
                     f"{tp.phases[0].global_batch}")
    lines.append(f"  steady: {tp.steady_steps:,} steps at batch {tp.global_batch}, {human_tokens(tp.steady_tokens)} tokens, "
                 f"{hours(tp.steady_wall_s)}; step {tp.steady_step_time_s:.4g} s, exposed comm "
                 f"{tp.steady_exposed_comm_share:.0%} of it (estimated)")
    lines.append("  not counted: evaluation, checkpoint stalls, failures and restarts, context-extension phases")
    return lines
