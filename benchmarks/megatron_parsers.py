"""Every generated Megatron argument file against the real parsers of Megatron-LM and Megatron-DeepSpeed.

Neither project ships its training arguments on PyPI, so this needs their source trees (a checkout or an
exported snapshot; nothing of theirs is kept in this repo). For each bundled spec x strategy x target it writes
the folder with `dstoolkit.generate.megatron.write_megatron_targets`, then, in one subprocess per target, puts
that tree first on sys.path and runs its `parse_args()` + `validate_args(args, {"tokenizer_type": ...})` (as
pretrain_gpt.py does) on the file's words plus the launch script's default DATA_ARGS, with RANK=0 and
WORLD_SIZE = the spec's world size. Megatron-LM files also go through `core_transformer_config_from_args`
(the TransformerConfig pretrain_gpt.py builds next). Megatron-DeepSpeed files are further held against the
DeepSpeed 0.19.8 runtime preconditions that its parser does not check (see `_mds_runtime_checks`).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/megatron_parsers.py \\
        --megatron-lm /path/Megatron-LM --megatron-deepspeed /path/Megatron-DeepSpeed \\
        --out benchmarks/results/megatron_parsers_202612.md

Environment the parsers need beyond this repo's venv (install outside the repo, e.g. `pip install --target
DIR triton six` and PYTHONPATH=DIR): Megatron-LM imports triton (a kernel module) and uses typing.override
(Python 3.12; shimmed from typing_extensions here on 3.11); Megatron-DeepSpeed imports six.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _worker(root: str, target: str, jobs_path: str) -> None:
    """In a subprocess: import the target's parser from `root` and check every job; print one JSON per job."""
    import contextlib
    import io
    import traceback
    import typing

    if not hasattr(typing, "override"):  # Megatron-LM uses the Python 3.12 name
        import typing_extensions

        typing.override = typing_extensions.override
    sys.path.insert(0, root)
    jobs = json.loads(Path(jobs_path).read_text())
    if target == "megatron-lm":
        import megatron.training.arguments  # noqa: F401 - load the modules to pretend on

        _pretend_gpu_machine()
    for job in jobs:
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(job["world"])})
        if job.get("cuda_device_max_connections") is None:
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        else:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = job["cuda_device_max_connections"]
        sys.argv = ["pretrain_gpt.py"] + job["words"]
        res = {"id": job["id"], "ok": False, "error": "", "notes": []}
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                if target == "megatron-lm":
                    import megatron.core as mc
                    from megatron.training.arguments import core_transformer_config_from_args, parse_args, validate_args

                    assert mc.__file__.startswith(root), f"megatron.core imported from {mc.__file__}, not {root}"
                    args = parse_args()
                    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
                    core_transformer_config_from_args(args)
                    _mlm_batch_schedule(args)
                    res["facts"] = {"dp": args.data_parallel_size, "train_iters": args.train_iters,
                                    "train_samples": args.train_samples}
                else:
                    from megatron.arguments import parse_args, validate_args

                    args = parse_args()
                    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
                    from megatron.microbatches import build_num_microbatches_calculator

                    calc = build_num_microbatches_calculator(args)
                    consumed = 0
                    while True:  # every batch of the ramp must divide by micro-batch x dp (consistency check)
                        calc.update(consumed, True)
                        if calc.get_current_global_batch_size() == args.global_batch_size:
                            break
                        consumed += calc.get_current_global_batch_size()
                    problems = _mds_runtime_checks(args, job["ds_config"], job["is_moe"])
                    if problems:
                        raise AssertionError("; ".join(problems))
                    res["facts"] = {"dp": args.data_parallel_size, "global_batch_size": args.global_batch_size,
                                    "ds_pipeline_enabled": args.ds_pipeline_enabled}
            res["ok"] = True
        except SystemExit as exc:  # argparse: unknown/invalid argument (its message is in buf)
            msg = [ln for ln in buf.getvalue().splitlines() if "error:" in ln]
            res["error"] = (msg[-1] if msg else f"SystemExit({exc.code})")[:400]
        except BaseException as exc:  # noqa: BLE001 - report anything the parser raises
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            where = os.path.relpath(tb.filename, root) if tb.filename.startswith(root) else Path(tb.filename).name
            res["error"] = f"{type(exc).__name__}: {str(exc)[:300]} [{where}:{tb.lineno}]"
        print("RESULT " + json.dumps(res), flush=True)


PRETEND = ("torch.cuda.get_device_capability() = (9, 0) and get_device_arch_version() = 9 (an H100/H800, the "
           "bundled specs' GPU); Transformer Engine 2.9.0 present (get_te_version, and its fused RoPE kernel "
           "present for TransformerConfig's apply_rope_fusion check); nothing is executed on a device")


