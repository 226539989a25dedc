"""Loss-spike guard: detect spikes (robust z-score, NaN/Inf, grad-norm) and decide an action (no torch import).

Detection (per candidate micro-batch loss, before its backward; and per step for the gradient norm):
  * robust z-score of the loss against the median/MAD of the last `window` accepted step losses
    (Iglewicz & Hoaglin 1993 modified z-score: z = (x - median) / (1.4826 * MAD)); only upward spikes count;
    by default the window is detrended first (Theil-Sen line, MAD of the residuals) so that a fast-falling
    early loss does not widen the band;
  * a non-finite loss or gradient norm;
  * a grad-norm robust z-score above `grad_norm_z_threshold`.
Actions (each configurable): skip the batch (no backward), scale the LR down for K steps, roll back to the
last good DeepSpeed checkpoint and skip the offending batches. Repeated skips escalate to a rollback:
one bad batch is skipped, a damaged model (every batch spikes) is rolled back.
The trainer applies the decisions; the guard logs every one with its reason.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Literal, Optional

MAD_TO_SIGMA = 1.4826
"""MAD x 1.4826 estimates the standard deviation of a normal sample (Rousseeuw & Croux 1993)."""

Action = Literal["none", "skip", "lr_scale", "rollback"]
Kind = Literal["ok", "loss_spike", "nonfinite_loss", "grad_norm_spike", "nonfinite_grad_norm"]


@dataclass(frozen=True)
class SpikeGuardConfig:
    """Thresholds and the action per detection kind."""

    window: int = 20
    """Accepted step losses kept for the median/MAD baseline."""
    min_history: int = 5
    """No z-score decision before this many accepted steps (NaN/Inf is always caught)."""
    z_threshold: float = 6.0
    """Loss robust z-score above which a batch is a spike."""
    mad_floor_frac: float = 0.01
    """MAD floor as a fraction of the median: a flat loss must not make noise look like a spike."""
    detrend: bool = True
    """Measure the loss against a Theil-Sen trend line of the window instead of its median (early training
    falls fast; the median lags and the spread hides spikes)."""
    grad_norm_z_threshold: float = 10.0
    """Grad-norm robust z-score above which a step is a spike."""
    on_loss_spike: Action = "skip"
    """Action for a loss spike."""
    on_nonfinite: Action = "skip"
    """Action for a NaN/Inf loss."""
    on_grad_norm_spike: Action = "lr_scale"
    """Action for a grad-norm spike (seen after the update; skip is not possible, so lr_scale or rollback)."""
    escalate_after: int = 2
    """This many consecutive skipped batches escalate to `rollback` (0 disables escalation)."""
    lr_scale: float = 0.1
    """LR multiplier while cooling down."""
    lr_scale_steps: int = 10
    """Steps the LR stays scaled after an lr_scale or a rollback."""
    lr_scale_on_rollback: bool = True
    """Also cool the LR down after a rollback."""
    rollback_margin_steps: int = 2
    """Roll back to a checkpoint at least this many steps older than the spike: damage (an LR blow-up)
    happens one or more steps before the loss shows it."""

    def __post_init__(self) -> None:
        if self.window < self.min_history or self.min_history < 2:
            raise ValueError(
                f"spike guard: need 2 <= min_history <= window, got min_history={self.min_history}, window={self.window}"
            )
        if not 0 < self.lr_scale <= 1:
            raise ValueError(f"spike guard: lr_scale={self.lr_scale} must be in (0, 1]")
        if self.on_grad_norm_spike == "skip":
            raise ValueError("spike guard: on_grad_norm_spike='skip' is impossible (the norm is known after the "
                             "update); use 'lr_scale' or 'rollback'")


@dataclass(frozen=True)
class Decision:
    """What the guard decided about one loss or gradient norm, and why."""

    action: Action
    kind: Kind
    reason: str
    value: float
    baseline: Optional[float] = None
    """Median (or trend value) the value was compared with."""
    mad: Optional[float] = None
    z: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def theil_sen(ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the Theil-Sen line through (i, ys[i]): median pairwise slope (Sen 1968)."""
    n = len(ys)
    slopes = [(ys[j] - ys[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
    slope = statistics.median(slopes) if slopes else 0.0
    intercept = statistics.median([y - slope * i for i, y in enumerate(ys)])
    return intercept, slope


def robust_z(value: float, history: list[float], mad_floor_frac: float,
             detrend: bool = False) -> tuple[float, float, float]:
    """(z, baseline, MAD) of `value` against `history`; the MAD is floored at mad_floor_frac * |baseline|.

    Without detrend the baseline is the median (modified z-score). With detrend it is the Theil-Sen line's
    value at the newest point and the MAD is taken over the residuals, so a loss that is still falling
    fast (large spread, small residuals) does not hide a spike.
    """
    if detrend and len(history) >= 3:
        a, b = theil_sen(history)
        base = a + b * (len(history) - 1)
        resid = [y - (a + b * i) for i, y in enumerate(history)]
        rmed = statistics.median(resid)
        mad = statistics.median([abs(r - rmed) for r in resid])
    else:
        base = statistics.median(history)
        mad = statistics.median([abs(h - base) for h in history])
    scale = MAD_TO_SIGMA * max(mad, mad_floor_frac * abs(base), 1e-12)
    return (value - base) / scale, base, mad


@dataclass
class SpikeGuard:
    """Stateful detector; `state_dict()` goes into the DeepSpeed checkpoint's client state."""

    config: SpikeGuardConfig = field(default_factory=SpikeGuardConfig)
    losses: deque = field(default_factory=deque)
    grad_norms: deque = field(default_factory=deque)
    consecutive_skips: int = 0
    lr_cooldown_left: int = 0
    last_spike_step: int = -(10**9)

    def _ok(self, value: float) -> Decision:
        return Decision("none", "ok", "", value)

    def check_loss(self, loss: float, step: int) -> Decision:
        """Judge a candidate batch loss before its backward pass."""
        cfg = self.config
        if not math.isfinite(loss):
            return self._flag(Decision(cfg.on_nonfinite, "nonfinite_loss", f"loss is {loss} (not finite)", loss), step)
        if len(self.losses) < cfg.min_history:
            return self._ok(loss)
        z, med, mad = robust_z(loss, list(self.losses), cfg.mad_floor_frac, cfg.detrend)
        if z > cfg.z_threshold:
            what = "trend" if cfg.detrend else "median"
            reason = (f"loss {loss:.4f} is {z:.1f} robust sigmas above the {what} {med:.4f} "
                      f"(MAD {mad:.4f}, window {len(self.losses)}) > z_threshold {cfg.z_threshold}")
            return self._flag(Decision(cfg.on_loss_spike, "loss_spike", reason, loss, med, mad, z), step)
        return self._ok(loss)

    def _flag(self, decision: Decision, step: int) -> Decision:
        self.last_spike_step = step
        if decision.action == "skip":
            self.consecutive_skips += 1
            if self.config.escalate_after and self.consecutive_skips >= self.config.escalate_after:
                return Decision("rollback", decision.kind,
                                decision.reason + f"; {self.consecutive_skips} consecutive skipped batches -> rollback",
                                decision.value, decision.baseline, decision.mad, decision.z)
        if decision.action == "lr_scale":
            self.lr_cooldown_left = self.config.lr_scale_steps
        return decision

    def observe_step(self, loss: float, grad_norm: Optional[float], step: int) -> Decision:
        """Record an accepted step; judge its gradient norm (after the update)."""
        cfg = self.config
        self.consecutive_skips = 0
        decision = self._ok(loss)
        if grad_norm is not None:
            if not math.isfinite(grad_norm):
                decision = self._flag(Decision("rollback", "nonfinite_grad_norm",
                                               f"grad norm is {grad_norm} (not finite)", grad_norm), step)
            elif len(self.grad_norms) >= cfg.min_history:
                z, med, mad = robust_z(grad_norm, list(self.grad_norms), cfg.mad_floor_frac)
                if z > cfg.grad_norm_z_threshold:
                    reason = (f"grad norm {grad_norm:.4g} is {z:.1f} robust sigmas above the median {med:.4g} "
                              f"(MAD {mad:.4g}) > grad_norm_z_threshold {cfg.grad_norm_z_threshold}")
                    decision = self._flag(Decision(cfg.on_grad_norm_spike, "grad_norm_spike", reason, grad_norm,
                                                   med, mad, z), step)
        if decision.action == "none":
            if math.isfinite(loss):
                self._push(self.losses, loss)
            if grad_norm is not None and math.isfinite(grad_norm):
                self._push(self.grad_norms, grad_norm)
        return decision

    def _push(self, buf: deque, value: float) -> None:
        buf.append(value)
        while len(buf) > self.config.window:
            buf.popleft()

    def after_rollback(self) -> None:
        """Reset the skip counter and start the LR cool-down (if configured)."""
        self.consecutive_skips = 0
        if self.config.lr_scale_on_rollback:
            self.lr_cooldown_left = self.config.lr_scale_steps

    def lr_multiplier(self) -> float:
        """LR factor for the coming step (1.0 unless cooling down)."""
        return self.config.lr_scale if self.lr_cooldown_left > 0 else 1.0

    def end_step(self) -> None:
        """Count one optimizer step of the cool-down."""
        if self.lr_cooldown_left > 0:
            self.lr_cooldown_left -= 1

    def healthy(self) -> bool:
        """No cool-down and no pending skips: a checkpoint taken now may serve as a rollback target."""
        return self.lr_cooldown_left == 0 and self.consecutive_skips == 0

    def rollback_limit(self, spike_step: int) -> int:
        """Newest checkpoint step a rollback for a spike at `spike_step` may use."""
        return spike_step - self.config.rollback_margin_steps

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms),
                "consecutive_skips": self.consecutive_skips, "lr_cooldown_left": self.lr_cooldown_left,
                "last_spike_step": self.last_spike_step}

    def load_state_dict(self, state: dict) -> None:
        self.losses = deque(state["losses"])
        self.grad_norms = deque(state["grad_norms"])
        self.consecutive_skips = state["consecutive_skips"]
        self.lr_cooldown_left = state["lr_cooldown_left"]
        self.last_spike_step = state["last_spike_step"]


@dataclass
class Rollback:
    """Rolling back after a spike, shared by the example trainer (`run_state.Checkpoints`) and the wrapper for a
    user's own DeepSpeed loop (`dstoolkit.runtime.train.guard.Guard`): at most `max_rollbacks` times, to the
    newest intact checkpoint saved while the guard was healthy and at least `rollback_margin_steps` older than
    the spike (`dstoolkit.runtime.train.ckpt.CheckpointManager.latest_valid`), then the guard's skip counter is
    reset and the LR cool-down starts. Loading is the caller's (`load(tag)`: the engine's `load_checkpoint` plus
    whatever the caller keeps in the client state). No torch import."""

    guard: SpikeGuard
    max_rollbacks: int = 5
    done: int = 0
    hint: str = "raise max_rollbacks or inspect the data"

    def perform(self, mgr, spike_step: int, reason: str, load) -> "tuple[Optional[str], list[str]]":
        """Roll back for a spike at `spike_step`. Returns (tag loaded or None when there is no good checkpoint,
        reasons the newer checkpoints were passed over).

        Raises:
            RuntimeError: `max_rollbacks` rollbacks already happened (the damage is not transient).
        """
        if self.done >= self.max_rollbacks:
            raise RuntimeError(f"step {spike_step}: {self.max_rollbacks} rollbacks did not clear the spike "
                               f"({reason}); stopping instead of looping ({self.hint})")
        self.done += 1
        found = mgr.latest_valid(max_step=self.guard.rollback_limit(spike_step), require_healthy=True)
        if found.tag is None:
            return None, found.rejected
        load(found.tag)
        self.guard.after_rollback()
        return found.tag, found.rejected
