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
Exit code: 0 ok, 1 training failure, 2 bad input; the message says what and why.

Fault-injection flags (--inject-poison, --inject-lr-blowup, --kill-at-step) exist to prove the guard and
the resume path in tests and demos; they are off by default.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DATA_SEED_OFFSET = 7_777
"""Data seed = --seed + this, so weight and data streams differ."""
LR_DECAY_FLOOR = 0.1
"""Cosine decay ends at this fraction of the peak LR (Chinchilla / Llama practice)."""
DEFAULT_DIST_TIMEOUT_S = 600.0
"""Process-group timeout: DeepSpeed's own init default (10 min). Long enough for a rank to wait out a peer's
checkpoint write or first-use C++ op compile (cpu_adam: 46 s on a 2-core host); short enough that a dead link or frozen node
fails the job in minutes, not after torch's 30 min gloo default that `dist.new_group` groups get otherwise."""


class UsageError(Exception):
    """Bad input: exit code 2 with the message."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dstoolkit.runtime.train.trainer", description=__doc__.split("\n")[0])
    p.add_argument("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config", required=True,
                   help="DeepSpeed JSON (batch triad, ZeRO, precision, optimizer, monitors)")
    p.add_argument("--spec", required=True, help="spec YAML: model, training.seq_len, checkpoint policy, ramp")
    p.add_argument("--steps", type=int, required=True, help="optimizer steps to run (total, including resumed ones)")
    p.add_argument("--metrics-out", required=True, help="JSON-lines file rank 0 appends to")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ep-size", type=int, default=None, help="expert-parallel degree (default: spec training.ep or 1)")
    p.add_argument("--shrink", default=None, metavar="auto|KEY=N,...",
                   help="train the spec's own transformers architecture (model.hf_config or inline HF fields), "
                        "shrunk to run here: 'auto', or sizes such as layers=4,hidden=64,heads=4,head_dim=16,"
                        "experts=8,vocab=512,window=16,seq_len=64 (dstoolkit.runtime.shrink). Without it the "
                        "trainer builds the project's TinyTransformer stand-in of the shape")
    p.add_argument("--checkpoint-dir", default=None, help="root for atomic DeepSpeed checkpoints")
    p.add_argument("--save-every", type=int, default=0, help="save every K steps (0: never)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint (if any)")
    p.add_argument("--dist-timeout-s", type=float, default=DEFAULT_DIST_TIMEOUT_S,
                   help="timeout of every process group, world and the ZeRO / expert groups DeepSpeed makes with "
                        "new_group (which otherwise get torch's default, 30 min on gloo): a collective stuck on a "
                        "dead peer or cut link fails after this long instead of hanging. Default 600 s, DeepSpeed's "
                        "own init default: room for a peer's checkpoint write or op compile, yet a dead link costs "
                        "minutes, not half an hour. Replaces DEEPSPEED_TIMEOUT")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint-backend", choices=["torch", "deepspeed"], default="torch",
                   help="recompute through torch.utils.checkpoint or deepspeed.checkpointing")
    p.add_argument("--monitor-every", type=int, default=5)
    p.add_argument("--monitor-dir", default=None, help="enable DeepSpeed's csv monitor (and tensorboard when installed) writing here")
    p.add_argument("--peak-flops", type=float, default=None,
                   help="peak FLOP/s per rank for MFU (default: the peak the estimator uses - this machine's "
                        "cached GEMM peak on CPU, the hardware table's on GPU)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="tqdm bar with ETA")
    p.add_argument("--data-delay-s", type=float, default=0.0, help="sleep per batch in the data iterator")
    g = p.add_argument_group("spike guard")
    g.add_argument("--spike-guard", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--spike-z", type=float, default=6.0)
    g.add_argument("--spike-window", type=int, default=20)
    g.add_argument("--spike-action", choices=["none", "skip", "lr_scale", "rollback"], default="skip")
    g.add_argument("--grad-spike-action", choices=["none", "lr_scale", "rollback"], default="lr_scale")
    g.add_argument("--escalate-after", type=int, default=2, help="consecutive skips that trigger a rollback")
    g.add_argument("--lr-scale", type=float, default=0.1)
    g.add_argument("--lr-scale-steps", type=int, default=10)
    g.add_argument("--max-rollbacks", type=int, default=5,
                   help="give up (exit 1) after this many rollbacks: the damage is not transient")
    f = p.add_argument_group("fault injection (tests and demos)")
    f.add_argument("--inject-poison", type=int, action="append", default=[],
                   help="at this step, the first micro-batch (every rank) gets random labels")
    f.add_argument("--inject-lr-blowup", action="append", default=[], metavar="STEP:FACTOR",
                   help="multiply the LR of one step by FACTOR (once)")
    f.add_argument("--kill-at-step", type=int, default=None, help="SIGKILL one rank after this step")
    f.add_argument("--kill-rank", type=int, default=1)
    return p


# ----------------------------------------------------------------------------------------------------------
# spec -> shape, policy, ramp


def load_spec_and_shape(path: str) -> tuple[Any, Any]:
    """(Spec, ModelShape) from a spec YAML, through the models package when it provides the readers."""
    from dstoolkit import spec as spec_mod

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--spec {path}: no such file")
    if hasattr(spec_mod, "load_spec"):
        spec = spec_mod.load_spec(p)
    else:  # TODO(#3): drop once load_spec lands everywhere
        import yaml

        spec = spec_mod.Spec.model_validate(yaml.safe_load(p.read_text()))
    try:
        from dstoolkit.models import resolve_model
    except ImportError:
        resolve_model = None
    if resolve_model is not None:
        shape = resolve_model(spec.model, p.parent)
    else:  # TODO(#3): inline-only fallback until dstoolkit.models.resolve_model lands
        from dstoolkit.models.shape import ModelShape

        extra = dict(spec.model.model_extra or {})
        if spec.model.preset or spec.model.hf_config:
            raise UsageError("spec model.preset / model.hf_config need dstoolkit.models.resolve_model")
        shape = ModelShape(**extra)
    return spec, shape


def policy_from_spec(training: Any) -> Any:
    """CheckpointPolicy from training.activation_checkpointing (+ every_k / ratio); "auto" means none here."""
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    kind = training.activation_checkpointing
    if kind == "every-k":
        return CheckpointPolicy(kind="every-k", every_k=training.checkpoint_every_k)
    if kind == "ratio":
        return CheckpointPolicy(kind="ratio", ratio=training.checkpoint_ratio)
    if kind in ("none", "auto"):
        return CheckpointPolicy(kind="none")
    return CheckpointPolicy(kind=kind)


def model_flops_per_token(shape: Any, seq_len: int) -> float:
    """MFU numerator: 6N + 12*L*H*Q*T from `dstoolkit.estimate.flops_per_token` (docs/anchors.md; recompute excluded)."""
    from dstoolkit.estimate import flops_per_token

    return flops_per_token(shape, seq_len).model


def monitor_peak(spec: Any, on_cuda: bool, precision: str) -> tuple[float, str]:
    """Peak FLOP/s per rank for MFU and what it is: `hardware.calibration.peak_flops_per_rank`, the estimator's
    own peak. Ranks on CUDA: the spec's GPU row. Ranks on CPU (also a GPU spec's strategy run here, shrunk):
    the CPU row with the spec's calibration, or this machine's cached one; never a probe (the job's ranks hold
    the cores), so without a cached calibration it is the hardware table's CPU row."""
    from dstoolkit.hardware import calibration as cal
    from dstoolkit.hardware.table import get_gpu

    if on_cuda:
        return cal.peak_flops_per_rank(get_gpu(spec.cluster.gpu), precision, None)
    value = getattr(spec.cluster, "calibration", None) if get_gpu(spec.cluster.gpu).name == "cpu" else None
    path = cal.calibration_path(value, "cpu", spec.base_dir, probe=False)
    return cal.peak_flops_per_rank(get_gpu("cpu"), precision,
                                   cal.load_calibration(path, precision) if path is not None else None)


