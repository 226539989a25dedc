"""Real Megatron-DeepSpeed runs of dstoolkit's generated files on 2 CPU ranks (DeepSpeed's CPU accelerator, gloo).

For each strategy of a tiny GPT spec (ds_configs/tiny_cpu.yaml / tiny_moe_cpu.yaml with the layout fields a mode
needs set: tp, pp, ep, activation_checkpointing, batch_ramp), this writes the strategy folder with
`dstoolkit generate SPEC --target megatron-deepspeed --strategy NAME`, runs its own `launch_megatron_deepspeed.sh`
(unchanged: PRETRAIN, DATA_ARGS and MASTER_PORT from the environment, plus `--log-interval 1`) for a few dozen
steps on a synthetic indexed dataset written here, and records per strategy: the flags, the loss per step (start ->
end), the samples consumed per step (checked against the spec's ramp, `RampPlan.batch_at`), the median step time
beside `generate`'s estimate for this machine's calibration, and the peak resident memory of each rank (VmHWM)
beside the estimate.

The Megatron-DeepSpeed tree is not part of this repo: pass a bare git dir from the `fetch` tool (the pinned commit is
exported to --work) or an exported tree. What this script does to that tree and its environment (all listed in the
results, nothing silent):
- builds its C++ dataset helpers (megatron/data/Makefile; needs pybind11: `pip install --target DEPS pybind11 six`);
- PATCH_GQA: megatron/model/transformer.py splits the fused QKV output into three equal thirds when DeepSpeed
  sequence parallelism is off (lines 734-739 at 4efb479d, since commit 676a482c "FPDT"), which breaks every model with
  fewer KV heads than query heads (the tiny model has 8 / 4): "shape '[128, 4, -1, 32]' is invalid". The patch
  restores the split of the commit before (view as [.., nkv, groups + 2, head_dim], then `split_tensor`);
- PATCH_ROPE_PP: with DeepSpeed's pipeline engine, pretrain_gpt.py:80 caches the RoPE table through
  megatron/utils.py:39, which calls `.to(device)` on the [cos, sin] list that RotaryEmbedding.forward returns
  (megatron/model/rotary_pos_embedding.py:39-40): "'list' object has no attribute 'to'" for every pipelined RoPE
  model, on any device. The patch moves each of the two tensors;
- a sitecustomize.py on PYTHONPATH standing in for two imports GPT pre-training never calls: torchvision
  (megatron/training.py:51 imports the vision modules unconditionally) and deepspeed.compression.compress (removed
  from DeepSpeed 0.19.8; megatron/training.py:57; used only with compression training);
- environment: DS_ACCELERATOR=cpu, OMP_NUM_THREADS=1 per rank, `nice -n 10`.

    nice -n 10 .venv/bin/python benchmarks/megatron_deepspeed_runs.py \\
        --mds /work/.mirror/deepspeedai+Megatron-DeepSpeed/repo --deps /tmp/g_pydeps --work /tmp/mds_runs \\
        --out benchmarks/results/megatron_deepspeed_runs_202612.jsonl
    .venv/bin/python benchmarks/megatron_deepspeed_runs.py --render benchmarks/results/megatron_deepspeed_runs_202612.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
STEPS = 30
WARMUP_STEPS_SKIPPED = 3  # first steps excluded from the median (allocator growth, first-call dispatch)

PATCH_GQA = ("megatron/model/transformer.py", """                each_hidden_size = mixed_x_layer.shape[-1] // 3
                query_layer = mixed_x_layer[:, :, :each_hidden_size].reshape(seq_len, bs, -1, self.head_dim)
                key_layer = mixed_x_layer[:, :, each_hidden_size:each_hidden_size+each_hidden_size].reshape(seq_len, bs, -1, self.head_dim)
                value_layer = mixed_x_layer[:, :, each_hidden_size+each_hidden_size:].reshape(seq_len, bs, -1, self.head_dim)
""", """                new_tensor_shape = mixed_x_layer.size()[:-1] + (-1, (self.num_key_value_groups + 2), self.hidden_size_per_attention_head)
                (query_layer, key_layer, value_layer) = self.split_tensor(mixed_x_layer.view(*new_tensor_shape))
