"""summary.md for each strategy folder and the index summary.md of the output folder.

Deterministic text: no timestamps, no absolute paths, fixed number formats.
"""
from __future__ import annotations

from typing import Optional

from dstoolkit.estimate.flops import flops_per_token
from dstoolkit.estimate.timeline import is_cpu_device
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import only_peak_fits
from dstoolkit.generate.launch import MEGATRON_ALTERNATIVE, bundled_trainer_problem
from dstoolkit.generate.megatron_deepspeed import FPDT_COMMIT
from dstoolkit.generate.result import GenerateResult, StrategyOutput
from dstoolkit.generate.shell import command_line
from dstoolkit.generate.targets import engine_note
from dstoolkit.models import count_params
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.cluster_fields import host_memory_source, memory_headroom_source
from dstoolkit.spec.target_engines import ENGINE_NAMES, TARGET_ENGINE

GiB = 2**30


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _md(text: str) -> str:
    """Free text inside a markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _why_field(spec: Spec, field: str, value, auto_note: str) -> str:
    given = getattr(spec.training, field)
    if given == "auto":
        return f"auto ({auto_note})"
    return f"fixed by the spec (training.{field}: {given})"


def _params_line(shape: ModelShape) -> str:
    c = count_params(shape)
    if shape.is_moe:
        return (f"{c.total / 1e9:.2f}B parameters, {c.active / 1e9:.2f}B active per token "
                f"({shape.num_experts} experts, top-{shape.num_experts_per_tok})")
    return f"{c.total / 1e9:.3f}B parameters"


def model_notes(shape: ModelShape, seq_len: int) -> list[str]:
    """What reading the model decided (`shape.notes`: text_config used, quantization_config ignored, FLOPs
    traced, ...) and the FLOPs accounting of a shape without the analytic formula, as a markdown section
    (empty for presets and hand-written readers, which have neither)."""

    lines = [f"- {_md(n)}" for n in shape.notes]
    if shape.source != "analytic":
        f = flops_per_token(shape, seq_len)
        lines.append(f"- FLOPs path at seq_len {seq_len}: {f.path}: {_md(f.detail)}")
    return ["## Model notes", "", *lines, ""] if lines else []


def render_strategy_summary(spec: Spec, shape: ModelShape, out: StrategyOutput) -> str:
    """Choices and why, the estimate numbers, the runner-ups and the validation result for one folder."""
    cand: Candidate = out.chosen.candidate
    est = out.chosen.estimate
    world = spec.cluster.world_size
    dp = cand.dp(world)
    gas = cand.grad_accum(world, spec.training.global_batch)
    gpu = spec.cluster.gpu_spec
    n_fit = out.sweep.all_ranked_count
    auto_note = f"best of {n_fit} fitting layouts of this strategy"
    opt = out.ds_config["optimizer"]
    opt_txt = opt["type"] + (" (torch implementation: avoids compiling DeepSpeed's FusedAdam on CPU)"
                             if opt["params"].get("torch_adam") else "")
    if cand.offload_optimizer:
        opt_txt += " on the CPU (DeepSpeedCPUAdam)"
    rows = [
        ("ZeRO stage", str(cand.zero_stage), out.strategy.description),
        ("offload", cand.offload_label, "strategy " + out.name),
        ("ZeRO++", _zeropp_label(out.ds_config) if cand.zeropp else "off", "strategy " + out.name),
        ("tensor parallel", str(cand.tp), _why_field(spec, "tp", cand.tp, auto_note)),
        ("pipeline parallel", str(cand.pp), _why_field(spec, "pp", cand.pp, auto_note)),
    ]
    if shape.is_moe:
        rows.append(("expert parallel", str(cand.ep),
                     ("experts sharded over ep ranks, replicated over dp/ep = " + str(dp // cand.ep))
                     + "; " + _why_field(spec, "ep", cand.ep, auto_note)))
    rows += [
        ("data parallel", str(dp), f"world {world} / (tp {cand.tp} x pp {cand.pp})"),
        ("micro-batch", str(cand.micro_batch), _why_field(spec, "micro_batch", cand.micro_batch, auto_note)),
        ("gradient accumulation", str(gas),
         f"global_batch {spec.training.global_batch} / (micro-batch {cand.micro_batch} x dp {dp})"),
        ("recompute", cand.checkpoint_label,
         _why_field(spec, "activation_checkpointing", cand.checkpoint_label, auto_note)),
        ("precision", spec.training.precision,
         "fp8 GEMMs via Transformer Engine (Megatron --fp8-* flags); DeepSpeed keeps bf16"
         if spec.training.precision == "fp8" else "training.precision"),
        ("optimizer", opt_txt, "training.optimizer"),
    ]
    lines = [
        f"# {out.name}: {spec.name}",
        "",
        f"{out.strategy.description}. Model {shape.name}: {_params_line(shape)}. Cluster: "
        f"{spec.cluster.describe(gpu.name)} ({world} ranks).",
        "",
        "| choice | value | why |",
        "|---|---|---|",
    ]
    lines += [f"| {a} | {_md(b)} | {_md(c)} |" for a, b, c in rows]
    lines += ["", *model_notes(shape, spec.training.seq_len)]
    lines += ["## Why this layout", "", _md(out.sweep.winner_reason or ""), ""]
    lines += ["## Estimate (per rank)", "", f"Source: {est.source}.", ""]
    if out.per_target:
        same = shared_targets(out)
        rest = "; the other targets: Layout per target below" if len(same) < len(out.per_target) else ""
        if same:
            lines += [f"For {', '.join(same)}, under {engine_name(same)}, the engine "
                      f"{'its' if len(same) == 1 else 'their'} files run{rest}.", ""]
        else:  # every target that got files runs a layout of its own engine (the others were skipped)
            lines += ["No target's files run this layout: each target's own layout and figures are under Layout "
                      "per target below.", ""]
    if note := engine_note(spec, list(out.per_target)):
        lines += [f"Note: {_md(note)}.", ""]
    lines += ["| quantity | value |", "|---|---|"]
    for k, v in est.memory_breakdown_bytes.items():
        lines.append(f"| memory: {k} (its own max) | {_gib(v)} |")
    lines += [
        f"| memory: sum of parts (upper bound) | {_gib(est.sum_of_parts_bytes)} |",
        f"| memory: peak ({_md(est.peak_phase)}) | {_gib(est.memory_per_rank_bytes)} of "
        f"{_gib(est.device_memory_bytes)} |",
        f"| memory: allowance (context, fragmentation) | {_gib(est.allowance_bytes)} |",
        f"| host memory (offload) | {_gib(est.host_memory_per_rank_bytes)} per rank; "
        f"{_gib(est.host_memory_per_node_bytes)} per node of {_gib(est.host_memory_node_capacity_bytes)} "
        f"({_md(host_memory_source(spec.cluster))}) |",
        f"| memory headroom | {_gib(est.headroom_bytes)} ({_md(memory_headroom_source(spec.cluster))}): "
        f"{'left' if est.within_headroom else 'NOT left (no fitting layout of this strategy leaves it)'} |",
        f"| step time | {est.step_time_s:.4g} s |",
        f"| MFU | {est.mfu * 100:.1f}% |",
        f"| fits | {_fits_text(est, spec)} |",
        "",
    ]
    if len(out.sweep.ranked) > 1:
        lines += ["## Next best layouts of this strategy", ""]
        for i, r in enumerate(out.sweep.ranked[1:], start=2):
            lines.append(f"{i}. `{r.candidate.label}`: {_md(r.reason)}")
        lines.append("")
    from dstoolkit.generate.undecided import undecided_lines  # ties within the measured error (issue 24)

    ties = undecided_lines([r.candidate.label for r in out.sweep.ranked],
                           [r.estimate.step_time_s for r in out.sweep.ranked], is_cpu_device(gpu),
                           spec.source_path.name if spec.source_path is not None else "SPEC.yaml")
    if ties:
        lines += ["## Cannot decide", "", *[_md(t) for t in ties], ""]
    errs = [f for f in out.findings if str(f.severity).lower().endswith("error")]
    others = [f for f in out.findings if f not in errs]
    lines += ["## Validation", "",
              f"`validate_config` at world size {world} (tp {cand.tp}, pp {cand.pp}"
              + (f", {shape.num_experts} experts, ep {cand.ep}" if shape.is_moe else "")
              + f"): {len(errs)} errors, {len(others)} other findings.", ""]
    for f in others:
        lines.append(f"- {f.severity}: `{f.pointer}` {f.code}: {_md(f.message)}")
    if others:
        lines.append("")
    distinct = other_targets(out)
    if distinct:
        lines += ["## Layout per target", "",
                  f"The table above is the layout of {', '.join(shared_targets(out))}. "
                  "These targets were resolved on their own, each under the engine its files run "
                  "(`dstoolkit.generate.targets.target_groups`):", ""]
        for t, r in distinct.items():
            lines.append(f"- {t} ({engine_name([t])}): `{r.candidate.label}`, {r.estimate.step_time_s:.4g} s/step, "
                         f"{_gib(r.estimate.memory_per_rank_bytes)} per rank, MFU {r.estimate.mfu * 100:.1f}%")
        lines.append("")
    lines += ["## Files", ""]
    lines += [f"- `{name}`: {file_note(out, name)}" for name in FILE_NOTES if name in out.files]
    lines += [f"- no {target} files: {_md(why)}" for target, why in out.targets_skipped.items()]
    lines.append("")
    return "\n".join(lines)


def engine_name(targets) -> str:
    """How summaries name the engine `targets` run (`TARGET_ENGINE`; one engine per `target_groups` group)."""
    return ENGINE_NAMES[TARGET_ENGINE[targets[0]]]


def other_targets(out: StrategyOutput) -> dict:
    """target -> its `Ranked` for the targets whose layout or figures are not `out.chosen`'s (another group's)."""
    return {t: r for t, r in out.per_target.items()
            if r.candidate != out.chosen.candidate or r.estimate != out.chosen.estimate}


def shared_targets(out: StrategyOutput) -> list[str]:
    """The targets whose layout and figures are `out.chosen`'s (the folder's table)."""
    others = other_targets(out)
    return [t for t in out.per_target if t not in others]


TARGET_SCRIPTS = {"deepspeed": "launch.sh", "megatron-lm": "launch_megatron_lm.sh",
                  "megatron-deepspeed": "launch_megatron_deepspeed.sh", "hf": "launch_hf.sh",
                  "accelerate": "launch_accelerate.sh"}
"""Each target's own launch script in a strategy folder."""
SCRIPT_ARGS = {"hf": ("YOUR_TRAIN.py",), "accelerate": ("YOUR_TRAIN.py",)}
"""What the user adds after the script (HF targets run the user's own training script)."""