# ----------------------------------------------------------------------------------------------------------
# process groups


def set_default_group_timeout(timeout_s: float) -> datetime.timedelta:
    """Make every process group created from now on without an explicit timeout use `timeout_s`.

    DeepSpeed 0.19.8 creates its ZeRO data-parallel group (`groups._clone_world_group`), expert and
    expert-data-parallel groups with `deepspeed.comm.new_group(ranks)`, which calls
    `torch.distributed.new_group(ranks)` with no timeout; torch 2.13 then reads the module globals
    `distributed_c10d.default_pg_timeout` (gloo and others: 30 min) or `default_pg_nccl_timeout` (NCCL: 10 min)
    through `_get_default_timeout` at creation time. Setting both here covers every later group.

    Args:
        timeout_s: seconds (> 0).

    Returns:
        The timeout as a timedelta (pass it to `deepspeed.init_distributed` for the world group).
    """
    import torch.distributed.distributed_c10d as c10d

    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"process-group timeout {timeout_s} s must be a positive number of seconds, e.g. 600")
    timeout = datetime.timedelta(seconds=timeout_s)
    c10d.default_pg_timeout = timeout
    if c10d.default_pg_nccl_timeout is not None:  # None when torch is built without NCCL (CPU wheels)
        c10d.default_pg_nccl_timeout = timeout
    return timeout


