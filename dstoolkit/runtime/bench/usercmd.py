"""The user's own command (`dstoolkit bench train CONFIG... -- <command>`, `dstoolkit tune ... -- <command>`):
placeholders filled, target files written (the DeepSpeed JSON, its HF Trainer form, an accelerate YAML), the
launcher found, the run started with the metrics hook (`dstoolkit.runtime.bench.metrics_hook`) and measured;
a failed run classified (oom / timeout / error). Also the config's HF "auto" values made concrete for the
estimate beside a run (`resolve_user_config`).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench import harness, results_jsonl, targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.metrics_hook import install_hook
from dstoolkit.runtime.bench.train_report import hf_log_metrics, summarize_hook_rows
from dstoolkit.runtime.jitlock import check_locks
from dstoolkit.runtime.train.shm import remove_orphaned_buffers

# Markers in a failed run's output that mean the rank ran out of memory (torch CUDA OOM, host allocator).
OOM_MARKERS = ("out of memory", "OutOfMemoryError", "CUDA error: out of memory", "std::bad_alloc",
               "Cannot allocate memory")


ERROR_MARKERS = ("error:", "errno", "can't open file", "no such file", "not found")
"""Lower-case markers of the line that says why a rank failed (a Python exception, a missing script)."""
LAUNCHER_WRAPPER_MARKERS = ("ChildFailedError", "torch/distributed/elastic", "torch.distributed.elastic",
                            "failed (exitcode:")
"""Lines in which torchrun reports that a child failed: they name no cause, the rank's own line does."""


def _failure(rc: int, tail: str, timeout_s: float, timed_out: bool) -> tuple[str, str]:
    """(status, one-line reason) for a failed run."""
    if timed_out:
        return "timeout", f"no result within {timeout_s:g} s (--trial-timeout)"
    low = tail.lower()
    if rc in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(m.lower() in low for m in OOM_MARKERS):
        why = next((ln.strip() for ln in tail.splitlines() if any(m.lower() in ln.lower() for m in OOM_MARKERS)),
                   f"a rank was killed (exit {rc}; the kernel OOM killer sends SIGKILL)")
        return "oom", why[:300]
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    # the rank's own error, not the launcher's report of it (torchrun's ChildFailedError, its per-rank banner)
    own = [ln for ln in lines if not any(w in ln for w in LAUNCHER_WRAPPER_MARKERS)]
    first = next((ln for ln in own if "training failed" in ln or any(m in ln.lower() for m in ERROR_MARKERS)),
                 None) or next((ln for ln in lines if "error:" in ln.lower()), None)
    return "error", (first or (lines[-1] if lines else f"exit code {rc}"))[:300] + f" (exit {rc})"


def kill_tree(pid: int) -> None:
    """SIGKILL a launcher and every process under it. torchrun starts each rank in its own session, so
    killing the launcher's process group would leave the ranks running; psutil (a DeepSpeed dependency)
    walks the tree instead."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    kill_procs(procs)


def kill_procs(procs: list) -> None:
    """SIGKILL `procs` (psutil.Process objects: psutil refuses a pid that now names another process) and wait up to
    10 s for them (reaping this process's own children)."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


LAUNCHERS = ("torchrun", "deepspeed", "accelerate")
"""Launchers a user's command may start with by bare name; found beside the interpreter when not on PATH."""


def find_launcher(cmd: list[str], path: Optional[str] = None) -> list[str]:
    """`cmd` with a bare launcher name (torchrun, deepspeed, accelerate) that is not on PATH replaced by the one
    beside the interpreter running dstoolkit (a venv used without activating it).

    Raises:
        BenchInputError: the launcher is neither on PATH nor beside the interpreter (the message names it and
            how to fix PATH).
    """
    if not cmd or cmd[0] not in LAUNCHERS or shutil.which(cmd[0], path=path):
        return cmd
    beside = pathlib.Path(sys.executable).parent / cmd[0]
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside), *cmd[1:]]
    raise BenchInputError(
        f"command {cmd[0]!r} (the first word after `--`) is not on PATH and not beside {sys.executable}: install it "
        f"into that environment (pip install {'accelerate' if cmd[0] == 'accelerate' else 'torch deepspeed'}), add "
        f"its folder to PATH (export PATH=/path/to/venv/bin:$PATH), or give its full path")


