"""`dstoolkit tune ... -- <command>` and `dstoolkit bench train ... -- <command>` on real user scripts that are
not the project's trainer (tests/dist/user_scripts/): an HF Trainer script on a transformers model built from a
config, the same through `accelerate launch`, and a plain DeepSpeed loop. Each is tuned (budget 4, real 2-rank
gloo runs), the best config is validated (`dstoolkit validate`) and re-run by
`bench train` beside the default config (DeepSpeed's defaults for the spec's batch: ZeRO off, micro batch 1).
The figures are printed (run with -s) for the closing note."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(1500)]

S = pathlib.Path(__file__).resolve().parent / "user_scripts"
SPEC = S / "spec.yaml"
HF_FLAGS = ["--per_device_train_batch_size", "{micro_batch}", "--gradient_accumulation_steps", "{grad_accum}",
            "{precision_flag}", "--max_steps", "{max_steps}", "--output_dir", "{out}/hf", "--use_cpu",
            "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1", "--seed", "0"]
COMMANDS = {
    "hf_trainer": ["torchrun", "--nproc_per_node", "{nproc}", "--master_port", "{port}", str(S / "hf_train.py"),
                   "--deepspeed", "{hf_config}", *HF_FLAGS],
    "accelerate": ["accelerate", "launch", "--config_file", "{accelerate_config}", str(S / "hf_train.py"), *HF_FLAGS],
    "ds_loop": ["torchrun", "--nproc_per_node", "{nproc}", "--master_port", "{port}", str(S / "ds_loop.py"),
                "--config", "{config}", "--steps", "1000"],
}
DEFAULT = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
           "bf16": {"enabled": True}, "zero_optimization": {"stage": 0},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "torch_adam": True}}}


def _dstoolkit(*args, timeout=1200):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run([sys.executable, "-m", "dstoolkit", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_user_script_tuned_benched_validated_rerun(name, tmp_path):
    cmd = COMMANDS[name]
    out = tmp_path / "tune"
    p = _dstoolkit("tune", str(SPEC), "--mode", "real", "--budget", "4", "--out", str(out), "--steps", "6",
                   "--skip-steps", "2", "--trial-timeout", "300", "--no-progress", "--format", "json", "--", *cmd)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(p.stdout)
    rep = json.loads((out / "report.json").read_text())
    trials = [t for t in rep.get("trials", []) if t.get("counted")]
    assert res["evaluated"] >= 4 or "exhausted" in res["stop_reason"], res
    ok = [t for t in trials if t["status"] == "ok"]
    assert ok and res["best"] is not None, trials
    for t in trials:
        m = t.get("measured") or {}
        print(f"[{name}] tune trial #{t['number']} {t['status']:<7} {t['label']:<40} "
              f"{(m.get('tokens_per_s') or 0):8.0f} tok/s  {t.get('reason') or ''}")
        if t["status"] == "ok":
            assert m["source"] == "deepspeed engine hook" and m["timed_steps"] == 4, m
            assert str(out) in m["command"] and "{" not in m["command"]
    # the flags the command asked for, and only those, were filled
    used = set(ok[0]["measured"]["placeholders"])
    assert used <= {"nproc", "port", "hf_config", "accelerate_config", "config", "micro_batch", "grad_accum",
                    "precision_flag", "max_steps", "out"}
    best = out / "best_ds_config.json"
    v = _dstoolkit("validate", str(best), timeout=300)
    assert v.returncode == 0, v.stdout + v.stderr

    default = tmp_path / "default.json"
    default.write_text(json.dumps(DEFAULT))
    b = _dstoolkit("bench", "train", str(default), str(best), "--spec", str(SPEC), "--steps", "10", "--skip-steps",
                   "3", "--no-progress", "--timeout-s", "300", "--format", "json", "--", *cmd)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
    recs = {r["config_name"]: r for r in json.loads(b.stdout)}
    assert set(recs) == {"default", "best_ds_config"}, list(recs)
    for r in recs.values():
        assert r["status"] == "ok" and r["measured"]["tokens_per_s"] > 0, r
    d, bb = recs["default"]["measured"], recs["best_ds_config"]["measured"]
    print(f"[{name}] best {res['best']['label']}: tune {res['best']['value']:.0f} tok/s; bench re-run "
          f"{bb['tokens_per_s']:.0f} tok/s (step {bb['step_time_s_median']:.3f} s, est "
          f"{(recs['best_ds_config'].get('estimate') or {}).get('tokens_per_s') or 0:.0f}) vs default (zero0 mb1 "
          f"ga4) {d['tokens_per_s']:.0f} tok/s (step {d['step_time_s_median']:.3f} s) = "
          f"x{bb['tokens_per_s'] / d['tokens_per_s']:.2f}")


# ------------------------------------------------------------------------------------------------------------
# The helpers inside the user's loop: Guard (plain DeepSpeed) and DstoolkitCallback (HF Trainer), real 2 ranks
# ------------------------------------------------------------------------------------------------------------
def _torchrun(script, *args, env=None):
    from dstoolkit.runtime.train.launch import free_port

    return [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
            str(free_port()), str(S / script), *map(str, args)]


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _events(path):
    rows = [json.loads(ln) for ln in pathlib.Path(path).read_text().splitlines() if ln.strip()]
    return rows, [r for r in rows if "event" in r]


def _run_and_kill_a_rank(cmd, env, ready, timeout=400):
    """Start `cmd`, SIGKILL one rank once `ready()` is true; returns the launcher's exit code."""
    import signal
    import time

    import psutil

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.monotonic()
    try:
        while not ready():
            assert proc.poll() is None, "the run ended before the kill point"
            assert time.monotonic() - t0 < timeout, "kill point not reached"
            time.sleep(0.2)
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True)
                 if any(str(S) in a for a in c.cmdline())]
        victim = max(ranks, key=lambda c: c.pid)  # the last rank started
        victim.send_signal(signal.SIGKILL)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            from dstoolkit.tune.objective import kill_tree

            kill_tree(proc.pid)


