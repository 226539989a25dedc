"""Per-target Megatron argument files (dstoolkit.generate.megatron): every bundled spec x strategy, both targets.

What the real parsers accept was checked while building (benchmarks/megatron_parsers.py against the Megatron-LM
and Megatron-DeepSpeed source trees; results in benchmarks/results/megatron_parsers_*.md). Here, without those
trees: the flags each target needs (and none it lacks), their agreement with the DeepSpeed JSON and the model,
the file format and the launch scripts, and, from the `megatron-core` wheel, that the Megatron-LM values build a
valid `TransformerConfig` / `MLATransformerConfig` and `ModelParallelConfig`.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from dstoolkit.generate.bundled import BUNDLED_SPECS, cached_bundled
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron import (ARGS_FILE, DEFAULT_DATA_ARGS, LAUNCH_FILE, TARGETS, megatron_target_files,
                                         read_args_file, render_args_file, write_megatron_targets)
from dstoolkit.generate.megatron_common import RampPlan, UnsupportedTarget, model_constants, vocab_divisor
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args
from dstoolkit.generate.megatron_lm import megatron_lm_args

# Published constants of the bundled models (config.json of each; tiny = dstoolkit/runtime/model.py).
EXPECTED = {  # stem: (rope base, norm eps, init std)
    "tiny_cpu": (10000, 1e-5, 0.02), "tiny_moe_cpu": (10000, 1e-5, 0.02),
    "llama3_8b_1x8_h100": (500000, 1e-5, 0.02), "mixtral_8x7b_2x8_h100": (1000000, 1e-5, 0.02),
    "deepseek_v3_32x8_h800": (10000, 1e-6, 0.006),
}
DS_ONLY = ("--deepspeed", "--deepspeed_config", "--zero-stage", "--no-pipeline-parallel", "--cpu-optimizer")


def flags(words: list[str]) -> dict[str, list[str]]:
    """Flag -> its values (words up to the next flag); a flag given twice keeps the last (argparse's rule)."""
    out: dict[str, list[str]] = {}
    cur = None
    for w in words:
        if w.startswith("--"):
            cur = w
            out[cur] = []
        else:
            assert cur is not None, f"value {w!r} before any flag"
            out[cur].append(w)
    return out


def folders():
    """(stem, spec, shape, strategy output) for every bundled spec and generated strategy."""
    root = Path(__file__).resolve().parents[2]
    for stem in BUNDLED_SPECS:
        spec, shape = load_spec_and_shape(root / "ds_configs" / f"{stem}.yaml")
        for o in cached_bundled(str(root / "ds_configs"), stem).generated:
            yield stem, spec, shape, o


ALL = list(folders())
IDS = [f"{s}/{o.name}" for s, _, _, o in ALL]


@pytest.mark.parametrize("stem,spec,shape,o", ALL, ids=IDS)
def test_megatron_lm_flags(stem, spec, shape, o):
    c, cfg = o.chosen.candidate, o.ds_config
    f = flags(megatron_lm_args(spec, shape, c))
    assert not set(DS_ONLY) & set(f), "DeepSpeed-only flags in the Megatron-LM file"
    cpu = spec.cluster.gpu == "cpu"
    assert "--use-flash-attn" not in f and f["--attention-backend"] == ["unfused" if cpu else "flash"]
    assert "--rampup-batch-size" not in f  # parsed and ignored by Megatron-LM
    assert f["--tensor-model-parallel-size"] == [str(c.tp)] and f["--pipeline-model-parallel-size"] == [str(c.pp)]
    assert ("--sequence-parallel" in f) == c.sequence_parallel == (c.tp > 1 and spec.training.sequence_parallel)
    # Megatron-LM's validate_args refuses --tp-comm-overlap without --sequence-parallel; the spec's switch decides it
    assert ("--tp-comm-overlap" in f) == (spec.training.tp_comm_overlap and c.sequence_parallel
                                          and "--use-megatron-fsdp" not in f)
    assert f["--micro-batch-size"] == [str(cfg["train_micro_batch_size_per_gpu"])]
    if spec.training.batch_ramp is None:
        assert f["--global-batch-size"] == [str(cfg["train_batch_size"])]
        assert f["--train-iters"] == [str(spec.training.train_steps or 20)]
    else:  # the step schedule carries the batch; Megatron-LM refuses it with --global-batch-size
        assert "--global-batch-size" not in f and "--train-samples" in f
        sched = f["--step-batch-size-schedule"]
        assert len(sched) == 1 and sched[0].split()[-1].endswith(f":{spec.training.global_batch}")
    rope, eps, std = EXPECTED[stem]
    assert f["--position-embedding-type"] == ["rope"] and f["--rotary-base"] == [str(rope)]
    assert f["--normalization"] == ["RMSNorm"] and float(f["--norm-epsilon"][0]) == eps
    assert float(f["--init-method-std"][0]) == std
    assert f["--attention-dropout"] == ["0.0"] and f["--hidden-dropout"] == ["0.0"]
    assert f["--vocab-size"] == [str(shape.vocab_size)]
    assert shape.vocab_size % (int(f["--make-vocab-size-divisible-by"][0]) * c.tp) == 0  # no padding rows
    assert f["--save"] == f["--load"] == [spec.training.save_dir]
    assert f["--save-interval"] == [str(spec.training.save_interval())]
    assert ("--no-gradient-accumulation-fusion" in f) == (spec.cluster.gpu == "cpu")
    if shape.is_mla:
        assert "--multi-latent-attention" in f and "--group-query-attention" not in f
    elif shape.kv_heads != shape.num_attention_heads:
        assert "--group-query-attention" in f and f["--num-query-groups"] == [str(shape.kv_heads)]
    # ZeRO -> Megatron-LM: 0 = DDP, 1-2 = distributed optimizer, 3 = Megatron-FSDP; overlap always
    assert "--overlap-grad-reduce" in f
    assert ("--use-distributed-optimizer" in f) == (c.zero_stage in (1, 2))
    assert ("--use-megatron-fsdp" in f) == (c.zero_stage == 3)
    assert ("--optimizer-cpu-offload" in f) == c.offload_optimizer
    if shape.is_moe:
        assert f["--num-experts"] == [str(shape.num_experts)] and f["--expert-model-parallel-size"] == [str(c.ep)]
        assert f["--moe-router-topk"] == [str(shape.num_experts_per_tok)]
        assert "--moe-grouped-gemm" in f and f["--moe-token-dispatcher-type"] == ["alltoall"]
        assert float(f["--moe-aux-loss-coeff"][0]) == model_constants(spec, shape).moe_aux_loss_coeff


@pytest.mark.parametrize("stem,spec,shape,o", ALL, ids=IDS)
def test_megatron_deepspeed_flags(stem, spec, shape, o, tmp_path):
    c, cfg = o.chosen.candidate, o.ds_config
    ds_path = tmp_path / "ds_config.json"
    if shape.is_mla:
        with pytest.raises(UnsupportedTarget, match="multi-latent attention"):
            megatron_deepspeed_args(spec, shape, c, ds_config_path=ds_path)
        return
    f = flags(megatron_deepspeed_args(spec, shape, c, ds_config_path=ds_path))
    assert f["--deepspeed"] == [] and f["--deepspeed_config"] == [str(ds_path)]
    assert f["--zero-stage"] == [str(cfg["zero_optimization"]["stage"])]
    assert ("--no-pipeline-parallel" in f) == (c.pp == 1)
    if c.zero_stage >= 2:
        assert "--no-pipeline-parallel" in f  # DeepSpeed's PipelineEngine refuses ZeRO-2/3
    offload = cfg["zero_optimization"].get("offload_optimizer", {}).get("device", "none") != "none"
    assert ("--cpu-optimizer" in f) == offload == c.offload_optimizer
    assert f["--micro-batch-size"] == [str(cfg["train_micro_batch_size_per_gpu"])]
    assert f["--global-batch-size"] == [str(cfg["train_batch_size"])]
    assert "--train-iters" in f or "--train-samples" in f
    rope, eps, std = EXPECTED[stem]
    for absent in ("--position-embedding-type", "--group-query-attention", "--num-query-groups", "--rotary-base",
                   "--use-flash-attn", "--norm-epsilon", "--attention-backend", "--expert-model-parallel-size"):
        assert absent not in f, absent
    assert "--use-rotary-position-embeddings" in f and "--no-position-embedding" in f
    assert f["--rotary-position-embeddings-theta"] == [str(rope)]
    assert f["--normalization"] == ["rmsnorm"] and float(f["--layernorm-epsilon"][0]) == eps
    assert float(f["--init-method-std"][0]) == std
    assert f["--attention-dropout"] == ["0.0"] and f["--hidden-dropout"] == ["0.0"]
    if shape.kv_heads != shape.num_attention_heads:
        assert f["--num-key-value-heads"] == [str(shape.kv_heads)]
    cpu = spec.cluster.gpu == "cpu"
    assert ("--use-flash-attn-v2" in f) == (not cpu)  # no FlashAttention op on DeepSpeed's CPU accelerator
    assert ("--no-gradient-accumulation-fusion" in f) == ("--no-masked-softmax-fusion" in f) == cpu
    # recompute through DeepSpeed's checkpoint function (Megatron's refuses the RoPE table list)
    assert ("--deepspeed-activation-checkpointing" in f) == ("--recompute-granularity" in f)
    assert f["--save"] == f["--load"] == [spec.training.save_dir]
    assert f["--save-interval"] == [str(spec.training.save_interval())]
    # its NullTokenizer adds the end-of-document id: V - 1 gives the model's V embedding rows
    assert f["--vocab-size"] == [str(shape.vocab_size - 1)]
    assert shape.vocab_size % (int(f["--make-vocab-size-divisible-by"][0]) * c.tp) == 0
    assert ("--sequence-parallel" in f) == c.sequence_parallel == (c.tp > 1 and spec.training.sequence_parallel)
    if shape.is_moe:  # DeepSpeed MoE spelling; its defaults would be top-1 and experts every 2nd layer
        assert f["--num-experts"] == [str(shape.num_experts)] and f["--expert-interval"] == ["1"]
        assert f["--topk"] == [str(shape.num_experts_per_tok)] and f["--moe-expert-parallel-size"] == [str(c.ep)]
        assert "--create-moe-param-group" in f and "--moe-router-topk" not in f
        assert ("--enable-expert-tensor-parallelism" in f) == (c.tp > 1)  # experts sharded over TP, as in Megatron-LM


def test_deepspeed_config_path_must_be_absolute():
    stem, spec, shape, o = ALL[0]
    with pytest.raises(ValueError, match="absolute"):
        megatron_deepspeed_args(spec, shape, o.chosen.candidate, ds_config_path="configs/ds_config.json")
    # the bare name is the goldens' form (no machine path committed); the launch script passes the absolute one
    words = megatron_deepspeed_args(spec, shape, o.chosen.candidate, ds_config_path="ds_config.json")
    assert words[words.index("--deepspeed_config") + 1] == "ds_config.json"


def test_deepseek_moe_layers_and_router():
    stem, spec, shape, o = next(a for a in ALL if a[0] == "deepseek_v3_32x8_h800")
    f = flags(megatron_lm_args(spec, shape, o.chosen.candidate))
    assert f["--moe-layer-freq"] == ["[" + ",".join(["0"] * 3 + ["1"] * 58) + "]"]  # first 3 dense, unquoted
    assert f["--moe-router-score-function"] == ["sigmoid"] and "--moe-router-enable-expert-bias" in f
    assert f["--moe-router-topk-scaling-factor"] == ["2.5"]
    assert f["--moe-router-num-groups"] == ["8"] and f["--moe-router-group-topk"] == ["4"]
    assert f["--moe-shared-expert-intermediate-size"] == ["2048"] and f["--moe-ffn-hidden-size"] == ["2048"]
    assert f["--kv-lora-rank"] == ["512"] and f["--q-lora-rank"] == ["1536"]
    assert f["--fp8-format"] and "--bf16" in f


def test_deepseek_step_schedule_reproduces_the_ramp():
    """3072 -> 15360 sequences over 469B tokens (DeepSeek-V3 §4.2): the schedule's batch at every threshold is
    Megatron's linear ramp (as Megatron-DeepSpeed's --rampup-batch-size computes it) at that sample count."""
    stem, spec, shape, o = next(a for a in ALL if a[0] == "deepseek_v3_32x8_h800")
    c = o.chosen.candidate
    f = flags(megatron_lm_args(spec, shape, c))
    seq = spec.training.seq_len
    entries = [tuple(int(x) for x in e.split(":")) for e in f["--step-batch-size-schedule"][0].split()]
    assert entries[0] == (0, 3072) and entries[-1][1] == 15360
    dp = spec.world_size // (c.tp * c.pp)
    inc = c.micro_batch * dp
    ramp = RampPlan(start=3072, increment=inc, ramp_samples=-(-469_000_000_000 // seq), final=15360)
    for (tok, batch), (nxt, _) in zip(entries, entries[1:] + [(10**18, 0)]):
        s = tok // seq
        assert ramp.batch_at(s) == batch and ramp.batch_at(nxt // seq - 1) == batch
    assert all(b % inc == 0 for _, b in entries)  # every step a multiple of micro_batch x dp
    # sample-based length and warm-up (Megatron refuses a ramp with iteration-based training)
    assert int(f["--train-samples"][0]) == ramp.samples_after(150000)
    assert int(f["--lr-warmup-samples"][0]) == ramp.samples_after(2000)


def test_megatron_deepspeed_sample_ramp(tmp_path):
    """Megatron-DeepSpeed's ramp is --rampup-batch-size START INC SAMPLES with sample-based training."""
    root = Path(__file__).resolve().parents[2]
    src = (root / "ds_configs" / "mixtral_8x7b_2x8_h100.yaml").read_text()
    p = tmp_path / "ramp.yaml"
    p.write_text(src + "  batch_ramp:\n    kind: megatron\n    start_batch: 64\n    increment: 64\n"
                 "    ramp_samples: 100000\n")
    spec, shape = load_spec_and_shape(p)
    from dstoolkit.generate import generate

    o = generate(spec, shape, ["zero1"]).generated[0]
    c = o.chosen.candidate
    f = flags(megatron_deepspeed_args(spec, shape, c, ds_config_path=tmp_path / "ds_config.json"))
    assert f["--rampup-batch-size"] == ["64", "64", "100000"] and f["--global-batch-size"] == ["256"]
    assert "--train-iters" not in f and "--train-samples" in f and "--lr-decay-samples" in f
    lm = flags(megatron_lm_args(spec, shape, c))
    assert lm["--step-batch-size-schedule"][0].startswith("0:64 ")


def test_model_constants_from_hf_config(tmp_path):
    """A config's own rope_theta / rms_norm_eps / initializer_range win over the family defaults."""
    cfg = {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "rope_theta": 1000000.0,
           "rms_norm_eps": 1e-6, "initializer_range": 0.01, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""\
        name: qwen_tiny
        model: {hf_config: config.json}
        cluster: {nodes: 1, gpus_per_node: 2, gpu: H100-SXM}
        training: {seq_len: 512, global_batch: 8, micro_batch: 1, tp: 2, pp: 1, zero_stage: 1}
        """))
    spec, shape = load_spec_and_shape(tmp_path / "s.yaml")
    k = model_constants(spec, shape)
    assert (k.rope_theta, k.norm_eps, k.init_std) == (1e6, 1e-6, 0.01)
    from dstoolkit.generate import generate

    c = generate(spec, shape, ["zero1"]).generated[0].chosen.candidate
    f = flags(megatron_lm_args(spec, shape, c))
    assert f["--rotary-base"] == ["1000000"] and "--add-qkv-bias" in f and "--disable-bias-linear" in f
    assert f["--make-vocab-size-divisible-by"] == ["125"]  # 1000 % (125 * tp 2) == 0: no padding
    with pytest.raises(UnsupportedTarget, match="biases on q/k/v only"):
        megatron_deepspeed_args(spec, shape, c, ds_config_path=tmp_path / "ds_config.json")


def test_vocab_divisor():
    assert vocab_divisor(128256, 1) == 128 and vocab_divisor(128256, 4) == 96  # 128256 = 2^8 * 3 * 167
    assert 128256 % (vocab_divisor(128256, 8) * 8) == 0
    assert vocab_divisor(50257, 2) == 1  # odd vocab at tp 2: no divisor avoids padding


def test_args_file_is_one_unquoted_word_per_line_and_mapfile_reads_it_back(tmp_path):
    stem, spec, shape, o = next(a for a in ALL if a[0] == "deepseek_v3_32x8_h800")
    words = megatron_lm_args(spec, shape, o.chosen.candidate)
    text = render_args_file(words)
    assert "'" not in text and '"' not in text
    assert read_args_file(text) == words
    p = tmp_path / "a.txt"
    p.write_text(text)
    out = subprocess.run(["bash", "-c", 'mapfile -t ARGS < "$1"; printf "%s\\0" "${ARGS[@]}"', "_", str(p)],
                         capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:-1] == words  # brackets and the spaced schedule arrive as one word each
    with pytest.raises(ValueError):
        render_args_file(["--x", "a\nb"])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("stem", ["llama3_8b_1x8_h100", "mixtral_8x7b_2x8_h100"])
def test_launch_scripts_pass_the_file(stem, tmp_path):
    """Each launch script runs torchrun on PRETRAIN with exactly the file's words, the data arguments, and (for
    Megatron-DeepSpeed) the absolute ds_config.json beside it; CUDA_DEVICE_MAX_CONNECTIONS=1 for Megatron-LM."""
    _, spec, shape, o = next(a for a in ALL if a[0] == stem and a[3].name == "zero1")
    folder = tmp_path / "gen" / "zero1"
    folder.mkdir(parents=True)
    (folder / "ds_config.json").write_text(o.files["ds_config.json"])
    res = write_megatron_targets(folder, spec, shape, o.chosen.candidate,
                                 pretrain_script={"megatron-lm": str(tmp_path / "mlm" / "pretrain_gpt.py")})
    # the scripts stop on a PRETRAIN that is not a file: Megatron-LM's as given, Megatron-DeepSpeed's default
    # (relative to where the script is launched, cwd=tmp_path below)
    for tree in ("mlm", "Megatron-DeepSpeed"):
        (tmp_path / tree).mkdir()
        (tmp_path / tree / "pretrain_gpt.py").write_text("")
    assert not res.skipped and set(res.files) == {ARGS_FILE[t] for t in TARGETS} | {LAUNCH_FILE[t] for t in TARGETS}
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\0" "CDMC=${CUDA_DEVICE_MAX_CONNECTIONS:-}" "$@"\n')
    (fake / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DATA_ARGS", None)
    env.pop("MOCK_DATA", None)
    for v in ("NODE_RANK", "MASTER_ADDR", "NNODES"):
        env.pop(v, None)
    if spec.cluster.nodes > 1:  # a multi-node launch without NODE_RANK / MASTER_ADDR: one line naming the variable
        for t in TARGETS:
            r = subprocess.run(["bash", str(folder / LAUNCH_FILE[t])], env={**env, "DATA_ARGS": "--x"},
                               capture_output=True, text=True, cwd=tmp_path)
            assert r.returncode == 2 and r.stderr.count("\n") == 1 and "NODE_RANK is not set" in r.stderr
            r = subprocess.run(["bash", str(folder / LAUNCH_FILE[t])], env={**env, "DATA_ARGS": "--x", "NODE_RANK": "1"},
                               capture_output=True, text=True, cwd=tmp_path)
            assert r.returncode == 2 and "MASTER_ADDR is not set" in r.stderr
        env.update(NODE_RANK="0", MASTER_ADDR="localhost")
    for t in TARGETS:  # no data arguments: a one-line message naming DATA_ARGS, exit 2, torchrun never started
        r = subprocess.run(["bash", str(folder / LAUNCH_FILE[t])], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 2 and r.stdout == "" and "DATA_ARGS is not set" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    env["MOCK_DATA"] = "1"  # Megatron-LM's synthetic data only when asked, and said on stderr
    env["DATA_ARGS"] = DEFAULT_DATA_ARGS["megatron-deepspeed"]
    r = subprocess.run(["bash", str(folder / LAUNCH_FILE["megatron-lm"])], env={**env, "DATA_ARGS": ""},
                       capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "MOCK_DATA=1" in r.stderr and "--mock-data" in r.stdout
    for t in TARGETS:
        script = folder / LAUNCH_FILE[t]
        assert script.stat().st_mode & stat.S_IXUSR
        got = subprocess.run(["bash", str(script), "--log-interval", "1"],
                             env={**env, "DATA_ARGS": "" if t == "megatron-lm" else DEFAULT_DATA_ARGS[t]},
                             capture_output=True,
                             check=True, cwd=tmp_path).stdout.decode().split("\0")[:-1]
        words = read_args_file((folder / ARGS_FILE[t]).read_text())
        i = got.index("--master-port") + 2
        pretrain = got[i]
        tail = got[i + 1:]
        assert got[0] == "CDMC=1"
        assert tail[:len(words)] == words
        rest = tail[len(words):]
        data = DEFAULT_DATA_ARGS[t].split()
        assert rest[:len(data)] == data
        if t == "megatron-lm":
            assert pretrain == str(tmp_path / "mlm" / "pretrain_gpt.py") and rest[len(data):] == ["--log-interval", "1"]
        else:
            assert rest[len(data):] == ["--deepspeed_config", str(folder.resolve() / "ds_config.json"),
                                        "--log-interval", "1"]
            assert flags(words)["--deepspeed_config"] == [str(folder.resolve() / "ds_config.json")]


def test_fsdp_launch_unsets_cuda_device_max_connections(tmp_path):
    stem, spec, shape, o = next(a for a in ALL if a[0] == "llama3_8b_1x8_h100" and a[3].name == "zero3")
    files = megatron_target_files(tmp_path, spec, shape, o.chosen.candidate).files
    assert "--use-megatron-fsdp" in files[ARGS_FILE["megatron-lm"]].splitlines()
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in files[LAUNCH_FILE["megatron-lm"]]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in files[LAUNCH_FILE["megatron-deepspeed"]]


# ------------------------------------------------------------------------------- megatron-core (PyPI)

# Megatron-LM flag -> megatron.core config field (flags absent here are training-loop or model-builder options).
_CORE_FIELDS = {
    "--num-layers": ("num_layers", int), "--hidden-size": ("hidden_size", int),
    "--ffn-hidden-size": ("ffn_hidden_size", int), "--num-attention-heads": ("num_attention_heads", int),
    "--kv-channels": ("kv_channels", int), "--num-query-groups": ("num_query_groups", int),
    "--attention-dropout": ("attention_dropout", float), "--hidden-dropout": ("hidden_dropout", float),
    "--init-method-std": ("init_method_std", float), "--normalization": ("normalization", str),
    "--norm-epsilon": ("layernorm_epsilon", float),
    "--tensor-model-parallel-size": ("tensor_model_parallel_size", int),
    "--pipeline-model-parallel-size": ("pipeline_model_parallel_size", int),
    "--expert-model-parallel-size": ("expert_model_parallel_size", int),
    "--decoder-first-pipeline-num-layers": ("num_layers_in_first_pipeline_stage", int),
    "--decoder-last-pipeline-num-layers": ("num_layers_in_last_pipeline_stage", int),
    "--pipeline-model-parallel-layout": ("pipeline_model_parallel_layout", str),
    "--num-experts": ("num_moe_experts", int), "--moe-router-topk": ("moe_router_topk", int),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", int),
    "--moe-shared-expert-intermediate-size": ("moe_shared_expert_intermediate_size", int),
    "--moe-token-dispatcher-type": ("moe_token_dispatcher_type", str),
    "--moe-aux-loss-coeff": ("moe_aux_loss_coeff", float),
    "--moe-router-score-function": ("moe_router_score_function", str),
    "--moe-router-load-balancing-type": ("moe_router_load_balancing_type", str),
    "--moe-router-topk-scaling-factor": ("moe_router_topk_scaling_factor", float),
    "--moe-router-num-groups": ("moe_router_num_groups", int),
    "--moe-router-group-topk": ("moe_router_group_topk", int),
    "--recompute-granularity": ("recompute_granularity", str), "--recompute-method": ("recompute_method", str),
    "--recompute-num-layers": ("recompute_num_layers", int),
    "--q-lora-rank": ("q_lora_rank", int), "--kv-lora-rank": ("kv_lora_rank", int),
    "--qk-head-dim": ("qk_head_dim", int), "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", int),
    "--v-head-dim": ("v_head_dim", int), "--rotary-base": ("rotary_base", float),
}
_CORE_SWITCHES = {"--sequence-parallel": "sequence_parallel", "--moe-grouped-gemm": "moe_grouped_gemm",
                  "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias", "--add-qkv-bias": "add_qkv_bias",
                  "--qk-layernorm": "qk_layernorm", "--bf16": "bf16", "--fp16": "fp16"}


def _core():
    try:
        import megatron.core  # noqa: F401
        from megatron.core import ModelParallelConfig
        from megatron.core.transformer import MLATransformerConfig, TransformerConfig
    except Exception as exc:  # noqa: BLE001 - any import failure means: cannot check here
        pytest.skip(f"megatron-core cannot be imported here ({type(exc).__name__}: {exc}); pip install megatron-core==0.16.1")
    return ModelParallelConfig, TransformerConfig, MLATransformerConfig


def _core_kwargs(f: dict[str, list[str]]) -> dict:
    """megatron.core TransformerConfig fields from Megatron-LM flags, torch-free (dtype and activation by name;
    see `_core_materialize`)."""
    kw = {}
    for flag, (field, typ) in _CORE_FIELDS.items():
        if flag in f:
            kw[field] = typ(f[flag][0])
    for flag, field in _CORE_SWITCHES.items():
        if flag in f:
            kw[field] = True
    if "--moe-layer-freq" in f:
        kw["moe_layer_freq"] = json.loads(f["--moe-layer-freq"][0])
    kw["gated_linear_unit"] = "--swiglu" in f
    kw["activation_func"] = "silu" if "--swiglu" in f else "gelu"
    kw["add_bias_linear"] = "--disable-bias-linear" not in f
    kw["params_dtype"] = "bfloat16" if kw.get("bf16") else "float16" if kw.get("fp16") else "float32"
    kw["pipeline_dtype"] = kw["params_dtype"]  # as Megatron-LM's core_transformer_config_from_args sets it
    kw["gradient_accumulation_fusion"] = "--no-gradient-accumulation-fusion" not in f
    kw["masked_softmax_fusion"] = "--no-masked-softmax-fusion" not in f
    return kw


def _core_materialize(kw: dict) -> dict:
    import torch

    kw = dict(kw)
    kw["activation_func"] = getattr(torch.nn.functional, kw["activation_func"])
    kw["params_dtype"] = kw["pipeline_dtype"] = getattr(torch, kw["params_dtype"])
    return kw


@pytest.mark.parametrize("stem,spec,shape,o", ALL, ids=IDS)
def test_megatron_lm_values_build_megatron_core_configs(stem, spec, shape, o):
    """The Megatron-LM values build megatron.core's ModelParallelConfig and (MLA)TransformerConfig: their
    __post_init__ checks (heads vs TP, GQA groups, MoE/EP, SP needs TP, recompute, pipeline split) pass."""
    import dataclasses

    import torch

    ModelParallelConfig, TransformerConfig, MLATransformerConfig = _core()
    f = flags(megatron_lm_args(spec, shape, o.chosen.candidate))
    kw = _core_materialize(_core_kwargs(f))
    if "--swiglu" not in f:
        kw.pop("activation_func")  # megatron-core's default (GeLU)
    cls = MLATransformerConfig if "--multi-latent-attention" in f else TransformerConfig
    if cls is TransformerConfig:  # the RoPE base is a GPTModel argument for standard attention
        assert float(kw.pop("rotary_base")) == model_constants(spec, shape).rope_theta
    names = {x.name for x in dataclasses.fields(cls)}
    missing = sorted(set(kw) - names)
    assert not missing, f"fields not in {cls.__name__}: {missing}"
    cfg = cls(**kw)
    assert cfg.num_layers == shape.num_hidden_layers and cfg.tensor_model_parallel_size == o.chosen.candidate.tp
    mp_names = {x.name for x in dataclasses.fields(ModelParallelConfig)}
    ModelParallelConfig(**{k: v for k, v in kw.items() if k in mp_names})
    if shape.is_moe:
        assert cfg.num_moe_experts == shape.num_experts


def test_gpt2_style_model_on_both_targets(tmp_path):
    """Learned positions, LayerNorm, all biases and tanh GeLU: each target's own spelling, no RoPE flags."""
    (tmp_path / "g.yaml").write_text(textwrap.dedent("""\
        name: gpt2_tiny
        model: {model_type: gpt2, n_embd: 256, n_layer: 2, n_head: 4, vocab_size: 1024, n_positions: 512}
        cluster: {nodes: 1, gpus_per_node: 2, gpu: H100-SXM}
        training: {seq_len: 512, global_batch: 8, micro_batch: 1, tp: 1, pp: 1, zero_stage: 2, precision: fp16}
        """))
    spec, shape = load_spec_and_shape(tmp_path / "g.yaml")
    from dstoolkit.generate import generate

    c = generate(spec, shape, ["zero2"]).generated[0].chosen.candidate
    lm = flags(megatron_lm_args(spec, shape, c))
    assert lm["--position-embedding-type"] == ["learned_absolute"] and "--rotary-base" not in lm
    assert lm["--normalization"] == ["LayerNorm"] and "--openai-gelu" in lm and "--swiglu" not in lm
    assert "--disable-bias-linear" not in lm and "--fp16" in lm
    assert lm["--train-iters"] == ["20"]  # no train_steps in the spec: the smoke default, never zero
    ds = flags(megatron_deepspeed_args(spec, shape, c, ds_config_path=tmp_path / "ds_config.json"))
    assert ds["--normalization"] == ["layernorm"] and "--use-rotary-position-embeddings" not in ds
    assert "--openai-gelu" in ds and "--no-pipeline-parallel" in ds and ds["--zero-stage"] == ["2"]
    # GPT-2's dropout (transformers' default 0.1, what the estimate charges) on both targets; the config's own wins
    assert lm["--attention-dropout"] == ds["--attention-dropout"] == ["0.1"] and lm["--hidden-dropout"] == ["0.1"]
    (tmp_path / "g0.yaml").write_text((tmp_path / "g.yaml").read_text().replace(
        "n_positions: 512}", "n_positions: 512, attn_pdrop: 0.0, resid_pdrop: 0.0}"))
    spec0, shape0 = load_spec_and_shape(tmp_path / "g0.yaml")
    lm0 = flags(megatron_lm_args(spec0, shape0, c))
    assert lm0["--attention-dropout"] == ["0.0"] and lm0["--hidden-dropout"] == ["0.0"]


def test_module_imports_no_torch():
    import sys

    code = "import sys, dstoolkit.generate.megatron; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# One rank (gloo) steps megatron-core's GPTModel built from the Megatron-LM target's values: forward + backward on
# CPU. What megatron-core 0.16.1 needs CUDA for, and what the worker answers instead (each the same arithmetic here):
CORE_CPU_ANSWERS = {
    "torch.cuda.current_device -> 'cpu'": "models/common/embeddings/rotary_pos_embedding.py:162 and "
    "transformer/moe/router.py:90 move CPU tensors to torch.cuda.current_device() on the first forward",
    "initialize_rng_tracker(inference_rng_tracker=True)": "tensor_parallel/random.py:235 CudaRNGStatesTracker.add "
    "calls torch.cuda.get_rng_state; its fork (attention dropout, p = 0 here) is a no-op in megatron-core's own "
    "inference tracker",
    "moe_utils.te_general_gemm = None": "transformer/moe/moe_utils.py:1192 reads te_general_gemm, never defined "
    "without Transformer Engine (NameError)",
    "MoE: --moe-token-dispatcher-type allgather": "transformer/moe/token_dispatcher.py:445 the alltoall dispatcher "
    "builds a torch.cuda.Stream (at EP 1 both dispatchers route the same tokens to the same experts)",
    "MoE: no --moe-grouped-gemm": "transformer/moe/grouped_gemm_util.py:16 GroupedMLP needs the CUDA grouped_gemm "
    "package; SequentialMLP holds the same expert weights",
}

_CORE_WORKER = r"""
import json, os, sys, torch, torch.distributed as dist
job = json.loads(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job['port']}", rank=0, world_size=1)
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel.random import initialize_rng_tracker
from megatron.core.transformer import TransformerConfig
import megatron.core.transformer.moe.moe_utils as moe_utils
parallel_state.initialize_model_parallel(1, 1)
torch.cuda.current_device = lambda: "cpu"
initialize_rng_tracker(inference_rng_tracker=True)
if not hasattr(moe_utils, "te_general_gemm"):
    moe_utils.te_general_gemm = None
torch.manual_seed(0)
kw = job["kw"]
kw["activation_func"] = getattr(torch.nn.functional, kw["activation_func"])
kw["params_dtype"] = kw["pipeline_dtype"] = getattr(torch, kw["params_dtype"])
cfg = TransformerConfig(use_cpu_initialization=True, **kw)
spec = get_gpt_layer_local_spec(num_experts=kw.get("num_moe_experts"), moe_grouped_gemm=False,
                                normalization=kw["normalization"])
model = GPTModel(config=cfg, transformer_layer_spec=spec, vocab_size=job["vocab"], max_sequence_length=job["max_pos"],
                 position_embedding_type="rope", rotary_base=job["rope"], share_embeddings_and_output_weights=job["tied"])
n_params = sum(p.numel() for p in model.parameters())
b, s = 2, 64
tok = torch.randint(0, job["vocab"], (b, s + 1))
pos = torch.arange(s).unsqueeze(0).expand(b, s)
mask = torch.ones(1, 1, s, s, dtype=torch.bool).triu(1)
loss = model(tok[:, :-1], pos, mask, labels=tok[:, 1:]).float().mean()
loss.backward()
grads = [p.grad for p in model.parameters() if p.requires_grad]
print("RESULT " + json.dumps({"params": n_params, "loss": loss.item(), "n_grads": sum(g is not None for g in grads),
                              "n_params_tensors": len(grads),
                              "finite": all(bool(torch.isfinite(g).all()) for g in grads if g is not None)}))
dist.destroy_process_group()
"""


@pytest.mark.dist
@pytest.mark.parametrize("stem", ["tiny_cpu", "tiny_moe_cpu"])
def test_megatron_core_steps_the_generated_model_on_cpu(stem):
    """megatron-core's GPTModel from the Megatron-LM target's TransformerConfig (tiny specs, TP 1, one gloo rank):
    its parameter count is dstoolkit's (exact), and forward + backward give a finite loss near ln(V) at init and a
    finite gradient on every parameter. CORE_CPU_ANSWERS lists what the worker answers for megatron-core's CUDA calls."""
    import math
    import sys

    _core()
    from dstoolkit.models.params import count_params
    from dstoolkit.runtime.train.launch import free_port

    _, spec, shape, o = next(a for a in ALL if a[0] == stem and a[3].name == "zero1")
    f = flags(megatron_lm_args(spec, shape, o.chosen.candidate))
    assert f["--tensor-model-parallel-size"] == ["1"] and f["--position-embedding-type"] == ["rope"]
    kw = _core_kwargs(f)
    kw.pop("rotary_base")
    if shape.is_moe:
        assert kw["moe_token_dispatcher_type"] == "alltoall" and kw["moe_grouped_gemm"]  # what the file says
        kw["moe_token_dispatcher_type"], kw["moe_grouped_gemm"] = "allgather", False  # CORE_CPU_ANSWERS
    job = {"port": free_port(), "kw": kw, "vocab": int(f["--vocab-size"][0]), "rope": int(f["--rotary-base"][0]),
           "max_pos": int(f["--max-position-embeddings"][0]), "tied": "--untie-embeddings-and-output-weights" not in f}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _CORE_WORKER, json.dumps(job)], capture_output=True, text=True,
                       timeout=300, env=env)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert r.returncode == 0 and line, r.stderr[-3000:]
    res = json.loads(line[len("RESULT "):])
    assert res["params"] == count_params(shape).total
    assert res["n_grads"] == res["n_params_tensors"] and res["finite"]
    assert abs(res["loss"] - math.log(shape.vocab_size)) < 1.0  # random init: about uniform over the vocabulary


@pytest.mark.parametrize("train_steps,warmup", [(None, 0), (None, 5), (100, 10)])
def test_lr_schedule_is_the_deepspeed_jsons(train_steps, warmup, tmp_path):
    """Same run in every target: the DeepSpeed JSON's scheduler (ds_json.scheduler_section) and the Megatron
    arguments agree on warm-up, decay and floor (cosine to COSINE_MIN_RATIO x lr only with train_steps)."""
    from dstoolkit.generate import generate
    from dstoolkit.generate.ds_json import COSINE_MIN_RATIO, scheduler_section

    root = Path(__file__).resolve().parents[2]
    extra = (f"  train_steps: {train_steps}\n" if train_steps else "") + f"  warmup_steps: {warmup}\n"
    (tmp_path / "s.yaml").write_text((root / "ds_configs" / "tiny_cpu.yaml").read_text() + extra)
    spec, shape = load_spec_and_shape(tmp_path / "s.yaml")
    c = generate(spec, shape, ["zero1"]).generated[0].chosen.candidate
    sched = scheduler_section(spec)
    for words in (megatron_lm_args(spec, shape, c),
                  megatron_deepspeed_args(spec, shape, c, ds_config_path=tmp_path / "ds_config.json")):
        f = flags(words)
        if train_steps:
            assert sched["type"] == "WarmupCosineLR" and f["--lr-decay-style"] == ["cosine"]
            assert float(f["--min-lr"][0]) == pytest.approx(spec.training.lr * COSINE_MIN_RATIO)
            assert f["--lr-decay-iters"] == [str(sched["params"]["total_num_steps"])]
        else:  # DeepSpeed: WarmupLR (then constant) or no scheduler: constant after any warm-up
            assert (sched is None) == (warmup == 0) and f["--lr-decay-style"] == ["constant"]
            assert "--min-lr" not in f
        assert f.get("--lr-warmup-iters", ["0"]) == [str(warmup)]


def _llama_spec(tmp_path, training: str):
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nmodel: {preset: llama-3-8b}\ncluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
                 f"training: {{seq_len: 32768, global_batch: 16, micro_batch: 1, precision: bf16, {training}}}\n")
    return load_spec_and_shape(p)


def test_ulysses_is_megatron_cores_all_to_all_context_parallelism(tmp_path):
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.targets import sequence_sharding_reason

    spec, shape = _llama_spec(tmp_path, "tp: 2, ulysses: 2, framework: megatron")
    cand = Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1, ulysses=2)
    f = flags(megatron_lm_args(spec, shape, cand))
    assert f["--context-parallel-size"] == ["2"] and f["--cp-comm-type"] == ["a2a"]
    assert sequence_sharding_reason("megatron-lm", cand, shape) is None
    assert sequence_sharding_reason("megatron-deepspeed", cand, shape) is None
    assert "--target megatron-deepspeed / megatron-lm" in sequence_sharding_reason("deepspeed", cand, shape)
    # Transformer Engine's a2a attention needs each TP rank's heads divisible by the degree: 8 kv heads / tp 2 = 4
    odd = Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1, ulysses=8)
    why = sequence_sharding_reason("megatron-lm", odd, shape)
    assert why is not None and "key/value heads of each TP rank (8 / tp 2 = 4)" in why
    # nor does DistributedAttention give 8 ranks a key/value head out of 4 (LY020), so neither launcher is advised
    assert "training.ulysses=8 exceeds the 4 key/value heads" in sequence_sharding_reason("megatron-deepspeed", odd, shape)
    assert "--target megatron-deepspeed" not in why and "run it on megatron-deepspeed" not in why
    # ring context parallelism keeps the p2p default
    ring = flags(megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1, cp=2)))
    assert ring["--context-parallel-size"] == ["2"] and "--cp-comm-type" not in ring