# HF TrainingArguments flags in the user's command -> dstoolkit.dsconfig.auto.resolve_auto's argument
HF_COMMAND_FLAGS: dict[str, tuple[str, type]] = {
    "per_device_train_batch_size": ("micro_batch", int), "gradient_accumulation_steps": ("grad_accum", int),
    "learning_rate": ("lr", float), "max_grad_norm": ("max_grad_norm", float), "adam_epsilon": ("eps", float),
    "weight_decay": ("weight_decay", float), "warmup_steps": ("warmup_steps", int), "max_steps": ("total_steps", int),
}


def command_flag_values(command: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """The HF flags the user's command sets to a literal value ({placeholders} are not values):
    {resolve_auto argument: (value, "--flag V in the command")}; --bf16 / --fp16 give the precision."""
    out: dict[str, tuple[Any, str]] = {}
    args = list(command)
    for i, a in enumerate(args):
        name, _, val = a.lstrip("-").partition("=")
        if not a.startswith("--"):
            continue
        if name in ("bf16", "fp16") and not val:
            out["precision"] = (name, f"--{name} in the command")
        if name not in HF_COMMAND_FLAGS:
            continue
        if not val and i + 1 < len(args):
            val = args[i + 1]
        key, typ = HF_COMMAND_FLAGS[name]
        try:
            out[key] = (typ(val), f"--{name} {val} in the command")
        except ValueError:  # a placeholder such as {micro_batch}: not a value the user gave
            pass
    return out


def resolve_user_config(cfg: dict, *, command: Sequence[str], spec, world_size: int,
                        hidden_size: Optional[int] = None) -> tuple[dict, list[str]]:
    """A config with HF "auto" values, made concrete for the estimate only (the run gets the user's file as it
    is): each "auto" from the command's HF flags, else the spec's training section, else HF's default
    (`dstoolkit.dsconfig.auto.resolve_auto`). Returns (resolved config, "pointer = value (source)" lines)."""
    from dstoolkit.dsconfig.auto import find_auto, resolve_auto

    if not find_auto(cfg):
        return cfg, []
    given = command_flag_values(command)
    if spec is not None:
        t = spec.training
        mb = given.get("micro_batch", (t.micro_batch, "spec training.micro_batch"))
        given.setdefault("micro_batch", mb)
        if t.global_batch and isinstance(mb[0], int) and mb[0] > 0 and t.global_batch % (mb[0] * world_size) == 0:
            given.setdefault("grad_accum", (t.global_batch // (mb[0] * world_size),
                                            f"spec training.global_batch {t.global_batch} / (micro {mb[0]} x "
                                            f"{world_size} ranks)"))
        given.setdefault("precision", (t.precision, f"spec training.precision {t.precision}"))
        if getattr(t, "lr", None):
            given.setdefault("lr", (t.lr, "spec training.lr"))
    rep = resolve_auto(cfg, world_size=world_size, hidden_size=hidden_size,
                       **{k: v for k, (v, _src) in given.items()})
    src_of = {"/train_micro_batch_size_per_gpu": "micro_batch", "/gradient_accumulation_steps": "grad_accum",
              "/gradient_clipping": "max_grad_norm", "/optimizer/params/lr": "lr", "/optimizer/params/eps": "eps",
              "/optimizer/params/weight_decay": "weight_decay", "/scheduler/params/warmup_max_lr": "lr",
              "/scheduler/params/warmup_num_steps": "warmup_steps", "/scheduler/params/total_num_steps": "total_steps",
              "/fp16/enabled": "precision", "/bf16/enabled": "precision"}
    lines = []
    for ptr, value, src in rep.filled:
        key = src_of.get(ptr)
        lines.append(f"{ptr} = {json.dumps(value)} ({given[key][1] if key in given else src})")
    resolved = rep.config
    for ptr, why in rep.unfilled:  # left "auto": drop it for the estimate (DeepSpeed's default), and say so
        parts = [p for p in ptr.split("/") if p]
        node = resolved
        for p in parts[:-1]:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(parts[-1], None)
        lines.append(f"{ptr} left out ({why})")
    return resolved, lines


COMMAND_PLACEHOLDERS = {
    "config": "the run's DeepSpeed JSON (every value concrete)",
    "hf_config": "the same JSON in the HF Trainer form: batch, precision, clipping and optimizer values 'auto'",
    "accelerate_config": "an `accelerate launch --config_file` YAML (DeepSpeed, {world_size} local processes)",
    "micro_batch": "train_micro_batch_size_per_gpu", "grad_accum": "gradient_accumulation_steps",
    "global_batch": "train_batch_size", "precision": "bf16 | fp16 | fp32",
    "precision_flag": "--bf16 | --fp16 | nothing (the argument is dropped)",
    "max_steps": "optimizer steps of the run (warm-up + timed)", "world_size": "ranks", "nproc": "ranks",
    "port": "a free TCP port for the rendezvous", "out": "the run's own folder",
}


def precision_of(ds_config: dict) -> str:
    if (ds_config.get("bf16") or {}).get("enabled"):
        return "bf16"
    if (ds_config.get("fp16") or {}).get("enabled"):
        return "fp16"
    return "fp32"


def hf_form(ds_config: dict) -> dict:
    """The DeepSpeed JSON as HF Trainer wants it: the values TrainingArguments also sets are "auto" (HF fills
    them from --per_device_train_batch_size, --gradient_accumulation_steps, --bf16/--fp16, --max_grad_norm, the
    learning rate flags); a concrete value that disagrees with them makes HF refuse the config. The ZeRO section
    and everything else stay as generated, so the tuned ZeRO knobs (bucket sizes, overlap_comm) reach the run.
    (`dstoolkit.generate.hf_targets.build_hf_ds_config` builds the HF file from a strategy instead; it sets the
    bucket sizes to "auto", which HF fills from the hidden size: right for `generate`, but it would
    undo the tuner's bucket-scale choice.)"""
    cfg = json.loads(json.dumps(ds_config))
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
              "gradient_clipping"):
        cfg[k] = "auto"
    for k in ("bf16", "fp16"):
        if k in cfg:
            cfg[k] = {**cfg[k], "enabled": "auto"}
    opt = cfg.get("optimizer")
    if isinstance(opt, dict):
        params = dict(opt.get("params") or {})
        for k in ("lr", "betas", "eps", "weight_decay"):
            params[k] = "auto"
        opt["params"] = params
    sch = cfg.get("scheduler")
    if isinstance(sch, dict):
        sch["params"] = {k: "auto" for k in (sch.get("params") or {})}
    return cfg


