"""Global-batch ramp-up (pure Python, no torch import): DeepSeek-style token ramp and Megatron's `--rampup-batch-size`.

Both forms reduce to one schedule, Megatron-LM's `RampupBatchsizeNumMicroBatchesCalculator`
(megatron/core/num_microbatches_calculator.py): with `n = ceil((end - start) / increment)` increments spread
evenly over `ramp_samples` consumed samples,

    batch(consumed) = end                                            if consumed > ramp_samples
                    = min(end, start + floor(consumed * n / ramp_samples) * increment)   otherwise

then rounded *down* to a multiple of micro_batch x dp (never below one micro-batch per rank), because
DeepSpeed's `engine.set_train_batch_size` only changes gradient accumulation and rejects other sizes.
The token form (DeepSeek-V3 §4.2: 3072 -> 15360 sequences over the first 469B tokens) converts tokens to
samples with `ramp_samples = ceil(ramp_tokens / seq_len)` (the generator's megatron_args does the same). Integer arithmetic replaces Megatron's float
`consumed / samples_per_increment`, so step boundaries are exact.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Literal, Optional

from dstoolkit.spec import BatchRampSpec


def _check_count(name: str, value: Any, least: int = 1) -> int:
    """`value` as an int: it must be a whole number (any integer type, numpy's included; not a bool or a float:
    batches are whole sequences) >= `least`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name}={value!r} must be {'> 0' if least == 1 else f'>= {least}'} (a whole number)")
    return int(value)


@dataclass(frozen=True)
class RampPoint:
    """One optimizer step of a simulated ramp."""

    step: int
    """Optimizer step index (0-based)."""
    consumed_samples: int
    """Samples consumed before this step."""
    global_batch: int
    """Global batch (sequences) of this step."""
    grad_accum: int
    """Gradient-accumulation steps = global_batch / (micro_batch * dp)."""