def test_tp_comm_overlap_follows_the_spec_and_needs_sequence_parallelism(tmp_path):
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.io import SpecLoadError

    spec, shape = _llama_spec(tmp_path, "tp: 2, sequence_parallel: true, tp_comm_overlap: true, framework: megatron")
    on = flags(megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1,
                                                         sequence_parallel=True)))
    assert "--tp-comm-overlap" in on and "--sequence-parallel" in on
    spec, shape = _llama_spec(tmp_path, "tp: 2, framework: megatron")
    off = flags(megatron_lm_args(spec, shape, Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1)))
    assert "--tp-comm-overlap" not in off and "--sequence-parallel" not in off
    with pytest.raises(SpecLoadError, match=r"s.yaml:4:\d+: training.tp_comm_overlap: tp_comm_overlap=true without sequence_parallel"):
        _llama_spec(tmp_path, "tp: 2, tp_comm_overlap: true, framework: megatron")


def test_megatron_lm_runs_the_specs_pipeline_schedule(tmp_path):
    from dstoolkit.generate.candidates import Candidate

    cand = Candidate(zero_stage=1, tp=1, pp=4, micro_batch=1)
    spec, shape = _llama_spec(tmp_path, "tp: 1, pp: 4, pipeline_schedule: interleaved, virtual_stages: 2, "
                                        "framework: megatron")
    f = flags(megatron_lm_args(spec, shape, cand))
    assert f["--num-virtual-stages-per-pipeline-rank"] == ["2"]  # 32 layers / 4 stages = 8 = 2 chunks of 4
    spec, shape = _llama_spec(tmp_path, "tp: 1, pp: 4, pipeline_schedule: interleaved, virtual_stages: 3, "
                                        "framework: megatron")
    with pytest.raises(UnsupportedTarget, match=r"virtual_stages=3 needs every pipeline stage's layer count "
                                                r"divisible by 3 \(stages of 8, 8, 8, 8 layers\)"):
        megatron_lm_args(spec, shape, cand)
    spec, shape = _llama_spec(tmp_path, "tp: 1, pp: 4, pipeline_schedule: zero-bubble, framework: megatron")
    with pytest.raises(UnsupportedTarget, match="pipeline_schedule 'zero-bubble' is not a Megatron-LM schedule"):
        megatron_lm_args(spec, shape, cand)
    with pytest.raises(UnsupportedTarget, match=r"pipeline_schedule 'zero-bubble' \(DeepSpeed's pipeline engine "):
        megatron_deepspeed_args(spec, shape, cand, ds_config_path="ds_config.json")
    spec, shape = _llama_spec(tmp_path, "tp: 1, pp: 4, framework: megatron")
    assert "--num-virtual-stages-per-pipeline-rank" not in flags(megatron_lm_args(spec, shape, cand))