def accelerate_yaml(hf_json: pathlib.Path, world_size: int, port: int) -> str:
    """An `accelerate launch --config_file` file: DeepSpeed with the HF-form JSON, local processes."""
    import torch

    cpu = not torch.cuda.is_available()
    return "\n".join([
        "compute_environment: LOCAL_MACHINE", "distributed_type: DEEPSPEED", "deepspeed_config:",
        f"  deepspeed_config_file: {hf_json}", "  zero3_init_flag: false", "machine_rank: 0",
        "main_training_function: main", "num_machines: 1", f"num_processes: {world_size}",
        "main_process_ip: 127.0.0.1", f"main_process_port: {port}", "rdzv_backend: static",
        f"use_cpu: {'true' if cpu else 'false'}", "same_network: true", ""])


def command_values(ds_config: dict, run_dir: pathlib.Path, *, world_size: int, steps: int,
                   resolved: Optional[dict] = None) -> dict[str, str]:
    """Write the run's target files and return every placeholder's value. {config} is `ds_config` as the user
    gave it ("auto" values and all); the numbers ({micro_batch}, {precision}...) come from `resolved` (its
    "auto" values made concrete, `resolve_user_config`) when given."""
    run_dir.mkdir(parents=True, exist_ok=True)
    ds_path = run_dir / "ds_config.json"
    ds_path.write_text(json.dumps(ds_config, indent=1) + "\n")
    hf_path = run_dir / "hf_ds_config.json"
    hf_path.write_text(json.dumps(hf_form(ds_config), indent=1) + "\n")
    ds_config = resolved if resolved is not None else ds_config
    port = harness.free_port()
    acc_path = run_dir / "accelerate_config.yaml"
    acc_path.write_text(accelerate_yaml(hf_path.resolve(), world_size, port))
    mb = int(ds_config.get("train_micro_batch_size_per_gpu") or 1)
    ga = int(ds_config.get("gradient_accumulation_steps") or 1)
    prec = precision_of(ds_config)
    return {"config": str(ds_path.resolve()), "hf_config": str(hf_path.resolve()),
            "accelerate_config": str(acc_path.resolve()), "micro_batch": str(mb), "grad_accum": str(ga),
            "global_batch": str(int(ds_config.get("train_batch_size") or mb * ga * world_size)),
            "precision": prec, "precision_flag": {"bf16": "--bf16", "fp16": "--fp16"}.get(prec, ""),
            "max_steps": str(steps), "world_size": str(world_size), "nproc": str(world_size), "port": str(port),
            "out": str(run_dir.resolve())}


