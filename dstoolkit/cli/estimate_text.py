"""`dstoolkit estimate`'s text output: the table of memory by phase and category, FLOPs, communication, step time
and MFU (`render_table`), the pipeline split the estimate assumed, the optimizer as the plan's engine builds it
(`engine_optimizer`, also the JSON's `engine`), and the DeepSpeed config's warnings. The verb
(`dstoolkit.cli.estimate`) builds the plan and the estimate; this module only writes them. No torch import.
"""
from __future__ import annotations

GiB = 2**30


def render_findings(findings: list) -> list[str]:
    """validate_config warnings, compiler-style, for the lines under the estimate."""
    if not findings:
        return []
    return ["", f"validate_config: {len(findings)} warning(s) in the DeepSpeed config"] + [
        f"  {f.format_text()}" for f in findings]


def pipeline_split_line(plan, layers: tuple[int, ...]) -> list[str]:
    """The layers per pipeline stage the estimate assumed (`layers`: layout.stage_layers in the framework's split), and
    the Megatron-LM flags that ask for an uneven one (the layout string named, not spelled out); nothing at pp 1."""
    from itertools import groupby

    from dstoolkit.layout import megatron_split, pipeline_split

    if plan.pp <= 1:
        return []
    runs = [(n, len(list(g))) for n, g in groupby(layers)]
    text = ", ".join(f"{k} stage{'s' if k > 1 else ''} of {n} layer{'s' if n != 1 else ''}" for n, k in runs)
    if pipeline_split(plan.framework) == "uniform":
        how = "DeepSpeed PipelineModule's uniform partition"
    else:
        flags = [flag if flag == "--pipeline-model-parallel-layout" else f"{flag} {v}"
                 for flag, v in megatron_split(plan.shape.num_hidden_layers, plan.pp).args()]
        how = "Megatron-LM" + (f": {' '.join(flags)}" if flags else "")
    return [f"pipeline stages: {text}, stage 0 first ({how}); the last stage also holds the output layer"]


def _megatron_optimizer(plan) -> tuple[str, str]:
    """(the optimizer class Megatron-Core 0.16 wraps the run in, the one that steps) for the plan's ZeRO stage, as
    `dstoolkit generate --target megatron-lm` writes it (generate/megatron_lm.py _distributed_lm: stage 0 DDP, 1-2
    --use-distributed-optimizer, 3 Megatron-FSDP; offload --optimizer-cpu-offload). megatron/core/optimizer/
    __init__.py: Adam / SGD are Transformer Engine's FusedAdam / FusedSGD (Apex's without TE); offload builds
    HybridDeviceOptimizer, whose host half is torch.optim.AdamW(fused=True) / SGD; the mixed-precision wrapper is
    DistributedOptimizer (also under Megatron-FSDP) or, without it, Float16OptimizerWithFloat16Params, FP32Optimizer
    in fp32."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.generate.megatron_lm import uses_megatron_fsdp

    ds = plan.ds
    if uses_megatron_fsdp(ds):
        wrapper = "DistributedOptimizer over Megatron-FSDP"
    elif ds.zero_stage >= 1:
        wrapper = "DistributedOptimizer"
    else:
        wrapper = ("FP32Optimizer" if plan.precision == "fp32" else "Float16OptimizerWithFloat16Params") + " over DDP"
    kind = {"adam": "Adam", "adamw": "Adam", "sgd": "SGD"}.get(ds.optimizer_type)
    if kind is None:
        return wrapper, f"{ds.optimizer_type}: not a Megatron-Core optimizer (it builds adam or sgd)"
    if ds.offload_optimizer:
        host = "torch.optim.AdamW(fused=True)" if kind == "Adam" else "torch.optim.SGD"
        return f"{wrapper} + HybridDeviceOptimizer", f"{host} on the host (HybridDeviceOptimizer, in place)"
    fused = "multi_tensor_adam" if kind == "Adam" else "multi_tensor_sgd"
    return wrapper, f"Transformer Engine Fused{kind} ({fused}, in place)"


_TORCH_NAMES = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "adafactor": "Adafactor"}
"""The torch.optim class of a spec's training.optimizer (lamb has none: shown as written)."""