def fastest_per_target(result: GenerateResult) -> dict[str, tuple[StrategyOutput, str]]:
    """target -> (the strategy folder whose layout for that target has the shortest estimated step, its script),
    for every target some folder has a launch script for."""
    out: dict[str, tuple] = {}
    for target, script in TARGET_SCRIPTS.items():
        have = [o for o in result.generated if script in o.files]
        if have:
            best = min(have, key=lambda o: o.per_target.get(target, o.chosen).estimate.step_time_s)
            out[target] = (best, script)
    return out


def launch_sh_problem(o: StrategyOutput) -> Optional[str]:
    """Why the folder's launch.sh cannot run the bundled example trainer (its deepspeed layout splits the model:
    `launch.bundled_trainer_problem`), or None."""
    return bundled_trainer_problem(o.per_target.get("deepspeed", o.chosen).candidate)


def run_hints(result: GenerateResult, out_dir: str = ".") -> list[str]:
    """One shell-quoted `bash .../<script>` line per target, naming the fastest strategy for that target. A deepspeed
    layout the bundled trainer cannot run (`launch.bundled_trainer_problem`) gets TRAIN_MODULE in its command, the
    reason and the Megatron launch scripts, then the fastest folder whose launch.sh runs the bundled trainer."""
    hints = []
    fastest = fastest_per_target(result)

    def line(target: str, o: StrategyOutput, script: str, head: str = "", env=()) -> str:
        e = o.per_target.get(target, o.chosen).estimate
        words = ["bash", f"{out_dir.rstrip('/')}/{o.name}/{script}", *SCRIPT_ARGS.get(target, ())]
        return f"{target}{head}, fastest {o.name} ({e.step_time_s:.4g} s/step): {command_line(words, env)}"

    for target, (o, script) in fastest.items():
        why = launch_sh_problem(o) if target == "deepspeed" else None
        if why is None:
            hints.append(line(target, o, script))
            continue
        hints.append(f"{line(target, o, script, env=[('TRAIN_MODULE', 'YOUR.TRAINER.MODULE')])} "
                     f"(launch.sh needs your own trainer: {why}; {MEGATRON_ALTERNATIVE})")
        dp = [x for x in result.generated if script in x.files and launch_sh_problem(x) is None]
        if dp:
            best = min(dp, key=lambda x: x.per_target.get(target, x.chosen).estimate.step_time_s)
            hints.append(line(target, best, script, head=" with the bundled trainer (data parallel)"))
    return hints