""")

PATCH_ROPE_PP = ("megatron/utils.py", """    rotary_pos_emb = RotaryEmbedding(rotary_dim, theta=args.rope_theta)(seq_length).to(
        get_accelerator().current_device_name())
""", """    rotary_pos_emb = [t.to(get_accelerator().current_device_name())
                      for t in RotaryEmbedding(rotary_dim, theta=args.rope_theta)(seq_length)]
""")
PATCHES = {"PATCH_GQA": PATCH_GQA, "PATCH_ROPE_PP": PATCH_ROPE_PP}

SITECUSTOMIZE = '''"""dstoolkit benchmarks/megatron_deepspeed_runs.py: stand-ins for imports GPT pre-training never calls."""
import importlib.abc, importlib.machinery, sys, types


class _Unavailable:
    def __init__(self, *a, **k):
        raise RuntimeError("stand-in (dstoolkit megatron_deepspeed_runs): not available in this run")


def _unavailable(*a, **k):
    raise RuntimeError("stand-in (dstoolkit megatron_deepspeed_runs): not available in this run")


STUBS = {"torchvision": None, "torchvision.transforms": _Unavailable, "torchvision.datasets": _Unavailable,
         "deepspeed.compression.compress": _unavailable}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=name == "torchvision") if name in STUBS else None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        if STUBS[spec.name] is not None:
            m.__getattr__ = lambda attr, f=STUBS[spec.name]: f
        if spec.name == "torchvision":
            m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''

# name, base spec, training overrides, strategy
RUNS = [
    ("dp-zero0", "tiny_cpu", {}, "zero0"),
    ("dp-zero1", "tiny_cpu", {}, "zero1"),
    ("dp-zero2", "tiny_cpu", {}, "zero2"),
    ("tp2-zero1", "tiny_cpu", {"tp": 2}, "zero1"),
    ("pp2-zero1", "tiny_cpu", {"pp": 2}, "zero1"),
    ("moe-ep2-zero1", "tiny_moe_cpu", {"ep": 2}, "zero1-ep"),
    ("ckpt-full-zero1", "tiny_cpu", {"activation_checkpointing": "full"}, "zero1"),
    ("ramp-zero1", "tiny_cpu", {"micro_batch": 2, "batch_ramp": {"kind": "megatron", "start_batch": 4,
                                                                 "increment": 4, "ramp_samples": 40}}, "zero1"),
]

LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) .*?elapsed time per iteration \(ms\):"
                  r" ([\d.]+) .*?global batch size:\s+(\d+) \| lm loss: ([\d.Ee+-]+)")


def _sh(cmd, **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout.strip()


def prepare_tree(mds: Path, work: Path, deps: Path) -> dict:
    """Export (if `mds` is a git dir), patch, build the helpers and write the import stand-ins; returns facts."""
    tree = work / "Megatron-DeepSpeed"
    if (mds / "HEAD").is_file() or (mds / ".git").exists():
        gd = mds if (mds / "HEAD").is_file() else mds / ".git"
        commit = _sh(["git", f"--git-dir={gd}", "rev-parse", "HEAD"])
        if not tree.exists():
            tree.mkdir(parents=True)
            arch = subprocess.run(["git", f"--git-dir={gd}", "archive", "HEAD"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "x", "-C", str(tree)], input=arch, check=True)
    else:
        commit, tree = "(exported tree; commit unknown)", mds
    for name, (rel, old, new) in PATCHES.items():
        p = tree / rel
        text = p.read_text()
        if old in text:
            p.write_text(text.replace(old, new))
        elif new not in text:
            raise SystemExit(f"{p}: the code {name} patches is not there (different commit?)")
    data_dir = tree / "megatron" / "data"
    py = sys.executable
    ext = _sh([py, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"])
    if not (data_dir / f"helpers{ext}").exists():
        inc = _sh([py, "-m", "pybind11", "--includes"], env={**os.environ, "PYTHONPATH": str(deps)})
        subprocess.run(["make", f"CPPFLAGS={inc}", f"LIBEXT={ext}"], cwd=data_dir, check=True, capture_output=True)
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"tree": str(tree), "commit": commit, "shim": str(shim)}


def write_dataset(work: Path, tree: str, deps: str, seq_len: int, vocab: int) -> str:
    """A Megatron mmap indexed dataset of dstoolkit's learnable synthetic sequences (runtime.synthetic.synthetic_batch,
    the data of dstoolkit's own trainer), written with Megatron-DeepSpeed's own builder."""
    prefix = work / f"synthetic_v{vocab}_s{seq_len}_text_document"
    if Path(f"{prefix}.idx").exists():
        return str(prefix)
    code = f"""