def engine_optimizer(plan, m) -> dict:
    """The optimizer as the plan's engine builds it, for the text and the JSON's `engine`: framework, engine (its
    name), optimizer (what holds the states: DeepSpeed's path, memory.optimizer_path, or the engine's class),
    implementation (what steps them) and counted_as: the DeepSpeed classes the memory is counted with
    (`m.optimizer_path`, `m.optimizer_impl`) where the engine is not DeepSpeed's (estimate.core: Megatron and FSDP
    runs are modelled with DeepSpeed's classes as a stand-in), else None."""
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.estimate.step_temporaries import IMPLEMENTATIONS
    from dstoolkit.spec.target_engines import ENGINE_NAMES

    impl = IMPLEMENTATIONS.get(m.optimizer_impl, m.optimizer_impl)
    out = {"framework": plan.framework, "engine": ENGINE_NAMES.get(plan.framework, plan.framework)}
    if plan.framework == "deepspeed":
        return {**out, "optimizer": m.optimizer_path, "implementation": impl, "counted_as": None}
    if plan.framework == "megatron":
        optimizer, implementation = _megatron_optimizer(plan)
    else:  # PyTorch FSDP: the training script's torch.optim optimizer over FSDP's sharded parameters
        cls = "torch.optim." + _TORCH_NAMES.get(plan.ds.optimizer_type, plan.ds.optimizer_type)
        optimizer, implementation = f"+ {cls}", f"{cls} as the training script builds it (for-loop, foreach or fused)"
    return {**out, "optimizer": optimizer, "implementation": implementation,
            "counted_as": f"DeepSpeed's {m.optimizer_path} path with {impl}"}


def offload_placement(plan) -> dict:
    """Where the estimate puts the offloaded states, for the header and the JSON's `offload`: optimizer and params,
    each "cpu", "nvme" or None (on the device), as the estimate models them (parameter offload only at ZeRO-3, the
    one stage that offloads parameters), the devices read through the validated `DeepSpeedConfig` model; and
    nvme_counted_as_host: the estimate counts NVMe-offloaded bytes in host memory (`offload_notes`)."""
    ds = plan.ds
    out = {"optimizer": None, "params": None, "nvme_counted_as_host": False}
    if not (ds.offload_optimizer or ds.offload_param):
        return out
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

    d = plan.dims  # the layout the plan's config was validated in (runplan.read_ds_config)
    z = DeepSpeedConfig.model_validate(plan.ds_config, context={"world_size": d.world, "tp": d.tp, "pp": d.pp,
                                                                 "gpus_per_node": d.gpus_per_node}).zero_optimization
    if ds.offload_optimizer:
        out["optimizer"] = z.offload_optimizer.device
    if ds.offload_param and ds.zero_stage == 3:
        out["params"] = z.offload_param.device
    out["nvme_counted_as_host"] = "nvme" in (out["optimizer"], out["params"])
    return out


def _offload_header(where: dict) -> str:
    """' + offload: optimizer -> cpu, params -> nvme' (what goes where), or nothing."""
    parts = [f"{what} -> {where[what]}" for what in ("optimizer", "params") if where[what]]
    return f" + offload: {', '.join(parts)}" if parts else ""