def file_note(out: StrategyOutput, name: str) -> str:
    """`FILE_NOTES[name]`, and for a launch.sh the bundled trainer cannot run, what it needs instead."""
    why = launch_sh_problem(out) if name == "launch.sh" else None
    if why is None:
        return FILE_NOTES[name]
    return (f"needs your own trainer: {why}. `TRAIN_MODULE=your.module bash launch.sh` (without it, launch.sh stops "
            f"before starting anything and says so; the module gets the arguments of its TRAIN_ARGS), "
            f"{MEGATRON_ALTERNATIVE}. `DRY_RUN=1` prints the command.")


FILE_NOTES = {
    "ds_config.json": "the DeepSpeed config (pure DeepSpeed keys; MoE facts go to the model: `--ep-size`).",
    "launch.sh": "`bash launch.sh` (deepspeed launcher + `hostfile`), `LAUNCHER=torchrun bash launch.sh`, "
                 "`DRY_RUN=1` prints the command; `STEPS=N` sets the run length.",
    "slurm.sbatch": "`sbatch slurm.sbatch` from this folder (hostfile from the allocation).",
    "ds_config_hf.json": "the same config in HF Trainer style: \"auto\" where the Trainer fills it from its "
                         "arguments (`training_args.json`), numbers where it must not; `bash launch_hf.sh YOUR_TRAIN.py [its arguments]` (multi-node: "
                         "`NODE_RANK=k MASTER_ADDR=<node 0> bash launch_hf.sh ...` on every node).",
    "accelerate_config.yaml": "accelerate's config (DeepSpeed plugin pointing at ds_config_hf.json); "
                              "`bash launch_accelerate.sh YOUR_TRAIN.py [its arguments]` (multi-node: torchrun per node through "
                              "`deepspeed_multinode_launcher: standard`; NODE_RANK and MASTER_ADDR on every node).",
    "megatron_lm_args.txt": "Megatron-LM's arguments, one word per line, unquoted (checked against its parse_args "
                            "+ validate_args); `launch_megatron_lm.sh` reads them with `mapfile` and starts "
                            "`PRETRAIN=/path/to/Megatron-LM/pretrain_gpt.py`; DATA_ARGS (--data-path and tokenizer) is "
                            "required, MOCK_DATA=1 trains on Megatron-LM's synthetic tokens instead (said on stderr).",
    "megatron_deepspeed_args.txt": "Megatron-DeepSpeed's arguments, same form; `launch_megatron_deepspeed.sh` adds "
                                   "`--deepspeed_config` with this folder's ds_config.json by absolute path; DATA_ARGS "
                                   "(--data-path and tokenizer) is required (Megatron-DeepSpeed has no mock dataset); "
                                   "for a GQA model it first stops on a tree that splits the QKV output into thirds "
                                   f"(Megatron-DeepSpeed since {FPDT_COMMIT}; docs/generate-and-targets.md).",
}
"""What each generated file is for, in the order summaries list them."""