def init_distributed(backend: str, timeout_s: float) -> list[str]:
    """`deepspeed.init_distributed` with `timeout_s` on the world group AND on every group made afterwards.

    Call it before `deepspeed.initialize` (and before building an MoE model): the groups DeepSpeed creates
    there take the timeout set here. A collective waiting on a rank that stopped answering then raises after
    about `timeout_s` instead of hanging.

    Args:
        backend: "gloo" or "nccl".
        timeout_s: seconds (> 0).

    Returns:
        The /dev/shm buffer names this rank unlinked (`dstoolkit.runtime.train.shm.unlink_after_rendezvous`; gloo only).
    """
    timeout = set_default_group_timeout(timeout_s)
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    if backend == "gloo":
        from dstoolkit.runtime.train.shm import unlink_after_rendezvous

        # DeepSpeed never unlinks its CPU all-reduce buffers (dstoolkit.runtime.train.shm): once every rank has mapped
        # them, drop their names so nothing is left in /dev/shm however the job ends.
        return unlink_after_rendezvous()
    return []


def _parse_blowups(specs: list[str]) -> dict[int, float]:
    out = {}
    for s in specs:
        try:
            step, factor = s.split(":")
            out[int(step)] = float(factor)
        except ValueError:
            raise UsageError(f"--inject-lr-blowup {s!r}: expected STEP:FACTOR, e.g. 18:1000") from None
    return out


def _lr_at(tokens: int, base_lr: float, warmup_tokens: int, total_tokens: Optional[int]) -> float:
    """Token-counted LR: linear warm-up, then cosine to LR_DECAY_FLOOR x peak (kept in tokens so a batch
    ramp does not distort it)."""
    if warmup_tokens > 0 and tokens < warmup_tokens:
        return base_lr * (tokens + 1) / warmup_tokens
    if total_tokens and total_tokens > warmup_tokens:
        frac = min(1.0, (tokens - warmup_tokens) / (total_tokens - warmup_tokens))
        return base_lr * (LR_DECAY_FLOOR + (1 - LR_DECAY_FLOOR) * 0.5 * (1 + math.cos(math.pi * frac)))
    return base_lr


# ----------------------------------------------------------------------------------------------------------
# inputs and builders (model, engine, data, guard, monitor), each on its own; `train` below calls them in order


@dataclass
class Inputs:
    """What the command line names, read and checked before torch / deepspeed are imported."""

    ds_config: dict
    spec: Any
    shape: Any
    blowups: dict[int, float]
    shrunk: Any = None
    """`dstoolkit.runtime.shrink.ShrunkRun` with --shrink (then `shape` is the shrunk shape), else None."""


def read_inputs(args: argparse.Namespace) -> Inputs:
    """Check the flags and read the DeepSpeed JSON and the spec; every problem is a UsageError (exit 2)."""
    if args.steps <= 0:
        raise UsageError(f"--steps={args.steps} must be > 0")
    if args.save_every < 0:
        raise UsageError(f"--save-every={args.save_every} must be >= 0")
    if (args.save_every or args.resume or args.spike_action == "rollback") and not args.checkpoint_dir:
        raise UsageError("--save-every / --resume / --spike-action rollback need --checkpoint-dir")
    cfg_path = Path(args.deepspeed_config)
    if not cfg_path.is_file():
        raise UsageError(f"--deepspeed_config {cfg_path}: no such file")
    try:
        ds_config = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise UsageError(f"--deepspeed_config {cfg_path}: not valid JSON ({e})") from None
    try:
        spec, shape = load_spec_and_shape(args.spec)
    except ValueError as e:  # pydantic ValidationError included: names the field
        raise UsageError(f"--spec {args.spec}: {e}") from None
    blowups = _parse_blowups(args.inject_lr_blowup)
    if not (args.dist_timeout_s > 0 and math.isfinite(args.dist_timeout_s)):
        raise UsageError(f"--dist-timeout-s={args.dist_timeout_s} must be a positive number of seconds, e.g. 600")
    shrunk = read_shrink(args, spec)
    if shrunk is not None:
        shape = shrunk.shape
    return Inputs(ds_config=ds_config, spec=spec, shape=shape, blowups=blowups, shrunk=shrunk)