def fill_command(template: Sequence[str], values: dict[str, str]) -> list[str]:
    """Fill {name} placeholders in each argument (str.format_map; {{ }} for literal braces). An argument that
    is only a placeholder whose value is empty (e.g. {precision_flag} at fp32) is dropped.

    Raises:
        BenchInputError: an unknown placeholder.
    """
    out = []
    for arg in template:
        try:
            filled = arg.format_map(values)
        except KeyError as exc:
            raise BenchInputError(f"command argument {arg!r}: unknown placeholder {{{exc.args[0]}}}; known: "
                                  + ", ".join("{" + k + "}" for k in COMMAND_PLACEHOLDERS)) from None
        except (ValueError, IndexError) as exc:
            raise BenchInputError(f"command argument {arg!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
        if filled == "" and arg.strip():
            continue
        out.append(filled)
    return out


def placeholders_used(template: Sequence[str]) -> list[str]:
    import string

    used = []
    for arg in template:
        for _, name, _, _ in string.Formatter().parse(arg):
            if name and name not in used:
                used.append(name)
    return used


def run_command(template: Sequence[str], ds_config: dict, run_dir: pathlib.Path, *, steps: int, skip_steps: int,
                world_size: int, timeout_s: float, seq_len: Optional[int] = None,
                extra_env: Optional[dict[str, str]] = None, who: str = "bench train",
                resolved: Optional[dict] = None) -> dict[str, Any]:
    """Run the user's command once for `ds_config` and measure it (never raises for a failed run).

    Returns:
        {"status": "ok"|"oom"|"timeout"|"error", "reason", "returncode", "command" (filled argv as a string),
         "placeholders" {name: value} (the ones the command uses), "measured" (when ok), "wall_s", "log"}.
    """
    values = command_values(ds_config, run_dir, world_size=world_size, steps=steps, resolved=resolved)
    cmd = find_launcher(fill_command(template, values))
    used = {k: values[k] for k in placeholders_used(template)}
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    hook = install_hook(run_dir)
    env = targets_mod.env_for_ranks()
    env["PYTHONPATH"] = os.pathsep.join([str(hook)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["DSTOOLKIT_METRICS"] = str(metrics.resolve())
    env["DSTOOLKIT_STOP_AFTER"] = str(steps)
    env.setdefault("LOCAL_SIZE", str(world_size))
    env.update(extra_env or {})
    check_locks(who=who)
    log_path = run_dir / "log.txt"
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        log.write(f"# dstoolkit: {' '.join(cmd)}\n# placeholders set: {json.dumps(used)}\n")
        log.flush()
        # in the caller's working directory, as the user typed the command (`train.py` relative to it); what the
        # run writes goes where the placeholders point ({out}, {config}: absolute paths under run_dir)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc.pid)
            rc = proc.wait()
        except BaseException:
            kill_tree(proc.pid)
            proc.wait()
            remove_orphaned_buffers()
            raise
    wall = time.perf_counter() - t0
    remove_orphaned_buffers()
    if timed_out:
        check_locks(who=who, since_s=time.time() - wall - 1, min_age_s=2.0, wait_timeout_s=5.0)
    text = log_path.read_text(errors="replace")
    tail = text[-4000:]
    rows = results_jsonl.read_records(metrics) if metrics.exists() else []
    body: dict[str, Any] = {"command": " ".join(cmd), "placeholders": used, "returncode": rc, "wall_s": wall,
                            "log": str(log_path)}
    measured = None
    if rc == 0 and not timed_out:
        try:
            measured = summarize_hook_rows(rows, skip_steps) if rows else hf_log_metrics(text, seq_len)
        except RuntimeError as exc:
            body.update(status="error", reason=str(exc), error_tail=tail[-2000:])
            return body
    if measured is None:
        status, reason = _failure(rc, tail, timeout_s, timed_out)
        if rc == 0 and not timed_out:
            status, reason = "error", ("the command exited 0 but no DeepSpeed engine step was seen and no HF Trainer "
                                       "train_samples_per_second line was printed")
        body.update(status=status, reason=reason, error_tail=tail[-2000:])
        return body
    if measured.get("tokens_per_s") is None and measured.get("samples_per_s") and seq_len:
        measured["tokens_per_s"] = measured["samples_per_s"] * seq_len
    body.update(status="ok", reason="", measured=measured)
    return body
