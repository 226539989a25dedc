"""Real 2-rank gloo runs of the hf and accelerate targets (dstoolkit.generate.hf_targets): each strategy's
generated ds_config_hf.json + TrainingArguments flags run through HF `Trainer` (tests/dist/hf_scripts/train_hf.py,
a tiny transformers Llama / Qwen3-MoE built from a config), launched with the generated launch_hf.sh
(torchrun, `--deepspeed`) or launch_accelerate.sh (`accelerate launch` and the YAML), as the summary says; the loss must fall. Each run prints its
losses first -> last, measured peak RSS per rank and step time beside the estimator's numbers.

Also documented here: what does not run through these targets and why (AutoEP: DeepSpeed 0.19.8 against
transformers 5.x; the pipeline engine: HF Trainer cannot drive a PipelineModule, but the engine itself trains on
CPU), each asserting the specific outcome.

All runs share one DeepSpeed JIT build (~/.cache/torch_extensions: shm_comm, cpu_adam).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.hf_targets import hf_target_files
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.runtime.train.launch import free_port

pytestmark = pytest.mark.dist

SCRIPT = Path(__file__).resolve().parent / "hf_scripts" / "train_hf.py"
STEPS = 6
RUN_TIMEOUT_S = 420  # a fresh machine JIT-builds shm_comm / cpu_adam once

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128, "max_position_embeddings": 32}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
             "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 32}

# The ZeRO strategies of the Llama model run in ONE torchrun (train_hf.py --also): importing transformers +
# deepspeed costs ~20 s per process here, more than the runs. (id, candidate)
ZERO_CASES = [
    ("zero0", Candidate(zero_stage=0, micro_batch=2)),
    ("zero1", Candidate(zero_stage=1, micro_batch=2)),
    ("zero2", Candidate(zero_stage=2, micro_batch=2)),
    ("zero3", Candidate(zero_stage=3, micro_batch=2)),
    ("zero2-offload", Candidate(zero_stage=2, offload_optimizer=True, micro_batch=2)),
    ("zero3-offload", Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, micro_batch=2)),
]
# One process each: (id, model, target, candidate)
CASES = [
    ("moe-zero3", "qwen3_moe", "hf", Candidate(zero_stage=3, micro_batch=2)),
    ("autotp2-zero1", "llama", "hf", Candidate(zero_stage=1, tp=2, micro_batch=2)),
    ("zero2", "llama", "accelerate", Candidate(zero_stage=2, micro_batch=2)),
    ("zero3", "llama", "accelerate", Candidate(zero_stage=3, micro_batch=2)),
]


def _spec(folder: Path, model: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model))
    (folder / "spec.yaml").write_text(textwrap.dedent(f"""\
        name: hf_dist
        model: {{hf_config: config.json}}
        cluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu}}
        training: {{seq_len: 32, global_batch: 8, micro_batch: 2, precision: fp32, lr: 0.003,
                    warmup_steps: 1, train_steps: {STEPS}}}
        """))
    return load_spec_and_shape(folder / "spec.yaml")


def _estimate(spec, shape, cand) -> dict:
    try:
        from dstoolkit.generate.planner import estimate_candidate

        e = estimate_candidate(spec, shape, cand)
        return {"est_mem_mib": round(e.memory_per_rank_bytes / 2**20, 1),
                "est_host_mib": round(e.host_memory_per_rank_bytes / 2**20, 1), "est_step_s": round(e.step_time_s, 4)}
    except Exception as exc:  # the estimator's refusal is reported, not a test failure
        return {"estimate": f"{type(exc).__name__}: {exc}"[:160]}


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("ACCELERATE_USE_DEEPSPEED", None)
    return env


def _launch(folder: Path, target: str, extra: list[str]) -> subprocess.CompletedProcess:
    """Run the generated launch script as the summary says: `bash launch_hf.sh OUR_SCRIPT [its arguments]`."""
    name = "launch_hf.sh" if target == "hf" else "launch_accelerate.sh"
    env = {**_env(), "MASTER_PORT": str(free_port())}
    return subprocess.run(["bash", str(folder / name), str(SCRIPT), *extra], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _write(folder: Path, model: str, cand: Candidate, target: str) -> dict:
    spec, shape = _spec(folder, QWEN3_MOE if model == "qwen3_moe" else LLAMA)
    files = hf_target_files(spec, shape, cand, accelerate=target == "accelerate")
    for name, text in files.items():
        (folder / name).write_text(text)
    return {"spec": spec, "shape": shape, "files": files}


def _check_and_report(folder: Path, target: str, cid: str, w: dict, cand: Candidate) -> None:
    r = json.loads((folder / "result.json").read_text())
    losses = r["losses"]
    assert len(losses) == STEPS and losses[-1] < losses[0], (cid, losses)
    assert r["zero_stage"] == cand.zero_stage, (cid, r)
    if cand.offload_optimizer:
        assert r["offload"].get("offload_optimizer") == "cpu", (cid, r)
    if cand.offload_param:
        assert r["offload"].get("offload_param") == "cpu", (cid, r)
    est = _estimate(w["spec"], w["shape"], cand)
    step = sorted(r["step_s"])[len(r["step_s"]) // 2]
    print(f"\n[{target} {cid}] loss {losses[0]:.3f} -> {losses[-1]:.3f}; peak RSS {r['peak_rss_mib']:.0f} MiB/rank, "
          f"params/rank {r['params_per_rank']}, optimizer {r['optimizer']}, step {step:.3f} s (median) | "
          f"estimate {est}")


def test_generated_hf_zero_strategies_train(tmp_path):
    written = {cid: _write(tmp_path / cid, "llama", cand, "hf") for cid, cand in ZERO_CASES}
    first = ZERO_CASES[0][0]
    # the flags are the same for every ZeRO strategy (only --deepspeed differs): checked, then one process runs all
    flags = {cid: next(ln for ln in w["files"]["launch_hf.sh"].splitlines() if ln.startswith("CMD=("))
             for cid, w in written.items()}
    assert len({f for f in flags.values()}) == 1, flags
    also = ",".join(str(tmp_path / cid) for cid, _ in ZERO_CASES[1:])
    proc = _launch(tmp_path / first, "hf", ["--model", "llama", "--result", "result.json", "--also", also])
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    for cid, cand in ZERO_CASES:
        _check_and_report(tmp_path / cid, "hf", cid, written[cid], cand)


@pytest.mark.parametrize("cid,model,target,cand", CASES, ids=[f"{t}-{c}" for c, _, t, _ in CASES])
def test_generated_hf_target_trains(tmp_path, cid, model, target, cand):
    w = _write(tmp_path, model, cand, target)
    extra = ["--model", model, "--result", "result.json"]
    if model == "qwen3_moe":
        extra.append("--leaf_modules")  # what the launch notes tell the user to add to their script
        assert "set_z3_leaf_modules" in w["files"]["launch_hf.sh"]
    if cand.tp > 1:
        assert json.loads(w["files"]["ds_config_hf.json"])["tensor_parallel"] == {"autotp_size": cand.tp}
    proc = _launch(tmp_path, target, extra)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    _check_and_report(tmp_path, target, cid, w, cand)
    if cand.tp > 1:  # AutoTP sharded the model: each rank holds part of the attention/MLP weights
        r = json.loads((tmp_path / "result.json").read_text())
        assert r["params_per_rank"] < 90432, r


AUTOEP_SCRIPT = """
import sys
import torch, deepspeed, deepspeed.comm as dist
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from dstoolkit.runtime.rankexit import install_exit_guard
install_exit_guard()  # groups released before exit: a gloo worker alive at exit aborts a finished run
deepspeed.init_distributed(dist_backend="gloo")
cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                     num_experts_per_tok=2, max_position_embeddings=32, mlp_only_layers=[])
model = Qwen3MoeForCausalLM(cfg)
ds = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
      "expert_parallel": {"enabled": True, "autoep_size": 2, "preset_model": "qwen3_moe"}}
