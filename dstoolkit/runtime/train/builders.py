"""The example trainer's builders, each on its own (model, engine, data, ramp, spike guard, checkpoint manager,
monitor, the metrics file's model line); `dstoolkit.runtime.train.trainer.setup` calls them in dependency order.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Optional

from dstoolkit.runtime.train.trainer_inputs import UsageError


DATA_SEED_OFFSET = 7_777
"""Data seed = --seed + this, so weight and data streams differ."""


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
    from dstoolkit.runtime.train.trainer_inputs import ep_size_of

    ep_size = ep_size_of(args, spec, shape)
    if shape.is_moe and world % ep_size != 0:
        raise UsageError(f"--ep-size={ep_size} must divide the world size {world}")
    model = build_model(shape, ep_size=ep_size, seed=args.seed)
    apply_checkpoint_policy(model, policy_from_spec(spec.training), backend=args.checkpoint_backend)
    return model


def build_shrunk_model(args: argparse.Namespace, spec: Any, shrunk: Any) -> Any:
    """The transformers model of the shrunk config (`dstoolkit.runtime.hf_model.build_hf_model`) with the spec's
    recompute policy through transformers' gradient checkpointing; its `info` is the metrics 'model' event."""
    from dstoolkit.runtime.hf_model import HFBuildError, apply_hf_checkpoint_policy, build_hf_model

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
        from dstoolkit.runtime.synthetic import synthetic_batch

        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return synthetic_batch(self.shape, self.micro, self.seq_len, step=pos, rank=self.rank, seed=self.seed)


def build_data(args: argparse.Namespace, shape: Any, engine: Any, seq_len: int, rank: int) -> SyntheticData:
    return SyntheticData(shape, engine.train_micro_batch_size_per_gpu(), seq_len, rank,
                         seed=args.seed + DATA_SEED_OFFSET,
                         delay_s=args.data_delay_s if args.data_delay_rank in (None, rank) else 0.0)


def build_ramp(spec: Any, engine: Any) -> Any:
    """The spec's batch ramp (None without one), ending at the JSON's global batch."""
    from dstoolkit.estimate.batch_ramp import BatchRamp

    if spec.training.batch_ramp is None:
        return None
    return BatchRamp.from_spec(spec.training.batch_ramp, global_batch=engine.train_batch_size(),
                               micro_batch=engine.train_micro_batch_size_per_gpu(), dp_size=engine.dp_world_size,
                               seq_len=spec.training.seq_len)


def build_guard(args: argparse.Namespace) -> Any:
    """The spike guard from the --spike-* flags (escalation to rollback only with skips and checkpoints). A NaN/Inf
    loss is never trained on: --spike-action rollback rolls it back, every other action skips it."""
    from dstoolkit.runtime.train.spike import SpikeGuard, SpikeGuardConfig

    return SpikeGuard(SpikeGuardConfig(
        window=args.spike_window, z_threshold=args.spike_z, on_loss_spike=args.spike_action,
        on_nonfinite="rollback" if args.spike_action == "rollback" else "skip",
        on_grad_norm_spike=args.grad_spike_action, escalate_after=args.escalate_after if args.spike_action == "skip"
        and args.checkpoint_dir else 0, lr_scale=args.lr_scale, lr_scale_steps=args.lr_scale_steps))


def build_checkpoint_manager(args: argparse.Namespace, rank: int) -> Any:
    """Atomic, verified checkpoints under --checkpoint-dir (None without one)."""
    from dstoolkit.runtime.train.ckpt import CheckpointManager

    if not args.checkpoint_dir:
        return None
    mgr = CheckpointManager(args.checkpoint_dir, keep=args.keep_checkpoints, rank=rank)
    mgr.clear_staging()  # a save killed mid-way left partial files there (the writer lock is this run's: setup)
    return mgr


def model_config_json(model: Any) -> Optional[str]:
    """The HF config (JSON, every field) of the transformers model a --shrink run trains; None for the
    TinyTransformer stand-in, which no HF config describes."""
    config = getattr(getattr(model, "hf", None), "config", None)
    return config.to_json_string(use_diff=False) if hasattr(config, "to_json_string") else None


def write_model_config(mgr: Any, model: Any) -> Optional[str]:
    """config.json of the trained transformers model beside the checkpoint tags (`CheckpointManager.
    write_model_config`), so `dstoolkit ckpt export` needs no --config; None without checkpoints or an HF model.
    A different config.json already there is a UsageError (never overwritten)."""
    text = model_config_json(model)
    if mgr is None or text is None:
        return None
    try:
        return mgr.write_model_config(text)
    except FileExistsError as e:
        raise UsageError(f"--checkpoint-dir {mgr.root}: {e}") from None


def build_monitor(args: argparse.Namespace, spec: Any, shape: Any, engine: Any, world: int, on_cuda: bool) -> Any:
    """Throughput / MFU / time-split monitor; peak FLOP/s from --peak-flops or `monitor_peak`."""
    import torch

    from dstoolkit.runtime.train.monitor import Monitor
    from dstoolkit.runtime.train.run_match import engine_precision

    precision = engine_precision(engine)
    peak, label = (args.peak_flops, "--peak-flops") if args.peak_flops else monitor_peak(spec, on_cuda, precision)
    from dstoolkit.runtime.train.crossrank import PROBE_BYTES, CrossRank
    from dstoolkit.runtime.train.monitor import estimated_comm_share

    # every --monitor-every steps: per-rank step/compute/comm/input/memory gathered, the slowest rank named
    cross = CrossRank(probe_bytes=PROBE_BYTES if args.link_probe_bytes is None else args.link_probe_bytes) \
        if world > 1 else None
    ds_dict = getattr(getattr(engine, "_config", None), "_param_dict", None) or {}
    return Monitor(args.monitor_every, flops_per_token=model_flops_per_token(shape, spec.training.seq_len),
                   peak_flops=peak, peak_label=label, world_size=world, threads=torch.get_num_threads(),
                   ds_monitor=getattr(engine, "monitor", None), cross_rank=cross,
                   estimated_comm_share=estimated_comm_share(spec, shape, ds_dict, world, on_cuda))


def model_event(model: Any, shape: Any, seq_len: int, world: int) -> dict:
    """The metrics file's first line: which model ran (builder, class, parameters, shrunk sizes)."""
    info = getattr(model, "info", None)
    if info is None:  # the TinyTransformer stand-in
        info = {"builder": "dstoolkit.runtime.model.TinyTransformer", "model_type": shape.model_type,
                "model_class": type(model).__name__,
                "params": int(sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters()))}
    return {"event": "model", **info, "shape": shape.name, "seq_len": seq_len, "world_size": world}
