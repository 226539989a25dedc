"""The example trainer's position (`RunState`, stored in every checkpoint), rank 0's metrics file (`MetricsWriter`),
and the save / resume / roll-back of that position through the atomic CheckpointManager (`Checkpoints`).
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunState:
    """Trainer position; stored in every checkpoint's client_state."""

    step: int = 0
    """Completed optimizer steps."""
    data_pos: int = 0
    """Micro-batches this rank has drawn from the data stream (consumed or skipped)."""
    consumed_samples: int = 0
    """Global sequences trained on (drives the ramp)."""
    tokens: int = 0
    """Global tokens trained on (drives the LR schedule)."""
    skip_positions: list[int] = field(default_factory=list)
    """Data positions never to train on (batches a rollback marked as offending)."""

    def as_dict(self) -> dict:
        return {"step": self.step, "data_pos": self.data_pos, "consumed_samples": self.consumed_samples,
                "tokens": self.tokens, "skip_positions": sorted(self.skip_positions)}


def finite_or_none(obj: Any) -> Any:
    """`obj` with every NaN / Inf float (at any depth) replaced by None: JSON has no NaN (`json.dumps` would write
    the bare word `NaN`, which no strict JSON reader takes), so a metrics line says null instead."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def resumed(rollbacks: Any, mgr: Any, found: Any, saved_streak: Any, step: int, data_pos: int) -> tuple[dict, str]:
    """After `found.tag` is loaded on resume (the trainer's and `Guard`'s): the streak it saved, or the guard and
    streak a rollback to it recorded (the run stopped before its next save; `spike.Rollback.restore`). Returns the
    "resume" metrics record and the log line."""
    tag, rejected = found.tag, found.rejected
    after = rollbacks.restore(saved_streak, mgr.rollback_state(tag))
    cooldown = rollbacks.guard.lr_cooldown_left
    note = f"; after a rollback to it: LR cool-down {cooldown} more steps, streak {rollbacks.streak}" if after else ""
    return ({"event": "resume", "tag": tag, "step": step, "data_pos": data_pos, "rejected": rejected,
             "after_rollback": after, "lr_cooldown_left": cooldown, "rollback_streak": rollbacks.streak},
            f"resumed from {tag} (step {step}, data position {data_pos}{note})")


class MetricsWriter:
    """Rank 0 appends one JSON object per line and flushes (so a killed run keeps what it wrote). A non-finite
    number (a NaN loss, no loss at all) is written as null (`finite_or_none`): every line is strict JSON."""

    def __init__(self, path: str, enabled: bool, file: Any = None) -> None:
        """`file`: an already opened text file to append to (`Guard` checks and opens its metrics_path itself)."""
        self.enabled = enabled
        self.f = file if enabled else None
        if enabled and file is None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "a", buffering=1)
        if self.f is not None and Path(path).is_file():
            from dstoolkit.runtime.bench.results_jsonl import lacks_final_newline

            if lacks_final_newline(Path(path)):  # a killed run's cut-off last line stays as it is; the records
                self.f.write("\n")  # start on a line of their own (as `results_jsonl.append_records`)
                self.f.flush()

    def write(self, obj: dict) -> None:
        if self.f is not None:
            # NaN / Inf -> null, also from a tensor / numpy scalar (json.dumps hands those to `default`)
            self.f.write(json.dumps(finite_or_none(obj), default=lambda v: finite_or_none(float(v)),
                                    allow_nan=False) + "\n")
            self.f.flush()

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class Checkpoints:
    """Save, resume and roll back through the atomic CheckpointManager (all no-ops without --checkpoint-dir).
    The trainer's RunState and the spike guard's state travel in every checkpoint's client_state."""

    def __init__(self, mgr: Any, args: argparse.Namespace, engine: Any, state: RunState, guard: Any,
                 writer: MetricsWriter, log) -> None:
        self.mgr = mgr
        self.engine, self.state, self.guard, self.writer, self.log = engine, state, guard, writer, log
        from dstoolkit.runtime.train.spike import Rollback

        self.rollbacks = Rollback(guard, max_rollbacks=args.max_rollbacks,
                                  hint="raise --max-rollbacks or inspect the data")
        self.abandoned = 0
        """Micro-batches of an open accumulation window the last load threw away (their gradients included)."""
        self.saved_step: Any = None
        """The step the folder's newest checkpoint of this run holds (saved or loaded); None: none yet."""

    def client_state(self) -> dict:
        return {"dstoolkit": {"run": self.state.as_dict(), "guard": self.guard.state_dict(),
                              "rollback": self.rollbacks.state_dict()}}

    def _load(self, tag: str, keep_skips: bool, open_loss: Any = None) -> dict:
        """Load `tag` into the engine and restore the position and the guard from it (plus the offending data
        positions rollbacks to it recorded: `CheckpointManager.rollback_skips`). A window of gradient accumulation
        still open (a rollback mid-step) is closed first with `open_loss`, the rejected micro-batch's loss: DeepSpeed's
        load keeps the accumulated gradients and the micro-step count (`dstoolkit.runtime.train.accum`)."""
        from dstoolkit.runtime.train.accum import align_window, close_window

        self.abandoned = close_window(self.engine, open_loss)
        path, cs = self.engine.load_checkpoint(str(self.mgr.root), tag=tag)
        align_window(self.engine)
        if path is None or cs is None or "dstoolkit" not in cs:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag} from {self.mgr.root}")
        run, state = cs["dstoolkit"]["run"], self.state
        self.saved_step = run["step"]
        skips = set(state.skip_positions) if keep_skips else set()
        state.step, state.data_pos = run["step"], run["data_pos"]
        state.consumed_samples, state.tokens = run["consumed_samples"], run["tokens"]
        state.skip_positions = sorted(skips | set(run["skip_positions"]) | self.mgr.rollback_skips(tag))
        self.guard.load_state_dict(cs["dstoolkit"]["guard"])
        return cs["dstoolkit"]

    def resume(self) -> None:
        """Continue from the newest intact checkpoint (corrupt / truncated ones are skipped and reported).

        Raises:
            UsageError: the folder holds a universal checkpoint, every checkpoint in it was rejected, or the one
                to load was saved at another ZeRO stage / data-parallel size (`resume_check`; the pre-flight of
                `dstoolkit train` says the same before any rank starts).
        """
        if self.mgr is None:
            return
        from dataclasses import replace

        from dstoolkit.runtime.train.names import CLI
        from dstoolkit.runtime.train.resume_check import pick_resume
        from dstoolkit.runtime.train.trainer_inputs import UsageError

        found, problem = pick_resume(self.mgr, self.engine, replace(CLI, nproc="a world size of"), self.log)
        if problem:
            raise UsageError(problem)
        if found.tag is not None:
            saved = self._load(found.tag, keep_skips=False).get("rollback")
            event, line = resumed(self.rollbacks, self.mgr, found, saved, self.state.step, self.state.data_pos)
            self.writer.write(event)
            self.log(line)
        else:
            self.writer.write({"event": "resume", "tag": None, "step": 0, "rejected": found.rejected})
            self.log("resume: no intact checkpoint, starting from step 0")

    def rollback(self, spike_step: int, reason: str, offending: list[int], kind: str = "loss_spike",
                 open_loss: Any = None) -> bool:
        """Go back to the newest healthy checkpoint before the spike and never train on `offending` again (also
        after a resume: recorded with the target). False when there is no checkpoint to go back to (the guard
        restarts its baseline); an error after --max-rollbacks in a row that do not clear the spike.
        `open_loss`: the rejected micro-batch's loss (not back-propagated), which closes an accumulation window
        the rollback interrupts. The policy (count, which checkpoint, guard reset) is
        `dstoolkit.runtime.train.spike.Rollback`."""
        from_step = self.state.step
        self.abandoned = 0
        tag, rejected = self.rollbacks.perform(self.mgr, spike_step, reason,
                                               load=lambda t: self._load(t, keep_skips=True, open_loss=open_loss),
                                               kind=kind)
        if tag is None:
            self.writer.write({"event": "rollback_unavailable", "step": spike_step, "kind": kind, "reason": reason,
                               "rejected": rejected, "baseline_restarted": True})
            self.log(self.rollbacks.unavailable_line(spike_step, reason, kind))
            return False
        self.state.skip_positions = sorted(set(self.state.skip_positions) | set(offending))
        self.mgr.record_rollback(tag, self.state.skip_positions, self.rollbacks.after_state())
        self.writer.write({"event": "rollback", "step": spike_step, "from_step": from_step, "to_tag": tag,
                           "to_step": self.state.step, "reason": reason, "skip_positions": offending,
                           "abandoned_micro_batches": self.abandoned,
                           "lr_scale": self.guard.config.lr_scale, "lr_scale_steps": self.guard.config.lr_scale_steps})
        self.log(f"step {spike_step}: ROLLBACK to {tag}: {reason}; skipping data positions {offending}")
        return True

    def maybe_save(self, every: int, barrier) -> None:
        """Save every `every` steps (--save-every)."""
        if self.mgr is None or not every or self.state.step % every != 0:
            return
        self._save(barrier)

    def save_final(self, barrier) -> None:
        """At the end of a run that trained to its last step: save that step unless it is saved already, so a run
        shorter than --save-every (launch.sh's defaults) still leaves a checkpoint for --resume, as
        `training.save_interval_steps` promises. Not called after a failure or a spike-guard abort (they raise)."""
        if self.mgr is None or self.state.step <= 0 or self.saved_step == self.state.step:
            return
        self._save(barrier)

    def _save(self, barrier) -> None:
        from dstoolkit.runtime.train.gradnorm import weights_finite

        # a rollback target only when the guard is calm and no weight is NaN / Inf
        healthy = self.guard.healthy() and weights_finite(self.engine)
        tag = self.mgr.save(self.engine, self.state.step, self.client_state(), healthy=healthy, barrier=barrier)
        self.writer.write({"event": "checkpoint", "tag": tag, "step": self.state.step,
                           "data_pos": self.state.data_pos, "healthy": healthy})
        self.saved_step = self.state.step
