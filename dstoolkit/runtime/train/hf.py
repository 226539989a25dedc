"""`DstoolkitCallback`: the spike guard, rollback, monitor and the estimate inside an HF Trainer run.

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[DstoolkitCallback(spec="spec.yaml")])

What it does, and how (HF Trainer with DeepSpeed, `--deepspeed ds.json` or `accelerate launch`):

* Spike guard (`dstoolkit.runtime.train.spike.SpikeGuard`): a forward hook on the model sees every training
  micro-batch's loss, takes its mean over the ranks (one scalar all-reduce, so every rank decides the same) and
  asks the guard. *Skip*: the Trainer still back-propagates the batch, so its loss becomes a finite zero and
  every parameter's gradient from that backward is replaced by zeros (`dstoolkit.runtime.train.hfskip.ZeroBatch`:
  `loss * 0` is not enough, 0 x NaN is NaN), so the batch adds no gradient, NaN/Inf included (the optimizer still
  takes its step on the other micro-batches' gradients; with a single micro-batch per step Adam's momentum still
  moves the weights a little). *LR cool-down*: the param-group LRs the Trainer's scheduler sets are multiplied
  by `lr_scale` for `lr_scale_steps` updates (from the spiking step's own update on).
  Grad-norm spikes are judged after each step (`engine.get_global_grad_norm()`).
* Rollback, through the Trainer's own checkpointing: at every `on_save` the callback writes
  `dstoolkit_guard.json` (healthy flag, guard state) into `checkpoint-N`; on a rollback decision
  (`dstoolkit.runtime.train.spike.Rollback`: bounded count, newest healthy checkpoint at least two steps older)
  it loads that folder's DeepSpeed checkpoint into the live engine (`engine.load_checkpoint`: weights,
  optimizer, scheduler). The Trainer's own step counter and data order continue: the offending batches are
  not replayed, the steps in between are lost.
* Batch ramp: not possible. The Trainer builds its DataLoader with a fixed per-device batch and fixes the
  accumulation count at train start (and DeepSpeed's engine has its batch from the config); the callback logs
  the ramp the spec asks for and that it is not applied. Use the example trainer or Megatron's
  --rampup-batch-size for a ramp.
* Monitor: every `logging_steps` (on_log) tokens/s over the window, MFU against the estimator's peak
  (FLOPs/token x tokens/s / (peak FLOP/s x ranks)), peak memory (RSS on CPU, max allocated on CUDA); beside
  them the estimate for the run's DeepSpeed config (`dstoolkit.runtime.bench.train.estimate_for`) when a spec
  is given (`spec=` or DSTOOLKIT_SPEC, which `dstoolkit tune`/`bench train` set). Lines go to stderr (rank 0)
  and to `metrics_path` as JSON. With it the measured comm share (time blocked in collectives, timed hooks
  `dstoolkit.runtime.train.commtime` installed when the callback is built) beside the estimate's, and with several
  ranks the cross-rank view (`crossrank.StepWindows` every `cross_rank_every` steps: one gather of each rank's
  step, compute, collective wait and memory; a line naming the rank/host that stands out). The callback does not
  see the DataLoader's wait, which counts as compute here.

Fault injection for tests and demos: `poison_step` (garbage labels for that step's first micro-batch) and
`lr_blowup=(step, factor)`, each firing once.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback

from dstoolkit.runtime.train.ckpt import HF_MARKER as MARKER  # noqa: F401 - the names callers import from here
from dstoolkit.runtime.train.ckpt import HfCheckpoints as _HfCheckpoints
from dstoolkit.runtime.train.hf_parts import batch_tokens as _batch_tokens
from dstoolkit.runtime.train.hf_parts import find_engine as _find_engine
from dstoolkit.runtime.train.hf_parts import peak_memory as _peak_memory
from dstoolkit.runtime.train.hfskip import ZeroBatch
from dstoolkit.runtime.train.spike import Rollback, SpikeGuard, SpikeGuardConfig


def last_complete_checkpoint(output_dir: Any) -> Optional[str]:
    """The newest `checkpoint-N` under `output_dir` that HF Trainer finished writing (its trainer_state.json is
    written last), or None. `Trainer.train(resume_from_checkpoint=True)` takes the highest N even when a rank was
    killed in the middle of saving it, and then fails on the missing trainer_state.json; pass this instead."""
    if not isinstance(output_dir, (str, os.PathLike)):
        raise TypeError(f"last_complete_checkpoint(output_dir={output_dir!r}): give the Trainer's output_dir, the "
                        "folder its checkpoint-N folders are in (TrainingArguments.output_dir)")
    root = Path(output_dir)
    done = [d for d in root.glob("checkpoint-*") if d.name.split("-")[-1].isdigit() and (d / "trainer_state.json").is_file()]
    return str(max(done, key=lambda d: int(d.name.split("-")[-1]))) if done else None


class DstoolkitCallback(TrainerCallback):
    """See the module docstring."""

    def __init__(self, *, spec: Optional[str] = None, config: Optional[SpikeGuardConfig] = None,
                 max_rollbacks: int = 5, metrics_path: Optional[str] = None,
                 poison_step: Optional[int] = None, lr_blowup: Optional[tuple[int, float]] = None,
                 cross_rank_every: int = 10) -> None:
        from dstoolkit.runtime.train.api_checks import callback_args

        # every argument checked here, not later on every rank (a SettingError); a spec typo is refused here too
        self.spec_path, self._spec, self._shape, self.metrics_path = callback_args(
            spec, metrics_path, max_rollbacks=max_rollbacks, cross_rank_every=cross_rank_every,
            poison_step=poison_step, lr_blowup=lr_blowup)
        from dstoolkit.runtime.rankexit import install_rank_guards

        install_rank_guards("dstoolkit callback")  # groups destroyed before exit; JIT-lock waits reported
        from dstoolkit.runtime.train.commtime import install_comm_timer

        self._comm = install_comm_timer()  # the measured comm share (see the module docstring)
        self._comm0 = 0.0
        self.cross_rank_every = cross_rank_every
        self._windows = None
        self._t_step = None
        self.guard = SpikeGuard(config or SpikeGuardConfig())
        self.rollbacks = Rollback(self.guard, max_rollbacks=max_rollbacks,
                                  hint="raise DstoolkitCallback(max_rollbacks=...)")
        self.poison_step, self.lr_blowup = poison_step, lr_blowup
        self.events: list[dict] = []
        self.engine = None
        self.rank, self.world = 0, 1
        self._step_losses: list[float] = []
        self._pending_rollback: Optional[str] = None
        self._tokens = 0
        self._t_window = None
        self._steps_window = 0
        self._estimate: Optional[dict] = None
        self._flops_per_token = self._peak = None
        self._live_params: Optional[int] = None
        self._seq_checked = False
        self._poisoned = self._blown = False
        self._zero = ZeroBatch()  # a skipped batch's backward adds zeros
        self._state = None
        self._f = None

    # ---------------------------------------------------------------------------------------------- helpers
    def _write(self, obj: dict) -> None:
        if "event" in obj:
            self.events.append(obj)
        if self._f is not None:
            self._f.write(json.dumps(obj, default=float) + "\n")
            self._f.flush()

    def _say(self, msg: str) -> None:
        if self.rank == 0:
            print(f"[dstoolkit] {msg}", file=sys.stderr, flush=True)

    def _mean(self, v: float) -> float:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or self.world == 1:
            return v
        dev = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([v], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    # ---------------------------------------------------------------------------------------------- hooks
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import torch.distributed as dist

        self._state = state
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.metrics_path and self.rank == 0:
            from dstoolkit.runtime.train.api_checks import open_append

            self._f = open_append("DstoolkitCallback", "metrics_path", self.metrics_path)
        self.engine = _find_engine(model)
        self.output_dir = args.output_dir
        model.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        model.register_forward_hook(self._post_forward, with_kwargs=True)
        self._estimate_for_run(model)
        self._t_window = self._t_step = time.perf_counter()
        self._comm0 = self._comm.total_s
        if self.cross_rank_every:
            from dstoolkit.runtime.train.crossrank import CrossRank, StepWindows

            self._windows = StepWindows(self.cross_rank_every, cross=CrossRank() if self.world > 1 else None)
        marker = Path(args.output_dir) / f"checkpoint-{state.global_step}" / MARKER
        if state.global_step and marker.is_file():  # resumed by the Trainer: the guard's state comes back too
            self.guard.load_state_dict(json.loads(marker.read_text())["guard"])
            self._write({"event": "resume", "step": state.global_step})
            self._say(f"resumed at step {state.global_step} with the spike guard's state from {marker.parent.name}")
        self._write({"event": "begin", "engine": self.engine is not None, "estimate": self._estimate,
                     "world_size": self.world})
        if self.engine is None:
            self._say("no DeepSpeed engine found: spike skip and the monitor work, rollback does not")

    def _estimate_for_run(self, model: Any) -> None:
        """The estimate for the spec's model on the engine's config, unless the spec's model is not `model`
        (`hf_estimate`: its parameter count differs; the batches' sequence length is checked at the first forward)."""
        if self._spec is None:
            return
        from dstoolkit.models.params import count_params
        from dstoolkit.runtime.train import hf_parts as H

        self._estimate, self._flops_per_token, self._peak = H.run_estimate(self._spec, self._shape, self.engine,
                                                                           self.world, self._say)
        try:
            spec_params, n = count_params(self._shape).total, H.live_params(model)
        except Exception:  # noqa: BLE001 - a model without a countable shape: nothing to compare
            return
        self._live_params = n
        if H.params_mismatch(spec_params, n):
            self._not_this_model(H.mismatch_line(self._shape.name, "has", f"{H.human(spec_params)} parameters",
                                                 f"model {H.human(n)}"))

    def _not_this_model(self, line: str) -> None:
        from dstoolkit.runtime.train.hf_parts import live_flops_per_token

        self._estimate = None
        self._flops_per_token = live_flops_per_token(self._live_params) if self._live_params else None
        self._write({"event": "spec_mismatch", "line": line})
        self._say(line)

    def _check_seq(self, ids: Any, mask: Any) -> None:
        """A training batch's tokens per sequence against the spec's seq_len: a mismatch only when a sequence is
        longer (padding to the batch's longest sequence makes shorter batches normal). Checked on every batch until
        one is longer; only a batch padded beyond seq_len costs a look at its attention mask (`longest_sequence`)."""
        seq = getattr(getattr(self._spec, "training", None), "seq_len", None)
        if self._estimate is None or not seq:
            self._seq_checked = True
            return
        from dstoolkit.runtime.train.hf_parts import longest_sequence, mismatch_line

        longest = longest_sequence(ids, mask, int(seq))
        if longest is None:
            return
        self._seq_checked = True
        self._not_this_model(mismatch_line(self._shape.name, "trains at seq_len", str(seq),
                                           f"batches hold {longest} tokens per sequence"))

    def _pre_forward(self, module, a, kw):
        self._zero.disarm()  # a skipped batch's backward is over by the next forward
        if not module.training:
            return None
        ids, mask, count = _batch_tokens(module, a, kw)
        self._tokens += count
        if not self._seq_checked and (ids is not None or mask is not None):
            self._check_seq(ids, mask)
        step = self._state.global_step + 1 if self._state is not None else 0
        if self.lr_blowup and not self._blown and step >= self.lr_blowup[0] and self.engine is not None:
            self._blown = True
            for g in self.engine.optimizer.param_groups:
                g["lr"] *= self.lr_blowup[1]
            self._write({"event": "inject", "kind": "lr_blowup", "step": step, "factor": self.lr_blowup[1]})
            # the scheduler resets the LR after the step: keep it blown up for the rest of the run
            self._blowup_factor = self.lr_blowup[1]
        if self.poison_step and not self._poisoned and step == self.poison_step and "labels" in (kw or {}):
            import torch

            self._poisoned = True
            lab = kw["labels"]
            g = torch.Generator().manual_seed(step)
            kw = dict(kw)
            kw["labels"] = torch.randint(0, int(lab.max()) + 1, lab.shape, generator=g).to(lab.device)
            self._write({"event": "inject", "kind": "poison", "step": step})
            return a, kw
        return None

    def _post_forward(self, module, a, kw, out):
        if not module.training:
            return None
        loss = out.get("loss") if hasattr(out, "get") else None
        if loss is None:
            return None
        step = self._state.global_step + 1 if self._state is not None else 0
        gl = self._mean(float(loss.detach().float().item()))
        cooling = self.guard.lr_multiplier() != 1.0
        d = self.guard.check_loss(gl, step)
        if d.action == "lr_scale" and not cooling and self.engine is not None:  # the cool-down starts with this update
            for g in self.engine.optimizer.param_groups:
                g["lr"] *= self.guard.lr_multiplier()
        if d.action == "none":
            self._step_losses.append(gl)
            return None
        self._write({"event": "spike", "step": step, **d.as_dict()})
        self._say(f"step {step}: {d.kind} -> {d.action}: {d.reason}")
        if d.action in ("skip", "rollback"):
            if d.action == "rollback":
                self._pending_rollback = d.reason
            out["loss"] = self._zero.arm(module, loss)  # this batch adds zero gradients (NaN/Inf included)
            return out
        return None  # lr_scale: the cool-down counter was set by the guard

    def on_substep_end(self, args, state, control, **kwargs):
        self._zero.disarm()  # the micro-batch's backward is done
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._zero.disarm()
        step = state.global_step
        self.guard.end_step()  # the update just taken counts for the cool-down, then it is judged
        if self._pending_rollback is not None:
            reason, self._pending_rollback = self._pending_rollback, None
            self._rollback(step, reason)
        elif self._step_losses:
            loss = sum(self._step_losses) / len(self._step_losses)
            gn = None
            if self.engine is not None:
                try:
                    g = self.engine.get_global_grad_norm()
                    gn = float(g) if g is not None else None
                except Exception:
                    gn = None
            d = self.guard.observe_step(loss, gn, step)
            if d.action != "none":
                self._write({"event": "spike", "step": step, **d.as_dict()})
                self._say(f"step {step}: {d.kind} -> {d.action}: {d.reason}")
                if d.action == "rollback":
                    self._rollback(step + 1, d.reason)
            self._write({"step": step, "loss": loss, "grad_norm": gn, "lr": self._lr(),
                         "lr_multiplier": self.guard.lr_multiplier()})
        self._step_losses = []
        self._apply_lr()
        self._steps_window += 1
        now = time.perf_counter()
        if self._windows is not None and self._t_step is not None:
            rec = self._windows.step(step, now - self._t_step, mem_bytes=float(_peak_memory() or 0))
            if rec is not None:
                self._write(rec)
                if rec["bottleneck_line"]:
                    self._say(rec["bottleneck_line"])
        self._t_step = now
        return control

    def _lr(self) -> Optional[float]:
        if self.engine is None:
            return None
        return float(self.engine.optimizer.param_groups[0]["lr"])

    def _apply_lr(self) -> None:
        if self.engine is None:
            return
        m = self.guard.lr_multiplier() * getattr(self, "_blowup_factor", 1.0)
        if m != 1.0:
            for g in self.engine.optimizer.param_groups:
                g["lr"] = g["lr"] * m

    def _rollback(self, spike_step: int, reason: str) -> None:
        if self.engine is None:
            self._say(f"step {spike_step}: rollback wanted ({reason}) but no DeepSpeed engine; the batch was skipped")
            return

        def load(path: str) -> None:
            loaded, _ = self.engine.load_checkpoint(path)
            if loaded is None:
                raise RuntimeError(f"DeepSpeed could not load {path}")
            self.guard.load_state_dict(json.loads((Path(path) / MARKER).read_text())["guard"])

        tag, rejected = self.rollbacks.perform(_HfCheckpoints(self.output_dir), spike_step, reason, load)
        if tag is None:
            self._write({"event": "rollback_unavailable", "step": spike_step, "reason": reason, "rejected": rejected,
                         "baseline_restarted": True})
            return self._say(Rollback.unavailable_line(spike_step, reason, "loss_spike"))
        self._blowup_factor = 1.0  # the injected blow-up is undone with the optimizer state
        self._write({"event": "rollback", "step": spike_step, "to": Path(tag).name, "reason": reason,
                     "rejected": rejected})
        self._say(f"step {spike_step}: ROLLBACK to {Path(tag).name} (weights, optimizer, scheduler): {reason}")

    def on_save(self, args, state, control, **kwargs):
        if self.rank == 0:
            d = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if d.is_dir():
                (d / MARKER).write_text(json.dumps({"step": state.global_step, "healthy": self.guard.healthy(),
                                                    "guard": self.guard.state_dict()}))
                self._write({"event": "checkpoint", "step": state.global_step, "healthy": self.guard.healthy()})
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        now = time.perf_counter()
        if self._t_window is None or not self._steps_window:
            return control
        dt = now - self._t_window
        tokens = self._tokens * self.world
        tps = tokens / dt if dt > 0 else None
        mfu = (tps * self._flops_per_token / (self._peak * self.world)
               if tps and self._flops_per_token and self._peak else None)
        mem = _peak_memory()
        comm_share = (self._comm.total_s - self._comm0) / dt if dt > 0 else None
        rec = {"event": "monitor", "step": state.global_step, "tokens_per_s": tps, "mfu": mfu,
               "peak_memory_bytes": mem, "step_time_s": dt / self._steps_window, "estimate": self._estimate,
               "comm_share": comm_share}
        self._write(rec)
        est = self._estimate or {}
        self._say(f"step {state.global_step}: {tps or 0:,.0f} tok/s"
                  + (f" (est {est['tokens_per_s']:,.0f})" if est.get("tokens_per_s") else "")
                  + (f", MFU {mfu:.2e}" if mfu else "") + (" (6N, live model)" if mfu and not est else "") + (f" (est {est['mfu']:.2e})" if est.get("mfu") else "")
                  + (f", peak mem {mem / 2**30:.2f} GiB" if mem else "")
                  + (f" (est {est['memory_per_rank_bytes'] / 2**30:.2f})" if est.get("memory_per_rank_bytes") else "")
                  + (f", comm {comm_share:.0%} measured" if comm_share is not None else "")
                  + (f" (est {est['comm_share']:.0%})" if est.get("comm_share") is not None else ""))
        self._t_window, self._tokens, self._steps_window = now, 0, 0
        self._comm0 = self._comm.total_s
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._write({"event": "done", "step": state.global_step, "rollbacks": self.rollbacks.done})
        if self._f is not None:
            self._f.close()
            self._f = None
        return control