def read_shrink(args: argparse.Namespace, spec: Any) -> Any:
    """--shrink: the spec's model shrunk (`dstoolkit.runtime.shrink.prepare_shrunk_run`) and the spec's
    seq_len capped to the shrink's; None without the flag. Every problem is a UsageError naming the field."""
    from dstoolkit.runtime.shrink import ShrinkError, parse_shrink, prepare_shrunk_run

    try:
        sizes = parse_shrink(args.shrink)
        if sizes is None:
            return None
        run = prepare_shrunk_run(spec, spec.base_dir, sizes)
    except ShrinkError as e:
        raise UsageError(f"--shrink (spec {args.spec}): {e}") from None
    if args.ep_size is not None and args.ep_size > 1:
        raise UsageError(f"--ep-size={args.ep_size} with --shrink: the transformers model's experts are plain "
                         "modules (no DeepSpeed expert groups); run with --ep-size 1 (experts data-parallel)")
    if run.seq_len < spec.training.seq_len:
        spec.training.seq_len = run.seq_len  # a short sequence: the shrunk run takes seconds, not minutes
    return run


def add_monitor_backends(ds_config: dict, monitor_dir: Optional[str]) -> None:
    """--monitor-dir: DeepSpeed's csv monitor, and its tensorboard monitor when the package is installed."""
    if not monitor_dir:
        return
    ds_config["csv_monitor"] = {"enabled": True, "output_path": str(monitor_dir), "job_name": "dstoolkit_train"}
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:  # DeepSpeed's TB backend needs the package
        ds_config["tensorboard"] = {"enabled": True, "output_path": str(monitor_dir),
                                    "job_name": "dstoolkit_train_tb"}


def build_model_for_run(args: argparse.Namespace, spec: Any, shape: Any, world: int, shrunk: Any = None) -> Any:
    """The tiny transformer of the spec's model section (experts split over --ep-size), with the spec's
    activation-checkpoint policy applied; with --shrink (`shrunk`) the spec's own transformers architecture,
    shrunk. Call after `init_distributed`: MoE layers make expert groups."""
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy

    if shrunk is not None:
        return build_shrunk_model(args, spec, shrunk)
    ep_size = args.ep_size or (spec.training.ep if isinstance(spec.training.ep, int) else 1)
    if shape.is_moe and world % ep_size != 0:
        raise UsageError(f"--ep-size={ep_size} must divide the world size {world}")
    model = build_model(shape, ep_size=ep_size if shape.is_moe else 1, seed=args.seed)
    apply_checkpoint_policy(model, policy_from_spec(spec.training), backend=args.checkpoint_backend)
    return model


def build_shrunk_model(args: argparse.Namespace, spec: Any, shrunk: Any) -> Any:
    """The transformers model of the shrunk config (`dstoolkit.runtime.model.build_hf_model`) with the spec's
    recompute policy through transformers' gradient checkpointing; its `info` is the metrics 'model' event."""
    from dstoolkit.runtime.model import HFBuildError, apply_hf_checkpoint_policy, build_hf_model

    try:
        model = build_hf_model(shrunk.shrunk.config, model_class=shrunk.model_class, seed=args.seed,
                               info=shrunk.record())
    except HFBuildError as e:
        raise UsageError(f"--shrink: {e}") from None
    notes = apply_hf_checkpoint_policy(model, policy_from_spec(spec.training))
    model.info["notes"] = list(model.info.get("notes", [])) + notes
    model.info["activation_checkpointing"] = spec.training.activation_checkpointing
    return model


def build_engine(model: Any, ds_config: dict, spec: Any) -> tuple[Any, Any, Any]:
    """(engine, optimizer, lr_scheduler) from `deepspeed.initialize`; with no optimizer in the JSON, the
    spec's AdamW at the spec's LR (then lr_scheduler is None and the trainer schedules the LR itself)."""
    import deepspeed
    import torch

    from dstoolkit.runtime.model import moe_param_groups

    if "optimizer" not in ds_config:  # no optimizer in the JSON: the spec's AdamW at the spec's LR
        client_opt = torch.optim.AdamW(moe_param_groups(model), lr=spec.training.lr)
        engine, optimizer, _, lr_sched = deepspeed.initialize(model=model, optimizer=client_opt, config=ds_config)
    else:
        engine, optimizer, _, lr_sched = deepspeed.initialize(
            model=model, model_parameters=moe_param_groups(model), config=ds_config)
    return engine, optimizer, lr_sched


