"""The metrics hook for the user's own command (`dstoolkit bench train CONFIG... -- <command>`,
`dstoolkit tune ... -- <command>`).

How a run of an arbitrary command is measured without touching its code: a `sitecustomize.py` is written
next to the run and put first on PYTHONPATH, so every Python process the command starts (torchrun, accelerate
launch, the deepspeed launcher, the ranks) imports it. With DSTOOLKIT_METRICS set it installs a post-import
hook on `deepspeed.runtime.engine` that wraps `DeepSpeedEngine.forward/backward/step`: at every optimizer
step (the accumulation boundary, `engine.global_steps` advancing) rank 0 appends one JSON line
{"step", "step_time_s", "tokens", "samples", "loss", "peak_memory_bytes", "micro_batch", "grad_accum",
"global_batch", "world_size"} to $DSTOOLKIT_METRICS. tokens = the input_ids elements rank 0's forward saw
in the step x data-parallel ranks. With DSTOOLKIT_STOP_AFTER=N every rank leaves after optimizer step N
(barrier, then exit 0): warm-up + K timed steps, then stop, whatever the script's own step count.
Each line also has "comm_wait_s" (rank 0's time blocked in collectives that step: the timed hooks of
dstoolkit.runtime.train.commtime), and every DSTOOLKIT_CROSS_RANK_EVERY steps (default 10, 0: off) every rank
joins the cross-rank view (dstoolkit.runtime.train.crossrank.StepWindows): rank 0 appends a "cross_rank" event
with the per-rank table and prints the bottleneck line when a rank or host stands out.
A command that never builds a DeepSpeed engine gets no hook lines; then HF Trainer's final log line
('train_samples_per_second') is read from the output instead.
"""
from __future__ import annotations

import pathlib

