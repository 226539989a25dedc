"""The eager attention core charged kernel by kernel (estimate.attention_core, issue 24), and the attention-dropout
fact it reads from the model config (models.hf -> ModelShape.attention_dropout -> RunPlan.attention_dropout)."""
import pytest

import dstoolkit.estimate.cluster_model as cm
from dstoolkit.estimate import attention_core as ac
from dstoolkit.estimate.gemm import gemm_rate
from dstoolkit.hardware.table import GpuSpec, get_gpu
from dstoolkit.models.hf import HFConfigError, shape_from_hf_dict as shape_from_hf_config
from dstoolkit.runplan import RunPlan

BW = 2.0e12
# a GPU whose GEMMs are so fast that every kernel of the core is bound by its pass over the score matrices
MEMORY_BOUND = GpuSpec(name="membound", memory_bytes=80 * 2**30, peak_bf16_flops=1e30, intra_node_bw_bytes_per_s=1e11,
                       inter_node_bw_bytes_per_s=1e10, gemm_fraction=0.9)  # no HBM figure: gemm.half_depth keeps its reference


def _core(gpu=MEMORY_BOUND, dropout=False, groups=4, q=1024, k=1024, d=64, p=2):
    return ac.eager_core_s(gpu, "bf16", groups=groups, queries=q, keys=k, head_dim_qk=d, head_dim_v=d,
                           element_bytes=p, dropout=dropout, mem_bw=BW)


def test_memory_bound_core_is_its_passes_over_the_scores():
    elements = 4 * 1024 * 1024
    one_pass = 2 * elements / BW
    core = _core()
    # forward: QK^T writes the scores, softmax reads and writes them, PV reads them: 4 passes
    assert core.forward_s == pytest.approx(4 * one_pass)
    # backward: dP written, P read for dV, softmax backward 3 passes, dS read for dQ and for dK: 7 passes
    assert core.backward_s == pytest.approx(7 * one_pass)


def test_dropout_adds_a_read_a_write_and_the_mask_each_way():
    elements = 4 * 1024 * 1024
    with_d, without = _core(dropout=True), _core(dropout=False)
    each_way = (2 * 2 + 1) * elements / BW
    assert with_d.forward_s - without.forward_s == pytest.approx(each_way)
    assert with_d.backward_s - without.backward_s == pytest.approx(each_way)


def test_core_time_follows_heads_times_seq_squared_not_flops_when_memory_bound():
    # doubling the head width doubles the core's FLOPs but not its passes over the s x s scores
    assert _core(d=128).forward_s == pytest.approx(_core(d=64).forward_s)
    # doubling the sequence quadruples the scores
    assert _core(q=2048, k=2048).forward_s == pytest.approx(4 * _core().forward_s)


def test_shallow_qk_gemm_runs_at_its_own_shape_rate():
    gpu = get_gpu("A100-80G")
    groups, s, d = 32, 2048, 96
    core = _core(gpu=gpu, groups=groups, q=s, k=s, d=d)
    qk = 2.0 * groups * s * s * d / gemm_rate(gpu, "bf16", s, s, d, groups)
    pv = max(2.0 * groups * s * s * d / gemm_rate(gpu, "bf16", s, d, s, groups), 2 * groups * s * s / BW)
    assert qk > 2 * groups * s * s / BW  # depth 96: compute-bound at the shallow-GEMM rate, above one pass
    assert core.forward_s == pytest.approx(qk + 2 * (2 * groups * s * s / BW) + pv)


def _plan(impl="eager", dropout=False, recompute="none"):
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    shape = shape_from_hf_config({"model_type": "gpt2", "n_embd": 3072, "n_layer": 4, "n_head": 32,
                                  "vocab_size": 50257, "n_positions": 2048, "attn_pdrop": 0.1 if dropout else 0.0})
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "fp16": {"enabled": True},
          "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=shape, ds_config=ds, world_size=8, gpus_per_node=8, gpu=get_gpu("A100-80G"), seq_len=2048,
                   tp=2, attention_impl=impl, attention_dropout=dropout, precision="fp16",
                   checkpoint=CheckpointPolicy(kind=recompute))