class SyntheticData:
    """The data stream: batch `pos` of this rank (`synthetic_batch`, deterministic in pos, rank and seed),
    after the optional --data-delay-s that stands in for a slow loader."""

    def __init__(self, shape: Any, micro: int, seq_len: int, rank: int, seed: int, delay_s: float) -> None:
        self.shape, self.micro, self.seq_len, self.rank, self.seed, self.delay_s = shape, micro, seq_len, rank, seed, delay_s

    def batch(self, pos: int) -> tuple[Any, Any]:
        from dstoolkit.runtime.model import synthetic_batch

        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return synthetic_batch(self.shape, self.micro, self.seq_len, step=pos, rank=self.rank, seed=self.seed)


def build_data(args: argparse.Namespace, shape: Any, engine: Any, seq_len: int, rank: int) -> SyntheticData:
    return SyntheticData(shape, engine.train_micro_batch_size_per_gpu(), seq_len, rank,
                         seed=args.seed + DATA_SEED_OFFSET, delay_s=args.data_delay_s)


def build_ramp(spec: Any, engine: Any) -> Any:
    """The spec's batch ramp (None without one), ending at the JSON's global batch."""
    from dstoolkit.runtime.train.ramp import BatchRamp

    if spec.training.batch_ramp is None:
        return None
    return BatchRamp.from_spec(spec.training.batch_ramp, global_batch=engine.train_batch_size(),
                               micro_batch=engine.train_micro_batch_size_per_gpu(), dp_size=engine.dp_world_size,
                               seq_len=spec.training.seq_len)


def build_guard(args: argparse.Namespace) -> Any:
    """The spike guard from the --spike-* flags (escalation to rollback only with skips and checkpoints)."""
    from dstoolkit.runtime.train.spike import SpikeGuard, SpikeGuardConfig

    return SpikeGuard(SpikeGuardConfig(
        window=args.spike_window, z_threshold=args.spike_z, on_loss_spike=args.spike_action,
        on_nonfinite="skip" if args.spike_action in ("skip", "none") else args.spike_action,
        on_grad_norm_spike=args.grad_spike_action, escalate_after=args.escalate_after if args.spike_action == "skip"
        and args.checkpoint_dir else 0, lr_scale=args.lr_scale, lr_scale_steps=args.lr_scale_steps))


def build_checkpoint_manager(args: argparse.Namespace, rank: int) -> Any:
    """Atomic, verified checkpoints under --checkpoint-dir (None without one)."""
    from dstoolkit.runtime.train.ckpt import CheckpointManager

    return CheckpointManager(args.checkpoint_dir, keep=args.keep_checkpoints, rank=rank) if args.checkpoint_dir else None


def build_monitor(args: argparse.Namespace, spec: Any, shape: Any, engine: Any, world: int, on_cuda: bool) -> Any:
    """Throughput / MFU / time-split monitor; peak FLOP/s from --peak-flops or `monitor_peak`."""
    import torch

    from dstoolkit.runtime.train.monitor import Monitor

    precision = "bf16" if engine.bfloat16_enabled() else ("fp16" if engine.fp16_enabled() else "fp32")
    peak, label = (args.peak_flops, "--peak-flops") if args.peak_flops else monitor_peak(spec, on_cuda, precision)
    return Monitor(args.monitor_every, flops_per_token=model_flops_per_token(shape, spec.training.seq_len),
                   peak_flops=peak, peak_label=label, world_size=world, threads=torch.get_num_threads(),
                   ds_monitor=getattr(engine, "monitor", None))


def model_event(model: Any, shape: Any, seq_len: int, world: int) -> dict:
    """The metrics file's first line: which model ran (builder, class, parameters, shrunk sizes)."""
    info = getattr(model, "info", None)
    if info is None:  # the TinyTransformer stand-in
        info = {"builder": "dstoolkit.runtime.model.TinyTransformer", "model_type": shape.model_type,
                "model_class": type(model).__name__,
                "params": int(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()))}
    return {"event": "model", **info, "shape": shape.name, "seq_len": seq_len, "world_size": world}


class LrControl:
    """Sets the LR of every param group for the next step: the token-counted schedule (`_lr_at`) when the
    JSON has no scheduler, else DeepSpeed's value; times a multiplier (spike-guard cool-down, injected blow-up)."""

    def __init__(self, optimizer: Any, own_schedule: bool, spec: Any, global_batch: int, state: "RunState") -> None:
        seq_len = spec.training.seq_len
        self.optimizer, self.own_schedule, self.state = optimizer, own_schedule, state
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.warmup_tokens = spec.training.warmup_steps * global_batch * seq_len
        self.total_tokens = spec.training.train_steps * global_batch * seq_len if spec.training.train_steps else None

    def set(self, mult: float) -> float:
        lrs = []
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            if self.own_schedule:
                g["lr"] = _lr_at(self.state.tokens, base, self.warmup_tokens, self.total_tokens) * mult
            else:  # DeepSpeed's scheduler set g["lr"] at the last engine.step(); scale on top of it
                g["lr"] = g["lr"] * mult
            lrs.append(g["lr"])
        return lrs[0]