import sys, torch, numpy as np
sys.path.insert(0, {tree!r})
from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
from dstoolkit.runtime.synthetic import synthetic_batch
class Shape: vocab_size = {vocab}
b = MMapIndexedDatasetBuilder({str(prefix) + '.bin'!r}, dtype=np.uint16)
for i in range(64):
    x, y = synthetic_batch(Shape, 32, {seq_len}, step=i, rank=0, seed=0)
    for row in torch.cat([x, y[:, -1:]], 1):
        b.add_item(row.to(torch.int32)); b.end_document()
b.finalize({str(prefix) + '.idx'!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join([deps, str(REPO)])})
    return str(prefix)


def _watch_hwm(pid: int, hwm: dict, stop: threading.Event) -> None:
    """Peak RSS (VmHWM) of each rank (torchrun's own children; their data-loader workers are not counted), polled
    every 0.2 s. `pid` is torchrun: nice and bash exec into it."""
    while not stop.is_set():
        try:
            ranks = [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            ranks = []
        for k in ranks:
            try:
                st = Path(f"/proc/{k}/status").read_text()
                cmd = Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not any(c.endswith(b"pretrain_gpt.py") for c in cmd) or b"torchrun" in b" ".join(cmd):
                continue
            m = re.search(r"VmHWM:\s+(\d+) kB", st)
            if m:
                hwm[k] = max(hwm.get(k, 0), int(m.group(1)) * 1024)
        stop.wait(0.2)


def run_one(name: str, base: str, over: dict, strategy: str, facts: dict, data: str, work: Path, deps: str) -> dict:
    from dstoolkit.runtime.train.launch import free_port

    spec = yaml.safe_load((REPO / "ds_configs" / f"{base}.yaml").read_text())
    spec["name"] = f"{base}_{name}"
    spec["training"].update({"train_steps": STEPS, "zero_stage": "auto", **over})
    rdir = work / name
    shutil.rmtree(rdir, ignore_errors=True)
    rdir.mkdir(parents=True)
    (rdir / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    gen = subprocess.run([str(REPO / ".venv/bin/dstoolkit"), "generate", str(rdir / "spec.yaml"), "--target",
                          "megatron-deepspeed", "--strategy", strategy, "--out", str(rdir / "gen"), "--format", "json"],
                         capture_output=True, text=True)
    rec: dict = {"strategy": name, "spec": base, "overrides": over, "dstoolkit_strategy": strategy}
    if gen.returncode != 0:
        rec.update(ok=False, error=f"generate exit {gen.returncode}: {gen.stderr.strip()[-400:]}")
        return rec
    g = json.loads(gen.stdout)["generated"][0]
    rec.update(layout=g["label"], est_step_s=g["step_time_s"], est_peak_bytes=g["memory_per_rank_bytes"])
    folder = rdir / "gen" / strategy
    words = (folder / "megatron_deepspeed_args.txt").read_text().splitlines()
    rec["flags"] = [("ds_config.json" if i and words[i - 1] == "--deepspeed_config" else w) for i, w in enumerate(words)]
    env = {**os.environ, "PATH": f"{REPO / '.venv/bin'}{os.pathsep}{os.environ['PATH']}", "DS_ACCELERATOR": "cpu",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([facts["shim"], deps, facts["tree"]]),
           "PRETRAIN": str(Path(facts["tree"]) / "pretrain_gpt.py"), "MASTER_PORT": str(free_port()),
           "DATA_ARGS": f"--data-path {data} --tokenizer-type NullTokenizer --split 100,0,0 --data-impl mmap"}
    load0 = os.getloadavg()
    t0 = time.time()
    log = rdir / "run.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(["nice", "-n", "10", "bash", str(folder / "launch_megatron_deepspeed.sh"),
                                 "--log-interval", "1"], cwd=rdir, env=env, stdout=fh, stderr=subprocess.STDOUT)
        hwm: dict = {}
        stop = threading.Event()
        th = threading.Thread(target=_watch_hwm, args=(proc.pid, hwm, stop), daemon=True)
        th.start()
        try:
            rc = proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
        stop.set()
        th.join()
    text = log.read_text(errors="replace")
    steps = [dict(step=int(m[0]), consumed=int(m[1]), ms=float(m[2]), batch=int(m[3]), loss=float(m[4]))
             for m in LINE.findall(text)]
    rec.update(rc=rc, ok=rc == 0 and len(steps) == STEPS, wall_s=round(time.time() - t0, 1),
               load_before=[round(x, 2) for x in load0], load_after=[round(x, 2) for x in os.getloadavg()],
               steps=steps, peak_rss_bytes_per_rank=sorted(hwm.values(), reverse=True))
    if steps:
        ms = [s["ms"] for s in steps[WARMUP_STEPS_SKIPPED:]] or [s["ms"] for s in steps]
        rec.update(loss_start=steps[0]["loss"], loss_end=steps[-1]["loss"], median_step_s=statistics.median(ms) / 1e3,
                   step_s_iqr=[round(x / 1e3, 4) for x in statistics.quantiles(ms, n=4)[::2]] if len(ms) > 3 else None)
    if over.get("batch_ramp"):
        rec["ramp_check"] = _ramp_check(rdir / "spec.yaml", strategy, steps)
    saved = list((rdir / "checkpoints").glob("*/")) if (rdir / "checkpoints").exists() else []
    rec["checkpoint_saved"] = [p.name for p in saved]
    if rc != 0:
        tb = [ln for ln in text.splitlines() if re.match(r"\[rank\d+\]: \w*(Error|Exception)\b", ln)] or \
             [ln for ln in text.splitlines() if "Error" in ln and "Warning" not in ln]
        rec["error"] = tb[-1][-400:] if tb else f"exit {rc}"
    return rec


