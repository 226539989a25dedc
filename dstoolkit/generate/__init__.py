"""dstoolkit.generate: spec -> DeepSpeed JSON / Megatron args / launch commands, and sweeps. No torch import.

Public API:
    generate(spec, shape, strategies=None, targets=("deepspeed",)) -> GenerateResult   (all files, in memory)
    write_generated(result, out_dir, force=False)                 (atomic; refuses existing output)
    run_sweep(spec, shape, top=3, ...) -> SweepResult             (ranked, dropped with reasons, fits_nowhere)
    build_ds_config(spec, shape, candidate) -> dict
    megatron_lm_args / megatron_deepspeed_args(spec, shape, candidate, ...) -> list[str]   (dstoolkit.generate.megatron_lm / megatron_deepspeed)
    load_spec_and_shape(path) -> (Spec, ModelShape)
    generate_demo(spec_path, out_dir, strategy="zero2", force=True) -> Path   (the demo's one-liner)

The planner API for callers above generate (the tuner, `dstoolkit estimate`): `dstoolkit.generate.planner`
(candidates_for, check_candidate, ds_config_for, estimate_candidate, plan_for, resolve_spec).
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from dstoolkit.generate.candidates import STRATEGIES, Candidate, StrategyDef
from dstoolkit.generate.core import GenerateError, generate, write_generated
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.generate.io import SpecLoadError, load_spec_and_shape
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args
from dstoolkit.generate.megatron_lm import megatron_lm_args
from dstoolkit.generate.result import GenerateResult
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.generate.sweep_result import SweepResult
from dstoolkit.generate.writer import OutputExistsError


def generate_demo(spec_path: Union[str, Path], out_dir: Union[str, Path], strategy: str = "zero2",
                  force: bool = True) -> Path:
    """Generate every default strategy of a spec into `out_dir` and return `out_dir/<strategy>/launch.sh`.

    The coordinator's demo calls this (or the CLI) and then runs `STEPS=10 bash <that launch.sh>`.

    Raises:
        SpecLoadError, GenerateError, OutputExistsError: as the CLI reports them.
    """
    spec, shape = load_spec_and_shape(spec_path)
    result = generate(spec, shape)
    names = [o.name for o in result.generated]
    if strategy not in names:
        raise GenerateError(f"strategy {strategy!r} was not generated for {spec.name} (generated: {names})")
    write_generated(result, Path(out_dir), force=force)
    return Path(out_dir) / strategy / "launch.sh"


__all__ = ["STRATEGIES", "Candidate", "StrategyDef", "GenerateError", "GenerateResult", "generate",
           "write_generated", "build_ds_config", "megatron_lm_args", "megatron_deepspeed_args", "SpecLoadError", "load_spec_and_shape",
           "SweepResult", "run_sweep", "OutputExistsError", "generate_demo"]
