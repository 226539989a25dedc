"""The spike guard, rollback and atomic checkpoints for a user's own DeepSpeed loop.

    engine, *_ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
    guard = Guard(engine, checkpoint_dir="ckpt", save_every=50)
    guard.resume()                               # newest intact checkpoint, if any
    while guard.step_count < total_steps:
        x, y = dataset[guard.data_pos]           # the position survives rollbacks and resumes
        loss = engine(x, y)
        guard.step(loss)                         # instead of engine.backward(loss); engine.step()

or ``with Guard(engine, ...) as guard:`` (a clean exit checkpoints the last step unless saved already, whatever
save_every, as `dstoolkit train`, then a "done" line; a block that raised gets none; the lock is given back).

`step(loss)` takes the mean loss over the data-parallel ranks (one all-reduce of a scalar, so every rank decides
the same), asks `dstoolkit.runtime.train.spike.SpikeGuard`, and then

* trains on the batch (`engine.backward` + `engine.step`) -> "trained";
* skips it (no backward; the data position moves on) -> "skipped";
* rolls back (`dstoolkit.runtime.train.spike.Rollback`: the newest healthy checkpoint at least two steps older
  than the spike, loaded through `engine.load_checkpoint`; offending data positions -- the skipped batches, or
  for a grad-norm rollback the batches of that update -- are skipped from then on, also after a resume; in the
  middle of gradient accumulation the open window's gradients are dropped first: `accum.close_window`)
  -> "rolled_back"; without a checkpoint the batch is skipped and the guard restarts its loss baseline;
* the LR cool-down scales each optimizer update by `lr_scale` for `lr_scale_steps` updates (from the update in
  progress when a loss spikes, from the next after a grad-norm spike or a rollback): only while the optimizer
  steps (torch optimizer step hooks; else around `engine.step`), so a scheduler that sets or decays the LR keeps
  its schedule and the checkpoints hold the unscaled LR;
* after an optimizer step it judges the gradient norm (`engine.get_global_grad_norm()`; where DeepSpeed reports none
  -- ZeRO-0 fp32 with a torch optimizer -- the norm of the `.grad`s just before the step: `gradnorm`; where neither
  is known it says once that grad-norm detection is off) and saves every `save_every` steps through
  `dstoolkit.runtime.train.ckpt.CheckpointManager` (staging dir + manifest + rename: a rank killed mid-save never
  leaves a checkpoint that `resume` would load).

As `dstoolkit train`, with the same one-line reasons (`dstoolkit.runtime.train.resume_check`, naming Guard's
parameters): a checkpoint_dir that already holds checkpoints is refused at the first `step` / `save` unless
`resume()` was called (`CheckpointDirError`: it would overwrite and prune another run's checkpoints), and `resume()`
refuses a universal checkpoint, a folder whose every checkpoint is rejected, and a checkpoint saved at another ZeRO
stage or data-parallel size. Global rank 0 takes checkpoint_dir's writer lock (`writer_lock`, the trainer's: a second
live run on the folder is a `CheckpointDirError`; released by `close()`, at exit and on SIGTERM). Bad arguments
(numbers, a checkpoint_dir or metrics_path that cannot be written, save_every or a 'rollback' action without
checkpoint_dir: `names.Names.missing_dir`, the trainer's rule) are a `SettingError` from the constructor. A step's
first micro-batch re-aligns DeepSpeed's accumulation count (`accum.align_window`), so a batch ramp's new count
(`BatchRamp.apply`, `engine.set_train_batch_size`) starts with that step.

Rank 0 appends one strict-JSON line (NaN / Inf as null: `run_state.MetricsWriter`) per optimizer step and per event
(spike, rollback, checkpoint, resume, done) to `metrics_path`. Every `monitor_every` optimizer steps (0: off) the
cross-rank view (`crossrank.StepWindows`): the share of the step blocked in collectives (timed hooks installed here:
the collectives DeepSpeed looked up at its init, all_gather_into_tensor / reduce_scatter_tensor, are not seen) and,
with several ranks, one gather of each rank's step, compute, collective and input wait, naming a rank or host that
stands out ("cross_rank" line). Input wait is what `step(loss, input_wait_s=...)` reports; without it the line says
"input wait not measured" and a slow data loader counts as compute. The guard's state, the rollback streak and the
position travel in every checkpoint's client_state, and a rollback records the guard's state after it with its target
(`CheckpointManager.record_rollback`) for a resume before the next save.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from dstoolkit.runtime.train.accum import align_window
from dstoolkit.runtime.train.gradnorm import NO_NORM_LINE, step_with_norm, weights_finite
from dstoolkit.runtime.train.guard_parts import (CheckpointDirError, check_seconds, default_log, hook_lr_cooldown,
                                                 peak_memory_bytes, release_lock, take_lock)
from dstoolkit.runtime.train.names import GUARD
from dstoolkit.runtime.train.run_state import resumed
from dstoolkit.runtime.train.spike import Rollback, SettingError, SpikeGuard, SpikeGuardConfig, check_int

__all__ = ["CheckpointDirError", "Guard", "guard"]


class Guard:
    """Spike guard + rollback + checkpoints around a DeepSpeed engine (see the module docstring)."""

    def __init__(self, engine: Any, *, config: Optional[SpikeGuardConfig] = None,
                 checkpoint_dir: Optional[str] = None, save_every: int = 0, keep: int = 3, max_rollbacks: int = 5,
                 metrics_path: Optional[str] = None, log: Any = None, monitor_every: int = 10) -> None:
        import deepspeed.comm as dist

        from dstoolkit.runtime.rankexit import install_exit_guard

        install_exit_guard()  # the process groups destroyed before the interpreter exits (rankexit)
        for name, value in (("save_every", save_every or 0), ("monitor_every", monitor_every or 0)):
            check_int(name, value, 0, "optimizer steps; 0: off", where="Guard")
        self.engine = engine
        self.guard = SpikeGuard(config or SpikeGuardConfig())
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.mgr = None
        self._fresh_refusal: Optional[str] = None
        self._lock: Optional[str] = None
        self._saved_step: Optional[int] = None
        self._norm_off_said = False
        self._log = log or default_log(self.rank)
        cfg = self.guard.config
        asked = ([f"save_every={save_every}"] if save_every else []) + [
            f"{k}='rollback'" for k in ("on_loss_spike", "on_nonfinite", "on_grad_norm_spike")
            if getattr(cfg, k) == "rollback"]
        problem = None if checkpoint_dir else GUARD.missing_dir(asked)  # the rule `dstoolkit train` applies
        if problem:
            raise SettingError("checkpoint_dir", checkpoint_dir, f"but {problem}", where="Guard")
        try:
            self._open(checkpoint_dir, keep, save_every, max_rollbacks, metrics_path, monitor_every)
        except BaseException:
            release_lock(self._lock)  # a Guard that failed to start holds no folder locked
            self._lock = None
            raise

    def _open(self, checkpoint_dir: Optional[str], keep: int, save_every: int, max_rollbacks: int,
              metrics_path: Optional[str], monitor_every: int) -> None:
        """The folder (its writer lock first), the counters, the metrics file and the monitor (`__init__`)."""
        if checkpoint_dir:
            from dstoolkit.runtime.train.api_checks import check_folder_param, make_folder
            from dstoolkit.runtime.train.ckpt import CheckpointManager, check_keep
            from dstoolkit.runtime.train.resume_check import fresh_run_refusal

            check_keep(keep)
            check_folder_param("Guard", "checkpoint_dir", checkpoint_dir)
            make_folder("Guard", "checkpoint_dir", checkpoint_dir)
            # one writer per folder, as `dstoolkit train` (writer_lock): before anything is read or written there
            self._lock = take_lock(checkpoint_dir, self.rank, self.world, self._log)
            # another run's checkpoints: refused at the first step or save unless resume() is called (as the trainer)
            self._fresh_refusal = fresh_run_refusal(checkpoint_dir, GUARD)
            self.mgr = CheckpointManager(checkpoint_dir, keep=keep, rank=self.rank, names=GUARD)
            self.mgr.clear_staging()  # a save killed mid-way (SIGTERM) left its partial files there
        self.save_every = int(save_every or 0)
        self.rollbacks = Rollback(self.guard, max_rollbacks=max_rollbacks, hint="raise Guard(max_rollbacks=...)")
        self.step_count = int(getattr(self.engine, "global_steps", 0) or 0)
        """Optimizer steps completed (survives rollback and resume)."""
        self._saved_step = self.step_count  # the engine's steps before this Guard are not its to save on exit
        self.data_pos = 0
        """Micro-batches consumed; index your data with it so a rollback/resume replays the same stream."""
        self.skip_positions: set[int] = set()
        self.events: list[dict] = []
        self._step_losses: list[float] = []
        self._step_positions: list[int] = []
        self._incidents: list[int] = []
        self._lr_used: Optional[float] = None
        self._mult_used = 1.0
        self._abandoned = 0
        self._grad_norm: Optional[float] = None
        self._hooked = hook_lr_cooldown(getattr(self.engine, "optimizer", None), self.guard.lr_multiplier)
        self._t = time.perf_counter()
        self._input_s: Optional[float] = 0.0
        self._f = None
        if metrics_path and self.rank == 0:
            from dstoolkit.runtime.train.api_checks import open_append
            from dstoolkit.runtime.train.run_state import MetricsWriter

            # strict JSON, NaN / Inf as null: the trainer's writer (run_state.MetricsWriter)
            self._f = MetricsWriter(metrics_path, True, file=open_append("Guard", "metrics_path", metrics_path))
        self._windows = None
        if monitor_every:
            from dstoolkit.runtime.train.crossrank import CrossRank, StepWindows

            self._windows = StepWindows(monitor_every, cross=CrossRank() if self.world > 1 else None)

    def _write(self, obj: dict) -> None:
        if "event" in obj:
            self.events.append(obj)
        if self._f is not None:
            self._f.write(obj)

    def _mean(self, value: float) -> float:
        if self.world == 1:
            return value
        import deepspeed.comm as dist
        import torch

        dev = getattr(self.engine, "device", None)
        t = torch.tensor([value], dtype=torch.float64, device=dev if dev is not None else "cpu")
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def _barrier(self) -> None:
        import deepspeed.comm as dist

        if dist.is_initialized():
            dist.barrier()

    def client_state(self) -> dict:
        pos = {"step": self.step_count, "data_pos": self.data_pos, "skip_positions": sorted(self.skip_positions)}
        return {"dstoolkit_guard": {**pos, "guard": self.guard.state_dict(), "rollback": self.rollbacks.state_dict()}}

    def _load(self, tag: str, keep_skips: bool, open_loss: Any = None) -> dict:
        """Load `tag`; a rollback mid-accumulation first closes the open window with `open_loss` (DeepSpeed's load
        keeps the accumulated gradients and the micro-step count: `dstoolkit.runtime.train.accum`)."""
        from dstoolkit.runtime.train.accum import close_window

        self._abandoned = close_window(self.engine, open_loss)
        path, cs = self.engine.load_checkpoint(str(self.mgr.root), tag=tag)
        align_window(self.engine)
        if path is None or not cs or "dstoolkit_guard" not in cs:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag} from {self.mgr.root}")
        st = cs["dstoolkit_guard"]
        self.step_count, self.data_pos = int(st["step"]), int(st["data_pos"])
        self._saved_step = self.step_count
        self.skip_positions = ((self.skip_positions if keep_skips else set()) | set(st["skip_positions"])
                               | self.mgr.rollback_skips(tag))
        self.guard.load_state_dict(st["guard"])
        return st

    def resume(self) -> Optional[str]:
        """Continue from the newest intact checkpoint in checkpoint_dir (None: nothing to resume).

        Raises:
            CheckpointDirError: what the bundled trainer's --resume refuses (`resume_check.pick_resume`): a
                universal checkpoint, every checkpoint rejected, or the one to load saved at another ZeRO stage or
                data-parallel size than this engine runs (DeepSpeed would fail inside load_checkpoint).
        """
        if self.mgr is None:
            return None
        from dstoolkit.runtime.train.resume_check import pick_resume

        found, problem = pick_resume(self.mgr, self.engine, GUARD, lambda m: self._log(m))
        if problem:
            raise CheckpointDirError(problem)
        self._fresh_refusal = None  # resumed (or nothing to resume): this run continues the folder
        if found.tag is None:
            self._write({"event": "resume", "tag": None, "step": 0, "rejected": found.rejected})
            return None
        saved = self._load(found.tag, keep_skips=False).get("rollback")  # the streak (a rollback's state: resumed)
        event, line = resumed(self.rollbacks, self.mgr, found, saved, self.step_count, self.data_pos)
        self._write(event)
        self._log(line)
        return found.tag

    def _check_fresh(self) -> None:
        """A checkpoint_dir that held checkpoints when the guard was built, and no resume(): refused before this
        run trains or saves (it would overwrite the tags it saves again, prune the others and leave a folder mixing
        two runs; the bundled trainer refuses the same, `resume_check.fresh_run_refusal`)."""
        if self._fresh_refusal:
            raise CheckpointDirError(self._fresh_refusal)

    def should_skip_position(self) -> bool:
        """Whether the current data position was marked offending by a rollback (then call `advance()`)."""
        return self.data_pos in self.skip_positions

    def advance(self) -> None:
        """Move past a data position without training on it."""
        self.data_pos += 1

    def step(self, loss: Any, input_wait_s: Optional[float] = None) -> str:
        """Judge `loss` (this rank's micro-batch loss tensor) and train on it, skip it or roll back (see the module
        docstring). `input_wait_s`: the seconds this micro-batch waited for its data, where your loop times it (the
        cross-rank view then tells an input-bound rank from a compute-bound one; None: not measured). Returns
        "trained", "skipped" or "rolled_back"."""
        if not hasattr(loss, "detach"):
            raise TypeError(f"Guard.step(loss): loss must be the loss tensor the engine returned (the guard runs "
                            f"engine.backward on it), got {type(loss).__name__} {loss!r}")
        if input_wait_s is not None:
            check_seconds(input_wait_s)
        self._input_s = None if input_wait_s is None or self._input_s is None else self._input_s + input_wait_s
        self._check_fresh()
        pos = self.data_pos
        target = self.step_count + 1
        if pos in self.skip_positions:  # a batch a rollback marked offending: never again
            self.data_pos += 1
            self._write({"event": "skip_marked", "step": target, "data_pos": pos})
            return "skipped"
        gl = self._mean(float(loss.detach().float().item()))
        d = self.guard.check_loss(gl, target)
        if d.kind != "ok":
            self._write({"event": "spike", "step": target, "data_pos": pos, **d.as_dict()})
            self._log(f"step {target}: {d.kind} -> {d.action}: {d.reason}")
            if d.action != "none":
                self._incidents.append(pos)
            if d.action == "rollback" and self._rollback(target, d.reason, d.kind, list(self._incidents), loss):
                return "rolled_back"
            if d.action in ("skip", "rollback"):
                self.data_pos += 1
                return "skipped"
        if not self._step_positions:  # a step's first micro-batch starts DeepSpeed's window (a batch ramp: accum)
            align_window(self.engine)
        before = self.engine.global_steps
        self.engine.backward(loss)
        self._optimizer_step()
        self.data_pos += 1
        self._step_losses.append(gl)
        self._step_positions.append(pos)
        if self.engine.global_steps == before:
            return "trained"  # inside gradient accumulation
        return self._after_optimizer_step()

    def _optimizer_step(self) -> None:
        """engine.step() with the LR cool-down on the update: the step hooks scale it, or (an optimizer without
        hooks) the param-group LRs are scaled around the call and put back unless a scheduler set new ones."""
        groups = getattr(getattr(self.engine, "optimizer", None), "param_groups", None) or []
        m = self._mult_used = self.guard.lr_multiplier()
        self._lr_used = float(groups[0]["lr"]) * m if groups else None
        saved = [(g, g["lr"]) for g in groups] if m != 1.0 and not self._hooked else []
        for g, lr in saved:
            g["lr"] = lr * m
        try:
            self._grad_norm = step_with_norm(self.engine)  # the engine's, else measured before the step (gradnorm)
        finally:
            for g, lr in saved:
                if g["lr"] == lr * m:
                    g["lr"] = lr

    def _after_optimizer_step(self) -> str:
        self.step_count = int(self.engine.global_steps)
        now = time.perf_counter()
        loss = sum(self._step_losses) / len(self._step_losses)
        positions = self._incidents + self._step_positions
        self._step_losses, self._step_positions, self._incidents = [], [], []
        gn = self._grad_norm
        if gn is None and not self._norm_off_said:
            self._norm_off_said = True
            self._write({"event": "grad_norm_off", "step": self.step_count, "reason": NO_NORM_LINE})
            self._log(NO_NORM_LINE)
        self.guard.end_step()  # the update just taken counts for the cool-down, then the grad norm is judged
        d = self.guard.observe_step(loss, gn, self.step_count)
        self._write({"step": self.step_count, "loss": loss, "grad_norm": gn, "lr": self._lr_used,
                     "data_pos": self.data_pos, "step_time_s": now - self._t, "lr_multiplier": self._mult_used})
        if self._windows is not None:
            rec = self._windows.step(self.step_count, now - self._t, self._input_s, mem_bytes=peak_memory_bytes())
            if rec is not None:
                self._write(rec)
                self._log(f"step {self.step_count}: comm {rec['comm_share']:.0%} of rank {self.rank}'s step blocked in "
                          "collectives (measured; waiting for a slower rank counts here)")
                if rec["bottleneck_line"]:
                    self._log(rec["bottleneck_line"])
        self._t, self._input_s = now, 0.0
        if d.kind != "ok":
            self._write({"event": "spike", "step": self.step_count, "data_pos": self.data_pos - 1, **d.as_dict()})
            self._log(f"step {self.step_count}: {d.kind} -> {d.action}: {d.reason}")
            # the update is judged: its batches are the offending ones
            if d.action == "rollback" and self._rollback(self.step_count + 1, d.reason, d.kind, positions):
                return "rolled_back"
        if self.mgr is not None and self.save_every and self.step_count % self.save_every == 0:
            self.save()
        return "trained"

    def _rollback(self, spike_step: int, reason: str, kind: str, offending: list[int], open_loss: Any = None) -> bool:
        from_step = self.step_count
        self._abandoned = 0
        tag, rejected = self.rollbacks.perform(self.mgr, spike_step, reason,
                                               load=lambda t: self._load(t, keep_skips=True, open_loss=open_loss),
                                               kind=kind)
        if tag is None:
            self._write({"event": "rollback_unavailable", "step": spike_step, "kind": kind, "reason": reason,
                         "rejected": rejected, "baseline_restarted": True})
            self._log(Rollback.unavailable_line(spike_step, reason, kind))
            return False
        self.skip_positions |= set(offending)
        self.mgr.record_rollback(tag, sorted(self.skip_positions), self.rollbacks.after_state())
        self._incidents, self._step_losses, self._step_positions = [], [], []
        self._write({"event": "rollback", "step": spike_step, "from_step": from_step, "to_tag": tag,
                     "to_step": self.step_count, "reason": reason, "skip_positions": offending,
                     "abandoned_micro_batches": self._abandoned})
        self._log(f"step {spike_step}: ROLLBACK to {tag}: {reason}; skipping data positions {offending}")
        self._t = time.perf_counter()
        return True

    def save(self) -> Optional[str]:
        """Write a checkpoint now (atomic; marked healthy -- a rollback target -- when the guard is not cooling down
        and every weight is finite, `gradnorm.weights_finite`). None without a checkpoint_dir."""
        if self.mgr is None:
            return None
        self._check_fresh()
        finite = weights_finite(self.engine)
        if not finite:
            self._log(f"step {self.step_count}: the weights hold NaN/Inf: this checkpoint is no rollback target")
        healthy = self.guard.healthy() and finite
        tag = self.mgr.save(self.engine, self.step_count, self.client_state(), healthy=healthy,
                            barrier=self._barrier)
        self._write({"event": "checkpoint", "tag": tag, "step": self.step_count, "data_pos": self.data_pos,
                     "healthy": healthy})
        self._saved_step = self.step_count
        return tag

    def close(self, completed: bool = True) -> None:
        """The "done" line unless `completed` is False (as the trainer's: a finished run); the lock given back."""
        if completed:
            self._write({"event": "done", "step": self.step_count, "data_pos": self.data_pos,
                         "rollbacks": self.rollbacks.done})
        if self._f is not None:
            self._f.close()
            self._f = None
        release_lock(self._lock)
        self._lock = None

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # a clean exit saves the last step unless saved already, whatever save_every (as the trainer's save_final);
        # the block's exception (a refusal, OOM, Ctrl-C) or the save's goes on to the caller, with no "done"
        completed = False
        try:
            if exc_type is None and self.mgr is not None and 0 < self.step_count != self._saved_step:
                self.save()
            completed = exc_type is None
        finally:
            self.close(completed=completed)


def guard(engine: Any, **kwargs: Any) -> Guard:
    """`with dstoolkit.runtime.train.guard.guard(engine, ...) as g:` -- the same as `Guard(engine, ...)`."""
    return Guard(engine, **kwargs)
