"""`dstoolkit estimate --config ds.json` reads DeepSpeed AutoTP (tensor_parallel.autotp_size) as the run's TP degree.

Before, the flag form ignored it: an AutoTP-4 config for llama-3-8b on 8 ranks was estimated at tp=1 dp=8 (54.40 GiB
at the end of forward, exit 0), and with --tp 4 validate_config refused it (DS223, "use one of them"), so an AutoTP
config could not be estimated at all. Now the config's autotp_size is the plan's tp (read by the validated
model's TensorParallelConfig), a --tp that repeats it is accepted, one that disagrees is refused naming both, and
the assumptions say what is modelled: Megatron-style column / row splits of the blocks' linears without sequence
parallelism, the embedding / LM head / logits as AutoTP holds them (test_s30_autotp_vocab), and DeepSpeed's batch
triad counting the AutoTP ranks.
"""
from __future__ import annotations

import json

from tests.unit.estimate_cli_runs import run_estimate as _run, estimate_error as _error

AUTOTP = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
          "tensor_parallel": {"autotp_size": 4}}
BASE = ["--model", "llama-3-8b", "--world-size", "8"]
GiB = 2**30


def _cfg(tmp_path, name="autotp.json", **more):
    path = tmp_path / name
    path.write_text(json.dumps({**AUTOTP, **more}))
    return path


def _json(capsys, *argv) -> dict:
    rc, out, err = _run(capsys, *argv, "--format", "json")
    assert rc == 0, err
    return json.loads(out)


def test_autotp_size_is_the_tp_degree(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    rc, out, err = _run(capsys, "--config", cfg, *BASE)
    assert rc == 0, err
    first = out.splitlines()[0]
    assert "8 x H100-SXM, tp=4 pp=1 ep=1 dp=2; ZeRO-1, bf16, micro batch 1 x accum 1" in first  # before: tp=1 dp=8
    # a Megatron --tp 4 run of the config without AutoTP splits the embedding and the logits too: AutoTP keeps them
    # whole (test_s30_autotp_vocab), so it needs more memory
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({k: v for k, v in AUTOTP.items() if k != "tensor_parallel"}))
    by_autotp = _json(capsys, "--config", cfg, *BASE)
    by_flag = _json(capsys, "--config", plain, *BASE, "--tp", "4")
    assert by_autotp["memory_per_rank_bytes"]["total"] > by_flag["memory_per_rank_bytes"]["total"]
    assert by_autotp["memory_per_rank_bytes"]["total"] < 40 * GiB  # before: the tp=1 plan, 58.31 GiB at its peak
    assert by_autotp["tokens_per_step"] == 2 * 4096  # dp 2 x micro batch 1 x seq


def test_the_assumptions_say_what_is_modelled(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    assumed = _json(capsys, "--config", cfg, *BASE)["assumptions"]
    assert assumed[0] == (
        f"tp=4 is DeepSpeed AutoTP ({cfg}: tensor_parallel.autotp_size): each block's attention and MLP linears split "
        "column / row-wise over 4 ranks as Megatron's, without sequence parallelism, 2 all-reduces per block forward "
        "and 2 backward (deepspeed 0.19.8 module_inject/auto_tp.py LinearLayer / LinearAllreduce), norms and the "
        "activations between the linears whole on every TP rank")
    # llama-3-8b: untied embed_tokens and lm_head, 128256 x 4096 = 525,336,576 parameters each
    assert assumed[1] == (
        "embedding, LM head and logits as DeepSpeed 0.19.8 AutoTP training holds them: the input embedding (0.525B "
        "params) whole on every TP rank, the LM head (0.525B) split over tp=4, [tokens, vocab] logits all-gathered and "
        "the loss over them whole on every TP rank (Hugging Face tp_plan: embed_tokens embedding_rowwise (a SKIP "
        "spec), lm_head colwise_gather_output (LinearLayer(gather_output=True)); --model is a transformers model "
        "whose class declares a Hugging Face tp_plan)")
    assert assumed[2] == (
        "batch: DeepSpeed counts the AutoTP ranks in the batch triad (train_batch_size = micro batch 1 x "
        "accumulation 1 x 8 ranks = 8); the 4 ranks of a TP group read the same samples, so a step trains 2 "
        "sequences over dp=2")
    vocab_parallel = _cfg(tmp_path, "vp.json", tensor_parallel={"autotp_size": 4, "vocab_parallel_lm_head": True})
    assert ("[tokens, vocab/4] logits with DeepSpeed's distributed loss"
            in _json(capsys, "--config", vocab_parallel, *BASE)["assumptions"][1])


def test_deepspeeds_batch_triad_counts_the_autotp_ranks(tmp_path, capsys):
    """DeepSpeed builds an AutoTP run's config without an mpu, so train_batch_size = micro x accum x world: 32 on 8
    ranks at micro batch 1 is accumulation 4 (not 16, as dp 2 would give), and a step trains 1 x 4 x dp 2 samples."""
    cfg = _cfg(tmp_path, train_batch_size=32)
    out = _json(capsys, "--config", cfg, *BASE)
    assert (out["parallel"]["dp"], out["parallel"]["micro_batch"], out["parallel"]["grad_accum"]) == (2, 1, 4)
    assert out["tokens_per_step"] == 8 * 4096
    assert "(train_batch_size = micro batch 1 x accumulation 4 x 8 ranks = 32)" in out["assumptions"][2]


def test_a_tp_flag_must_repeat_autotp_size(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    rc, out, err = _run(capsys, "--config", cfg, *BASE, "--tp", "4")  # before: DS223, exit 1
    assert rc == 0, err
    assert "tp=4 pp=1 ep=1 dp=2" in out.splitlines()[0]
    for tp in ("2", "1"):
        assert _error(capsys, "--config", cfg, *BASE, "--tp", tp) == (
            f"--tp {tp} disagrees with {cfg}: tensor_parallel.autotp_size=4 (DeepSpeed AutoTP, the TP degree this "
            f"config runs): drop --tp (the estimate takes autotp_size as the TP degree), or for Megatron tensor "
            f"parallelism at {tp} remove tensor_parallel.autotp_size from the config")


def test_autotp_has_no_megatron_sequence_parallelism(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    assert _error(capsys, "--config", cfg, *BASE, "--sequence-parallel") == (
        f"--sequence-parallel with {cfg}: tensor_parallel.autotp_size=4: AutoTP has no Megatron sequence "
        "parallelism (its norms and dropouts run on the whole activations on every TP rank): drop "
        "--sequence-parallel")


def test_autotp_size_1_shards_nothing_and_leaves_tp_to_the_flag(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    assert _json(capsys, "--config", cfg, *BASE)["parallel"]["dp"] == 2  # before: 8
    one = _cfg(tmp_path, "one.json", tensor_parallel={"autotp_size": 1})
    out = _json(capsys, "--config", one, *BASE, "--tp", "2")  # --tp is Megatron's
    assert out["parallel"]["dp"] == 4
    assert not any("AutoTP" in a for a in out["assumptions"])


def test_the_layout_rules_name_the_config_key(tmp_path, capsys):
    cfg = _cfg(tmp_path, tensor_parallel={"autotp_size": 3})
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "12", "--gpus-per-node", "4") == (
        f"{cfg}: tensor_parallel.autotp_size=3 must divide --gpus-per-node=4 or be a multiple of it (keep tensor "
        "parallelism inside a node, or span whole nodes; layout rule LY002, `dstoolkit validate --explain LY002`)")
