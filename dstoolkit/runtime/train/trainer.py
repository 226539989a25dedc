"""Example DeepSpeed trainer: TinyTransformer on synthetic data, with every training helper wired in.

Launch (stable CLI; generated launch.sh, the demo and the benchmarks call exactly this):

    deepspeed --num_gpus 2 --module dstoolkit.runtime.train.trainer --deepspeed_config DS.json --spec SPEC.yaml \
        --steps N --metrics-out metrics.jsonl [--seed 0] [--ep-size E] [--checkpoint-dir DIR] [--save-every K] [--resume]
        [--dist-timeout-s 600] [--shrink auto|layers=4,hidden=64,...]
    torchrun --nproc_per_node 2 -m dstoolkit.runtime.train.trainer <same args>

With --shrink the model is the spec's own transformers architecture (Gemma, GPT-OSS, Qwen3-Next,
Nemotron-H, ...), shrunk by `dstoolkit.runtime.shrink` (layers, widths, experts, vocabulary; the layer pattern,
routing top-k, shared experts, norms and tied embeddings kept); the first metrics line is
{"event": "model", "builder": "transformers", "model_class", "params", "shrunk_sizes", "changed", "kept", ...}.

What it does: init the process group (gloo on CPU, nccl on CUDA; every group, world and the ZeRO / expert
groups DeepSpeed creates later, with the --dist-timeout-s timeout), build the model from the spec's model
section with the spec's checkpoint policy, start a DeepSpeed engine from the JSON (batch triad from the JSON),
train N optimizer steps on `synthetic_batch` data with the batch ramp, spike guard, monitor and atomic
checkpoints, and have rank 0 append JSON lines to --metrics-out:
  per step  {"step", "loss", "step_time_s", "tokens_per_s", "global_batch", "micro_batch", "grad_accum",
             "peak_rss_bytes", "lr", "cpu_time_s" (rank 0's process CPU seconds in the step), ...}
  events    {"event": "spike"|"rollback"|"checkpoint"|"resume"|"monitor"|"inject", ...}
  at the end {"event": "done", "steps", "final_loss", "world_size", "shm_buffers_unlinked"}
Every line is strict JSON: a NaN / Inf (a non-finite loss; final_loss of a run that trained no step) is null.
With --checkpoint-dir the last step is saved at the end unless --save-every saved it already (a run shorter than
--save-every still leaves a checkpoint for --resume). A --resume whose checkpoint is already at --steps or beyond
says so in one line ("step_N is already at step N >= --steps M: nothing to train") and exits 0.
Exit code: 0 ok, 1 training failure, 2 bad input; the message says what and why.

Fault-injection flags (--inject-poison, --inject-lr-blowup, --kill-at-step) exist to prove the guard and
the resume path in tests and demos; they are off by default.

This module is the loop; beside it: the flags and inputs (`trainer_inputs`), the builders (`builders`), the
process groups (`pgroups`), the LR control (`lr`), fault injection (`faults`), DeepSpeed's accumulation window
(`accum`), and the run's position, metrics file and checkpoints (`run_state`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from dstoolkit.runtime.rankexit import end_ranks, install_rank_guards
from dstoolkit.runtime.train.accum import align_window, open_micro_batches
from dstoolkit.runtime.train.gradnorm import NO_NORM_LINE, step_with_norm
from dstoolkit.runtime.train.builders import (SyntheticData, add_monitor_backends, build_checkpoint_manager, build_data,
                                              build_engine, build_guard, build_model_for_run, build_monitor,
                                              build_ramp, model_event, write_model_config)
from dstoolkit.runtime.train.ckpt import CheckpointSaveError, tag_for
from dstoolkit.runtime.train.faults import FaultInjector
from dstoolkit.runtime.train.lr import LrControl
from dstoolkit.runtime.train.pgroups import init_distributed
from dstoolkit.runtime.train.run_state import Checkpoints, MetricsWriter, RunState
from dstoolkit.runtime.train.trainer_inputs import Inputs, UsageError, build_parser, launched_as_rank0, read_inputs

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as the shell reports it
OTHER_RANKS_WAIT_S = 5.0
"""How long a rank other than global rank 0 holds back its bad-input line (`say_usage_error`). Every rank refuses the
same input (the same files and flags; the writer lock and the --metrics-out check are rank 0's), and the launcher
stops the rest once rank 0 has exited (torch/distributed/elastic/agent/server/api.py `SimpleElasticAgent._invoke_run`:
`_stop_workers` on FAILED; deepspeed/launcher/launch.py: `sigkill_handler` on a non-zero returncode): the line is
said once. A rank still running after the wait says it itself (rank 0 did not refuse, or nothing stopped it)."""


def say_usage_error(line: str) -> None:
    """Print a rank's bad-input line: global rank 0 (RANK unset or 0) at once, another rank after
    `OTHER_RANKS_WAIT_S` unless its launcher stopped it meanwhile (N ranks printed N copies before)."""
    if not launched_as_rank0():
        time.sleep(OTHER_RANKS_WAIT_S)
    print(line, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------
# the run: built once by `setup`, then the loop (`accumulate` for one step's micro-batches, `train` for the steps)


@dataclass
class Run:
    """Everything one training run holds, built once by `train`."""

    args: argparse.Namespace
    rank: int
    world: int
    on_cuda: bool
    shape: Any
    seq_len: int
    engine: Any
    data: SyntheticData
    ramp: Any
    lr: LrControl
    guard: Any
    monitor: Any
    ckpt: Checkpoints
    faults: FaultInjector
    writer: MetricsWriter
    state: RunState
    log: Any
    lock: Any = None
    """The --checkpoint-dir writer lock global rank 0 holds (`writer_lock`; None elsewhere or without one)."""
    norm_off_said: bool = False
    """Whether the run said that grad-norm detection is off (`gradnorm.NO_NORM_LINE`, once)."""

    def global_mean(self, value: float) -> float:
        import deepspeed.comm as dist
        import torch

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world


@dataclass
class Accumulated:
    """One optimizer step's micro-batches: the global losses trained on, time spent waiting for data, the LR and
    its multiplier in force, the data positions of the step (trained on or flagged: the offending ones when the
    update itself is judged bad), and whether a rollback abandoned the step."""

    losses: list[float]
    input_wait_s: float
    lr: float
    mult: float
    positions: list[int]
    rolled_back: bool = False
    grad_norm: Optional[float] = None
    """The update's gradient norm: DeepSpeed's, else measured before the step (`gradnorm.step_with_norm`)."""


def accumulate(run: Run, target: int, gas: int, lr: float, mult: float) -> Accumulated:
    """Forward/backward `gas` accepted micro-batches for step `target`, the spike guard judging each loss
    (skip the batch, scale the LR, or roll back to a checkpoint); `lr` / `mult`: the LR set for the step and
    the multiplier in it."""
    import torch

    state, guard, args = run.state, run.guard, run.args
    accepted: list[float] = []
    positions: list[int] = []
    incidents: list[int] = []
    input_wait, grad_norm = 0.0, None
    other = mult / guard.lr_multiplier()  # the injected blow-up's part of the multiplier
    while len(accepted) < gas:
        pos = state.data_pos
        if pos in state.skip_positions:
            state.data_pos += 1
            continue
        t_in = time.perf_counter()
        x, y = run.data.batch(pos)
        poison = run.faults.poison_due(target, len(accepted))
        if poison:
            y = run.faults.poisoned_labels(y, pos, run.shape.vocab_size)
        input_wait += time.perf_counter() - t_in
        if poison:
            run.faults.poisoned(target, pos)
        if run.on_cuda:
            x, y = x.cuda(), y.cuda()
        torch.manual_seed((args.seed * 1_000_003 + pos) & 0x7FFFFFFF)  # per-batch RNG: resume-exact
        loss = run.engine(x, y)
        gl = run.global_mean(float(loss.detach().float().item()))
        decision = guard.check_loss(gl, target) if args.spike_guard else None
        if decision is not None and decision.kind != "ok":
            run.writer.write({"event": "spike", "step": target, "data_pos": pos, **decision.as_dict()})
            run.log(f"step {target}: {decision.kind} -> {decision.action}: {decision.reason}")
            if decision.action != "none":
                incidents.append(pos)
            if decision.action == "skip":
                del loss
                state.data_pos += 1
                continue
            if decision.action == "rollback":
                # the loss closes the accumulation window the rollback abandons (weight 0; accum.close_window)
                rolled = run.ckpt.rollback(target, decision.reason, incidents, decision.kind, open_loss=loss)
                del loss
                if rolled:
                    return Accumulated(accepted, input_wait, lr, mult, positions, rolled_back=True)
                state.data_pos += 1  # no checkpoint: do not train on it (the guard restarted its baseline)
                continue
            new_mult = guard.lr_multiplier() * other
            if new_mult != mult:  # lr_scale: the cool-down starts with this step's update
                lr = run.lr.set(new_mult if run.lr.own_schedule else new_mult / mult)
                mult = new_mult
        run.engine.backward(loss)
        grad_norm = step_with_norm(run.engine)  # ZeRO-0 fp32: DeepSpeed reports None (gradnorm)
        accepted.append(gl)
        positions.append(pos)
        state.data_pos += 1
    left = open_micro_batches(run.engine)
    if left:  # the step's last micro-batch must close DeepSpeed's window (accum), else steps mix batches silently
        raise RuntimeError(f"step {target}: DeepSpeed's gradient-accumulation window is out of phase with the "
                           f"trainer's steps ({left} of {gas} micro-batches still open after the step's last one); "
                           "report this with the metrics file")
    return Accumulated(accepted, input_wait, lr, mult, sorted(positions + incidents), grad_norm=grad_norm)


def setup(args: argparse.Namespace, inputs: Inputs) -> tuple[Run, list[str]]:
    """Process groups, then the builders in dependency order; returns the run and the /dev/shm names unlinked."""
    import deepspeed.comm as dist
    import torch

    on_cuda = torch.cuda.is_available()
    from dstoolkit.runtime.train.commtime import install_comm_timer

    install_comm_timer()  # before DeepSpeed looks the collectives up: the monitor's measured comm share
    shm_unlinked = init_distributed("nccl" if on_cuda else "gloo", args.dist_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    spec, shape, ds_config = inputs.spec, inputs.shape, inputs.ds_config
    lock = take_writer_lock(args, rank)

    model = build_model_for_run(args, spec, shape, world, shrunk=inputs.shrunk)
    mgr = build_checkpoint_manager(args, rank)
    add_monitor_backends(ds_config, args.monitor_dir)
    engine, optimizer, lr_sched = build_engine(model, ds_config, spec)
    seq_len = spec.training.seq_len
    state = RunState()
    lr = LrControl(optimizer, own_schedule=lr_sched is None, spec=spec, global_batch=engine.train_batch_size(),
                   state=state)
    ramp = build_ramp(spec, engine)
    guard = build_guard(args)
    writer = MetricsWriter(args.metrics_out, enabled=(rank == 0))
    monitor = build_monitor(args, spec, shape, engine, world, on_cuda)
    writer.write(model_event(model, shape, seq_len, world))

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[dstoolkit.runtime.train] {msg}", file=sys.stderr, flush=True)

    run = Run(args=args, rank=rank, world=world, on_cuda=on_cuda, shape=shape, seq_len=seq_len, engine=engine,
              data=build_data(args, shape, engine, seq_len, rank), ramp=ramp, lr=lr, guard=guard,
              monitor=monitor, ckpt=Checkpoints(mgr, args, engine, state, guard, writer, log),
              faults=FaultInjector(args, inputs.blowups, writer), writer=writer, state=state, log=log, lock=lock)
    return run, shm_unlinked


def take_writer_lock(args: argparse.Namespace, rank: int) -> Any:
    """Global rank 0 takes the --checkpoint-dir writer lock before anything is written there; every rank learns the
    outcome (a broadcast), so a folder another live run writes into is one UsageError on every rank, exit 2."""
    if not args.checkpoint_dir:
        return None
    import deepspeed.comm as dist

    from dstoolkit.runtime.train.writer_lock import take

    lock, problem = (take(args.checkpoint_dir, note=lambda m: print(f"[dstoolkit.runtime.train] {m}",
                                                                    file=sys.stderr, flush=True))
                     if rank == 0 else (None, None))
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise UsageError(box[0])
    return lock


def train(args: argparse.Namespace) -> int:
    """Run the training loop (called on every rank)."""
    inputs = read_inputs(args)
    for note in inputs.notes:  # only the rank that checked the --metrics-out file has any
        print(f"dstoolkit.runtime.train.trainer: note: {note}", file=sys.stderr)
    if args.checkpoint_dir and not args.resume:  # as `dstoolkit train`'s pre-flight: never overwrite another run's
        from dstoolkit.runtime.train.resume_check import fresh_run_refusal

        problem = fresh_run_refusal(args.checkpoint_dir)
        if problem:
            raise UsageError(problem)

    import deepspeed.comm as dist

    from dstoolkit.runtime.train.monitor import StepSample, comm_wait_total_s, cpu_time_s, peak_rss_bytes

    run, shm_unlinked = setup(args, inputs)
    engine, state, guard, writer = run.engine, run.state, run.guard, run.writer
    if args.resume:
        run.ckpt.resume()
    # --shrink: config.json beside the tags, what `dstoolkit ckpt export` reads; only once the resume loaded (or this
    # run starts afresh), so a refused resume leaves no config.json of this model beside another model's tags
    write_model_config(run.ckpt.mgr, engine.module)
    if args.resume and state.step >= args.steps:  # exit 0: the run asked for is done ("done": steps N, loss null)
        run.log(f"{tag_for(state.step)} is already at step {state.step} >= --steps {args.steps}: nothing to train "
                f"(raise --steps to train on)")
    bar = None
    if run.rank == 0 and args.progress:
        from tqdm import tqdm

        bar = tqdm(total=args.steps, initial=state.step, desc="train", unit="step", file=sys.stderr,
                   dynamic_ncols=True, mininterval=0.5)

    last_loss = float("nan")
    while state.step < args.steps:
        target = state.step + 1
        if run.ramp is not None:
            run.ramp.apply(engine, state.consumed_samples)
        gas = engine.gradient_accumulation_steps()
        align_window(engine)  # a ramp's new window starts with this step (DeepSpeed counts micro-steps; accum)
        gb = engine.train_batch_size()
        mult = guard.lr_multiplier()
        mult *= run.faults.lr_factor(target)
        lr = run.lr.set(mult)
        t_step, cpu0 = time.perf_counter(), cpu_time_s()
        comm0 = comm_wait_total_s()

        micro = accumulate(run, target, gas, lr, mult)
        if micro.rolled_back:
            if bar is not None:
                bar.n = state.step
                bar.refresh()
            continue
        step_time = time.perf_counter() - t_step
        step_cpu_s = cpu_time_s() - cpu0
        comm1 = comm_wait_total_s()  # this step's time blocked in collectives: comm1 - comm0
        state.step = target
        state.consumed_samples += gb
        state.tokens += gb * run.seq_len
        step_loss = last_loss = sum(micro.losses) / len(micro.losses)
        grad_norm = micro.grad_norm
        if grad_norm is None and args.spike_guard and not run.norm_off_said:
            run.norm_off_said = True
            run.log(NO_NORM_LINE)
        guard.end_step()  # the update just taken counts for the cool-down, then its grad norm is judged
        if args.spike_guard:
            d = guard.observe_step(step_loss, grad_norm, target)
            if d.kind != "ok":
                writer.write({"event": "spike", "step": target, **d.as_dict()})
                run.log(f"step {target}: {d.kind} -> {d.action}: {d.reason}")
                # the update is judged: its batches are the offending ones
                if d.action == "rollback" and run.ckpt.rollback(target + 1, d.reason, micro.positions, d.kind):
                    continue

        tps = gb * run.seq_len / step_time
        writer.write({"step": state.step, "loss": step_loss, "step_time_s": step_time, "tokens_per_s": tps,
                      "global_batch": gb, "micro_batch": run.data.micro, "grad_accum": gas,
                      "peak_rss_bytes": peak_rss_bytes(), "lr": micro.lr, "grad_norm": grad_norm,
                      "data_pos": state.data_pos, "tokens": state.tokens, "input_wait_s": micro.input_wait_s,
                      "lr_mult": micro.mult, "cpu_time_s": step_cpu_s,
                      "comm_wait_s": (comm1 - comm0) if comm0 is not None else None})
        report = run.monitor.record(StepSample(
            step=state.step, step_time_s=step_time, input_wait_s=micro.input_wait_s, tokens=gb * run.seq_len,
            loss=step_loss, cpu_time_s=cpu_time_s() - cpu0, comm_time_s=(comm1 - comm0) if comm0 is not None else None))
        if report is not None:
            writer.write({"event": "monitor", **report.as_dict()})
            if bar is not None:
                bar.write(report.line(), file=sys.stderr)
            else:
                run.log(report.line())
            if report.bottleneck_line:
                (bar.write if bar is not None else run.log)(report.bottleneck_line)
        if bar is not None:
            bar.set_postfix(loss=f"{step_loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
        run.ckpt.maybe_save(args.save_every, barrier=dist.barrier)
        run.faults.maybe_kill(state.step, run.rank)
    if bar is not None:
        bar.close()
    run.ckpt.save_final(barrier=dist.barrier)  # a run shorter than --save-every still saves once, at its end
    if run.lock is not None:
        run.lock.release()  # (a failure releases it at exit)
    writer.write({"event": "done", "steps": state.step, "final_loss": last_loss, "world_size": run.world,
                  "data_pos": state.data_pos, "shm_buffers_unlinked": len(shm_unlinked)})
    writer.close()
    end_ranks()  # barrier, then every process group destroyed before the interpreter exits (rankexit)
    return EXIT_OK


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    install_rank_guards("dstoolkit.runtime.train.trainer")
    try:
        return train(args)
    except UsageError as e:  # exit 2; torchrun's own exit is 1 whatever its ranks' codes (docs/training-helpers.md)
        say_usage_error(f"dstoolkit.runtime.train.trainer: error: {e}")
        return EXIT_USAGE
    except CheckpointSaveError as e:  # one line on every rank (a full disk: torch says `unexpected pos`); no traceback
        print(f"dstoolkit.runtime.train.trainer: training failed on rank {os.environ.get('RANK', '0')}: {e}",
              file=sys.stderr)
        return EXIT_FAIL
    except KeyboardInterrupt:  # Ctrl-C, passed on by the launcher: the launching command says it, once
        return EXIT_INTERRUPTED
    except Exception as e:  # a clear one-line reason first, the traceback after for debugging
        import traceback

        print(f"dstoolkit.runtime.train.trainer: training failed on rank {os.environ.get('RANK', '0')}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