# ----------------------------------------------------------------------------------------------------------
# fault injection (tests and demos; every fault fires once, even when a rollback replays its step)


class FaultInjector:
    """--inject-poison, --inject-lr-blowup and --kill-at-step."""

    def __init__(self, args: argparse.Namespace, blowups: dict[int, float], writer: "MetricsWriter") -> None:
        self.poison_steps = args.inject_poison
        self.blowups = blowups
        self.kill_at_step, self.kill_rank = args.kill_at_step, args.kill_rank
        self.writer = writer
        self.fired: set[tuple[str, int]] = set()

    def lr_factor(self, step: int) -> float:
        """The blow-up factor for this step's LR (1.0 when none is due)."""
        if step in self.blowups and ("lr", step) not in self.fired:
            self.fired.add(("lr", step))
            self.writer.write({"event": "inject", "kind": "lr_blowup", "step": step, "factor": self.blowups[step]})
            return self.blowups[step]
        return 1.0

    def poison_due(self, step: int) -> bool:
        return step in self.poison_steps and ("poison", step) not in self.fired

    @staticmethod
    def poisoned_labels(labels: Any, pos: int, vocab_size: int) -> Any:
        """Random labels seeded by the data position: every rank's batch is bad (a globally bad batch)."""
        import torch

        gen = torch.Generator().manual_seed(pos)
        return torch.randint(0, vocab_size, labels.shape, generator=gen)

    def poisoned(self, step: int, pos: int) -> None:
        self.fired.add(("poison", step))
        self.writer.write({"event": "inject", "kind": "poison", "step": step, "data_pos": pos})

    def maybe_kill(self, step: int, rank: int) -> None:
        if self.kill_at_step is not None and step == self.kill_at_step and rank == self.kill_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # die like an OOM-killed / preempted rank


# ----------------------------------------------------------------------------------------------------------
# the run


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


class MetricsWriter:
    """Rank 0 appends one JSON object per line and flushes (so a killed run keeps what it wrote)."""

    def __init__(self, path: str, enabled: bool) -> None:
        self.enabled = enabled
        self.f = None
        if enabled:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "a", buffering=1)

    def write(self, obj: dict) -> None:
        if self.f is not None:
            self.f.write(json.dumps(obj, default=float) + "\n")
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

    def client_state(self) -> dict:
        return {"dstoolkit": {"run": self.state.as_dict(), "guard": self.guard.state_dict()}}

    def _restore(self, cs: dict, keep_skips: bool) -> None:
        run, state = cs["dstoolkit"]["run"], self.state
        skips = set(state.skip_positions) if keep_skips else set()
        state.step, state.data_pos = run["step"], run["data_pos"]
        state.consumed_samples, state.tokens = run["consumed_samples"], run["tokens"]
        state.skip_positions = sorted(skips | set(run["skip_positions"]))
        self.guard.load_state_dict(cs["dstoolkit"]["guard"])

    def _load(self, tag: str) -> dict:
        path, cs = self.engine.load_checkpoint(str(self.mgr.root), tag=tag)
        if path is None or cs is None or "dstoolkit" not in cs:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tag} from {self.mgr.root}")
        return cs

    def resume(self) -> None:
        """Continue from the newest intact checkpoint (corrupt / truncated ones are skipped and reported)."""
        if self.mgr is None:
            return
        found = self.mgr.latest_valid()
        for reason in found.rejected:
            self.log(f"resume: skipping checkpoint: {reason}")
        if found.tag is not None:
            self._restore(self._load(found.tag), keep_skips=False)
            self.writer.write({"event": "resume", "tag": found.tag, "step": self.state.step,
                               "data_pos": self.state.data_pos, "rejected": found.rejected})
            self.log(f"resumed from {found.tag} (step {self.state.step}, data position {self.state.data_pos})")
        else:
            self.writer.write({"event": "resume", "tag": None, "step": 0, "rejected": found.rejected})
            self.log("resume: no intact checkpoint, starting from step 0")

    def rollback(self, spike_step: int, reason: str, offending: list[int]) -> bool:
        """Go back to the newest healthy checkpoint before the spike and never train on `offending` again.
        False when there is no checkpoint to go back to; an error after --max-rollbacks.
        The policy (count, which checkpoint, guard reset) is `dstoolkit.runtime.train.spike.Rollback`."""
        if self.mgr is None:
            return False
        from_step = self.state.step
        tag, rejected = self.rollbacks.perform(
            self.mgr, spike_step, reason, load=lambda t: self._restore(self._load(t), keep_skips=True))
        if tag is None:
            self.writer.write({"event": "rollback_unavailable", "step": spike_step, "reason": reason,
                               "rejected": rejected})
            self.log(f"step {spike_step}: rollback wanted ({reason}) but no good checkpoint; continuing")
            return False
        self.state.skip_positions = sorted(set(self.state.skip_positions) | set(offending))
        self.writer.write({"event": "rollback", "step": spike_step, "from_step": from_step, "to_tag": tag,
                           "to_step": self.state.step, "reason": reason, "skip_positions": offending,
                           "lr_scale": self.guard.config.lr_scale, "lr_scale_steps": self.guard.config.lr_scale_steps})
        self.log(f"step {spike_step}: ROLLBACK to {tag}: {reason}; skipping data positions {offending}")
        return True

    def maybe_save(self, every: int, barrier) -> None:
        if self.mgr is None or not every or self.state.step % every != 0:
            return
        healthy = self.guard.healthy()
        tag = self.mgr.save(self.engine, self.state.step, self.client_state(), healthy=healthy, barrier=barrier)
        self.writer.write({"event": "checkpoint", "tag": tag, "step": self.state.step,
                           "data_pos": self.state.data_pos, "healthy": self.guard.healthy()})


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

    def global_mean(self, value: float) -> float:
        import deepspeed.comm as dist
        import torch

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / self.world