def test_eager_layer_charges_the_core_once_and_its_scores_not_twice(monkeypatch):
    from dstoolkit.estimate.activations import eager_score_bytes, layer_activation_bytes

    plan = _plan(dropout=True)
    tok, bw = 2 * 2048, 2.039e12
    saved = layer_activation_bytes(plan, 0, 2).full
    core = ac.eager_core(plan, 2, bw)
    scores = eager_score_bytes(plan, 2)
    assert scores == pytest.approx(2 * (32 / 2) * 2048 * 2048 * (2 + 1 + 2))  # probs + mask + dropped probs
    with_core = cm.layer_compute_s(plan, 0, tok, saved, bw)
    monkeypatch.setattr(cm, "EAGER_CORE_BY_KERNEL", False)
    old = cm.layer_compute_s(plan, 0, tok, saved, bw)
    monkeypatch.setattr(cm, "EAGER_CORE_BY_KERNEL", True)
    # the only differences: the core's kernels instead of its FLOPs at ATTENTION_FRACTION["eager"], and its
    # score matrices taken out of the generic elementwise passes
    H, Q = 32, 96
    old_core = 12 * H * Q * 2048 * tok / 2 / (plan.gpu.peak_bf16_flops * cm.ATTENTION_FRACTION["eager"])
    passes = cm.NON_GEMM_PASSES_PER_SAVED_BYTE
    assert with_core - old == pytest.approx(core.forward_s + core.backward_s - old_core - passes * scores / bw)
    # full recompute runs the core's forward once more
    full = _plan(dropout=True, recompute="full")
    again = cm.layer_compute_s(full, 0, tok, layer_activation_bytes(full, 0, 2).full, bw)
    monkeypatch.setattr(cm, "EAGER_CORE_BY_KERNEL", False)
    assert again > with_core


def test_flash_layers_keep_their_attention_fraction():
    plan = _plan(impl="flash")
    tok = 2 * 2048
    from dstoolkit.estimate.activations import layer_activation_bytes

    s = cm.layer_compute_s(plan, 0, tok, layer_activation_bytes(plan, 0, 2).full, 2.039e12)
    assert s == pytest.approx(cm.layer_compute_s(plan.model_copy(update={"attention_dropout": True}), 0, tok,
                                                  layer_activation_bytes(plan, 0, 2).full, 2.039e12))


def test_attention_dropout_comes_from_the_model_config():
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100, "n_positions": 128}
    assert shape_from_hf_config(gpt2).attention_dropout == pytest.approx(0.1)  # transformers' GPT2Config default
    assert shape_from_hf_config({**gpt2, "attn_pdrop": 0.0}).attention_dropout == 0.0
    llama = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 100}
    assert shape_from_hf_config(llama).attention_dropout == 0.0
    assert shape_from_hf_config({**llama, "attention_dropout": 0.05}).attention_dropout == pytest.approx(0.05)
    # a family built through transformers (Bloom): its config's attention_dropout, transformers' default 0.0
    bloom = {"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}
    assert shape_from_hf_config(bloom).attention_dropout == 0.0
    assert shape_from_hf_config({**bloom, "attention_dropout": 0.1}).attention_dropout == pytest.approx(0.1)
    with pytest.raises(HFConfigError, match="attn_pdrop.*1.5.*probability"):
        shape_from_hf_config({**gpt2, "attn_pdrop": 1.5})
    with pytest.raises(HFConfigError, match="attention_dropout.*'high'.*not a number"):
        shape_from_hf_config({**llama, "attention_dropout": "high"})
    # the transformers-built path refuses the same values with the same words, naming the config's key
    for bad, words in ((1.5, "1.5 is not a probability in [0, 1)"), ("high", "'high' is not a number")):
        with pytest.raises(HFConfigError) as refused:
            shape_from_hf_config({**bloom, "attention_dropout": bad})
        assert (refused.value.field, refused.value.problem) == ("attention_dropout", words)
        assert refused.value.fix == "give a probability in [0, 1), e.g. 0.0 (no dropout) or 0.1"


def test_the_plan_takes_dropout_from_the_shape(tmp_path):
    from dstoolkit.cli.estimate import _plan_from_spec

    text = """name: t
model: {model_type: gpt2, n_embd: 64, n_layer: 2, n_head: 4, vocab_size: 100, n_positions: 128%s}
cluster: {nodes: 1, gpus_per_node: 2, gpu: A100-80G}
training: {seq_len: 128, global_batch: 4, micro_batch: 1, precision: bf16}
"""
    on, off = tmp_path / "on.yaml", tmp_path / "off.yaml"
    on.write_text(text % "")
    off.write_text(text % ", attn_pdrop: 0.0")
    assert _plan_from_spec(str(on))[0].attention_dropout is True
    assert _plan_from_spec(str(off))[0].attention_dropout is False