def offload_notes(where: dict) -> list[str]:
    """The assumption NVMe offload needs: the estimate counts it as host memory, and times it at PCIe rates."""
    nvme = [what for what in ("optimizer", "params") if where[what] == "nvme"]
    if not nvme:
        return []
    what = " and ".join({"optimizer": "the optimizer states (fp32 master weights and moments)",
                         "params": "the parameter partition"}[n] for n in nvme)
    buffers = "; ".join({"optimizer": "offload_optimizer.buffer_count buffers",
                         "params": "offload_param.buffer_count x buffer_size elements"}[n] for n in nvme)
    return [f"NVMe offload: {what} {'are' if len(nvme) > 1 or nvme == ['optimizer'] else 'is'} counted in "
            "'host (offload) per rank' as host RAM (the estimator has no disk term); the run keeps "
            f"{'them' if len(nvme) > 1 or nvme == ['optimizer'] else 'it'} in swap files under nvme_path and holds "
            f"DeepSpeed's pinned swap buffers in host RAM instead ({buffers}), which are not counted; the offload "
            "traffic is timed at PCIe rates (estimate.step_time PCIE_BYTES_PER_S), not the drive's, so the step time "
            "is optimistic"]


def _sequence_shards(plan) -> str:
    """The ranks that share a sequence, when any (they come out of dp, so the header shows why dp is smaller)."""
    return "".join(f" {name}={n}" for name, n in (("cp", plan.cp), ("ulysses", plan.ulysses)) if n > 1)


def _optimizer_note(eng: dict) -> str:
    """The fits line's note on what holds the optimizer states: DeepSpeed's path, or the engine's optimizer and the
    DeepSpeed classes its bytes are counted with."""
    if eng["counted_as"] is None:
        return f"DeepSpeed path: {eng['optimizer']}"
    return f"{eng['engine']} {eng['optimizer']}, counted as {eng['counted_as']}"