try:
    deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    line = "AUTOEP OK"
except Exception as e:
    line = f"AUTOEP FAIL {type(e).__name__} {e}"
if dist.get_rank() == 0:  # one rank, one write: two ranks' prints interleave word by word on a shared pipe
    sys.stdout.write(line + "\\n")
"""


def test_autoep_fails_in_deepspeed_0_19_8_with_transformers_5(tmp_path):
    """AutoEP is not generated: DeepSpeed 0.19.8 calls registry.get(key, default) on transformers 5's
    _CanRecordRegistry (get takes one argument). The validator warns (DS228) and hf_unavailable_reason says so."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("documents the transformers >= 5 failure")
    (tmp_path / "autoep.py").write_text(AUTOEP_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           f"--master_port={free_port()}", "autoep.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    out = proc.stdout
    assert "AUTOEP FAIL TypeError _CanRecordRegistry.get() takes 2 positional arguments but 3 were given" in out, (
        out[-2000:], proc.stderr[-2000:])
    from dstoolkit.validate import validate_config

    f = [x for x in validate_config({"train_micro_batch_size_per_gpu": 2, "expert_parallel": {
        "enabled": True, "autoep_size": 2}}, world_size=2) if x.code == "DS228"]
    assert f and f[0].severity == "warning" and "_CanRecordRegistry.get()" in f[0].message


PIPELINE_SCRIPT = """
import torch, deepspeed, deepspeed.comm as dist
from deepspeed.pipe import PipelineModule
from dstoolkit.runtime.rankexit import install_exit_guard
install_exit_guard()  # groups released before exit: a gloo worker alive at exit aborts a finished run
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)]
model = PipelineModule(layers=layers, num_stages=2, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "torch_adam": True}}, "pipeline": {"stages": "auto"}}
eng, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()], config=ds)
g = torch.Generator().manual_seed(1); X = torch.randn(64, 16, generator=g); Y = X[:, :1] * 2
def batches():
    i = 0
    while True:
        yield X[i % 8:i % 8 + 2], Y[i % 8:i % 8 + 2]; i += 2  # the same 8 samples every step
it = batches()
losses = [float(eng.train_batch(data_iter=it)) for _ in range(6)]
if dist.get_rank() == 0:
    print("PIPELINE", losses)
"""


def test_pipeline_engine_trains_on_cpu_but_has_no_hf_target(tmp_path):
    """The pipeline engine runs on 2 gloo CPU ranks (PP=2, ZeRO-1, pipeline.stages "auto" accepted by the
    validator); HF Trainer / Accelerate cannot drive a PipelineModule, so the hf target refuses pp > 1."""
    from dstoolkit.generate.hf_targets import PIPELINE_REASON, hf_unavailable_reason
    from dstoolkit.validate import validate_config

    (tmp_path / "pipe.py").write_text(PIPELINE_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           f"--master_port={free_port()}", "pipe.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("PIPELINE")][0]
    losses = json.loads(line.split(" ", 1)[1])
    assert losses[-1] < losses[0], losses
    print(f"\n[deepspeed pipeline pp2] loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "pipeline": {"stages": "auto"},
          "zero_optimization": {"stage": 1}}
    assert [f for f in validate_config(ds, world_size=2, pp=2) if f.severity == "error"] == []
    spec, shape = _spec(tmp_path / "s", LLAMA)
    assert PIPELINE_REASON in hf_unavailable_reason(Candidate(zero_stage=1, pp=2, micro_batch=2), shape)


ULYSSES_SCRIPT = """
import torch, deepspeed, deepspeed.comm as dist
from dstoolkit.runtime.rankexit import install_exit_guard
install_exit_guard()  # groups released before exit: a gloo worker alive at exit aborts a finished run
deepspeed.init_distributed(dist_backend="gloo")
from deepspeed.sequence.layer import DistributedAttention
def local_attn(q, k, v, *a, **kw):
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
group = dist.new_group(list(range(dist.get_world_size())))
attn = DistributedAttention(local_attn, group, scatter_idx=2, gather_idx=1)
torch.manual_seed(dist.get_rank())
q = torch.randn(1, 8, 4, 16, requires_grad=True)  # [batch, seq / sp, heads, head_dim]
out = attn(q, q, q, batch_dim_idx=0)
out.sum().backward()
if dist.get_rank() == 0:
    print("ULYSSES", tuple(out.shape), bool(torch.isfinite(q.grad).all()))
"""


def test_ulysses_all_to_all_runs_on_cpu_but_is_not_generated_for_hf(tmp_path):
    """DeepSpeed's Ulysses core (DistributedAttention: all-to-all sequence <-> heads) runs on 2 gloo CPU ranks.
    It is not generated for the hf target: sequence_parallel_size in the JSON alone does not turn it on (the
    script must register UlyssesSPAttentionHF and pass its mpu), which the generator's notes say; the validator
    checks sequence_parallel_size against the world size and the heads (DS226)."""
    from dstoolkit.generate.hf_targets import ULYSSES_NOTE
    from dstoolkit.validate import validate_config

    (tmp_path / "sp.py").write_text(ULYSSES_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           f"--master_port={free_port()}", "sp.py"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "ULYSSES (1, 8, 4, 16) True" in proc.stdout
    spec, shape = _spec(tmp_path / "s", LLAMA)
    files = hf_target_files(spec, shape, Candidate(zero_stage=1, micro_batch=2))
    assert ULYSSES_NOTE not in files["launch_hf.sh"]  # the note only where the layout has Ulysses (f7961ec)
    assert ULYSSES_NOTE in hf_target_files(spec, shape, Candidate(zero_stage=1, micro_batch=2, ulysses=2))["launch_hf.sh"]
    bad = [f.code for f in validate_config({"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 3},
                                           world_size=2, num_heads=4) if f.severity == "error"]
    assert "DS226" in bad
