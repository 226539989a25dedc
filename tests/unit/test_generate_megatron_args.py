"""megatron_args.txt agrees with the DeepSpeed JSON and the spec: parallel sizes, MoE, batch, ramp, precision,
fp8 and recompute flags."""
from __future__ import annotations

import json
import math
import shlex

from dstoolkit.generate.bundled import cached_bundled
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.megatron_args import build_megatron_args
from dstoolkit.spec.checkpoint import CheckpointPolicy


def _flags(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        words = shlex.split(line)
        out[words[0]] = words[1:]
    return out


def _folder(repo_root, stem, strategy):
    res = cached_bundled(str(repo_root / "ds_configs"), stem)
    o = next(o for o in res.generated if o.name == strategy)
    return _flags(o.files["megatron_args.txt"]), json.loads(o.files["ds_config.json"]), o


def test_consistent_with_deepspeed_json_for_every_folder(repo_root):
    from dstoolkit.generate.bundled import BUNDLED_SPECS

    for stem in BUNDLED_SPECS:
        for o in cached_bundled(str(repo_root / "ds_configs"), stem).generated:
            f, cfg = _flags(o.files["megatron_args.txt"]), json.loads(o.files["ds_config.json"])
            c = o.chosen.candidate
            assert f["--micro-batch-size"] == [str(cfg["train_micro_batch_size_per_gpu"])]
            assert f["--global-batch-size"] == [str(cfg["train_batch_size"])]
            assert f["--zero-stage"] == [str(cfg["zero_optimization"]["stage"])]
            assert f["--tensor-model-parallel-size"] == [str(c.tp)]
            assert f["--pipeline-model-parallel-size"] == [str(c.pp)]
            assert ("--bf16" in f) == ("bf16" in cfg)
            assert ("--fp16" in f) == ("fp16" in cfg)


def test_moe_flags_for_expert_parallel_variant(repo_root):
    f, cfg, o = _folder(repo_root, "tiny_moe_cpu", "zero1-ep")
    assert f["--num-experts"] == ["4"]  # tiny-moe preset: 4 experts, top-2
    assert f["--moe-router-topk"] == ["2"]
    assert f["--expert-model-parallel-size"] == ["2"]  # 2 ranks, ep variant
    f1, _, _ = _folder(repo_root, "tiny_moe_cpu", "zero1")
    assert f1["--expert-model-parallel-size"] == ["1"]


def test_deepseek_ramp_fp8_and_uneven_pipeline(repo_root):
    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / "deepseek_v3_32x8_h800.yaml")
    res = cached_bundled(str(repo_root / "ds_configs"), "deepseek_v3_32x8_h800")
    o = res.generated[0]
    f = _flags(o.files["megatron_args.txt"])
    c = o.chosen.candidate
    dp = spec.world_size // (c.tp * c.pp)
    # DeepSeek-V3 §4.2: 3072 -> 15360 sequences over 469B tokens at 4K context; Megatron counts samples.
    start, inc, samples = (int(x) for x in f["--rampup-batch-size"])
    assert start == 3072
    assert samples == math.ceil(469_000_000_000 / 4096)
    assert inc == c.micro_batch * dp and (15360 - 3072) % inc == 0
    assert f["--fp8-format"] and f["--bf16"] == []
    # 61 layers (docs/anchors.md) over pp stages: the other stages take ceil(61/pp) each, stage 0 the rest.
    if c.pp > 1 and 61 % c.pp:
        per = math.ceil(61 / c.pp)
        assert f["--decoder-first-pipeline-num-layers"] == [str(61 - (c.pp - 1) * per)]
    assert f["--multi-latent-attention"] == [] and f["--kv-lora-rank"] == ["512"] and f["--q-lora-rank"] == ["1536"]
    assert f["--num-experts"] == ["256"] and f["--moe-router-topk"] == ["8"]
    # first 3 dense layers, then MoE every layer
    assert f["--moe-layer-freq"] == ["([" + ",".join(["0"] * 3 + ["1"] * 58) + "])"]


def test_recompute_flags_per_policy(repo_root):
    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / "llama3_8b_1x8_h100.yaml")

    def flags(policy, pp=1):
        c = Candidate(zero_stage=1, micro_batch=1, checkpoint=policy, pp=pp)
        return {k: list(v) for k, v in build_megatron_args(spec, shape, c)}

    assert "--recompute-granularity" not in flags(CheckpointPolicy(kind="none"))
    assert flags(CheckpointPolicy(kind="selective"))["--recompute-granularity"] == ["selective"]
    full = flags(CheckpointPolicy(kind="full"))
    assert full["--recompute-method"] == ["uniform"] and full["--recompute-num-layers"] == ["1"]
    # every-2 on 32 layers / pp 2 = 16 layers per stage: 8 checkpointed per stage
    ek = flags(CheckpointPolicy(kind="every-k", every_k=2), pp=2)
    assert ek["--recompute-method"] == ["block"] and ek["--recompute-num-layers"] == ["8"]


def test_values_are_shell_quoted(repo_root):
    res = cached_bundled(str(repo_root / "ds_configs"), "deepseek_v3_32x8_h800")
    text = res.generated[0].files["megatron_args.txt"]
    line = next(ln for ln in text.splitlines() if ln.startswith("--moe-layer-freq"))
    assert line.split(" ", 1)[1].startswith("'")  # brackets/parens are quoted, so xargs passes one word