@dataclass(frozen=True)
class BatchRamp:
    """A batch-size ramp bound to a micro-batch and data-parallel size."""

    start_batch: int
    """Global batch at step 0 (before rounding)."""
    end_batch: int
    """Global batch after the ramp (training.global_batch)."""
    increment: int
    """Sequences added per increment."""
    ramp_samples: int
    """Samples over which the ramp runs."""
    micro_batch: int
    """Per-rank micro-batch (fixed during the ramp)."""
    dp_size: int
    """Data-parallel world size."""
    kind: Literal["tokens", "megatron"] = "megatron"
    """Which form the ramp was given in."""
    seq_len: Optional[int] = None
    """Tokens per sequence (token form; used to report tokens)."""

    def __post_init__(self) -> None:
        self._check_positive()
        self._check_end_reachable()

    def _check_positive(self) -> None:
        # stored as Python ints (frozen: object.__setattr__), so a numpy integer never reaches JSON or the schedule
        for name in ("start_batch", "end_batch", "increment", "ramp_samples", "micro_batch", "dp_size"):
            object.__setattr__(self, name, _check_count(f"batch_ramp.{name}", getattr(self, name)))
        if self.seq_len is not None:
            object.__setattr__(self, "seq_len", _check_count("batch_ramp.seq_len", self.seq_len))

    def _check_end_reachable(self) -> None:
        unit = self.micro_batch * self.dp_size
        if self.start_batch > self.end_batch:
            raise ValueError(
                f"batch_ramp.start_batch={self.start_batch} exceeds training.global_batch={self.end_batch}; "
                "a ramp only grows the batch"
            )
        if self.end_batch % unit != 0:
            raise ValueError(
                f"training.global_batch={self.end_batch} is not a multiple of micro_batch x dp = "
                f"{self.micro_batch} x {self.dp_size} = {unit}; DeepSpeed cannot run it"
            )

    @property
    def unit(self) -> int:
        """micro_batch x dp: the granularity DeepSpeed can run."""
        return self.micro_batch * self.dp_size

    @property
    def num_increments(self) -> int:
        return max(1, -(-(self.end_batch - self.start_batch) // self.increment))

    @classmethod
    def from_spec(
        cls, spec: BatchRampSpec, *, global_batch: int, micro_batch: int, dp_size: int, seq_len: int
    ) -> "BatchRamp":
        """Bind a `training.batch_ramp` spec section to a run's micro-batch, dp size and sequence length."""
        seq_len = _check_count("seq_len", seq_len)
        unit = micro_batch * dp_size
        if spec.kind == "tokens":
            if spec.ramp_tokens is None:
                raise ValueError("training.batch_ramp.ramp_tokens is required when batch_ramp.kind='tokens'")
            samples = -(-spec.ramp_tokens // seq_len)  # ceil: the ramp spans at least ramp_tokens (as generate)
            return cls(spec.start_batch, global_batch, spec.increment or unit, samples, micro_batch, dp_size,
                       "tokens", seq_len)
        if spec.increment is None or spec.ramp_samples is None:
            raise ValueError(
                "training.batch_ramp.increment and training.batch_ramp.ramp_samples are both required when "
                f"batch_ramp.kind='megatron' (got increment={spec.increment}, ramp_samples={spec.ramp_samples})"
            )
        return cls(spec.start_batch, global_batch, spec.increment, spec.ramp_samples, micro_batch, dp_size,
                   "megatron", seq_len)

    def batch_at(self, consumed_samples: int) -> int:
        """Global batch for the step that starts after `consumed_samples` samples (rounded to micro x dp)."""
        consumed_samples = _check_count("consumed_samples", consumed_samples, 0)
        if consumed_samples > self.ramp_samples:
            raw = self.end_batch
        else:
            steps = consumed_samples * self.num_increments // self.ramp_samples
            raw = min(self.end_batch, self.start_batch + steps * self.increment)
        return max(self.unit, raw // self.unit * self.unit)

    def batch_at_tokens(self, consumed_tokens: int) -> int:
        """Token form: global batch after `consumed_tokens` tokens (needs seq_len)."""
        if not self.seq_len:
            raise ValueError("batch_at_tokens needs seq_len; build the ramp with from_spec(..., seq_len=...)")
        consumed_tokens = _check_count("consumed_tokens", consumed_tokens, 0)
        return self.batch_at(consumed_tokens // self.seq_len)

    def schedule(self, num_steps: int) -> list[RampPoint]:
        """Simulate `num_steps` optimizer steps: the batch each one runs with."""
        num_steps = _check_count("num_steps", num_steps, 0)
        points, consumed = [], 0
        for step in range(num_steps):
            gb = self.batch_at(consumed)
            points.append(RampPoint(step, consumed, gb, gb // self.unit))
            consumed += gb
        return points

    def apply(self, engine: Any, consumed_samples: int) -> int:
        """Set the engine's global batch for the next step (only when it changes); returns that batch.

        Uses `engine.set_train_batch_size`, which keeps the micro-batch and changes gradient accumulation.
        """
        gb = self.batch_at(consumed_samples)
        if engine.train_batch_size() != gb:
            engine.set_train_batch_size(gb)
        return gb

    def megatron_rampup_args(self) -> list[str]:
        """`["--rampup-batch-size", start, increment, samples]` for Megatron-LM with the same schedule.

        Megatron requires (global_batch - start) to be a multiple of the increment; a token-form ramp whose
        increment does not divide the difference has no exact Megatron equivalent and raises.
        """
        if (self.end_batch - self.start_batch) % self.increment != 0:
            raise ValueError(
                f"Megatron needs (global_batch - start_batch) = {self.end_batch - self.start_batch} to be a multiple "
                f"of batch_ramp.increment={self.increment}; pick an increment that divides it"
            )
        return ["--rampup-batch-size", str(self.start_batch), str(self.increment), str(self.ramp_samples)]