HOOK_SOURCE = r'''
# Written by dstoolkit (dstoolkit/runtime/bench/metrics_hook.py): per-step metrics of DeepSpeed engines. Inert unless
# DSTOOLKIT_METRICS is set.
import os as _os
import sys as _sys


def _dstoolkit_rank_guards():
    # Every rank of the user's job: the process groups destroyed before the interpreter exits (a gloo worker
    # thread alive at exit aborts a finished run: dstoolkit/runtime/rankexit.py) and a JIT-build lock wait that
    # says what it waits for and removes a lock whose builder is gone (dstoolkit/runtime/jitlock.py).
    try:
        from dstoolkit.runtime.rankexit import install_rank_guards
    except ImportError:  # the user's interpreter does not have dstoolkit: the one dstoolkit was run from does
        _sys.path.append(_DSTOOLKIT_ROOT)
        try:
            from dstoolkit.runtime.rankexit import install_rank_guards
        except ImportError:
            install_rank_guards = None
    if install_rank_guards is not None:
        install_rank_guards("dstoolkit hook")
        return
    import atexit

    def _destroy():
        try:
            import torch.distributed as d
            if d.is_available() and d.is_initialized():
                d.destroy_process_group()
        except Exception:
            pass
    atexit.register(_destroy)


def _dstoolkit_patch(mod):
    import json, time
    E = getattr(mod, "DeepSpeedEngine", None)
    if E is None or getattr(E, "_dstoolkit_hooked", False):
        return
    E._dstoolkit_hooked = True
    _dstoolkit_rank_guards()
    path = _os.environ["DSTOOLKIT_METRICS"]
    stop = int(_os.environ.get("DSTOOLKIT_STOP_AFTER") or 0)
    every = int(_os.environ.get("DSTOOLKIT_CROSS_RANK_EVERY") or 10)  # cross-rank view window (0: off)
    st = {"t": None, "tokens": 0, "samples": 0, "loss": None, "comm": 0.0}
    fwd, bwd, stp = E.forward, E.backward, E.step
    try:  # time blocked in collectives per step (dstoolkit.runtime.train.commtime), when dstoolkit imports here
        from dstoolkit.runtime.train.commtime import comm_timer_total_s, install_comm_timer
        install_comm_timer()
    except Exception:
        comm_timer_total_s = lambda: None

    def _rank():
        try:
            import torch.distributed as d
            return d.get_rank() if d.is_initialized() else int(_os.environ.get("RANK", "0"))
        except Exception:
            return 0

    def forward(self, *a, **k):
        if st["t"] is None:
            st["t"] = time.perf_counter()
        x = k.get("input_ids")
        if x is None:
            x = next((v for v in a if hasattr(v, "numel") and hasattr(v, "dim")), None)
        if x is not None and hasattr(x, "numel"):
            st["tokens"] += int(x.numel())
            st["samples"] += int(x.shape[0]) if x.dim() else 1
        return fwd(self, *a, **k)

    def backward(self, loss, *a, **k):
        try:
            st["loss"] = float(loss.detach().float().item())
        except Exception:
            pass
        return bwd(self, loss, *a, **k)

    def step(self, *a, **k):
        before = self.global_steps
        out = stp(self, *a, **k)
        if self.global_steps == before:
            return out
        now = time.perf_counter()
        if _rank() == 0:
            try:
                import torch
                if torch.cuda.is_available():
                    peak = int(torch.cuda.max_memory_allocated())
                else:
                    import resource
                    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
            except Exception:
                peak = None
            dp = int(getattr(self, "dp_world_size", 1) or 1)
            row = {"step": int(self.global_steps), "step_time_s": now - (st["t"] or now),
                   "tokens": st["tokens"] * dp, "samples": st["samples"] * dp, "loss": st["loss"],
                   "peak_memory_bytes": peak, "micro_batch": self.train_micro_batch_size_per_gpu(),
                   "grad_accum": self.gradient_accumulation_steps(), "global_batch": self.train_batch_size(),
                   "world_size": int(_os.environ.get("WORLD_SIZE", "1")),
                   "skipped_steps": int(getattr(self, "skipped_steps", 0) or 0)}
            total = comm_timer_total_s()
            row["comm_wait_s"] = None if total is None else total - st["comm"]
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")
        win = st.get("win")
        if win is None and every:  # every rank builds it at the same step (its first gather is collective)
            try:
                import torch.distributed as d
                from dstoolkit.runtime.train.crossrank import CrossRank, StepWindows
                multi = d.is_initialized() and d.get_world_size() > 1
                win = st["win"] = StepWindows(every, cross=CrossRank() if multi else None)
            except Exception:
                win = st["win"] = False
        if win:
            try:
                import resource
                mem = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
            except Exception:
                mem = 0.0
            rec = win.step(int(self.global_steps), now - (st["t"] or now), mem_bytes=mem)
            if rec is not None and _rank() == 0:
                with open(path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                if rec.get("bottleneck_line"):
                    print(rec["bottleneck_line"], file=_sys.stderr, flush=True)
        st.update(t=now, tokens=0, samples=0, comm=comm_timer_total_s() or 0.0)
        if stop and self.global_steps >= stop:
            if _rank() == 0:
                with open(path, "a") as f:
                    f.write(json.dumps({"event": "stop", "step": int(self.global_steps)}) + "\n")
            try:
                import torch.distributed as d
                if d.is_initialized():
                    d.barrier()
            except Exception:
                pass
            _sys.stdout.flush()
            _sys.stderr.flush()
            _os._exit(0)
        return out

    E.forward, E.backward, E.step = forward, backward, step


if _os.environ.get("DSTOOLKIT_METRICS"):
    import importlib.abc as _abc
    import importlib.machinery as _mach

    class _DstoolkitFinder(_abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "deepspeed.runtime.engine":
                return None
            _sys.meta_path.remove(self)
            spec = _mach.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _dstoolkit_patch(module)
            spec.loader.exec_module = exec_module
            return spec

    _sys.meta_path.insert(0, _DstoolkitFinder())
'''


def install_hook(run_dir: pathlib.Path) -> pathlib.Path:
    """Write the metrics hook (`HOOK_SOURCE`) as <run_dir>/_dstoolkit_hook/sitecustomize.py; returns the folder
    to put first on PYTHONPATH."""
    d = run_dir / "_dstoolkit_hook"
    d.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(__file__).resolve().parents[3]  # the folder holding the dstoolkit package
    (d / "sitecustomize.py").write_text(f"_DSTOOLKIT_ROOT = {str(root)!r}\n" + HOOK_SOURCE)
    return d
