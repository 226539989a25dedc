"""Loss-spike guard: detect spikes (robust z-score, NaN/Inf, grad-norm) and decide an action (no torch import).

Detection (per candidate micro-batch loss, before its backward; and per step for the gradient norm):
  * robust z-score of the loss against the median/MAD of the last `window` accepted batch losses (each
    micro-batch the guard passed and the model trained on: like is compared with like, whatever the gradient
    accumulation; Iglewicz & Hoaglin 1993 modified z-score: z = (x - median) / (1.4826 * MAD)); only upward
    spikes count; by default the window is detrended first (Theil-Sen line, MAD of the residuals) so that a
    fast-falling early loss does not widen the band;
  * a non-finite loss or gradient norm;
  * a grad-norm robust z-score above `grad_norm_z_threshold`.
Actions (each configurable): skip the batch (no backward), scale the LR down for K optimizer steps (the step in
progress when a loss spikes, the next ones after a grad-norm spike), roll back to the last good DeepSpeed
checkpoint and skip the offending batches. Consecutive skipped batches (no batch trained on between them)
escalate to a rollback: one bad batch is skipped, a damaged model (every batch spikes) is rolled back. When a
rollback is needed and there is nothing to roll back to, or `window` batches in a row were skipped with
escalation off, the loss has moved to a new level the guard cannot undo: it restarts its baseline from the next
batches (logged) instead of skipping every batch from then on.
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
ACTIONS = ("none", "skip", "lr_scale", "rollback")
GRAD_NORM_ACTIONS = ("none", "lr_scale", "rollback")
"""A grad norm is known after the update: skipping that batch is no longer possible."""
NONFINITE_ACTIONS = ("skip", "rollback")
"""A NaN/Inf loss is never back-propagated: 'none' and 'lr_scale' train on the batch, and one NaN/Inf gradient
makes every weight NaN (an LR scale does not help)."""


class SettingError(ValueError):
    """A guard / rollback / checkpoint setting out of range: `name`, `value` and what it must be (`need`);
    the command line maps `name` to its flag."""

    def __init__(self, name: str, value: object, need: str, where: str = "spike guard") -> None:
        self.name, self.value, self.need = name, value, need
        super().__init__(f"{where}: {name}={value!r} {need}")


def check_int(name: str, value: object, least: int, what: str, where: str = "spike guard") -> None:
    """`value` must be an int (not a bool) >= `least`; `what` says what the number counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SettingError(name, value, f"must be a whole number >= {least} ({what})", where)