@dataclass
class Accumulated:
    """One optimizer step's micro-batches: the global losses trained on, time spent waiting for data, the LR
    in force, and whether a rollback abandoned the step."""

    losses: list[float]
    input_wait_s: float
    lr: float
    rolled_back: bool = False


def accumulate(run: Run, target: int, gas: int, lr: float) -> Accumulated:
    """Forward/backward `gas` accepted micro-batches for step `target`, the spike guard judging each loss
    (skip the batch, scale the LR, or roll back to a checkpoint)."""
    import torch

    state, guard, args = run.state, run.guard, run.args
    accepted: list[float] = []
    incidents: list[int] = []
    input_wait = 0.0
    while len(accepted) < gas:
        pos = state.data_pos
        if pos in state.skip_positions:
            state.data_pos += 1
            continue
        t_in = time.perf_counter()
        x, y = run.data.batch(pos)
        poison = run.faults.poison_due(target) and not accepted
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
        if decision is not None and decision.action != "none":
            run.writer.write({"event": "spike", "step": target, "data_pos": pos, **decision.as_dict()})
            run.log(f"step {target}: {decision.kind} -> {decision.action}: {decision.reason}")
            incidents.append(pos)
            if decision.action == "skip":
                del loss
                state.data_pos += 1
                continue
            if decision.action == "rollback":
                del loss
                if run.ckpt.rollback(target, decision.reason, incidents):
                    return Accumulated(accepted, input_wait, lr, rolled_back=True)
                state.data_pos += 1  # no checkpoint: at least do not train on it
                guard.consecutive_skips = 0
                continue
            if decision.action == "lr_scale":
                guard.lr_cooldown_left = guard.config.lr_scale_steps
                lr = run.lr.set(guard.lr_multiplier())
        run.engine.backward(loss)
        run.engine.step()
        accepted.append(gl)
        state.data_pos += 1
    return Accumulated(accepted, input_wait, lr)