LOOP_DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
           "zero_optimization": {"stage": 1}}


def test_guard_plain_loop_poison_skipped_lr_blowup_rolled_back(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(LOOP_DS))
    m = tmp_path / "m.jsonl"
    p = subprocess.run(_torchrun("ds_loop.py", "--config", ds, "--steps", 30, "--guard", "--ckpt", tmp_path / "ck",
                                 "--save-every", 4, "--poison-step", 12, "--lr-blowup", "20:1000", "--metrics", m),
                       env=_env(), capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows, ev = _events(m)
    spikes = [e for e in ev if e["event"] == "spike" and e["kind"] == "loss_spike"]
    assert spikes[0]["step"] == 13 and spikes[0]["action"] == "skip"  # the poisoned batch, never trained on
    rb = [e for e in ev if e["event"] == "rollback"]
    assert rb and rb[0]["to_tag"] == "step_00000020" and rb[0]["step"] > 20, ev
    after = [r["loss"] for r in rows if "event" not in r and r["step"] > 22][-5:]
    before = [r["loss"] for r in rows if "event" not in r and 16 <= r["step"] <= 20]
    assert max(after) < max(before), (before, after)  # back in (below) the pre-spike band
    assert ev[-1]["event"] == "done" and ev[-1]["step"] == 30
    print(f"[guard] poison at step 13 skipped; LR x1000 at step 21 -> {len(rb)} rollback(s) to {rb[0]['to_tag']}; "
          f"loss before {['%.3f' % x for x in before]} after {['%.3f' % x for x in after]}")


def test_guard_resume_after_killed_rank(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(LOOP_DS))
    m = tmp_path / "m.jsonl"
    cmd = _torchrun("ds_loop.py", "--config", ds, "--steps", 40, "--guard", "--ckpt", tmp_path / "ck",
                    "--save-every", 4, "--metrics", m)

    def ready():
        return m.exists() and any(e.get("event") == "checkpoint" and e["step"] >= 8 for e in _events(m)[1])

    rc = _run_and_kill_a_rank(cmd, _env(), ready)
    assert rc != 0
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows, ev = _events(m)
    res = [e for e in ev if e["event"] == "resume"]
    assert len(res) == 2 and res[1]["tag"] is not None and res[1]["step"] >= 8, res
    assert ev[-1]["event"] == "done" and ev[-1]["step"] == 40
    print(f"[guard] rank killed after {res[1]['tag']}; rerun resumed at step {res[1]['step']} and finished 40")


HF_CB = ["--deepspeed", None, "--per_device_train_batch_size", 4, "--learning_rate", 0.01, "--lr_scheduler_type",
         "constant", "--use_cpu", "--report_to", "none", "--save_strategy", "steps", "--save_steps", 4,
         "--logging_steps", 5, "--dstoolkit_callback", "--spec", SPEC]
HF_DS = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
         "gradient_clipping": "auto", "zero_optimization": {"stage": 1}}