def _ramp_check(spec_path: Path, strategy: str, steps: list[dict]) -> dict:
    """The batch of each logged step against dstoolkit's RampPlan of the spec (what the generator meant)."""
    from dstoolkit.generate import generate
    from dstoolkit.generate.io import load_spec_and_shape
    from dstoolkit.generate.megatron_common import ramp_plan

    spec, shape = load_spec_and_shape(spec_path)
    cand = generate(spec, shape, [strategy]).generated[0].chosen.candidate
    plan = ramp_plan(spec, cand)
    consumed, mismatches, expected = 0, [], []
    for s in steps:
        want = plan.batch_at(consumed)
        expected.append(want)
        if s["batch"] != want or s["consumed"] != consumed + want:
            mismatches.append({"step": s["step"], "logged_batch": s["batch"], "expected": want,
                               "logged_consumed": s["consumed"], "expected_consumed": consumed + want})
        consumed = s["consumed"]
    return {"plan": {"start": plan.start, "increment": plan.increment, "ramp_samples": plan.ramp_samples,
                     "final": plan.final}, "expected_batches": expected, "mismatches": mismatches}


# What stopped a mode here, read from its run log and their trees (file:line at the pinned commits), and what it needs.
CANNOT_RUN = {
    "tp2-zero1": "Megatron TP 2 with --sequence-parallel (as generated): the first forward stops in the unfused softmax "
                 "mask, megatron/model/utils.py:46 (from model/fused_softmax.py:198): attention scores with 64 keys against "
                 "the 128 x 128 causal mask, i.e. keys still split along the sequence by Megatron sequence parallelism. "
                 "See the TP diagnostic below for the same layout without --sequence-parallel.",
    "pp2-zero1": "DeepSpeed pipeline PP 2: with PATCH_ROPE_PP the model builds and the first forward stops in "
                 "megatron/model/rotary_pos_embedding.py:59 (`freqs.shape` of a list): the pipeline layers get the cached "
                 "[cos, sin] list (transformer.py:1515) while ParallelAttention unpacks only a tuple (transformer.py:774) "
                 "and otherwise duplicates the list as (q, k) tables. Needs the pipeline path to pass what the "
                 "non-pipeline path passes (language_model.py:548-551), and the RoPE finding below fixed; not patched "
                 "further here (a second semantic patch to their model would no longer test their tree).",
    "moe-ep2-zero1": "trains all 30 steps; the checkpoint save at step 30 then raises in DeepSpeed 0.19.8 "
                     "deepspeed/runtime/engine.py:5317 `dict(universal_checkpoint_info)`: it reads the module attribute "
                     "universal_checkpoint_info as a dict, and Megatron-DeepSpeed's GPTModel defines it as a method "
                     "(megatron/model/gpt_model.py:303). Needs DeepSpeed to call it when callable (or a Megatron-DeepSpeed "
                     "release that stores a dict); without --save the run ends at exit 0.",
}