def render_table(plan, est, assumptions: list[str], verdict) -> str:
    """The text report of one estimate; `verdict` is its `generate.costing.fit_verdict` (device and host RAM)."""
    from dstoolkit.estimate.core import upper_bound_exceeds
    from dstoolkit.estimate.timeline import is_cpu_device

    m = est.memory
    ds = plan.ds
    eng = engine_optimizer(plan, m)
    how = "" if eng["counted_as"] is None else f" ({eng['engine']} {eng['optimizer']})"
    where = offload_placement(plan)
    lines = [
        f"model {plan.shape.name}: {est.params.total / 1e9:,.3f}B params ({est.params.active / 1e9:,.3f}B active); "
        f"{plan.world_size} x {plan.gpu.name}, tp={plan.tp} pp={plan.pp} ep={plan.ep}{_sequence_shards(plan)} "
        f"dp={plan.dp}; "
        f"ZeRO-{ds.zero_stage}{how}{_offload_header(where)}, {plan.precision}, "
        f"micro batch {ds.micro_batch} x accum {ds.grad_accum}, seq {plan.seq_len}, checkpoint {plan.checkpoint.kind}",
    ]
    for a in assumptions:
        lines.append(f"  assumed: {a}")
    lines += [
        "",
        f"{'memory per rank, by phase':<28}{'bytes':>20}{'':>4}{'GiB':>10}"
        + (f"   ({m.peak_pipeline_stage} pipeline stage, the one that peaks)" if m.peak_pipeline_stage else ""),
    ]
    for p in m.timeline.phases:
        mark = "  <- peak" if p.name == m.peak_phase else ""
        lines.append(f"{p.name:<28}{p.device_bytes:>20,}{'':>4}{p.device_bytes / GiB:>10.2f}{mark}")
    lines.append(f"{'peak (total)':<28}{m.total:>20,}{'':>4}{m.total / GiB:>10.2f}   in {m.peak_phase}: "
                 f"{', '.join(m.peak_alive)}")
    lines += ["", f"{'by category, each at its max':<28}{'bytes':>20}{'':>4}{'GiB':>10}"]
    for name, val in (("params", m.params), ("grads", m.grads), ("optimizer (master+states)", m.optimizer),
                      ("activations", m.activations), ("buffers", m.buffers),
                      ("temporaries (largest)", m.temporaries), ("  optimizer step temporaries", None),
                      ("sum of parts (upper bound)", m.sum_of_parts_bytes)):
        if val is None:  # issue 24: the inner optimizer's temporaries, named by the engine's implementation
            val = m.optimizer_temporaries
            lines.append(f"{name:<28}{val:>20,}{'':>4}{val / GiB:>10.2f}   ({eng['implementation']})")
            continue
        lines.append(f"{name:<28}{val:>20,}{'':>4}{val / GiB:>10.2f}")
    lines.append(f"{'host (offload) per rank':<28}{est.host_memory_per_rank_bytes:>20,}{'':>4}"
                 f"{est.host_memory_per_rank_bytes / GiB:>10.2f}"
                 + ("   (NVMe-offloaded bytes counted here: see assumed)" if where["nvme_counted_as_host"] else ""))
    lines.append(f"{'allowance':<28}{m.allowance_bytes:>20,}{'':>4}{m.allowance_bytes / GiB:>10.2f}   "
                 f"({m.allowance_source})")
    lines.append(f"fits in {plan.gpu.memory_bytes / GiB:.0f} GiB: {'yes' if est.fits else 'NO'}"
                 f" (peak + allowance = {m.required_bytes / GiB:.2f} GiB)"
                 f"   ({_optimizer_note(eng)}; ZeRO paper view for this stage: "
                 f"{est.paper_view.stage_bytes / GiB:.2f} GiB model states)")
    if est.host_memory_per_rank_bytes or not verdict.host_fits:
        lines.append(f"host RAM per node: {verdict.host_node_bytes / GiB:.2f} GiB of {verdict.host_capacity_bytes / GiB:.1f}"
                     f" GiB: {'fits' if verdict.host_fits else 'NO'} ({verdict.host_source})")
    if est.fits and not is_cpu_device(plan.gpu) and upper_bound_exceeds(m.sum_of_parts_bytes, m.allowance_bytes,
                                                                        plan.gpu.memory_bytes):
        lines.append(f"caution: the sum of parts + allowance ({(m.sum_of_parts_bytes + m.allowance_bytes) / GiB:.2f} "
                     f"GiB) is over the {plan.gpu.memory_bytes / GiB:.0f} GiB device: the peak fits, but a caching "
                     "allocator that keeps each phase's blocks can hold more; leave room or set "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    lines += ["", f"FLOPs/token {est.flops_per_token:.4g} (with recompute {est.hardware_flops_per_token:.4g}); "
                  f"FLOPs/step {est.flops_per_step:.4g}; tokens/step {est.tokens_per_step:,}", "",
              f"{'communication per step':<32}{'bytes/rank':>20}"]
    for k, v in sorted(est.comm_bytes_per_step.items()):
        lines.append(f"{k:<32}{v:>20,}")
    st = est.step_time
    lines += ["", f"step time {est.step_time_s:.4g} s = compute {st.compute_s:.4g} + exposed comm {st.comm_exposed_s:.4g} "
                  f"(of {st.comm_total_s:.4g}, overlap eta={st.overlap_efficiency}) + optimizer {st.optimizer_s:.4g} "
                  f"+ memory-bound {st.memory_s:.4g} "
                  f"+ offload {st.offload_s:.4g} + overhead {st.overhead_s:.4g}",
              _mfu_line(plan, est) if verdict.fits else "MFU: none (the run does not fit, so it cannot run)"]
    return "\n".join(lines)


def _mfu_line(plan, est) -> str:
    """MFU with the peak it divides by; an fp8 run's over the fp8 peak also over the bf16 one (published MFU is
    quoted both ways: DeepSeek-V3 and NeMo's fp8 tables against different peaks)."""
    line = f"MFU {est.mfu:.1%} of {est.mfu_peak_flops_per_gpu / 1e12:,.4g} TFLOP/s per rank, the {est.mfu_peak}"
    bf16 = plan.gpu.peak_bf16_flops
    if plan.precision == "fp8" and bf16 and est.mfu_peak_flops_per_gpu != bf16:
        line += f"; {est.mfu * est.mfu_peak_flops_per_gpu / bf16:.1%} of the bf16 peak ({bf16 / 1e12:,.4g} TFLOP/s)"
    return line
