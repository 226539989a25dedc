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
from dstoolkit.generate.megatron import (ARGS_FILE, DEFAULT_DATA_ARGS, LAUNCH_FILE, TARGETS, RampPlan,
                                         UnsupportedTarget, megatron_deepspeed_args, megatron_lm_args,
                                         megatron_target_files, model_constants, read_args_file, render_args_file,
                                         vocab_divisor, write_megatron_targets)

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
    assert "--use-flash-attn" not in f and f["--attention-backend"] == ["flash"]
    assert "--rampup-batch-size" not in f  # parsed and ignored by Megatron-LM
    assert f["--tensor-model-parallel-size"] == [str(c.tp)] and f["--pipeline-model-parallel-size"] == [str(c.pp)]
    assert ("--sequence-parallel" in f) == (c.tp > 1)
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
    assert "--use-flash-attn-v2" in f
    assert ("--sequence-parallel" in f) == (c.tp > 1)
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
    with pytest.raises(UnsupportedTarget, match="q/k/v-only biases"):
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
                                 pretrain_script={"megatron-lm": "/opt/mlm/pretrain_gpt.py"})
    assert not res.skipped and set(res.files) == {ARGS_FILE[t] for t in TARGETS} | {LAUNCH_FILE[t] for t in TARGETS}
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "torchrun").write_text('#!/usr/bin/env bash\nprintf "%s\\0" "CDMC=${CUDA_DEVICE_MAX_CONNECTIONS:-}" "$@"\n')
    (fake / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DATA_ARGS", None)
    for t in TARGETS:
        script = folder / LAUNCH_FILE[t]
        assert script.stat().st_mode & stat.S_IXUSR
        got = subprocess.run(["bash", str(script), "--log-interval", "1"], env=env, capture_output=True,
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
            assert pretrain == "/opt/mlm/pretrain_gpt.py" and rest[len(data):] == ["--log-interval", "1"]
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


@pytest.mark.parametrize("stem,spec,shape,o", ALL, ids=IDS)
def test_megatron_lm_values_build_megatron_core_configs(stem, spec, shape, o):
    """The Megatron-LM values build megatron.core's ModelParallelConfig and (MLA)TransformerConfig: their
    __post_init__ checks (heads vs TP, GQA groups, MoE/EP, SP needs TP, recompute, pipeline split) pass."""
    import dataclasses

    import torch

    ModelParallelConfig, TransformerConfig, MLATransformerConfig = _core()
    f = flags(megatron_lm_args(spec, shape, o.chosen.candidate))
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
    if "--swiglu" in f:
        kw["activation_func"] = torch.nn.functional.silu
    kw["add_bias_linear"] = "--disable-bias-linear" not in f
    kw["params_dtype"] = torch.bfloat16 if kw.get("bf16") else torch.float16 if kw.get("fp16") else torch.float32
    kw["pipeline_dtype"] = kw["params_dtype"]  # as Megatron-LM's core_transformer_config_from_args sets it
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


def test_module_imports_no_torch():
    import sys

    code = "import sys, dstoolkit.generate.megatron; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
