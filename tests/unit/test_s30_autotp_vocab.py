"""DeepSpeed AutoTP is estimated as AutoTP: the embedding, the LM head and the logits as DeepSpeed 0.19.8 holds them
(runplan.autotp), not as Megatron's vocab-parallel layers.

Before, `estimate --config` with tensor_parallel.autotp_size ran the plan as Megatron TP, splitting the embedding, the
LM head and the [tokens, vocab] logits by tp. For llama-3-8b at autotp 8 on 8 H100s, seq 8192, ZeRO-1: 1,004,015,616
params per rank, 1,050,673,152 bytes of loss temporaries, peak 35.56 GiB, no logits all-gather; at seq 16384 "fits:
yes" (59.04 GiB). DeepSpeed keeps the untied embedding whole on every TP rank and all-gathers the logits of its
tp_plan's colwise_gather_output head (measured on 2 gloo ranks, runplan/autotp.py), so those were low by 7/8 of the
embedding's states and of the logits.

The Megatron pins were taken from the code before this change (commit 562832b): a Megatron-TP plan's figures must not
move.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.dsconfig.ds_misc import TensorParallelConfig
from dstoolkit.estimate import Calibration, estimate_run
from dstoolkit.estimate import cpu_compute as cc
from dstoolkit.estimate.cluster_model import FRAMEWORK_EFFICIENCY
from dstoolkit.estimate.comm import comm_plan
from dstoolkit.estimate.flops import lm_head_train_flops_per_token
from dstoolkit.estimate.step_time import gpu_compute_s
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import AutoTp, RunPlan, autotp_layout
from tests.unit.estimate_cli_runs import run_estimate

GiB = 2**30
V, H, L = 128256, 4096, 32
"""llama-3-8b: vocabulary, hidden size, layers."""
LLAMA3_8B_BLOCK_LINEARS = 2 * H * H + 2 * H * 1024 + 3 * H * 14336
"""q, o (4096 x 4096), k, v (8 kv heads x 128), gate, up, down (14336): 218,103,808 per block."""
BASE = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}


def _json(capsys, tmp_path, tensor_parallel: dict, *argv, model="llama-3-8b", seq=8192, rc_expected=0) -> dict:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**BASE, "tensor_parallel": tensor_parallel} if tensor_parallel else BASE))
    rc, out, err = run_estimate(capsys, "--config", path, "--model", model, "--world-size", "8", "--gpu", "H100-SXM",
                                "--seq-len", str(seq), *argv, "--format", "json")
    assert rc == rc_expected, err
    return json.loads(out)


def _loss_backward(out: dict) -> int:
    """The loss temporaries when backward starts at the loss (timeline phase backward_loss)."""
    phase = next(p for p in out["memory_per_rank_bytes"]["timeline"] if p["phase"] == "backward_loss")
    return phase["terms"]["loss_temporaries"]


def _tp(**section) -> TensorParallelConfig:
    return TensorParallelConfig.model_validate({"autotp_size": 2, **section})


@pytest.mark.parametrize("section, tied, hf_plan, expect", [
    # measured on 2 gloo ranks, tiny transformers 5.25 LlamaForCausalLM (vocab 1024, hidden 64), deepspeed 0.19.8:
    # (embedding split, LM head split, logits [tokens, vocab/tp] with the distributed loss)
    ({}, False, True, (False, True, False)),  # embed [1024, 64], head [512, 64], logits [1, 16, 1024]
    ({"vocab_parallel_lm_head": True}, False, True, (False, True, True)),  # head [512, 64], logits [1, 16, 512]
    ({}, True, True, (True, True, True)),  # embed [512, 64] (VocabParallelEmbedding), logits [1, 16, 512]
    ({"vocab_parallel_lm_head": False}, True, True, (False, False, False)),  # embed [1024, 64], logits 1024
    ({}, False, False, (False, False, False)),  # no tp_plan: head [1024, 64] (Linear), logits 1024
    ({"vocab_parallel_lm_head": True}, False, False, (False, True, True)),  # VocabParallelLinear [512, 64]
    ({}, True, False, (False, False, False)),  # embed [1024, 64], logits 1024
    ({"vocab_parallel_lm_head": True}, True, False, (True, True, True)),  # embed [512, 64], logits 512
    ({"preset_model": "llama"}, False, True, (False, False, False)),  # head [1024, 64] (Linear), logits 1024
    ({"preset_model": "llama", "partition_config": {"layer_specs": [  # head [512, 64] (LinearLayer), logits 1024
        {"patterns": [r".*lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}},
     False, True, (False, True, False)),
    ({"preset_model": "llama", "partition_config": {"layer_specs": [  # tied: embed [1024, 64], logits 1024
        {"patterns": [r".*lm_head\.weight$"], "partition_type": "column", "gather_output": True}]}},
     True, True, (False, False, False)),
])
def test_the_layout_is_what_deepspeed_builds(section, tied, hf_plan, expect):
    got = autotp_layout(_tp(**section), tied=tied, model_type="llama", hf_tp_plan=hf_plan)
    assert (got.embedding_split, got.lm_head_split, got.vocab_parallel_loss) == expect


def test_deepcompile_autotp_keeps_a_tied_pair_whole():
    got = autotp_layout(_tp(), tied=True, model_type="llama", hf_tp_plan=True, deepcompile_autotp=True)
    assert not (got.embedding_split or got.lm_head_split or got.vocab_parallel_loss)
    assert "DeepCompile" in got.why


def test_llama3_8b_keeps_the_embedding_and_the_logits_whole(tmp_path, capsys):
    out = _json(capsys, tmp_path, {"autotp_size": 8})
    # blocks' linears / 8 with their two norms, the embedding whole, the LM head / 8, the final norm
    assert out["params"]["per_rank"] == L * (LLAMA3_8B_BLOCK_LINEARS // 8 + 2 * H) + V * H + V * H // 8 + H
    assert out["params"]["per_rank"] == 1_463_685_120  # before: 1,004,015,616 (the embedding / 8 too)
    # log_softmax backward's two fp32 [tokens, vocab] tensors, the whole vocabulary: before / 8 (1,050,673,152)
    assert _loss_backward(out) == 2 * 4 * 8192 * V
    # colwise_gather_output: each micro batch's bf16 logits all-gathered into [tokens, vocab]
    assert out["comm_bytes_per_step"]["autotp_logits_all_gather"] == 8192 * V * 2
    assert out["memory_per_rank_bytes"]["peak"] > 51 * GiB  # before: 35.56 GiB
    assert out["assumptions"][1].startswith(
        "embedding, LM head and logits as DeepSpeed 0.19.8 AutoTP training holds them: the input embedding (0.525B "
        "params) whole on every TP rank, the LM head (0.525B) split over tp=8, [tokens, vocab] logits all-gathered "
        "and the loss over them whole on every TP rank (Hugging Face tp_plan: embed_tokens embedding_rowwise")
    assert not any("low by" in a for a in out["assumptions"])  # the old caveat is gone
    # exit 1: it does not fit (before: exit 0, "fits: yes", 59.04 GiB)
    assert _json(capsys, tmp_path, {"autotp_size": 8}, seq=16384, rc_expected=1)["fits"] is False


def test_vocab_parallel_lm_head_splits_the_logits_but_not_an_untied_embedding(tmp_path, capsys):
    whole = _json(capsys, tmp_path, {"autotp_size": 8})
    vp = _json(capsys, tmp_path, {"autotp_size": 8, "vocab_parallel_lm_head": True})
    assert vp["params"]["per_rank"] == whole["params"]["per_rank"]
    assert _loss_backward(vp) == 2 * 4 * 8192 * V // 8
    assert "autotp_logits_all_gather" not in vp["comm_bytes_per_step"]
    assert "[tokens, vocab/8] logits with DeepSpeed's distributed loss" in vp["assumptions"][1]


def test_a_tied_model_is_vocab_parallel_unless_the_config_says_false(tmp_path, capsys):
    cfg = tmp_path / "tied" / "config.json"
    cfg.parent.mkdir()
    h, v, layers, inter = 2048, 128256, 16, 8192
    cfg.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": h,
                               "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "vocab_size": v, "tie_word_embeddings": True}))
    blocks = layers * ((2 * h * h + 2 * h * 512 + 3 * h * inter) // 8 + 2 * h)
    auto = _json(capsys, tmp_path, {"autotp_size": 8}, model=str(cfg))
    assert auto["params"]["per_rank"] == blocks + v * h // 8 + h
    assert _loss_backward(auto) == 2 * 4 * 8192 * v // 8
    off = _json(capsys, tmp_path, {"autotp_size": 8, "vocab_parallel_lm_head": False}, model=str(cfg))
    assert off["params"]["per_rank"] == blocks + v * h + h
    assert _loss_backward(off) == 2 * 4 * 8192 * v
    assert "the tied embedding / LM head (0.263B params) whole on every TP rank" in off["assumptions"][1]


def _plan(autotp, gpu="H100-SXM", calibration=None, shape="llama-3-8b", seq=8192, tp=8) -> RunPlan:
    return RunPlan(shape=get_preset(shape), ds_config=BASE, world_size=tp, gpus_per_node=tp, gpu=get_gpu(gpu),
                   seq_len=seq, tp=tp, autotp=autotp, calibration=calibration)


GATHERED = AutoTp(path="hf_tp_plan", embedding_split=False, lm_head_split=True, vocab_parallel_loss=False, why="")
WHOLE = AutoTp(path="heuristic", embedding_split=False, lm_head_split=False, vocab_parallel_loss=False, why="")


def test_a_whole_head_runs_its_gemm_on_every_rank():
    from dstoolkit.estimate.gemm import linear_s

    tok = 8192
    split, whole = _plan(GATHERED), _plan(WHOLE)
    assert whole.lm_head_gemm_shards == 1 and split.lm_head_gemm_shards == 8
    full = linear_s(get_gpu("H100-SXM"), "bf16", V * H * tok, tok, V, H)
    part = linear_s(get_gpu("H100-SXM"), "bf16", V * H * tok / 8, tok, V / 8, H)
    extra = (full.forward_s + full.backward_s - part.forward_s - part.backward_s) / FRAMEWORK_EFFICIENCY
    assert gpu_compute_s(whole, 3.35e12) - gpu_compute_s(split, 3.35e12) == pytest.approx(extra)
    # the CPU op-level model: the head's three GEMMs at the whole vocabulary
    fit = cc.GemmFit(4e11, 100.0, 4e-5)
    rates = cc.OpRates(fit, ((128, 32, 4e-6, 1e-6), (512, 128, 16e-6, 4e-6)), 2e-9)
    s, w = _plan(GATHERED, "cpu", shape="tiny", seq=128, tp=2), _plan(WHOLE, "cpu", shape="tiny", seq=128, tp=2)
    v, h = get_preset("tiny").vocab_size, get_preset("tiny").hidden_size
    assert cc.cpu_compute_s(w, rates) - cc.cpu_compute_s(s, rates) == pytest.approx(
        cc.linear_s(fit, cc.Linear(h, v, 128)) - cc.linear_s(fit, cc.Linear(h, v / 2, 128)))
    # a calibration's block rate: the head's 6·vocab·hidden FLOPs per token on the rank, not / tp
    cal = Calibration(matmul_flops_per_s=5e10, mem_bw_bytes_per_s=3e9, comm_busbw_bytes_per_s=1e9,
                      comm_latency_s=5e-4, step_overhead_s=0.02)
    s, w = (estimate_run(_plan(a, "cpu", cal, "tiny", 128, 2)).step_time.compute_s for a in (GATHERED, WHOLE))
    assert w / s - 1 == pytest.approx(lm_head_train_flops_per_token(get_preset("tiny")) * (1 - 1 / 2) * 128
                                      / (s * cal.rate_at(128 * h / 2)))
    # the logits of a whole head are on every rank already: nothing to gather (a gathered head's are)
    assert [op.bytes for op in comm_plan(_plan(WHOLE)).ops if op.name == "autotp_logits_all_gather"] == []
    assert [op.bytes for op in comm_plan(_plan(GATHERED)).ops if op.name == "autotp_logits_all_gather"] == [
        8192 * V * 2]


def test_autotp_has_no_sequence_parallelism_and_no_pipeline():
    with pytest.raises(ValueError, match="autotp with sequence_parallel=True, pp=1: DeepSpeed AutoTP"):
        RunPlan(shape=get_preset("llama-3-8b"), ds_config=BASE, world_size=8, gpus_per_node=8,
                gpu=get_gpu("H100-SXM"), seq_len=4096, tp=8, autotp=GATHERED, sequence_parallel=True)


def test_megatron_tp_figures_are_unchanged(tmp_path, capsys):
    """A Megatron-TP plan reads every fact the AutoTP change touched (tp_splits, logits / LM-head shards): its figures
    are the ones the code before this change gave, to the byte (commit 562832b)."""
    out = _json(capsys, tmp_path, {}, "--tp", "8")
    m = out["memory_per_rank_bytes"]
    assert (m["params"], m["grads"], m["optimizer"], m["activations"], m["temporaries"], m["peak"]) == (
        2008031232, 8032124928, 12048187392, 23080370176, 1050673152, 38187261952)
    assert out["params"]["per_rank"] == 1004015616
    assert out["comm_bytes_per_step"] == {"tp_all_reduce": 8589934592}
    assert repr(out["step_time_s"]) == "0.2869572953584802"
    # the CPU paths: op-level rates and a block rate (tiny, tp 2, micro batch 2, seq 128)
    ops = dict(gemm_rate_flops_per_s=4e11, gemm_half_dim=100.0, gemm_call_s=4e-5, elementwise_s_per_byte=2e-9,
               attention_points=[[128, 32, 4e-6, 1e-6], [128, 128, 8e-6, 2e-6], [512, 32, 6e-6, 1.5e-6],
                                 [512, 128, 16e-6, 4e-6]], per_layer_overhead_s=1e-3)
    base = dict(matmul_flops_per_s=5e10, mem_bw_bytes_per_s=3e9, comm_busbw_bytes_per_s=1e9, comm_latency_s=5e-4,
                step_overhead_s=0.02)
    ds = {**BASE, "train_micro_batch_size_per_gpu": 2}
    for cal, step, compute in ((Calibration(**base, **ops), "0.11292475818666667", "0.046422955519999996"),
                               (Calibration(**base), "0.11912490666666667", "0.056623104")):
        plan = RunPlan(shape=get_preset("tiny"), ds_config=ds, world_size=2, gpus_per_node=2, gpu=get_gpu("cpu"),
                       seq_len=128, tp=2, calibration=cal)
        st = estimate_run(plan).step_time
        assert (repr(st.total_s), repr(st.compute_s)) == (step, compute)
