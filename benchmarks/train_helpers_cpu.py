"""Training-helpers benchmark on this CPU machine (2 gloo ranks): the closing-note numbers of issue #7.

    .venv/bin/python benchmarks/train_helpers_cpu.py [--out benchmarks/results] [--steps 25] [--skip A,B,...]

Parts (each real, none copied from our own output):
  step_time   seconds per optimizer step of the `tiny` preset (and `tiny-moe` at ep=2), ZeRO-2 bf16, 2 ranks,
              the example trainer; median / p10 / p90 over the steps after warm-up (`runtime.bench.stats.summarize`).
  activations saved-tensor bytes per checkpoint policy (torch.autograd.graph.saved_tensors_hooks, bf16, one
              process) vs `dstoolkit.estimate.activation_bytes` for the SAME CheckpointPolicy; absolute bytes,
              saving vs none, and the error of each.
  resume      SIGKILL of rank 1 mid-run, newest checkpoint truncated, relaunch with --resume: max |loss
              difference| against an uninterrupted run, and the data positions.
  spike       a poisoned batch and an LR blow-up injected into one run: detection, action and recovery trace.
Writes benchmarks/results/train_helpers_cpu2_<yyyymm>.json (+ .md). Records versions, git commit, load.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import pathlib
import sys
import tempfile

import yaml

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dstoolkit.common.atomic import atomic_write_text  # noqa: E402
from dstoolkit.runtime.bench import harness, stats  # noqa: E402
from dstoolkit.runtime.train.ckpt import tag_for  # noqa: E402
from dstoolkit.runtime.train.launch import read_metrics, run_local, start_local  # noqa: E402

SMALL_MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
"""The fast shape the resume / spike scenarios use (the dist tests use the same)."""


def _ds(gb: int, micro: int, lr: float, stage: int = 2) -> dict:
    return {"train_batch_size": gb, "train_micro_batch_size_per_gpu": micro,
            "optimizer": {"type": "AdamW", "params": {"lr": lr, "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": True}}


def _write(work: pathlib.Path, name: str, spec: dict, ds: dict) -> list[str]:
    (work / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    (work / f"{name}.json").write_text(json.dumps(ds))
    return ["--deepspeed_config", str(work / f"{name}.json"), "--spec", str(work / f"{name}.yaml")]


def step_time(work: pathlib.Path, steps: int, skip: int) -> list[dict]:
    out = []
    for preset, ep in (("tiny", 1), ("tiny-moe", 2)):
        spec = {"name": preset, "model": {"preset": preset}, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
                "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 4, "precision": "bf16", "lr": 1e-3}}
        args = _write(work, f"st_{preset}", spec, _ds(8, 4, 1e-3))
        metrics = work / f"st_{preset}.jsonl"
        extra = ["--ep-size", str(ep)] if ep > 1 else []
        proc = run_local(args + ["--steps", str(steps), "--metrics-out", str(metrics), "--no-progress",
                                 "--monitor-every", "5"] + extra, timeout_s=1200)
        if proc.returncode != 0:
            out.append({"model": preset, "error": proc.stderr[-2000:]})
            continue
        m = read_metrics(metrics)
        st = stats.summarize([s["step_time_s"] for s in m.steps[skip:]])
        mon = m.of("monitor")
        out.append({"model": preset, "ep": ep, "zero_stage": 2, "precision": "bf16", "ranks": 2, "seq_len": 64,
                    "global_batch": 8, "micro_batch": 4, "timed_steps": len(m.steps) - skip,
                    "step_time_s": {"median": st.median, "p10": st.p10, "p90": st.p90, "min": st.min},
                    "tokens_per_s_median": 8 * 64 / st.median,
                    "first_loss": m.steps[0]["loss"], "last_loss": m.steps[-1]["loss"],
                    "monitor_flags": sorted({f["name"] for r in mon for f in r["flags"]}),
                    "monitor_last": mon[-1] if mon else None})
    return out


def activations() -> list[dict]:
    import torch

    from dstoolkit.estimate import RunPlan, activation_bytes
    from dstoolkit.models import get_preset
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.spec.checkpoint import CheckpointPolicy
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy, measure_saved_activation_bytes

    policies = {"none": CheckpointPolicy(kind="none"), "full": CheckpointPolicy(kind="full"),
                "every-2": CheckpointPolicy(kind="every-k", every_k=2),
                "ratio-0.75": CheckpointPolicy(kind="ratio", ratio=0.75),
                "selective": CheckpointPolicy(kind="selective")}
    rows = []
    for preset, seq, micro in (("tiny", 64, 2), ("tiny", 256, 4)):
        shape = get_preset(preset)
        model = build_model(shape).to(torch.bfloat16)
        x, y = synthetic_batch(shape, micro, seq, step=0, rank=0)
        measured, est = {}, {}
        for name, pol in policies.items():
            apply_checkpoint_policy(model, pol)
            measured[name] = measure_saved_activation_bytes(lambda: model(x, y),
                                                            exclude=list(model.parameters())).saved_bytes
            plan = RunPlan(shape=shape, ds_config={"train_micro_batch_size_per_gpu": micro,
                                                   "gradient_accumulation_steps": 1, "bf16": {"enabled": True}},
                           world_size=1, gpus_per_node=1, gpu=get_gpu("cpu"), seq_len=seq, checkpoint=pol,
                           precision="bf16", flash_attention=True)
            est[name] = activation_bytes(plan).saved
        for name in policies:
            sm, se = measured["none"] - measured[name], est["none"] - est[name]
            rows.append({"model": preset, "seq_len": seq, "micro_batch": micro, "policy": name,
                         "measured_bytes": measured[name], "estimated_bytes": int(est[name]),
                         "error": est[name] / measured[name] - 1,
                         "saving_measured_bytes": sm, "saving_estimated_bytes": int(se),
                         "saving_error": (se / sm - 1) if sm else None})
    return rows


def resume(work: pathlib.Path) -> dict:
    spec = {"name": "fault", "model": SMALL_MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 2, "precision": "bf16", "lr": 0.01}}
    common = _write(work, "fault", spec, _ds(8, 2, 0.01)) + ["--steps", "12", "--save-every", "3", "--no-progress",
                                                             "--monitor-every", "100"]
    ref = start_local(common + ["--metrics-out", str(work / "ref.jsonl"), "--checkpoint-dir", str(work / "ck_ref")])
    kill = start_local(common + ["--metrics-out", str(work / "run.jsonl"), "--checkpoint-dir", str(work / "ck"),
                                 "--kill-at-step", "7"])
    kill_rc, ref_rc = kill.wait(timeout=900), ref.wait(timeout=900)
    shard = sorted((work / "ck" / tag_for(6)).glob("*optim_states.pt"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    proc = run_local(common + ["--metrics-out", str(work / "run.jsonl"), "--checkpoint-dir", str(work / "ck"),
                               "--resume"], timeout_s=900)
    ref_steps = {s["step"]: s for s in read_metrics(work / "ref.jsonl").steps}
    after = read_metrics(work / "run.jsonl")
    res = after.of("resume")[0]
    resumed = [d for d in after.lines[after.lines.index(res) + 1:] if "event" not in d]
    diffs = [abs(s["loss"] - ref_steps[s["step"]]["loss"]) for s in resumed]
    return {"zero_stage": 2, "precision": "bf16", "ranks": 2, "killed_rank": 1, "killed_after_step": 7,
            "killed_launch_exit": kill_rc, "reference_exit": ref_rc, "resume_exit": proc.returncode,
            "resumed_from": res["tag"], "rejected": res["rejected"],
            "resumed_steps": [s["step"] for s in resumed], "max_abs_loss_diff": max(diffs),
            "data_pos_equal": all(s["data_pos"] == ref_steps[s["step"]]["data_pos"] for s in resumed),
            "losses_resumed": [s["loss"] for s in resumed],
            "losses_reference": [ref_steps[s["step"]]["loss"] for s in resumed]}


def spike(work: pathlib.Path) -> dict:
    spec = {"name": "spike", "model": SMALL_MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 4, "precision": "bf16", "lr": 0.01}}
    args = _write(work, "spike", spec, _ds(8, 4, 0.01)) + [
        "--steps", "30", "--metrics-out", str(work / "spike.jsonl"), "--no-progress", "--monitor-every", "100",
        "--checkpoint-dir", str(work / "ck_spike"), "--save-every", "4", "--inject-poison", "14",
        "--inject-lr-blowup", "22:1000", "--lr-scale-steps", "5"]
    proc = run_local(args, timeout_s=900)
    m = read_metrics(work / "spike.jsonl")
    trace = []
    for d in m.lines:
        if "event" not in d:
            trace.append({"step": d["step"], "loss": round(d["loss"], 4), "lr": d["lr"], "data_pos": d["data_pos"]})
        elif d["event"] in ("spike", "rollback", "inject"):
            trace.append({k: d[k] for k in ("event", "step", "kind", "action", "value", "z", "to_step",
                                             "skip_positions", "factor", "data_pos", "reason") if k in d})
    return {"exit": proc.returncode, "trace": trace}


def to_markdown(res: dict) -> str:
    from dstoolkit.runtime.bench.report import render_markdown_table

    L = [f"# Training helpers on CPU, 2 gloo ranks ({res['env']['timestamp_utc']})", "",
         f"torch {res['env']['torch']}, deepspeed {res['env']['deepspeed']}, {res['env']['cpu_model']} "
         f"({res['env']['cpu_count']} cores), load {res['env']['load_avg']}, commit {res['env']['git_commit']}", ""]
    if "step_time" in res:
        L += ["## Seconds per step (example trainer, ZeRO-2 bf16, seq 64, global batch 8, micro 4)", ""]
        rows = []
        for r in res["step_time"]:
            if "error" in r:
                rows.append([r["model"], "error"])
                continue
            s = r["step_time_s"]
            rows.append([r["model"], r["ep"], f"{s['median']:.3f}", f"{s['p10']:.3f}", f"{s['p90']:.3f}",
                         f"{r['tokens_per_s_median']:.0f}", f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}",
                         ", ".join(r["monitor_flags"]) or "-"])
        L += render_markdown_table(rows, ("model", "ep", "median s/step", "p10", "p90", "tokens/s",
                                          "loss first -> last", "monitor flags"))
        L.append("")
    if "activations" in res:
        L += ["## Activation bytes per checkpoint policy: measured (saved_tensors_hooks) vs estimate", ""]
        L += render_markdown_table(
            ([r["model"], f"{r['seq_len']}x{r['micro_batch']}", r["policy"], f"{r['measured_bytes']:,}",
              f"{r['estimated_bytes']:,}", f"{r['error'] * 100:+.2f}%", f"{r['saving_measured_bytes']:,}",
              f"{r['saving_estimated_bytes']:,}",
              f"{r['saving_error'] * 100:+.1f}%" if r["saving_error"] is not None else "-"] for r in res["activations"]),
            ("model", "s x b", "policy", "measured", "estimated", "error", "saving measured", "saving estimated",
             "saving error"))
        L.append("")
    if "resume" in res:
        r = res["resume"]
        L += ["## Kill + resume", "",
              f"Rank {r['killed_rank']} SIGKILLed after step {r['killed_after_step']} (launch exit {r['killed_launch_exit']}); "
              f"newest checkpoint truncated; relaunch rejected it ({'; '.join(r['rejected'])}) and resumed from "
              f"{r['resumed_from']}. Steps {r['resumed_steps'][0]}-{r['resumed_steps'][-1]}: max |loss difference| vs "
              f"the uninterrupted run = {r['max_abs_loss_diff']!r}; data positions equal: {r['data_pos_equal']}.", ""]
    if "spike" in res:
        L += ["## Spike guard trace (poisoned batch at step 14, LR x1000 at step 22)", "", "```"]
        for t in res["spike"]["trace"]:
            L.append(json.dumps({k: v for k, v in t.items() if k != "reason"}))
        L += ["```", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--skip-steps", type=int, default=5)
    p.add_argument("--parts", default="step_time,activations,resume,spike")
    p.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON and exit "
                   "(nothing is run or written)")
    args = p.parse_args(argv)
    if args.render_from:
        sys.stdout.write(to_markdown(json.loads(pathlib.Path(args.render_from).read_text())))
        return 0
    from dstoolkit.runtime.bench.report import write_report
    parts = args.parts.split(",")
    res: dict = {"env": harness.capture_env(world_size=2, backend="gloo", config={k: v for k, v in vars(args).items() if k != "render_from"})}
    with tempfile.TemporaryDirectory() as tmp:
        work = pathlib.Path(tmp)
        if "activations" in parts:
            res["activations"] = activations()
        if "step_time" in parts:
            res["step_time"] = step_time(work, args.steps, args.skip_steps)
        if "resume" in parts:
            res["resume"] = resume(work)
        if "spike" in parts:
            res["spike"] = spike(work)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = out / f"train_helpers_cpu2_{stamp}"
    atomic_write_text(base.with_suffix(".json"), json.dumps(res, indent=1, default=float))
    write_report(base.with_suffix(".md"), to_markdown(res))
    print(to_markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