def _check_positive(name: str, value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise SettingError(name, value, f"must be a finite number > 0 ({what})")


@dataclass(frozen=True)
class SpikeGuardConfig:
    """Thresholds and the action per detection kind (checked when built: `SettingError` names the field)."""

    window: int = 20
    """Accepted batch losses (micro-batches trained on) kept for the median/MAD baseline."""
    min_history: int = 5
    """No z-score decision before this many accepted batches (NaN/Inf is always caught)."""
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
    """Action for a NaN/Inf loss: skip or rollback only (`NONFINITE_ACTIONS`; never trained on)."""
    on_grad_norm_spike: Action = "lr_scale"
    """Action for a grad-norm spike (seen after the update; skip is not possible, so lr_scale or rollback)."""
    escalate_after: int = 2
    """This many consecutive skipped batches escalate to `rollback` (0: no escalation; then `window`
    consecutive skips restart the baseline)."""
    lr_scale: float = 0.1
    """LR multiplier while cooling down."""
    lr_scale_steps: int = 10
    """Optimizer steps the LR stays scaled after an lr_scale (the spiking step included) or a rollback."""
    lr_scale_on_rollback: bool = True
    """Also cool the LR down after a rollback."""
    rollback_margin_steps: int = 2
    """Roll back to a checkpoint at least this many steps older than the spike: damage (an LR blow-up)
    happens one or more steps before the loss shows it."""

    def __post_init__(self) -> None:
        check_int("min_history", self.min_history, 2, "accepted losses before a z-score decision")
        check_int("window", self.window, self.min_history,
                  f"accepted losses in the baseline, at least min_history={self.min_history}")
        _check_positive("z_threshold", self.z_threshold, "robust sigmas above the baseline; the default is 6")
        _check_positive("grad_norm_z_threshold", self.grad_norm_z_threshold,
                        "robust sigmas above the median grad norm; the default is 10")
        if isinstance(self.mad_floor_frac, bool) or not isinstance(self.mad_floor_frac, (int, float)) or not (
                math.isfinite(self.mad_floor_frac) and self.mad_floor_frac >= 0):
            raise SettingError("mad_floor_frac", self.mad_floor_frac,
                               "must be a finite number >= 0 (a fraction of the median; the default is 0.01)")
        if self.on_loss_spike not in ACTIONS:
            raise SettingError("on_loss_spike", self.on_loss_spike, f"must be one of {', '.join(ACTIONS)}")
        if self.on_nonfinite not in NONFINITE_ACTIONS:
            raise SettingError("on_nonfinite", self.on_nonfinite, (
                "would back-propagate a NaN/Inf loss and step it (every weight NaN)" if self.on_nonfinite in ACTIONS
                else "is not an action") + f"; use one of {', '.join(NONFINITE_ACTIONS)}")
        if self.on_grad_norm_spike not in GRAD_NORM_ACTIONS:
            raise SettingError("on_grad_norm_spike", self.on_grad_norm_spike,
                               ("is impossible (the norm is known after the update)" if self.on_grad_norm_spike
                                == "skip" else "is not an action") + f"; use one of {', '.join(GRAD_NORM_ACTIONS)}")
        check_int("escalate_after", self.escalate_after, 0, "consecutive skipped batches before a rollback; 0: never")
        if isinstance(self.lr_scale, bool) or not isinstance(self.lr_scale, (int, float)) or not (
                0 < self.lr_scale <= 1):
            raise SettingError("lr_scale", self.lr_scale, "must be in (0, 1] (the LR multiplier while cooling down, "
                                                          "e.g. 0.1)")
        check_int("lr_scale_steps", self.lr_scale_steps, 1, "optimizer steps the LR stays scaled")
        check_int("rollback_margin_steps", self.rollback_margin_steps, 0,
                  "steps between the spike and the newest checkpoint a rollback may load")
        for name in ("detrend", "lr_scale_on_rollback"):
            if not isinstance(getattr(self, name), bool):
                raise SettingError(name, getattr(self, name), "must be True or False")


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
    """Stateful detector; `state_dict()` goes into the DeepSpeed checkpoint's client state.

    Per batch: `check_loss` before its backward (a batch it passes is trained on and its loss counts for the
    baseline once its step is accepted). Per optimizer step, after the update: `end_step` (the cool-down counts
    the update just taken), then `observe_step` (judges the grad norm, accepts the step's losses)."""

    config: SpikeGuardConfig = field(default_factory=SpikeGuardConfig)
    losses: deque = field(default_factory=deque)
    grad_norms: deque = field(default_factory=deque)
    consecutive_skips: int = 0
    """Skipped batches since the last batch trained on."""
    lr_cooldown_left: int = 0
    last_spike_step: int = -(10**9)
    pending: list = field(default_factory=list)
    """Losses of the batches trained on in the step in progress (enter `losses` when the step is accepted)."""

    def _ok(self, value: float) -> Decision:
        return Decision("none", "ok", "", value)

    def check_loss(self, loss: float, step: int) -> Decision:
        """Judge a candidate batch loss before its backward pass."""
        cfg = self.config
        judged = math.isfinite(loss) and len(self.losses) >= cfg.min_history
        z, med, mad = robust_z(loss, list(self.losses), cfg.mad_floor_frac, cfg.detrend) if judged else (0, 0, 0)
        if not math.isfinite(loss):
            d = self._flag(Decision(cfg.on_nonfinite, "nonfinite_loss", f"loss is {loss} (not finite)", loss), step)
        elif z > cfg.z_threshold:
            what = "trend" if cfg.detrend else "median"
            reason = (f"loss {loss:.4f} is {z:.1f} robust sigmas above the {what} {med:.4f} "
                      f"(MAD {mad:.4f}, window {len(self.losses)}) > z_threshold {cfg.z_threshold}")
            d = self._flag(Decision(cfg.on_loss_spike, "loss_spike", reason, loss, med, mad, z), step)
        else:
            d = self._ok(loss)
        if d.action in ("none", "lr_scale"):  # trained on: the skip run ends, the loss joins the step's
            self.consecutive_skips = 0
            if math.isfinite(loss):
                self.pending.append(loss)
        return d

    def _flag(self, decision: Decision, step: int) -> Decision:
        self.last_spike_step = step
        cfg = self.config
        if decision.action == "skip":
            self.consecutive_skips += 1
            n = self.consecutive_skips
            if cfg.escalate_after and n >= cfg.escalate_after:
                return Decision("rollback", decision.kind,
                                decision.reason + f"; {n} consecutive skipped batches -> rollback",
                                decision.value, decision.baseline, decision.mad, decision.z)
            if not cfg.escalate_after and n >= cfg.window:
                self.restart_baseline("loss")
                return Decision("skip", decision.kind, decision.reason + (
                    f"; {n} consecutive skipped batches with escalation off (escalate_after=0): the loss moved to "
                    f"a new level, the baseline restarts from the next {cfg.min_history} batches"),
                    decision.value, decision.baseline, decision.mad, decision.z)
        if decision.action == "lr_scale":
            self.lr_cooldown_left = cfg.lr_scale_steps
        return decision

    def observe_step(self, loss: float, grad_norm: Optional[float], step: int) -> Decision:
        """Accept a finished optimizer step: judge its gradient norm (after the update); when it is fine, the
        losses of the batches trained on in it (`check_loss`) join the baseline. A caller that does not judge
        batches passes the step's loss, which then stands for them."""
        cfg = self.config
        batch_losses, self.pending = self.pending, []
        if not batch_losses:
            batch_losses = [loss] if math.isfinite(loss) else []
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
        if decision.kind == "ok":
            for value in batch_losses:
                self._push(self.losses, value)
            if grad_norm is not None:
                self._push(self.grad_norms, grad_norm)
        return decision

    def _push(self, buf: deque, value: float) -> None:
        buf.append(value)
        while len(buf) > self.config.window:
            buf.popleft()

    def restart_baseline(self, kind: str) -> None:
        """The loss (a loss `kind`) or the grad norm (a 'grad_norm' kind) moved to a level the guard cannot undo:
        forget that window, so the next `min_history` accepted values form the new baseline (NaN/Inf still caught)."""
        (self.grad_norms if "grad_norm" in kind else self.losses).clear()
        self.consecutive_skips = 0

    def after_rollback(self) -> None:
        """Reset the skip counter and start the LR cool-down (if configured)."""
        self.consecutive_skips = 0
        self.pending = []
        if self.config.lr_scale_on_rollback:
            self.lr_cooldown_left = self.config.lr_scale_steps

    def lr_multiplier(self) -> float:
        """LR factor for the optimizer update in progress / coming next (1.0 unless cooling down)."""
        return self.config.lr_scale if self.lr_cooldown_left > 0 else 1.0

    def end_step(self) -> None:
        """Count one optimizer update of the cool-down (call it right after the update, before `observe_step`)."""
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
        self.pending = []


@dataclass
class Rollback:
    """Rolling back after a spike, shared by the example trainer (`run_state.Checkpoints`), the wrapper for a
    user's own DeepSpeed loop (`dstoolkit.runtime.train.guard.Guard`) and the HF callback: to the newest intact
    checkpoint saved while the guard was healthy and at least `rollback_margin_steps` older than the spike
    (`dstoolkit.runtime.train.ckpt.CheckpointManager.latest_valid`), then the guard's skip counter is reset and
    the LR cool-down starts. At most `max_rollbacks` rollbacks in a row that do not get the run past their spike
    (a spike at or before the step of the previous rollback's spike); one that does starts the count again.
    Without a checkpoint to go back to, nothing is loaded or counted and the guard restarts its baseline (the
    loss moved to a level it cannot undo). Loading is the caller's (`load(tag)`: the engine's `load_checkpoint`
    plus whatever the caller keeps in the client state). No torch import."""

    guard: SpikeGuard
    max_rollbacks: int = 5
    done: int = 0
    """Rollbacks performed in this process."""
    hint: str = "raise max_rollbacks or inspect the data"
    streak: int = 0
    """Rollbacks in a row that did not get the run past their spike."""
    unresolved_step: Optional[int] = None
    """The furthest spike step of the current streak: a new spike after it means the streak's spike was cleared."""

    def __post_init__(self) -> None:
        check_int("max_rollbacks", self.max_rollbacks, 0, "rollbacks in a row that may fail to clear a spike",
                  where="rollback")

    def state_dict(self) -> dict:
        """The streak `max_rollbacks` counts (saved with every checkpoint, so a resume keeps counting it)."""
        return {"streak": self.streak, "unresolved_step": self.unresolved_step}

    def load_state_dict(self, state: dict) -> None:
        self.streak, self.unresolved_step = state["streak"], state["unresolved_step"]

    def after_state(self) -> dict:
        """The guard (cool-down started) and streak right after a rollback (`perform`), recorded with the target
        (`CheckpointManager.record_rollback`): the target's client state holds the guard as at its save."""
        return {"guard": self.guard.state_dict(), "rollback": self.state_dict()}

    def restore(self, saved: Optional[dict], recorded: Optional[dict]) -> bool:
        """On resume, after the checkpoint's guard state is loaded: the streak it saved (`saved`; None: saved before
        streaks were), or where a rollback to it was recorded (`recorded`, `after_state`) the guard and streak right
        after that rollback: the resumed run retrains with the same cool-down, health marks and count. Returns
        whether `recorded` was used."""
        if recorded is not None:
            self.guard.load_state_dict(recorded["guard"])
            saved = recorded["rollback"]
        if saved is not None:
            self.load_state_dict(saved)
        return recorded is not None

    def perform(self, mgr, spike_step: int, reason: str, load,
                kind: str = "loss_spike") -> "tuple[Optional[str], list[str]]":
        """Roll back for a spike at `spike_step` (`kind`: the Decision's kind; `mgr` None: no checkpoints). Returns
        (tag loaded, or None when there is no good checkpoint and the guard restarted its baseline instead;
        reasons the newer checkpoints were passed over).

        Raises:
            RuntimeError: `max_rollbacks` rollbacks in a row did not clear the spike (the damage is not transient).
        """
        if mgr is None:  # no checkpoint directory: nothing to go back to
            self.guard.restart_baseline(kind)
            return None, ["no checkpoint directory"]
        found = mgr.latest_valid(max_step=self.guard.rollback_limit(spike_step), require_healthy=True)
        if found.tag is None:
            self.guard.restart_baseline(kind)
            return None, found.rejected
        repeat = self.unresolved_step is not None and spike_step <= self.unresolved_step
        streak = self.streak + 1 if repeat else 1
        if streak > self.max_rollbacks:
            tried = (f"{self.streak} rollbacks did not clear the spike" if self.max_rollbacks
                     else "a rollback is needed but max_rollbacks=0 allows none")
            raise RuntimeError(f"step {spike_step}: {tried} ({reason}); stopping instead of looping ({self.hint})")
        load(found.tag)
        self.streak, self.done = streak, self.done + 1
        self.unresolved_step = max(spike_step, self.unresolved_step) if repeat else spike_step
        self.guard.after_rollback()
        return found.tag, found.rejected

    @staticmethod
    def unavailable_line(spike_step: int, reason: str, kind: str) -> str:
        """The log line for a rollback `perform` could not do (the same words in every caller)."""
        what = "grad-norm" if "grad_norm" in kind else "loss"
        then = "" if "grad_norm" in kind else "the batch is skipped and "
        return (f"step {spike_step}: rollback wanted ({reason}) but no good checkpoint: {then}the guard restarts its "
                f"{what} baseline (the {what} moved to a level it cannot roll back from)")