def _hf_args(tmp_path, *more):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(HF_DS))
    args = list(HF_CB)
    args[1] = ds
    return [*args, "--output_dir", tmp_path / "out", *more]


def test_hf_callback_poison_skipped_lr_blowup_rolled_back(tmp_path):
    m = tmp_path / "cb.jsonl"
    p = subprocess.run(_torchrun("hf_train.py", *_hf_args(tmp_path, "--max_steps", 30, "--poison_step", 12,
                                                          "--lr_blowup", "22:1000")),
                       env=_env(DSTOOLKIT_CALLBACK_METRICS=str(m)), capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows, ev = _events(m)
    spikes = [e for e in ev if e["event"] == "spike"]
    assert spikes[0]["step"] == 12 and spikes[0]["action"] == "skip", spikes
    rb = [e for e in ev if e["event"] == "rollback"]
    assert rb and rb[0]["to"] == "checkpoint-20", ev
    after = [r["loss"] for r in rows if "event" not in r and r["step"] > rb[-1]["step"]]
    before = [r["loss"] for r in rows if "event" not in r and 16 <= r["step"] <= 21]
    assert after and max(after) < 2 * max(before), (before, after)
    mon = [e for e in ev if e["event"] == "monitor"]
    assert mon and mon[-1]["tokens_per_s"] > 0 and mon[-1]["peak_memory_bytes"] > 0
    assert mon[-1]["estimate"] and mon[-1]["estimate"]["tokens_per_s"] > 0 and mon[-1]["mfu"] > 0, mon[-1]
    assert "[dstoolkit] step 30:" in p.stderr and "(est " in p.stderr
    print(f"[hf callback] poison at step 12 skipped; LR x1000 at step 22 -> {len(rb)} rollback(s) to "
          f"{rb[0]['to']}; loss before {['%.3f' % x for x in before]} after {['%.3f' % x for x in after]}; "
          f"monitor {mon[-1]['tokens_per_s']:.0f} tok/s (est {mon[-1]['estimate']['tokens_per_s']:.0f}), "
          f"MFU {mon[-1]['mfu']:.2e} (est {mon[-1]['estimate']['mfu']:.2e})")


def test_hf_callback_resume_after_killed_rank(tmp_path):
    m = tmp_path / "cb.jsonl"
    cmd = _torchrun("hf_train.py", *_hf_args(tmp_path, "--max_steps", 24))
    out = tmp_path / "out"

    def ready():
        return (out / "checkpoint-8" / "dstoolkit_guard.json").is_file()

    rc = _run_and_kill_a_rank(cmd, _env(DSTOOLKIT_CALLBACK_METRICS=str(m)), ready)
    assert rc != 0
    p = subprocess.run(cmd + ["--resume"], env=_env(DSTOOLKIT_CALLBACK_METRICS=str(m)), capture_output=True,
                       text=True, timeout=500)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows, ev = _events(m)
    res = [e for e in ev if e["event"] == "resume"]
    assert res and res[0]["step"] >= 8, ev
    assert ev[-1]["event"] == "done" and ev[-1]["step"] == 24
    from dstoolkit.ckpt.inspect import inspect_checkpoint  # `dstoolkit ckpt inspect` on an HF Trainer output_dir

    info = inspect_checkpoint(out)
    assert (info.format, info.step, info.zero_stage, info.dp, info.complete) == ("hf-trainer", 24, 1, 2, True), info
    print(f"[hf callback] rank killed after checkpoint-8; rerun resumed at step {res[0]['step']} (Trainer "
          "checkpoint + the guard's state) and finished 24")