def setup(args: argparse.Namespace, inputs: Inputs) -> tuple[Run, list[str]]:
    """Process groups, then the builders in dependency order; returns the run and the /dev/shm names unlinked."""
    import deepspeed.comm as dist
    import torch

    on_cuda = torch.cuda.is_available()
    shm_unlinked = init_distributed("nccl" if on_cuda else "gloo", args.dist_timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    if on_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    spec, shape, ds_config = inputs.spec, inputs.shape, inputs.ds_config

    model = build_model_for_run(args, spec, shape, world, shrunk=inputs.shrunk)
    add_monitor_backends(ds_config, args.monitor_dir)
    engine, optimizer, lr_sched = build_engine(model, ds_config, spec)
    seq_len = spec.training.seq_len
    state = RunState()
    lr = LrControl(optimizer, own_schedule=lr_sched is None, spec=spec, global_batch=engine.train_batch_size(),
                   state=state)
    ramp = build_ramp(spec, engine)
    guard = build_guard(args)
    mgr = build_checkpoint_manager(args, rank)
    writer = MetricsWriter(args.metrics_out, enabled=(rank == 0))
    monitor = build_monitor(args, spec, shape, engine, world, on_cuda)
    writer.write(model_event(model, shape, seq_len, world))

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[dstoolkit.runtime.train] {msg}", file=sys.stderr, flush=True)

    run = Run(args=args, rank=rank, world=world, on_cuda=on_cuda, shape=shape, seq_len=seq_len, engine=engine,
              data=build_data(args, shape, engine, seq_len, rank), ramp=ramp, lr=lr, guard=guard,
              monitor=monitor, ckpt=Checkpoints(mgr, args, engine, state, guard, writer, log),
              faults=FaultInjector(args, inputs.blowups, writer), writer=writer, state=state, log=log)
    return run, shm_unlinked


def train(args: argparse.Namespace) -> int:
    """Run the training loop (called on every rank)."""
    inputs = read_inputs(args)

    import deepspeed.comm as dist

    from dstoolkit.runtime.train.monitor import StepSample, comms_logger_total_s, cpu_time_s, peak_rss_bytes

    run, shm_unlinked = setup(args, inputs)
    engine, state, guard, writer = run.engine, run.state, run.guard, run.writer
    if args.resume:
        run.ckpt.resume()
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
        gb = engine.train_batch_size()
        mult = guard.lr_multiplier()
        mult *= run.faults.lr_factor(target)
        lr = run.lr.set(mult)
        t_step, cpu0 = time.perf_counter(), cpu_time_s()
        comm0 = comms_logger_total_s()

        micro = accumulate(run, target, gas, lr)
        if micro.rolled_back:
            if bar is not None:
                bar.n = state.step
                bar.refresh()
            continue
        step_time = time.perf_counter() - t_step
        step_cpu_s = cpu_time_s() - cpu0
        state.step = target
        state.consumed_samples += gb
        state.tokens += gb * run.seq_len
        step_loss = last_loss = sum(micro.losses) / len(micro.losses)
        grad_norm = engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else None
        if args.spike_guard:
            d = guard.observe_step(step_loss, grad_norm, target)
            if d.action != "none":
                writer.write({"event": "spike", "step": target, **d.as_dict()})
                run.log(f"step {target}: {d.kind} -> {d.action}: {d.reason}")
                if d.action == "rollback" and run.ckpt.rollback(target + 1, d.reason, []):
                    continue
        guard.end_step()

        tps = gb * run.seq_len / step_time
        writer.write({"step": state.step, "loss": step_loss, "step_time_s": step_time, "tokens_per_s": tps,
                      "global_batch": gb, "micro_batch": run.data.micro, "grad_accum": gas,
                      "peak_rss_bytes": peak_rss_bytes(), "lr": micro.lr, "grad_norm": grad_norm,
                      "data_pos": state.data_pos, "tokens": state.tokens, "input_wait_s": micro.input_wait_s,
                      "lr_mult": mult, "cpu_time_s": step_cpu_s})
        comm1 = comms_logger_total_s()
        report = run.monitor.record(StepSample(
            step=state.step, step_time_s=step_time, input_wait_s=micro.input_wait_s, tokens=gb * run.seq_len,
            loss=step_loss, cpu_time_s=cpu_time_s() - cpu0, comm_time_s=(comm1 - comm0) if comm0 is not None else None))
        if report is not None:
            writer.write({"event": "monitor", **report.as_dict()})
            if bar is not None:
                bar.write(report.line(), file=sys.stderr)
            else:
                run.log(report.line())
        if bar is not None:
            bar.set_postfix(loss=f"{step_loss:.4f}", tok_s=f"{tps:,.0f}", refresh=False)
            bar.update(1)
        run.ckpt.maybe_save(args.save_every, barrier=dist.barrier)
        run.faults.maybe_kill(state.step, run.rank)
    if bar is not None:
        bar.close()
    writer.write({"event": "done", "steps": state.step, "final_loss": last_loss, "world_size": run.world,
                  "data_pos": state.data_pos, "shm_buffers_unlinked": len(shm_unlinked)})
    writer.close()
    dist.barrier()
    return EXIT_OK


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return train(args)
    except UsageError as e:
        print(f"dstoolkit.runtime.train.trainer: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # a clear one-line reason first, the traceback after for debugging
        import traceback

        print(f"dstoolkit.runtime.train.trainer: training failed on rank {os.environ.get('RANK', '0')}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