def test_each_target_gets_files_only_for_a_layout_it_runs(tmp_path, capsys):
    from dstoolkit.cli import main

    spec = tmp_path / "u.yaml"
    spec.write_text("name: u\nmodel: {preset: llama-3-8b}\ncluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
                    "training: {seq_len: 4096, global_batch: 64, micro_batch: 1, precision: bf16, tp: 1, pp: 1, "
                    "zero_stage: 1, ulysses: 2}\n")
    out = tmp_path / "o"
    assert main(["generate", str(spec), "-o", str(out), "--strategy", "zero1", "--target", "deepspeed",
                 "--target", "megatron-lm"]) == 0
    assert sorted(p.name for p in (out / "zero1").iterdir() if "launch" in p.name) == ["launch_megatron_lm.sh"]
    assert ("zero1: no deepspeed files: training.ulysses=2: deepspeed does not split sequences that way"
            in capsys.readouterr().out)
    # a layout none of the requested targets runs: the folder says why, and the exit code says nothing launches
    il = tmp_path / "il.yaml"
    il.write_text(spec.read_text().replace("pp: 1,", "pp: 4, pipeline_schedule: interleaved, virtual_stages: 3, "
                                           "framework: megatron,").replace(" ulysses: 2", " ulysses: 1"))
    assert main(["generate", str(il), "-o", str(tmp_path / "il"), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 1
    captured = capsys.readouterr()
    # the sweep drops the layouts Megatron-LM refuses (targets.target_refusal, s33): the strategy is not generated
    assert "zero1: megatron-lm: virtual_stages=3" in captured.err
    assert "no configuration written for u" in captured.err
