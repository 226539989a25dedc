"""Load a spec file and resolve its model, turning every input problem into one `SpecLoadError` message; or check
it whole, as `Finding`s (`spec_file_findings`, for `dstoolkit validate SPEC.yaml`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Sequence, Union

import yaml

from dstoolkit.hardware.calibration import calibration_for_spec
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec, load_spec
from dstoolkit.spec.errors import SpecError, spec_finding
from dstoolkit.validate.findings import Finding, has_spec_sections

if TYPE_CHECKING:  # the estimator loads only when a spec is resolved (spec_file_findings)
    from dstoolkit.generate.costing import CandidateEstimate
    from dstoolkit.generate.planner import Resolution

GiB = 2**30


class SpecLoadError(ValueError):
    """The spec cannot be used (missing file, YAML/schema error, unknown model); the message says where."""


def load_spec_and_shape(path: Union[str, Path], targets: Sequence[str] = ()) -> tuple[Spec, ModelShape]:
    """`load_spec(path, targets=targets)`, `resolve_spec_model(spec)`, and a check that its calibration file (if any)
    is usable. `targets`: the command line's --target values, which replace the spec's `targets` (`load_spec`).

    Raises:
        SpecLoadError: with the `file:line:col: error: ...` text of the underlying `SpecError`.
    """

    p = Path(path)  # a missing file or a folder: load_spec's SpecError says which
    try:
        spec, shape = _loaded(p, targets)
    except ValueError as exc:  # SpecError is a ValueError carrying file:line:col findings
        raise SpecLoadError(str(exc)) from None
    except OSError as exc:
        raise SpecLoadError(f"{p}: error: cannot read ({exc.strerror or exc})") from None
    return spec, shape


def looks_like_spec(text: str) -> bool:
    """Whether the text of a .yaml / .yml file is to be checked as a dstoolkit spec: a mapping with two or more of
    SPEC_SECTIONS (`validate.findings.has_spec_sections`: a spec missing one, or with one misspelled, still gets
    load_spec's located "required field is missing" / "did you mean 'training'?" instead of being read as a
    DeepSpeed config), or YAML that does not parse (load_spec reports its syntax error at its line, SP001, where
    the DeepSpeed check would say "not JSON"). A .json file is asked by `dstoolkit validate` with json.loads."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return True
    return has_spec_sections(data)


def spec_file_findings(path: Union[str, Path]) -> list[Finding]:
    """What `dstoolkit validate SPEC.yaml` reports for a spec: every problem `estimate`, `sweep` and `generate`
    would refuse it for, each a located `Finding` (the spec's YAML and fields, its model against its layout, its
    calibration file, then the layout rules the sweep applies to its "auto" fields), and a warning (SP007) when
    the layout it resolves to is estimated not to fit: in device memory per rank, in host RAM per node (its
    offloaded states), or both (`fit_warning_text`). [] for a spec that launches as written."""
    p = Path(path)
    try:
        spec, shape = _loaded(p)
    except SpecError as exc:
        return list(exc.findings)
    except ValueError as exc:
        return [spec_finding(str(p), None, None, "<spec>", str(exc), "fix the field it names", "SP004")]
    from dstoolkit.generate.planner import resolve_spec  # the sweep: loads the estimator only for a valid spec

    warnings = spec_warnings(spec)
    try:
        resolved = resolve_spec(spec, shape, tuple(spec.targets or ()))  # as estimate / generate resolve it
    except ValueError as exc:
        return spec.error(("training",), str(exc), "change the layout fields it names (training.tp / pp / ep / cp / "
                          "micro_batch) or the cluster").findings + warnings
    if resolved.fits:
        return warnings
    [found] = spec.error(("training",), fit_warning_text(resolved, _resolved_estimate(spec, shape, resolved)),
                         f"`dstoolkit estimate {p}` prints the peak by phase and what would make it fit").findings
    return [dataclasses.replace(found, code="SP007", severity="warning"), *warnings]


def _resolved_estimate(spec: Spec, shape: ModelShape, resolved: "Resolution") -> "CandidateEstimate":
    """The sweep's estimate (`CandidateEstimate`, its fit fields from `costing.fit_verdict`) of the layout
    `resolve_spec` chose, with the plan `dstoolkit estimate SPEC` estimates: the group's engine (`spec_for_targets`)
    and the resolution's DeepSpeed JSON (planner.plan_for builds resolved.plan from the same two)."""
    from dstoolkit.generate.planner import estimate_candidate
    from dstoolkit.generate.targets import spec_for_targets

    return estimate_candidate(spec_for_targets(spec, tuple(resolved.targets)), shape, resolved.candidate,
                              ds_config=resolved.ds_config)


def fit_warning_text(resolved: "Resolution", est: "CandidateEstimate") -> str:
    """SP007's message: the layout (the candidate label the sweep and `estimate`'s "assumed" line print, offload
    included, and its dp) and each budget `est` fails, with the figures `dstoolkit estimate` prints for it: device
    memory per rank (peak + allowance against the device's memory: "fits in N GiB") and host RAM per node (the
    node's offloaded states against its host RAM: "host RAM per node"). `est`: a `CandidateEstimate` that does not
    fit (`est.fits` is False)."""
    failing = []
    if not est.device_fits:
        failing.append(f"in {est.device_memory_bytes / GiB:.0f} GiB per {resolved.plan.gpu.name}: needs "
                       f"{(est.memory_per_rank_bytes + est.allowance_bytes) / GiB:.2f} GiB per rank (peak + allowance)")
    if not est.host_fits:
        failing.append(f"in host RAM per node: needs {est.host_memory_per_node_bytes / GiB:.2f} GiB (offloaded states)"
                       f" > {est.host_memory_node_capacity_bytes / GiB:.1f} GiB available ({est.host_source})")
    layout = f"layout {resolved.candidate.label} (dp={resolved.plan.dp})"
    return f"{layout} is estimated not to fit " + ", nor ".join(failing)


