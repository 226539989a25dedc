"""`dstoolkit estimate --config/--model/--world-size` asks the rules the spec form asks, and a SPEC.yaml refuses the
flags it would not read.

The flag form used to estimate layouts the spec form refuses (fp8 on A100, ZeRO-2 with pp 2, native MoE at ZeRO-3,
8 ranks on nodes of 3, a TP group across a node boundary), and `estimate SPEC.yaml --tp 8 --gpu A100-40G ...`
estimated the spec as written, every flag ignored, exit 0.
"""
import json

import pytest

from dstoolkit.cli import main
from dstoolkit.cli.estimate import FLAG_FORM_ONLY

BATCH = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
         "bf16": {"enabled": True}}


def _cfg(tmp_path, stage=2, name="ds.json", **more):
    cfg = tmp_path / name
    cfg.write_text(json.dumps({**BATCH, "zero_optimization": {"stage": stage}, **more}))
    return cfg


def _spec(tmp_path, cluster, training, preset="llama-3-8b"):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: s\nmodel: {{preset: {preset}}}\ncluster: {{{cluster}}}\n"
                    f"training: {{seq_len: 4096, precision: bf16, {training}}}\n")
    return spec


def _run(capsys, *argv):
    capsys.readouterr()
    rc = main(["estimate", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def _error(capsys, *argv) -> str:
    """The one-line error of an exit-2 run."""
    rc, out, err = _run(capsys, *argv)
    assert rc == 2, out + err
    assert out == "" and err.count("\n") == 1, err
    return err.removeprefix("dstoolkit estimate: error: ").rstrip("\n")


# -- A: the flag form runs the spec form's rules -------------------------------------------------------------

def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_like_the_spec(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--gpu", "A100-80G",
                  "--precision", "fp8") == (
        "--precision fp8 with --gpu A100-80G: fp8.recipe='delayed' needs compute capability sm_89+ but "
        "'A100-80G' is sm_80: use bf16 (FP8 tensor cores start with Ada/Hopper)")
    # the spec form refuses the same run (SP004)
    spec = _spec(tmp_path, "nodes: 1, gpus_per_node: 8, gpu: A100-80G", "global_batch: 64, micro_batch: 2, "
                 "zero_stage: 2").read_text().replace("precision: bf16", "precision: fp8")
    (tmp_path / "spec.yaml").write_text(spec)
    assert "training.precision='fp8' but cluster.gpu='A100-80G' has no fp8 tensor cores" in _error(
        capsys, tmp_path / "spec.yaml")
    # where the tensor cores are there, fp8 estimates
    rc, out, _ = _run(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--gpu", "H100-SXM",
                      "--precision", "fp8", "--checkpoint", "full")
    assert rc == 0 and "ZeRO-2, fp8," in out.splitlines()[0]


def test_fp8_recipe_comes_from_the_config_section(tmp_path, capsys):
    cfg = _cfg(tmp_path, dstoolkit={"fp8": {"recipe": "mxfp8"}})
    base = ["--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--precision", "fp8"]
    assert _error(capsys, *base, "--gpu", "H100-SXM") == (
        f"--precision fp8 with --gpu H100-SXM (the recipe of {cfg}: dstoolkit.fp8): fp8.recipe='mxfp8' needs "
        "compute capability sm_100+ but 'H100-SXM' is sm_90: use recipe 'block' (sm_90) or 'delayed', or a "
        "Blackwell (sm_100) GPU")
    rc, out, _ = _run(capsys, *base, "--gpu", "B200")
    assert rc == 0 and "8 x B200" in out


def test_zero2_with_pipeline_parallelism_is_refused_naming_the_flag(tmp_path, capsys):
    cfg = _cfg(tmp_path, stage=2, train_batch_size=64, gradient_accumulation_steps=8)
    # the config's own rule (DS232, what `dstoolkit validate --pp 2` says): a finding in the file, exit 1
    rc, out, err = _run(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--pp", "2")
    assert rc == 1 and ("error[DS232]: zero_optimization.stage=2 is incompatible with --pp=2: DeepSpeed's pipeline "
                        "engine raises 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' (use ZeRO "
                        "stage 1 with pipeline parallelism, or pp 1)") in out + err
    # the spec form refuses it with the same rule
    spec = _spec(tmp_path, "nodes: 1, gpus_per_node: 8", "global_batch: 64, micro_batch: 2, zero_stage: 2, pp: 2")
    assert "training.zero_stage=2 is incompatible with training.pp=2" in _error(capsys, spec)
    # ZeRO-1 with the same pipeline estimates
    rc, out, _ = _run(capsys, "--config", _cfg(tmp_path, stage=1, name="z1.json", gradient_accumulation_steps=8),
                      "--model", "llama-3-8b", "--world-size", "8", "--pp", "2", "--checkpoint", "full")
    assert rc == 0 and "tp=1 pp=2 ep=1 dp=4; ZeRO-1" in out


def test_native_moe_at_zero3_is_a_config_finding(tmp_path, capsys):
    """The model's experts reach validate_config: DS214 (LY010) refuses native MoE at ZeRO-3, exit 1, as
    `dstoolkit validate --num-experts 8` does."""
    cfg = tmp_path / "moe.json"
    cfg.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                               "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 3}}))
    rc, out, err = _run(capsys, "--config", cfg, "--model", "mixtral-8x7b", "--world-size", "8", "--ep", "2")
    assert rc == 1 and out == ""
    assert "error[DS214]: MoE with 8 experts at zero_optimization.stage=3" in err
    assert f"dstoolkit estimate: {cfg}: 1 error(s) from validate_config: not estimated" in err
    # a dense model at ZeRO-3 is not MoE: estimated
    rc, out, _ = _run(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8")
    assert rc == 0 and "ZeRO-3" in out.splitlines()[0]


def test_world_size_must_be_whole_nodes(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    base = ["--config", cfg, "--model", "llama-3-8b"]
    assert _error(capsys, *base, "--world-size", "8", "--gpus-per-node", "3") == (
        "--world-size=8 is not whole nodes of --gpus-per-node=3 (8 / 3 = 2.67 nodes): use a --world-size that is a "
        "multiple of 3 (6 or 9), or a --gpus-per-node that divides 8")
    cfg12 = tmp_path / "ds12.json"
    cfg12.write_text(json.dumps({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 1,
                                 "gradient_accumulation_steps": 4, "zero_optimization": {"stage": 1}}))
    assert _error(capsys, "--config", cfg12, "--model", "llama-3-8b", "--world-size", "12") == (
        "--world-size=12 is not whole nodes of --gpus-per-node=8 (the default, min(8, --world-size)) "
        "(12 / 8 = 1.5 nodes): use a --world-size that is a multiple of 8 (8 or 16), or a --gpus-per-node that "
        "divides 12")
    rc, out, _ = _run(capsys, "--config", cfg12, "--model", "llama-3-8b", "--world-size", "12", "--gpus-per-node",
                      "4", "--checkpoint", "full", "--format", "json")
    assert rc == 0 and json.loads(out)["parallel"]["dp"] == 12


def test_tp_group_across_a_node_boundary_is_refused(tmp_path, capsys):
    cfg = tmp_path / "tp2.json"
    cfg.write_text(json.dumps({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 1,
                               "gradient_accumulation_steps": 16, "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 1}}))
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "6", "--tp", "2",
                  "--gpus-per-node", "3") == (
        "--tp=2 must divide --gpus-per-node=3 or be a multiple of it (keep tensor parallelism inside a node, or "
        "span whole nodes; layout rule LY002, `dstoolkit validate --explain LY002`)")
    # the spec form refuses the same layout (the sweep's tp-node rule)
    spec = _spec(tmp_path, "nodes: 2, gpus_per_node: 3", "global_batch: 48, micro_batch: 1, zero_stage: 1, tp: 2")
    assert "dropped by tp-node: 1" in _error(capsys, spec)
    # nodes of 2 keep the same TP groups inside a node
    rc, out, _ = _run(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "6", "--tp", "2",
                      "--gpus-per-node", "2")
    assert rc == 0 and "tp=2 pp=1 ep=1 dp=3" in out


@pytest.mark.parametrize("extra,expected", [
    (["--world-size", "8", "--tp", "3"],
     "--tp * --pp = 3 * 1 = 3 does not divide the world size 8 (pick degrees whose product divides the world "
     "size; layout rule LY001, `dstoolkit validate --explain LY001`)"),
    (["--world-size", "6", "--tp", "3"],
     "--tp=3 does not divide num_attention_heads=32 (choose tp from the divisors of 32; layout rule LY003, "
     "`dstoolkit validate --explain LY003`)"),
    (["--world-size", "8", "--ep", "2"],
     "--ep=2 but the model has no experts (dense model) (use ep 1; layout rule LY007, `dstoolkit validate "
     "--explain LY007`)"),
    (["--world-size", "8", "--sequence-parallel"],
     "sequence parallelism needs tp > 1 (--sequence-parallel with --tp=1) (set tp > 1, or turn sequence "
     "parallelism off; layout rule LY016, `dstoolkit validate --explain LY016`)"),
    (["--world-size", "8", "--tp", "2", "--sequence-parallel", "--seq-len", "4097"],
     "--seq-len=4097: 4097 tokens do not split over --tp=2 with Megatron sequence parallelism "
     "(--sequence-parallel) (use a seq_len divisible by 2, or turn sequence parallelism off; layout rule LY019, "
     "`dstoolkit validate --explain LY019`)"),
    (["--world-size", "6", "--tp", "4"],
     "--tp * --pp = 4 * 1 = 4 does not divide the world size 6 (pick degrees whose product divides the world "
     "size; layout rule LY001, `dstoolkit validate --explain LY001`)"),
])
def test_flag_layout_rules_name_the_flag(tmp_path, capsys, extra, expected):
    cfg = tmp_path / "ds.json"  # no train_batch_size: the batch follows dp, so only the layout can be wrong
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}))
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", *extra) == expected


def test_ep_that_does_not_divide_the_experts(tmp_path, capsys):
    cfg = _cfg(tmp_path, stage=1)
    assert _error(capsys, "--config", cfg, "--model", "mixtral-8x7b", "--world-size", "8", "--ep", "3") == (
        "--ep=3 does not divide the number of experts 8 (choose ep from the divisors of 8; layout rule LY008, "
        "`dstoolkit validate --explain LY008`)")


def test_every_k_needs_the_every_k_policy_and_target_needs_a_spec(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    base = ["--config", cfg, "--model", "llama-3-8b", "--world-size", "8"]
    assert _error(capsys, *base, "--checkpoint", "full", "--every-k", "3") == (
        "--every-k is only used with --checkpoint every-k (got --checkpoint full)")
    assert _error(capsys, *base, "--every-k", "3") == (
        "--every-k is only used with --checkpoint every-k (got --checkpoint none)")
    assert _error(capsys, *base, "--target", "hf") == (
        "--target hf: chooses among a spec's 'auto' layouts, and the --config/--model form has none (its layout "
        "is the flags'): drop --target, or estimate a SPEC.yaml")


def test_left_out_flags_take_their_defaults(tmp_path, capsys):
    """The layout flags default to None (so a spec sees them given); the flag form fills in the parser's defaults,
    so leaving them out and writing them out at their defaults are the same estimate."""
    cfg = _cfg(tmp_path)
    base = ["--config", cfg, "--model", "tiny", "--world-size", "8", "--calibration", "none", "--format", "json"]
    rc, bare, _ = _run(capsys, *base)
    assert rc == 0
    rc, explicit, _ = _run(capsys, *base, "--gpu", "H100-SXM", "--seq-len", "4096", "--tp", "1", "--pp", "1",
                           "--ep", "1", "--gpus-per-node", "8", "--checkpoint", "none")
    assert rc == 0 and json.loads(bare) == json.loads(explicit)
    doc = json.loads(bare)
    assert doc["parallel"]["dp"] == 8 and doc["gpu_memory_bytes"] == 80 * 2**30
    assert "8 x H100-SXM, tp=1 pp=1 ep=1 dp=8; ZeRO-2, bf16, micro batch 2 x accum 4, seq 4096, checkpoint none" in (
        _run(capsys, *base[:-2])[1])
    # --every-k left out is the parser's 2 (llama-3-8b: 32 blocks, so one in 2 and one in 3 differ)
    big = ["--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--format", "json", "--checkpoint", "every-k"]
    acts = []
    for extra in ([], ["--every-k", "2"], ["--every-k", "3"]):
        rc, out, _ = _run(capsys, *big, *extra)
        assert rc == 0
        acts.append(json.loads(out)["memory_per_rank_bytes"]["activations"])
    assert acts[0] == acts[1] < acts[2]


# -- B: a SPEC.yaml refuses the flags it does not read --------------------------------------------------------

FLAG_ARGV = {"world_size": ["--world-size", "64"], "gpus_per_node": ["--gpus-per-node", "4"],
             "gpu": ["--gpu", "A100-40G"], "nvlink_domain_gpus": ["--nvlink-domain-gpus", "8"],
             "seq_len": ["--seq-len", "128"], "tp": ["--tp", "8"], "pp": ["--pp", "2"], "ep": ["--ep", "2"],
             "precision": ["--precision", "fp32"], "checkpoint": ["--checkpoint", "full"],
             "every_k": ["--every-k", "3"], "checkpoint_ratio": ["--checkpoint-ratio", "0.5"],
             "flash_attention": ["--no-flash-attention"], "sequence_parallel": ["--sequence-parallel"]}


def test_every_flag_form_flag_has_a_case():
    assert set(FLAG_ARGV) == set(FLAG_FORM_ONLY)


@pytest.fixture
def base_spec(tmp_path):
    return _spec(tmp_path, "nodes: 1, gpus_per_node: 8, gpu: H100-SXM",
                 "global_batch: 64, micro_batch: 2, tp: 2, pp: 1, zero_stage: 1")


@pytest.mark.parametrize("dest", sorted(FLAG_ARGV), ids=lambda d: f"flag-{d}")  # a bare "gpu" id marks a GPU test
def test_a_spec_refuses_each_layout_flag(base_spec, capsys, dest):
    flag, field = FLAG_FORM_ONLY[dest]
    assert FLAG_ARGV[dest][0] == flag
    assert _error(capsys, base_spec, *FLAG_ARGV[dest]) == (
        f"{base_spec}: {flag} is a flag of the --config/--model form, which a spec does not read (it is estimated "
        f"as written): edit the spec instead ({field}), or drop it")


def test_a_spec_refuses_the_fuzzed_flags_all_named(base_spec, capsys):
    err = _error(capsys, base_spec, "--world-size", "64", "--tp", "8", "--gpu", "A100-40G", "--seq-len", "128",
                 "--precision", "fp32", "--checkpoint", "full")
    assert err == (f"{base_spec}: --world-size, --gpu, --seq-len, --tp, --precision, --checkpoint are flags of the "
                   "--config/--model form, which a spec does not read (it is estimated as written): edit the spec "
                   "instead (cluster.nodes x cluster.gpus_per_node, cluster.gpu, training.seq_len, training.tp, "
                   "training.precision, training.activation_checkpointing), or drop them")


def test_a_flag_at_its_default_value_is_refused_too(base_spec, capsys):
    """--tp 1 beside a spec with tp 2 would be ignored just the same."""
    assert "--tp is a flag of the --config/--model form" in _error(capsys, base_spec, "--tp", "1")
    assert "--gpu is a flag of the --config/--model form" in _error(capsys, base_spec, "--gpu", "H100-SXM")


def test_a_spec_still_takes_its_own_flags(base_spec, capsys):
    rc, out, _ = _run(capsys, base_spec, "--calibration", "none", "--target", "deepspeed", "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["parallel"]["dp"] == 4 and doc["step_time_calibration"] == "nominal hardware-table rates"
    rc, out, _ = _run(capsys, base_spec, "--tokens", "1B", "--format", "json")
    assert rc == 0 and json.loads(out)["training_plan"]["tokens_requested"] == 10**9
