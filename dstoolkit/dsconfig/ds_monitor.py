"""Monitoring and profiling sections of the DeepSpeed config (deepspeed 0.19.8): comms logger, the
TensorBoard / Weights & Biases / CSV / Comet monitors, the FLOPs profiler and timers. Sources are named per
class. DeepSpeed validates the monitors with pydantic; flops_profiler it reads with ``get_scalar_param``
(unknown keys silently ignored), and we reject unknown keys there too.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from dstoolkit.dsconfig.base import Bool, DSModel, Float, Int


class CommsLoggerConfig(DSModel):
    """`comms_logger` (comm/config.py CommsLoggerConfig)."""

    enabled: Bool = False
    """Log collective calls."""
    prof_all: Bool = True
    """Profile every collective."""
    prof_ops: list[str] = Field(default_factory=list)
    """Only these ops (when prof_all is false)."""
    verbose: Bool = False
    """Print each op as it runs."""
    debug: Bool = False
    """Add the calling function to each record."""


class TensorBoardConfig(DSModel):
    """`tensorboard` (monitor/config.py)."""

    enabled: Bool = False
    """Log to TensorBoard (needs the tensorboard package)."""
    output_path: str = ""
    """Log directory (default: under the launch directory)."""
    job_name: str = "DeepSpeedJobName"
    """Sub-directory per job."""


class WandbConfig(DSModel):
    """`wandb` (monitor/config.py)."""

    enabled: Bool = False
    """Log to Weights & Biases."""
    group: Optional[str] = None
    """Run group."""
    team: Optional[str] = None
    """Team (entity)."""
    project: str = "deepspeed"
    """Project."""


class CSVConfig(DSModel):
    """`csv_monitor` (monitor/config.py)."""

    enabled: Bool = False
    """Write metrics to CSV files."""
    output_path: str = ""
    """Output directory."""
    job_name: str = "DeepSpeedJobName"
    """Sub-directory per job."""


class CometConfig(DSModel):
    """`comet` (monitor/config.py)."""

    enabled: Bool = False
    """Log to Comet."""
    samples_log_interval: Int = 100
    """Samples between submissions."""
    project: Optional[str] = None
    """Project."""
    workspace: Optional[str] = None
    """Workspace."""
    api_key: Optional[str] = None
    """API key (prefer the COMET_API_KEY environment variable)."""
    experiment_name: Optional[str] = None
    """Experiment name."""
    experiment_key: Optional[str] = None
    """Experiment key (32-50 alphanumerics)."""
    online: Optional[Bool] = None
    """Log online (default true)."""
    mode: Optional[Literal["get", "create", "get_or_create"]] = None
    """How the experiment is started."""


class FlopsProfilerConfig(DSModel):
    """`flops_profiler` (profiling/config.py, profiling/constants.py)."""

    enabled: Bool = False
    """Profile FLOPs at profile_step."""
    recompute_fwd_factor: Float = 0.0
    """Extra forward passes from activation recomputation (0.0-1.0)."""
    profile_step: Int = 1
    """Step at which to profile."""
    module_depth: Int = -1
    """Depth of the module tree printed (-1: all)."""
    top_modules: Int = 1
    """Top modules listed per depth."""
    detailed: Bool = True
    """Print the per-module profile."""
    output_file: Optional[str] = None
    """File for the profile (default stdout)."""


class ThroughputTimerConfig(DSModel):
    """`timers.throughput` (utils/config.py)."""

    enabled: Bool = True
    """Measure throughput."""
    synchronized: Bool = True
    """Synchronise the device for accurate timing."""


class TimersConfig(DSModel):
    """`timers`."""

    throughput: ThroughputTimerConfig = Field(default_factory=ThroughputTimerConfig)
    """Throughput timer."""
