"""Megatron's scale-mask-softmax (estimate.megatron_softmax): its fused CUDA kernel runs only for some shapes
(megatron/model/fused_softmax.py is_kernel_available); otherwise five torch ops run in its place, which cost HBM
passes, launches and fp32 activation bytes."""
import pytest

from dstoolkit.estimate import attention_core as ac
from dstoolkit.estimate import host_cost
from dstoolkit.estimate.activations import eager_score_bytes
from dstoolkit.estimate.megatron_softmax import (
    UNFUSED_SOFTMAX_KERNELS,
    fused_softmax_runs,
    plan_fused_softmax,
    softmax_batch_per_block,
    softmax_bytes_per_element,
)
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan
from dstoolkit.spec.checkpoint import CheckpointPolicy


def test_batch_per_block_follows_the_kernels_warp_layout():
    # 128 threads; a warp of min(next pow2 of keys, 32) lanes; two rows per warp up to 128 keys
    assert [softmax_batch_per_block(k) for k in (16, 64, 128, 129, 1024, 2048, 4096)] == [16, 8, 8, 4, 4, 4, 4]


@pytest.mark.parametrize("precision, mb, heads, seq, fused", [
    ("fp16", 1, 2, 1024, False),   # 16 heads at TP 8, micro batch 1: attn_batches 2
    ("fp16", 2, 2, 1024, True),    # micro batch 2: 4
    ("bf16", 2, 3, 2048, False),   # 48 heads at TP 16, micro batch 2: 6
    ("bf16", 1, 4, 2048, True),
    ("fp8", 1, 4, 2048, True),     # fp8 plans run the core in 16-bit
    ("fp32", 4, 8, 2048, False),   # the kernel takes 16-bit input only
    ("bf16", 1, 8, 8192, False),   # keys above 4096
    ("bf16", 1, 8, 16, False),     # keys of 16 or fewer
    ("bf16", 1, 8, 128, True),     # 128 keys: 8 rows a block, attn_batches 8
    ("bf16", 1, 4, 128, False),    # ... 4 is not a multiple of 8
])
def test_fused_kernel_runs_only_where_megatron_allows_it(precision, mb, heads, seq, fused):
    assert fused_softmax_runs(precision, mb, heads, seq, seq) is fused


def test_fallback_bytes_per_element_count_each_torch_op():
    assert softmax_bytes_per_element(2, True) == (4, 6)
    # forward 2->4, 4->4, 4->4, 4->4, 4->2; backward 2->4, 4+4->4, 4->4, 4->4, 4->2
    assert softmax_bytes_per_element(2, False) == (6 + 8 + 8 + 8 + 6, 6 + 12 + 8 + 8 + 6)
    assert softmax_bytes_per_element(4, False) == (24, 28)  # no casts


def _plan(tp=8, mb=1, heads=16, precision="bf16", dropout=False, ck="full"):
    shape = ModelShape(name="g", model_type="gpt2", hidden_size=1024, num_hidden_layers=4, num_attention_heads=heads,
                       intermediate_size=4096, vocab_size=50257, attention_dropout=0.1 if dropout else 0.0)
    cfg = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "train_batch_size": mb}
    return RunPlan(shape=shape, ds_config=cfg, world_size=tp, gpus_per_node=8, tp=tp, gpu=get_gpu("A100-80G"),
                   seq_len=1024, precision=precision, framework="megatron", attention_impl="eager",
                   checkpoint=CheckpointPolicy(kind=ck), attention_dropout=dropout)


def test_plan_reads_heads_per_rank_and_micro_batch():
    assert not plan_fused_softmax(_plan(tp=8, mb=1))
    assert plan_fused_softmax(_plan(tp=8, mb=2))
    assert plan_fused_softmax(_plan(tp=4, mb=1))


def test_fallback_costs_time_launches_and_fp32_bytes():
    fused, unfused = _plan(mb=2), _plan(mb=1)
    bw = 2.0e12
    # the same core per sequence, except the softmax: per element 36 / 40 bytes in place of 4 / 6
    one = ac.eager_core(fused, 1, bw)
    two = ac.eager_core(unfused, 1, bw)
    elements = 2 * 1024 * 1024  # 2 heads on the rank, 1024 x 1024 scores
    assert two.forward_s - one.forward_s == pytest.approx((36 - 4) * elements / bw)
    assert two.backward_s - one.backward_s == pytest.approx((40 - 6) * elements / bw)
    # four more launches forward and four backward, and the checkpointed block's forward again
    extra = UNFUSED_SOFTMAX_KERNELS - 1
    assert host_cost.layer_kernels(unfused, 0) - host_cost.layer_kernels(fused, 0) == 3 * extra
    assert host_cost.layer_kernels(_plan(mb=1, ck="none"), 0) - host_cost.layer_kernels(_plan(mb=2, ck="none"), 0) == 2 * extra
    # kept for backward per score element: fp32 softmax output + its 16-bit cast (2 + 0 with the fused kernel)
    assert eager_score_bytes(unfused, 1) == elements * (4 + 2)
    assert eager_score_bytes(fused, 1) == elements * 2
    # with dropout: fp32 softmax output, the mask and the dropped probabilities
    assert eager_score_bytes(_plan(mb=1, dropout=True), 1) == elements * (4 + 1 + 2)


def test_estimate_and_generate_say_when_the_softmax_falls_back(tmp_path):
    from dstoolkit.estimate.megatron_softmax import fallback_note

    note = fallback_note(_plan(tp=8, mb=1))
    assert "micro batch 1 x 2 heads per TP rank = 2, not a multiple of 4" in note
    assert note.endswith("micro batch 2 would run the fused kernel")
    assert fallback_note(_plan(tp=8, mb=2)) is None
    assert "fp32 scores" in fallback_note(_plan(tp=4, mb=4, precision="fp32"))
    # a spec resolved by generate's planner carries the line among its assumptions, and estimate prints it once
    import subprocess
    import sys

    spec = tmp_path / "s.yaml"
    spec.write_text("""name: fallback
model: {model_type: gpt2, n_embd: 1024, n_layer: 4, n_head: 16, vocab_size: 50257, n_positions: 1024}
cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80G}
training: {seq_len: 1024, global_batch: 8, micro_batch: 1, precision: bf16, tp: 8, pp: 1, zero_stage: 0,
           activation_checkpointing: full, framework: megatron, attention_impl: eager}
""")
    out = subprocess.run([sys.executable, "-m", "dstoolkit", "estimate", str(spec)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("fused scale-mask-softmax kernel cannot run") == 1
