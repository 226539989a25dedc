"""`dstoolkit tune ... -- <command>` and `dstoolkit bench train ... -- <command>` on real user scripts that are
not the project's trainer (tests/dist/user_scripts/): an HF Trainer script on a transformers model built from a
config, the same through `accelerate launch`, and a plain DeepSpeed loop. Each is tuned (budget 4, real 2-rank
gloo runs, 4 optimizer steps per trial), the best config is validated (`dstoolkit validate`) and re-run by
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
    p = _dstoolkit("tune", str(SPEC), "--mode", "real", "--budget", "4", "--out", str(out), "--steps", "4",
                   "--skip-steps", "1", "--trial-timeout", "300", "--no-progress", "--format", "json", "--", *cmd)
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
            assert m["source"] == "deepspeed engine hook" and m["timed_steps"] == 3, m
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
    b = _dstoolkit("bench", "train", str(default), str(best), "--spec", str(SPEC), "--steps", "6", "--skip-steps",
                   "2", "--no-progress", "--timeout-s", "300", "--format", "json", "--", *cmd)
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
