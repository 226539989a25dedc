"""Say when the ranking cannot decide (issue 24, item 5): the ranked layouts whose estimated step time lies within
the step-time model's measured error of the best one are ties for the estimator, and only a measurement orders
them. `sweep` and `generate` mark them and print the `dstoolkit tune --mode real` command that measures just the ones
real mode can run (data parallel: tp = pp = 1), naming the others as not measurable by tune.

The error is measured, never chosen: on GPUs the leave-one-source-out throughput MAPE of benchmarks/published_runs.py
(every fitted constant refitted without the source it predicts), on CPU ranks the calibrated model's MAPE against
real DeepSpeed steps (benchmarks/step_time_fidelity.py). tests/unit/test_estimator_fit.py holds the GPU figure equal to
the committed result; benchmarks/layout_sweeps.py reports how often the measured best is among the marked
layouts. No torch import.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

GPU_OUT_OF_SOURCE_ERROR = 0.06
"""Leave-one-source-out throughput MAPE of the GPU step-time model: benchmarks/results/published_runs_202612.jsonl,
closing record, summary.loso.overall.mape_out_of_source (rounded to 0.5%)."""
GPU_ERROR_SOURCE = "leave-one-source-out MAPE, benchmarks/results/published_runs_202612.md"
CPU_STEP_TIME_ERROR = 0.079
"""Calibrated CPU step-time model against real 2-rank DeepSpeed steps: cpu-clock MAPE 7.9% over 10 configs
(benchmarks/results/step_time_fidelity_cpu_202612.md)."""
CPU_ERROR_SOURCE = "CPU step-time MAPE, benchmarks/results/step_time_fidelity_cpu_202612.md"
MAX_TUNE_SEED_TRIALS = 5
"""`dstoolkit tune --seed-trials` takes 1-5 estimator-ranked points (tune.seeding.MAX_SEED_TRIALS; spelled out here
because generate sits below tune in the import order, tests/unit/test_cluster_physics.py holds them equal)."""


@dataclass(frozen=True)
class Undecided:
    """The ranked positions (0 = best) the estimator cannot order, and the error that decides it."""

    positions: tuple[int, ...]
    error: float
    source: str

    @property
    def decided(self) -> bool:
        """Only the best one lies within the error: the ranking decides."""
        return len(self.positions) <= 1


def model_error(is_cpu: bool) -> tuple[float, str]:
    """(relative step-time error, where it was measured) for the device kind."""
    return (CPU_STEP_TIME_ERROR, CPU_ERROR_SOURCE) if is_cpu else (GPU_OUT_OF_SOURCE_ERROR, GPU_ERROR_SOURCE)


def within_error(step_times_s: Sequence[float], error: float) -> tuple[int, ...]:
    """Positions whose step time is at most best x (1 + error); the best is always among them."""
    if not step_times_s:
        return ()
    if error < 0:
        raise ValueError(f"error={error}: a relative error is >= 0")
    best = min(step_times_s)
    return tuple(i for i, t in enumerate(step_times_s) if t <= best * (1.0 + error))


def undecided(step_times_s: Sequence[float], is_cpu: bool) -> Undecided:
    err, src = model_error(is_cpu)
    return Undecided(within_error(step_times_s, err), err, src)


def tune_command(spec_path: str, n: int, out_dir: str = "tune_undecided") -> str:
    """The `dstoolkit tune --mode real` command whose first trials are the n best estimated layouts, one trial each at
    the layout's default DeepSpeed settings: tune seeds its study with one point per distinct layout of the
    estimator's ranking (`tune.seeding.one_per_layout`, `--seed-trials`, 1-5) and `--budget n` stops after them."""
    k = max(1, min(n, MAX_TUNE_SEED_TRIALS))
    return f"dstoolkit tune {spec_path} --mode real --budget {max(1, n)} --seed-trials {k} -o {out_dir}"


REAL_MODE_LIMIT = ("not measurable by tune (TP/PP > 1: `tune --mode real` runs the example trainer, which is data "
                   "parallel only)")


def real_mode_runnable(label: str) -> bool:
    """Whether `dstoolkit tune --mode real` can run a layout (its sweep label): real mode's space is data parallel
    only (tune.space, data_parallel_only: tp = pp = 1)."""
    tp = re.search(r"\btp(\d+)\b", label)
    pp = re.search(r"\bpp(\d+)\b", label)
    return (tp is None or tp.group(1) == "1") and (pp is None or pp.group(1) == "1")


def split_measurable(labels: Sequence[str], positions: Sequence[int]) -> tuple[list[int], list[int]]:
    """(positions tune's real mode can measure, positions it cannot: TP/PP > 1), each in ranked order."""
    ok = [i for i in positions if real_mode_runnable(labels[i])]
    return ok, [i for i in positions if i not in ok]


def _names(labels: Sequence[str], positions: Sequence[int], shown: Optional[int]) -> str:
    listed = [i for i in positions if shown is None or i < shown]
    names = ", ".join(f"#{i + 1} {labels[i]}" for i in listed)
    if len(listed) < len(positions):
        names += (" and " if names else "") + f"{len(positions) - len(listed)} more below --top {shown}"
    return names


def undecided_lines(labels: Sequence[str], step_times_s: Sequence[float], is_cpu: bool,
                    spec_path: str = "SPEC.yaml", shown: Optional[int] = None) -> list[str]:
    """Text for sweep/generate: which layouts are ties and the tune command that measures the ones real mode can run
    (`split_measurable`; the others are named as not measurable by tune); [] when the ranking decides. `labels` and
    `step_times_s` are every ranked layout; `shown` (the rows printed, sweep's --top) shortens the lists of names (the
    counts are always over all of them)."""
    u = undecided(step_times_s, is_cpu)
    if u.decided:
        return []
    ok, other = split_measurable(labels, u.positions)
    lines = [f"Cannot decide: {len(u.positions)} layouts lie within {100 * u.error:.1f}% of the best estimate "
             f"(the model's measured error: {u.source}): {_names(labels, u.positions, shown)}."]
    if not ok:
        return lines + ["None of them is measurable by `dstoolkit tune --mode real`: all have TP/PP > 1, and real mode "
                        "runs the example trainer, which is data parallel only; measure them with runs of their "
                        "generated configs."]
    if other:
        lines += [f"Measure the {len(ok)} that tune's real mode runs ({_names(labels, ok, shown)}): "
                  f"{tune_command(spec_path, len(ok))}",
                  f"The other {len(other)} are {REAL_MODE_LIMIT}: {_names(labels, other, shown)}."]
    else:
        lines.append(f"Measure them: {tune_command(spec_path, len(ok))}")
    if len(ok) > MAX_TUNE_SEED_TRIALS:
        lines.append(f"(tune seeds at most {MAX_TUNE_SEED_TRIALS} estimator-ranked points; the rest of the budget "
                     "is its own search)")
    return lines