def render_index(spec: Spec, shape: ModelShape, result: GenerateResult) -> str:
    """The output folder's summary.md: what was generated, what was not and why."""
    gpu = spec.cluster.gpu_spec
    lines = [
        f"# dstoolkit generate: {spec.name}",
        "",
        f"Model {shape.name}: {_params_line(shape)}. Cluster: {spec.cluster.describe(gpu.name)}. "
        f"Training: seq_len {spec.training.seq_len}, global batch {spec.training.global_batch}, "
        f"{spec.training.precision}.",
        "",
        *model_notes(shape, spec.training.seq_len),
        "## Generated",
        "",
    ]
    if result.generated:
        lines += ["| strategy | targets | layout | memory / rank | step time | MFU |", "|---|---|---|---|---|---|"]
        # "fastest" only among rows of the same targets (figures of different engines or launchers do not rank; the
        # Run section names the fastest folder of each target)
        same = len({tuple(o.chosen_targets) for o in result.generated}) == 1
        best = min(result.generated, key=lambda o: o.chosen.estimate.step_time_s) if same else None
        for o in result.generated:
            mark = " (fastest)" if o is best else ""
            rows = [(f"[{o.name}]({o.name}/summary.md){mark}", shared_targets(o), o.chosen)]
            others = other_targets(o)
            for r in {id(x): x for x in others.values()}.values():  # one row per other group, in target order
                rows.append((o.name, [t for t, x in others.items() if x is r], r))
            for cell, ts, r in rows:
                e = r.estimate
                lines.append(f"| {cell} | {', '.join(ts)} | `{r.candidate.label}` | {_gib(e.memory_per_rank_bytes)} | "
                             f"{e.step_time_s:.4g} s | {e.mfu * 100:.1f}% |")
        targets = list(dict.fromkeys(t for o in result.generated for t in o.per_target))
        engines = "; ".join(f"{t}: {engine_name([t])}" for t in targets)
        lines += ["", f"Estimates: {result.generated[0].chosen.estimate.source}; each target's under the engine its "
                      f"files run ({engines}).", ""]
        if note := engine_note(spec, targets):
            lines += [f"Note: {_md(note)}.", ""]
        lines += ["## Run", "", *[f"- {_md(h)}" for h in run_hints(result)], ""]
    else:
        lines += ["Nothing: no strategy fits (see below).", ""]
    if result.skipped:
        lines += ["## Not generated", ""]
        for s in result.skipped:
            lines.append(f"- {s.name}: {_md(s.reason)}")
            if s.fits_nowhere:
                lines += ["", "  ```", *["  " + ln for ln in s.fits_nowhere.splitlines()], "  ```", ""]
        lines.append("")
    return "\n".join(lines)


def _fits_text(est, spec) -> str:
    """`fits` for the summary, with the caution where only the peak fits (generate.costing.only_peak_fits)."""
    if not est.fits:
        return "no"
    if only_peak_fits(est, spec.cluster.gpu_spec):
        return ("yes by the peak; caution: the sum of parts + allowance is over the device, and a caching allocator "
                "that keeps each phase's blocks can hold that much")
    return "yes"


def _zeropp_label(ds_config: dict) -> str:
    """What the generated ZeRO++ section turns on: hpZ only where its secondary partition is more than one rank
    (layout.dims.hpz_partition: off when the data-parallel group fits in one node)."""
    hpz = int(ds_config.get("zero_optimization", {}).get("zero_hpz_partition_size") or 1)
    if hpz > 1:
        return f"qwZ + hpZ ({hpz} ranks per secondary partition) + qgZ"
    return "qwZ + qgZ (hpZ off: the data-parallel group fits in one node)"