FINDINGS = [
    "RoPE at 4efb479d is not RoPE (read from the code, not measured): since commit 676a482c RotaryEmbedding.forward "
    "returns [cos(theta), sin(theta)] (megatron/model/rotary_pos_embedding.py:39-40), language_model.py:548-551 passes "
    "them as (q_pos_emb, k_pos_emb), and transformer.py:824-826 rotates the queries with apply_rotary_pos_emb(q, "
    "cos(theta)) and the keys with (k, sin(theta)), which take cos/sin of those values again (rotary_pos_embedding.py"
    ":66-68). Every run here trains that model (the loss falls; position information is not what the spec's RoPE "
    "gives). No flag of ours changes it; it needs a fix in Megatron-DeepSpeed (or a commit before 676a482c).",
    "Step times: the machine was shared (load averages in the table, 2 cores); the estimate is for this machine's "
    "calibration on a quiet machine, so measured/estimated here bounds the slowdown of a loaded machine, not the model.",
]


def render(jsonl: Path) -> None:
    recs = [json.loads(ln) for ln in jsonl.read_text().splitlines() if ln.strip()]
    head = recs[0] if recs and "meta" in recs[0] else {}
    runs = [r for r in recs if "strategy" in r]
    table = [r for r in runs if not r.get("superseded")]
    gib = 2 ** 30
    md = [f"# Megatron-DeepSpeed runs of generated files on 2 CPU ranks", "",
          f"Generated by `benchmarks/megatron_deepspeed_runs.py` from `{jsonl.name}` (JSONL first)."]
    if head:
        m = head["meta"]
        md += ["", f"- Megatron-DeepSpeed commit `{m['commit']}`; dstoolkit `{m['dstoolkit']}`; torch {m['torch']}, "
                   f"deepspeed {m['deepspeed']}; {m['cpu']}; {m['date']}",
               f"- {STEPS} steps per run, `--log-interval 1`, median step time over steps {WARMUP_STEPS_SKIPPED + 1}.."
               f"{STEPS}; peak memory = VmHWM of each rank process (resident, includes Python/torch/DeepSpeed "
               "themselves, which the estimate does not count: the estimate is the tensor peak per rank)",
               "- Changes to their tree/environment: " + "; ".join(m["changes"]),
               f"- The machine is shared with other engineers' jobs: load average before/after each run is listed; "
               "step times are noisy."]
    md += ["", "| strategy | layout (dstoolkit) | result | loss start -> end | step s measured (IQR) | step s est | "
               "peak RSS/rank GiB | est peak/rank GiB | load 1m before/after |", "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        if "layout" not in r:
            md.append(f"| {r['strategy']} | - | not generated: {r.get('error', '')} | | | | | | |")
            continue
        res = "ok" if r.get("ok") else f"failed: {r.get('error', '')[:160]}"
        loss = f"{r['loss_start']:.3f} -> {r['loss_end']:.3f}" if r.get("steps") else "-"
        st = f"{r['median_step_s']:.3f}" + (f" ({r['step_s_iqr'][0]:.3f}-{r['step_s_iqr'][1]:.3f})"
                                            if r.get("step_s_iqr") else "") if r.get("steps") else "-"
        rss = "/".join(f"{b / gib:.2f}" for b in r.get("peak_rss_bytes_per_rank", [])) or "-"
        md.append(f"| {r['strategy']} | {r['layout']} | {res} | {loss} | {st} | {r['est_step_s']:.3f} | {rss} | "
                  f"{r['est_peak_bytes'] / gib:.3f} | {r['load_before'][0]}/{r['load_after'][0]} |")
    notes = [(r["strategy"], CANNOT_RUN[r["strategy"]]) for r in runs
             if not r.get("ok") and r["strategy"] in CANNOT_RUN and not r.get("superseded")]
    if notes:
        md += ["", "What stopped a mode (from the run logs; file:line in the pinned trees):", ""]
        md += [f"- {name}: {why}" for name, why in notes]
    for r in runs:
        if r.get("superseded"):
            md += ["", f"First attempt of {r['strategy']} (before {r['superseded']}): {r.get('error', '')}"]
    md += ["", "Findings:", ""] + [f"- {x}" for x in FINDINGS]
    for r in recs:
        if "diagnostic" in r:
            md += ["", f"Diagnostic: {r['diagnostic']}"]
    for r in runs:
        if r.get("ramp_check"):
            rc = r["ramp_check"]
            md += ["", f"Batch ramp ({r['strategy']}): plan {rc['plan']}; logged global batch per step "
                       f"{[s['batch'] for s in r['steps']]}; expected {rc['expected_batches']}; "
                       f"mismatches: {rc['mismatches'] or 'none'}."]
    md += ["", "Flags per strategy (the generated megatron_deepspeed_args.txt):", ""]
    for r in runs:
        if r.get("flags"):
            md.append(f"- {r['strategy']}: `{' '.join(r['flags'])}`")
    out = jsonl.with_suffix(".md")
    out.write_text("\n".join(md) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        for r in runs:
            if r.get("steps"):
                ax.plot([s["step"] for s in r["steps"]], [s["loss"] for s in r["steps"]], label=r["strategy"])
        ax.set_xlabel("step")
        ax.set_ylabel("lm loss")
        ax.set_title("Megatron-DeepSpeed on 2 CPU ranks, generated files")
        ax.legend(fontsize=8)
        fig.savefig(jsonl.with_suffix(".png"), dpi=100, bbox_inches="tight")
    except ImportError:
        pass
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mds", type=Path, help="Megatron-DeepSpeed bare git dir (fetch tool) or exported tree")
    ap.add_argument("--deps", default="/tmp/g_pydeps", help="pip --target dir with pybind11 and six")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mds_runs"))
    ap.add_argument("--out", type=Path, help="JSONL to append to")
    ap.add_argument("--only", action="append", default=[], help="run only these strategies")
    ap.add_argument("--render", type=Path, help="render md/png from this JSONL and exit")
    a = ap.parse_args()
    if a.render:
        render(a.render)
        return
    a.work.mkdir(parents=True, exist_ok=True)
    facts = prepare_tree(a.mds, a.work, Path(a.deps))
    data = write_dataset(a.work, facts["tree"], a.deps, 128, 2048)
    import deepspeed
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "cpu")
    meta = {"commit": facts["commit"], "dstoolkit": _sh(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"]),
            "torch": torch.__version__, "deepspeed": deepspeed.__version__, "cpu": f"{cpu}, {os.cpu_count()} cores",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "changes": ["PATCH_GQA (megatron/model/transformer.py:734-739, see the module docstring)",
                        "PATCH_ROPE_PP (megatron/utils.py:39, pipeline runs only)",
                        "sitecustomize stand-ins for torchvision and deepspeed.compression.compress",
                        "dataset helpers built with pybind11", "DS_ACCELERATOR=cpu, OMP_NUM_THREADS=1, nice -n 10"]}
    new = not a.out.exists() or a.out.stat().st_size == 0
    with open(a.out, "a") as fh:
        if new:
            fh.write(json.dumps({"meta": meta}) + "\n")
        for name, base, over, strategy in RUNS:
            if a.only and name not in a.only:
                continue
            rec = run_one(name, base, over, strategy, facts, data, a.work, a.deps)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            print(name, rec.get("ok"), rec.get("loss_start"), rec.get("loss_end"), rec.get("median_step_s"),
                  rec.get("error", ""), flush=True)


if __name__ == "__main__":
    main()