def _pretend_gpu_machine() -> None:
    """Megatron-LM's validate_args and TransformerConfig ask the GPU and Transformer Engine; on this CPU machine
    answer as the specs' target machine would (see PRETEND). Only these answers change; every check still runs."""
    import torch
    from packaging.version import Version

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    te = Version("2.9.0")
    for name, mod in list(sys.modules.items()):
        if not name.startswith("megatron"):
            continue
        if hasattr(mod, "get_te_version"):
            mod.get_te_version = lambda: te
        if hasattr(mod, "is_te_min_version"):
            mod.is_te_min_version = lambda v, check_equality=True: te >= Version(v) if check_equality else te > Version(v)
        if hasattr(mod, "get_device_arch_version"):
            mod.get_device_arch_version = lambda: 9
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None  # stands for TE's kernel; never called


def _mlm_batch_schedule(args) -> None:
    """What set_global_variables and update_train_iters do with the batch next: build the micro-batch
    calculator (the step schedule is parsed and checked there) and count the iterations of a sample-based run."""
    from megatron.core import num_microbatches_calculator as nmc

    nmc.destroy_num_microbatches_calculator()
    nmc.init_num_microbatches_calculator(
        rank=0, global_batch_size=args.global_batch_size, micro_batch_size=args.micro_batch_size,
        data_parallel_size=args.data_parallel_size * getattr(args, "gtp_weight_remat_size", 1),
        decrease_batch_size_if_needed=args.decrease_batch_size_if_needed,
        step_batch_size_schedule=args.step_batch_size_schedule, seq_length=args.seq_length)
    nmc.update_num_microbatches(0, consistency_check=True)
    if not args.train_iters:
        assert args.train_samples, "neither --train-iters nor --train-samples"
        if args.step_batch_size_schedule is not None:  # as update_train_iters counts them
            last = int(args.step_batch_size_schedule.split()[-1].split(":")[0]) // args.seq_length
            consumed, iters = 0, 0
            while consumed < args.train_samples and consumed <= last:  # every step of the ramp checked
                nmc.update_num_microbatches(consumed, consistency_check=True)
                consumed += nmc.get_current_global_batch_size()
                iters += 1
            if consumed < args.train_samples:  # the rest at the final batch
                nmc.update_num_microbatches(consumed, consistency_check=True)
                iters += -(-(args.train_samples - consumed) // nmc.get_current_global_batch_size())
            args.train_iters = iters
        else:
            args.train_iters = args.train_samples // args.global_batch_size
    nmc.destroy_num_microbatches_calculator()


def _mds_runtime_checks(args, ds_config: dict, is_moe: bool) -> list[str]:
    """Conditions Megatron-DeepSpeed + DeepSpeed 0.19.8 check only once the engine starts (facts of their code):
    - deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (the
      PipelineEngine is used unless --no-pipeline-parallel);
    - deepspeed/runtime/engine.py: ZeRO-Offload with a client optimizer other than DeepSpeedCPUAdam raises
      (Megatron-DeepSpeed passes its own optimizer; --cpu-optimizer makes it DeepSpeedCPUAdam);
    - stage_1_and_2.py / bf16_optimizer.py: MoE layers need an optimizer param group marked moe
      (--create-moe-param-group);
    - megatron/training.py: --deepspeed_config is opened from the working directory (must be absolute here)."""
    out = []
    zero = (ds_config.get("zero_optimization") or {}).get("stage", 0)
    if args.ds_pipeline_enabled and zero >= 2:
        out.append("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (needs --no-pipeline-parallel)")
    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer", {}).get("device", "none")
    if offload not in (None, "none") and not args.cpu_optimizer:
        out.append("ZeRO-Offload with a client provided optimizer (needs --cpu-optimizer)")
    if is_moe and not args.create_moe_param_group:
        out.append("MoE without --create-moe-param-group")
    if not args.deepspeed:
        out.append("--deepspeed missing")
    if not (args.deepspeed_config and os.path.isabs(args.deepspeed_config) and os.path.isfile(args.deepspeed_config)):
        out.append(f"--deepspeed_config {args.deepspeed_config!r} is not an absolute path to an existing file")
    if ds_config.get("train_batch_size") != args.global_batch_size:
        out.append(f"ds_config train_batch_size {ds_config.get('train_batch_size')} != --global-batch-size "
                   f"{args.global_batch_size}")
    if ds_config.get("train_micro_batch_size_per_gpu") != args.micro_batch_size:
        out.append("ds_config train_micro_batch_size_per_gpu != --micro-batch-size")
    if getattr(args, "zero_stage", None) != zero:
        out.append(f"--zero-stage {getattr(args, 'zero_stage', None)} != ds_config stage {zero}")
    return out


def _before_jobs():
    """The committed megatron_args.txt files (the writer this module replaces), read as `xargs` would (shlex),
    for both targets, with the launch script's default DATA_ARGS."""
    import shlex

    from dstoolkit.generate.bundled import BUNDLED_SPECS, cached_bundled
    from dstoolkit.generate.megatron import DEFAULT_DATA_ARGS, TARGETS

    jobs = {t: [] for t in TARGETS}
    for stem in BUNDLED_SPECS:
        for o in cached_bundled(str(REPO / "ds_configs"), stem).generated:
            f = REPO / "ds_configs" / "generated" / stem / o.name / "megatron_args.txt"
            if not f.is_file():
                continue
            words = shlex.split(f.read_text())
            for t in TARGETS:
                jobs[t].append({"id": f"{stem}/{o.name}/megatron_args.txt as {t} (committed, before)",
                                "words": words + DEFAULT_DATA_ARGS[t].split(), "world": None,  # set by the caller
                                "cuda_device_max_connections": "1", "ds_config": o.ds_config, "is_moe": None,
                                "layout": o.chosen.candidate.label})
    return jobs


def _build_jobs(work: Path, extra_specs=()):
    """Write every bundled spec (and each extra spec file) x strategy folder (JSON + both targets) under
    `work`; return the jobs."""
    from dstoolkit.generate import generate
    from dstoolkit.generate.bundled import BUNDLED_SPECS, cached_bundled
    from dstoolkit.generate.io import load_spec_and_shape
    from dstoolkit.generate.megatron import ARGS_FILE, DEFAULT_DATA_ARGS, TARGETS, read_args_file, write_megatron_targets
    from dstoolkit.generate.megatron_lm import uses_megatron_fsdp

    jobs = {t: [] for t in TARGETS}
    skipped = []
    sources = [(stem, REPO / "ds_configs" / f"{stem}.yaml") for stem in BUNDLED_SPECS]
    sources += [(Path(p).stem, Path(p)) for p in extra_specs]
    for stem, path in sources:
        spec, shape = load_spec_and_shape(path)
        bundled = stem in BUNDLED_SPECS and path.parent == REPO / "ds_configs"
        # an extra spec is generated for both Megatron targets, so its cp / ulysses layouts are not dropped as the
        # default deepspeed target would (targets.SEQUENCE_SHARDING_TARGETS)
        outs = (cached_bundled(str(REPO / "ds_configs"), stem).generated if bundled
                else generate(spec, shape, targets=TARGETS).generated)
        for o in outs:
            # each target's files are written for the layout generate chose under that target's engine
            # (StrategyOutput.per_target: Megatron-LM's can differ from the DeepSpeed engine's)
            for t in TARGETS:
                if t in o.targets_skipped:
                    skipped.append((stem, o.name, t, o.targets_skipped[t]))
                    continue
                ranked = o.per_target.get(t)
                if ranked is None:
                    skipped.append((stem, o.name, t, "generate chose no layout for this target"))
                    continue
                if t == "megatron-deepspeed" and "ds_config.json" not in o.files:
                    skipped.append((stem, o.name, t, "no DeepSpeed config for this layout"))
                    continue
                cand = ranked.candidate
                folder = work / stem / o.name / t
                folder.mkdir(parents=True, exist_ok=True)
                if "ds_config.json" in o.files:
                    (folder / "ds_config.json").write_text(o.files["ds_config.json"])
                res = write_megatron_targets(folder, spec, shape, cand, targets=[t])
                for why in res.skipped.values():
                    skipped.append((stem, o.name, t, why))
                if ARGS_FILE[t] not in res.files:
                    continue
                words = read_args_file(res.files[ARGS_FILE[t]]) + DEFAULT_DATA_ARGS[t].split()
                cdmc = None if (t == "megatron-lm" and uses_megatron_fsdp(cand)) else "1"
                jobs[t].append({"id": f"{stem}/{o.name}/{ARGS_FILE[t]}", "words": words, "world": spec.world_size,
                                "cuda_device_max_connections": cdmc, "ds_config": o.ds_config, "is_moe": shape.is_moe,
                                "layout": cand.label})
    return jobs, skipped


def _git_head(path: str) -> str:
    try:
        return subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "(not a git checkout; pass --commit)"


def _dirty() -> bool:
    try:
        return bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megatron-lm", help="Megatron-LM source tree")
    ap.add_argument("--megatron-deepspeed", help="Megatron-DeepSpeed source tree")
    ap.add_argument("--commit", action="append", default=[], help="TARGET=SHA when the tree is not a git checkout")
    ap.add_argument("--out", help="markdown report to write")
    ap.add_argument("--spec", action="append", default=[], help="also check this spec file (repeatable)")
    ap.add_argument("--before", action="store_true", help="also check the committed megatron_args.txt files")
    ap.add_argument("--worker", nargs=3, metavar=("ROOT", "TARGET", "JOBS"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker(*a.worker)
        return 0
    roots = {"megatron-lm": a.megatron_lm, "megatron-deepspeed": a.megatron_deepspeed}
    commits = dict(c.split("=", 1) for c in a.commit)
    results, facts = {}, {}
    with tempfile.TemporaryDirectory(prefix="dstoolkit-megatron-") as tmp:
        jobs, skipped = _build_jobs(Path(tmp), a.spec)
        if a.before:
            from dstoolkit.generate.io import load_spec_and_shape

            for t, js in _before_jobs().items():
                for j in js:
                    stem = j["id"].split("/")[0]
                    spec, shape = load_spec_and_shape(REPO / "ds_configs" / f"{stem}.yaml")
                    j["world"], j["is_moe"] = spec.world_size, shape.is_moe
                jobs[t] = js + jobs[t]
        for target, root in roots.items():
            if not root:
                continue
            root = str(Path(root).resolve())
            facts[target] = commits.get(target) or _git_head(root)
            jp = Path(tmp) / f"jobs-{target}.json"
            jp.write_text(json.dumps(jobs[target]))
            t0 = time.time()
            proc = subprocess.run([sys.executable, __file__, "--worker", root, target, str(jp)],
                                  capture_output=True, text=True)
            got = {}
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    r = json.loads(line[7:])
                    got[r["id"]] = r
            for j in jobs[target]:
                r = got.get(j["id"]) or {"ok": False, "error": f"worker died: {proc.stderr.strip()[-300:]}"}
                results[j["id"]] = (j, r)
            print(f"{target}: {sum(r['ok'] for _, r in results.values() if _['id'] in got)} / {len(jobs[target])} "
                  f"accepted in {time.time() - t0:.0f} s", file=sys.stderr)
    lines = ["# Megatron argument files against the real parsers", "",
             f"Generated by `benchmarks/megatron_parsers.py` on {time.strftime('%Y-%m-%d', time.gmtime())} "
             f"(Python {sys.version.split()[0]}), dstoolkit at `{_git_head(str(REPO))[:12]}`"
             + (" plus uncommitted edits" if _dirty() else "") + ".", ""]
    for t, sha in facts.items():
        lines.append(f"- {t}: commit `{sha}` (`parse_args` + `validate_args`"
                     + (" + `core_transformer_config_from_args`)" if t == "megatron-lm"
                        else " + DeepSpeed runtime preconditions)"))
    lines += ["", f"Megatron-LM checks pretend: {PRETEND}.",
              "Each file is passed as `mapfile -t` reads it, followed by the launch script's default DATA_ARGS, "
              "with RANK=0, WORLD_SIZE = the spec's world size and CUDA_DEVICE_MAX_CONNECTIONS as the launch "
              "script sets it."]
    lines += ["", "| file | layout | world | result | checked facts / error |", "| --- | --- | --- | --- | --- |"]
    for fid, (j, r) in results.items():
        err = r.get("error", "").replace("|", "\\|").replace("\n", " ")
        fx = ", ".join(f"{k}={v}" for k, v in (r.get("facts") or {}).items() if v is not None)
        lines.append(f"| {fid} | {j['layout']} | {j['world']} | {'accepted' if r['ok'] else 'rejected'} | "
                     f"{err if not r['ok'] else fx} |")
    if skipped:
        lines += ["", "Not generated (the target cannot express the model or layout):", ""]
        for stem, strat, t, why in skipped:
            lines.append(f"- {stem}/{strat} {t}: {why}")
    new = {k: v for k, v in results.items() if "(committed, before)" not in k}
    old = {k: v for k, v in results.items() if "(committed, before)" in k}
    n_ok = sum(r["ok"] for _, r in new.values())
    lines += ["", f"Generated files: {n_ok} accepted, {len(new) - n_ok} rejected, {len(skipped)} not generated."]
    if old:
        lines.append(f"Committed megatron_args.txt (before): {sum(r['ok'] for _, r in old.values())} accepted, "
                     f"{sum(not r['ok'] for _, r in old.values())} rejected.")
    lines.append("")
    text = "\n".join(lines)
    if a.out:
        Path(a.out).write_text(text)
    print(text)
    return 0 if n_ok == len(new) else 1


if __name__ == "__main__":
    sys.exit(main())