CPU_FP16_PROBLEM = ("training.precision: fp16 with cluster.gpu: cpu runs only on a CPU with mkldnn fp16 support: "
                    "DeepSpeed's CPU accelerator allows fp16 where torch.ops.mkldnn._is_mkldnn_fp16_supported() is "
                    "true (AVX512-FP16 / AMX-FP16), and elsewhere every rank stops at start-up with 'Type fp16 is not "
                    "supported on your device'")
CPU_FP16_FIX = "set training.precision: bf16 or fp32"


def cpu_precision_warnings(spec: Spec) -> list[Finding]:
    """A warning (SP004, at training.precision) for fp16 on CPU ranks: whether it runs depends on the machine that
    launches (deepspeed accelerator/cpu_accelerator.py is_fp16_supported), which neither validate nor generate can
    know, so it is not an error."""
    from dstoolkit.generate.ds_json import is_cpu_cluster

    if spec.training.precision != "fp16" or not is_cpu_cluster(spec):
        return []
    [found] = spec.error(("training", "precision"), CPU_FP16_PROBLEM, CPU_FP16_FIX).findings
    return [dataclasses.replace(found, severity="warning")]


def spec_warnings(spec: Spec) -> list[Finding]:
    """The warnings a loadable spec gets from `dstoolkit validate SPEC.yaml` besides SP007 (and `generate` prints):
    `cpu_precision_warnings`, then `schedule_warnings`."""
    return cpu_precision_warnings(spec) + schedule_warnings(spec)


SCHEDULE_SPEC_FIXES = {
    "/scheduler/params/total_num_steps": "training.train_steps counts the warmup too: make it >= "
                                         "training.warmup_steps, or shorten the warmup",
}
"""The spec's fix for a DS235 problem of the scheduler generate writes, by the problem's pointer (any other keeps
the rule's own fix)."""


def schedule_warnings(spec: Spec) -> list[Finding]:
    """The DS235 warnings of the LR schedule `generate` writes for `spec` (`ds_json.scheduler_section`, checked by
    the rule's own `rules_sched.misbehaving`), located at training.warmup_steps: what `dstoolkit validate` of the
    generated JSON would warn about, said on the spec."""
    from dstoolkit.dsconfig import rules  # noqa: F401 - the registry's order: rules imports every rule module
    from dstoolkit.dsconfig.rules_sched import misbehaving
    from dstoolkit.generate.ds_json import scheduler_section

    sched = scheduler_section(spec)
    if sched is None:
        return []
    t = spec.training
    cfg = {"optimizer": {"params": {"lr": t.lr}}, "scheduler": sched}
    out = []
    for problem in misbehaving(sched["type"], sched["params"], cfg):
        [found] = spec.error(("training", "warmup_steps"),
                             f"training.warmup_steps={t.warmup_steps}, train_steps={t.train_steps}: the {sched['type']} "
                             f"scheduler generate writes for them warns (DS235): {problem.message}",
                             SCHEDULE_SPEC_FIXES.get(problem.pointer, problem.fix)).findings
        out.append(dataclasses.replace(found, code="DS235", severity="warning"))
    return out


def refuse_megatron_lm_on_cpu(spec: Spec, from_flag: bool) -> None:
    """A spec whose only target is megatron-lm on a CPU cluster: nothing could be generated, ranked or estimated for
    a launcher that cannot start there (megatron_lm.CPU_REASON, the reason generate gives when other targets get
    files beside it), so every verb that loads the spec refuses it at cluster.gpu. Nothing to do for other targets."""
    if list(spec.targets) != ["megatron-lm"]:
        return
    from dstoolkit.generate.ds_json import is_cpu_cluster
    from dstoolkit.generate.megatron_lm import CPU_PROBLEM

    if is_cpu_cluster(spec):
        if from_flag:
            where, fix = "--target megatron-lm", "use --target megatron-deepspeed or deepspeed on CPU"
        else:
            where, fix = "targets: [megatron-lm]", "set targets: [megatron-deepspeed] or [deepspeed] on CPU"
        raise spec.error(("cluster", "gpu"), f"{where} on this cluster: {CPU_PROBLEM}", f"{fix}, or a GPU in cluster.gpu")


def _loaded(p: Path, targets: Sequence[str] = ()) -> tuple[Spec, ModelShape]:
    """`load_spec`, `resolve_spec_model` and a check that its calibration file (if any) is usable; SpecError (a
    ValueError) or OSError as they come."""
    spec = load_spec(p, targets=targets)
    refuse_megatron_lm_on_cpu(spec, from_flag=bool(targets))
    shape = resolve_spec_model(spec)
    calibration_for_spec(spec)  # cluster.calibration: a missing/unusable file is the spec's error
    return spec, shape
