"""Issue 24's cluster physics: a collective group's inter-node bandwidth by its ranks per node and the node's NICs
(NCCL runs a ring per NIC), TP across whole nodes allowed with a warning and priced over the NICs, pipeline p2p
overlapped only where the framework overlaps it, and the "cannot decide" marking of sweep/generate."""
import pytest

from dstoolkit.estimate import host_cost as hc
from dstoolkit.estimate import pipeline_stages as ps
from dstoolkit.estimate import collective_time as ct
from dstoolkit.estimate.collective_time import group_inter_node_busbw, op_time_s
from dstoolkit.estimate.comm import CommOp, GroupLayout, comm_plan, group_layout
from dstoolkit.generate import undecided as und
from dstoolkit.hardware.table import GPU_TABLE, get_gpu
from dstoolkit.layout.constraints import LayoutFacts, check_layout
from dstoolkit.layout.degree_rules import tp_across_nodes_note, tp_tiles_nodes
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan

NIC, NVLINK = 24e9, 230e9  # DGX A100: one 200 Gb/s HDR NIC per GPU, NVLink all-reduce busbw


def _plan(tp=1, pp=1, world=16, gpn=8, framework="deepspeed", schedule="1f1b", vpp=1, gpu="A100-80G"):
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
          "zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW"}}
    return RunPlan(shape=get_preset("llama-3-8b"), ds_config=ds, world_size=world, gpus_per_node=gpn,
                   gpu=get_gpu(gpu), seq_len=2048, tp=tp, pp=pp, framework=framework, pipeline_schedule=schedule,
                   virtual_stages=vpp)


def test_group_gets_a_nic_per_rank_on_the_node_capped_by_nvlink(monkeypatch):
    monkeypatch.setattr(ct, "MULTI_RING_GAIN", True)
    # ring per NIC: tp 1's DP group holds all 8 ranks of each node -> 8 rings over 8 NICs (192 GB/s < NVLink 230)
    assert group_inter_node_busbw(NIC, 8, 8, 1, NVLINK) == pytest.approx(8 * NIC)
    assert group_inter_node_busbw(50e9, 8, 8, 1, 200e9) == pytest.approx(200e9)  # never above the NVLink ring


def test_nics_are_shared_by_the_groups_crossing_a_node(monkeypatch):
    assert ct.MULTI_RING_GAIN is True  # shipped on since the vTrain sweep's TP 16 rows (collective_time.MULTI_RING_GAIN)
    # with the gain off a group gets at most one NIC (the comparison the switch keeps)
    monkeypatch.setattr(ct, "MULTI_RING_GAIN", False)
    assert group_inter_node_busbw(NIC, 8, 8, 1, NVLINK) == pytest.approx(NIC)
    monkeypatch.undo()
    # tp 8: 8 DP groups side by side, one rank per node each -> one NIC each
    assert group_inter_node_busbw(NIC, 8, 1, 8, NVLINK) == pytest.approx(NIC)
    # 4 NICs for 8 groups crossing at once (Jean Zay: 4 Omni-Path links per 8-GPU node): half a NIC each
    assert group_inter_node_busbw(12e9, 4, 1, 8, NVLINK) == pytest.approx(6e9)


def test_group_layout_counts_ranks_per_node():
    assert group_layout(16, 8, 16, 1).ranks_per_node == 8  # tp 1 DP group of 16 over 2 nodes
    lay = group_layout(16, 8, 2, 8)  # tp 8: DP groups of 2, one rank per node, 8 of them per node
    assert (lay.cross_node, lay.concurrent_groups, lay.ranks_per_node) == (True, 8, 1)
    assert group_layout(16, 8, 4, 4).ranks_per_node == 2  # tp 4: DP group of 4, 2 ranks on each node


def _group_layout_every_rank(world, gpn, size, stride):
    """group_layout's definition read rank by rank over the whole world (what it did before reading one period)."""
    if size <= 1:
        return GroupLayout(False, 1)
    nodes = {}
    for r in range(world):
        base = r - r % (size * stride) + r % stride
        nodes.setdefault(r // gpn, []).append(base)
    per_node, busiest, cross = 1, 0, False
    for node, bases in nodes.items():
        spanning = {b for b in bases if b // gpn != min(b + (size - 1) * stride, world - 1) // gpn}
        cross = cross or bool(spanning)
        busiest = max(busiest, len(spanning))
        for b in spanning:
            per_node = max(per_node, bases.count(b))
    return GroupLayout(cross, max(1, busiest), per_node)


def test_group_layout_reads_one_period_and_gives_what_every_rank_gives():
    # the groups' pattern over nodes repeats every lcm(size * stride, gpus per node) ranks: reading one period
    # (a sweep at 8192 GPUs spent 132 of its 134 s reading every rank) gives the layout of the whole world
    import random

    rng = random.Random(1)
    for _ in range(400):
        gpn = rng.choice([1, 2, 4, 6, 8, 16, 72])
        tp, pp, dp = rng.choice([1, 2, 3, 4, 8, 16]), rng.choice([1, 2, 3, 4, 8]), rng.choice([1, 2, 3, 4, 6, 8, 32])
        world = tp * pp * dp
        for size, stride in ((tp, 1), (dp, tp), (pp, tp * dp)):
            assert group_layout(world, gpn, size, stride) == _group_layout_every_rank(world, gpn, size, stride)


def test_data_parallel_ops_carry_ranks_per_node_and_concurrency(monkeypatch):
    ops1 = {o.name: o for o in comm_plan(_plan(tp=1)).ops}
    ops8 = {o.name: o for o in comm_plan(_plan(tp=8)).ops}
    a1, a8 = ops1["zero_grad_all_reduce"], ops8["zero_grad_all_reduce"]
    assert (a1.ranks_per_node, a1.concurrent_groups) == (8, 1)
    assert (a8.ranks_per_node, a8.concurrent_groups) == (1, 8)
    monkeypatch.setattr(ct, "MULTI_RING_GAIN", True)
    t1 = op_time_s(a1, NVLINK, NIC, nics_per_node=8) / a1.bytes
    t8 = op_time_s(a8, NVLINK, NIC, nics_per_node=8) / a8.bytes
    # per byte, tp 1's 16-rank all-reduce (factor 2*15/16) over 8 NICs vs tp 8's 2-rank one (factor 1) over one
    assert t8 / t1 == pytest.approx(8 * 1.0 / (2 * 15 / 16))


def test_deepspeed_zero3_collectives_keep_one_ring_other_fsdp_gets_a_ring_per_nic():
    """comm.DEEPSPEED_ZERO3_ONE_RING: DeepSpeed ZeRO-3's gathers and reduce-scatters at one NIC's rate (Narayanan et
    al. 2021 Table 2); a PyTorch-FSDP framework's same ops and DeepSpeed's ZeRO-1 all-reduce get a ring per NIC."""
    def ops(stage, framework="deepspeed"):
        plan = _plan(tp=1, framework=framework)
        ds = dict(plan.ds_config, zero_optimization={"stage": stage})
        return {o.name: o for o in comm_plan(plan.model_copy(update={"ds_config": ds})).ops}

    z3 = ops(3)
    for name in ("zero3_param_all_gather_fwd", "zero3_param_all_gather_bwd", "zero3_grad_reduce_scatter"):
        op = z3[name]
        assert op.one_ring and op.ranks_per_node == 8 and op.cross_node, name
        assert op_time_s(op, NVLINK, NIC, nics_per_node=8) == pytest.approx(
            op_time_s(CommOp(**{**op.__dict__, "ranks_per_node": 1, "one_ring": False}), NVLINK, NIC,
                      nics_per_node=8))
    fsdp = ops(3, "fsdp")["zero3_param_all_gather_fwd"]
    assert not fsdp.one_ring and op_time_s(fsdp, NVLINK, NIC, nics_per_node=8) < op_time_s(
        z3["zero3_param_all_gather_fwd"], NVLINK, NIC, nics_per_node=8) / 7
    assert not ops(1)["zero_grad_all_reduce"].one_ring
    # an MoE model's experts as ordinary parameters under DeepSpeed ZeRO-3 (Hugging Face modules): gathered the same way
    moe = _plan(tp=1).model_copy(update={"shape": get_preset("mixtral-8x7b")})
    moe = moe.model_copy(update={"ds_config": dict(moe.ds_config, zero_optimization={"stage": 3})})
    ex = {o.name: o for o in comm_plan(moe).ops}
    assert ex["zero3_param_all_gather_fwd_experts"].one_ring and ex["zero3_grad_reduce_scatter_experts"].one_ring


def test_hardware_table_states_nics_per_node():
    for name in ("H100-SXM", "H200", "H800", "A100-80G", "A100-40G"):
        assert GPU_TABLE[name].nics_per_node == 8


def test_tp_across_whole_nodes_is_allowed_with_a_warning_and_priced_over_the_nics():
    assert check_layout(LayoutFacts(tp=16, gpus_per_node=8), ("LY002",)) == []
    v = check_layout(LayoutFacts(tp=12, gpus_per_node=8), ("LY002",))
    assert v and "tp=12 must divide gpus_per_node=8 or be a multiple of it" in v[0].message
    assert check_layout(LayoutFacts(tp=3, gpus_per_node=8), ("LY002",))
    assert tp_tiles_nodes(16, 8) and tp_tiles_nodes(4, 8) and not tp_tiles_nodes(12, 8)
    assert "tp=16 spans 2 nodes of 8 GPUs" in tp_across_nodes_note(16, 8)
    assert tp_across_nodes_note(8, 8) is None
    # llama-3-8b has 8 KV heads, so tp 8 over nodes of 4 GPUs stands for tp 16 over 8-GPU nodes
    tp = {o.name: o for o in comm_plan(_plan(tp=8, gpn=4)).ops}["tp_all_reduce"]
    assert (tp.cross_node, tp.ranks_per_node, tp.concurrent_groups) == (True, 4, 1)
    inside = {o.name: o for o in comm_plan(_plan(tp=8)).ops}["tp_all_reduce"]
    assert not inside.cross_node


def test_pipeline_p2p_overlaps_only_under_megatrons_interleaved_schedule():
    def p2p(**kw):
        return {o.name: o for o in comm_plan(_plan(tp=8, pp=2, **kw)).ops}["pp_p2p"]

    ds = p2p()
    assert ds.cross_node and not ds.overlappable and ds.concurrent_groups == 8
    assert not p2p(framework="megatron").overlappable
    assert p2p(framework="megatron", schedule="interleaved", vpp=2).overlappable


def test_deepspeed_pipeline_sends_one_tp_slice_and_gathers_it_on_the_next_stage():
    # llama-3-8b, seq 2048, micro batch 1, bf16: one boundary's activations 2048 x 4096 x 2 bytes; ga 8
    act = 2048 * 4096 * 2

    def ops(ds_pipeline=None, **kw):
        plan = _plan(tp=8, pp=2, **kw)
        if ds_pipeline is not None:
            plan = plan.model_copy(update={"ds_config": {**plan.ds_config, "pipeline": ds_pipeline}})
        return {o.name: o for o in comm_plan(plan).ops}

    shipped = ops()
    # pipe_partitioned + grad_partitioned (DeepSpeed defaults): 1/8 of the activations and of their gradients
    # cross to the next stage, and the receiver all-gathers the full tensor over its TP group (inside the node)
    assert shipped["pp_p2p"].bytes == 2 * act // 8 * 8
    gather = shipped["pp_partition_all_gather"]
    assert (gather.bytes, gather.group_size, gather.calls, gather.cross_node) == (2 * act * 8, 8, 2 * 8, False)
    # turned off in the config: full tensors, no gather; only the gradients partitioned: half of each
    off = ops({"pipe_partitioned": False, "grad_partitioned": False})
    assert off["pp_p2p"].bytes == 2 * act * 8 and "pp_partition_all_gather" not in off
    half = ops({"pipe_partitioned": False})
    assert half["pp_p2p"].bytes == (act + act // 8) * 8 and half["pp_partition_all_gather"].calls == 8
    # Megatron-Core without sequence parallelism sends the full tensor from every TP rank (p2p_communication.py)
    assert ops(framework="megatron")["pp_p2p"].bytes == 2 * act * 8


def test_tied_embedding_gradients_are_all_reduced_between_the_end_stages_once_a_step():
    tied = get_preset("llama-3-8b").model_copy(update={"tie_word_embeddings": True})

    def ops(shape=None, **kw):
        plan = _plan(tp=8, **kw)
        if shape is not None:
            plan = plan.model_copy(update={"shape": shape})
        return {o.name: o for o in comm_plan(plan).ops}

    op = ops(tied, pp=2)["pp_tied_embedding_all_reduce"]
    # each TP rank its vocab / 8 rows x hidden 4096, bf16 gradients; two ranks on different nodes, all the first
    # stage's ranks of a node at once, one call after backward, not overlapped
    assert op.bytes == 128256 * 4096 // 8 * 2
    assert (op.group_size, op.cross_node, op.calls, op.overlappable, op.concurrent_groups) == (2, True, 1, False, 8)
    assert "pp_tied_embedding_all_reduce" not in ops(pp=2)  # untied (Llama 3)
    assert "pp_tied_embedding_all_reduce" not in ops(tied)  # one stage holds both ends
    # DualPipe keeps both ends on one rank (DeepSeek-V3's own code; DeepSpeed's pipeline engine runs 1F1B only)
    assert "pp_tied_embedding_all_reduce" not in ops(tied, pp=2, schedule="dualpipe", framework="megatron")


def test_undecided_marks_layouts_within_the_measured_error_and_prints_the_tune_command():
    assert und.within_error([1.0, 1.05, 1.2], 0.10) == (0, 1)
    assert und.within_error([1.3, 1.0, 1.09], 0.10) == (1, 2)
    with pytest.raises(ValueError, match="error=-0.1"):
        und.within_error([1.0], -0.1)
    assert und.tune_command("s.yaml", 2) == "dstoolkit tune s.yaml --mode real --budget 2 --seed-trials 2 -o tune_undecided"
    assert und.tune_command("s.yaml", 7).endswith("--budget 7 --seed-trials 5 -o tune_undecided")
    lines = und.undecided_lines(["a", "b", "c"], [1.0, 1.0 + und.GPU_OUT_OF_SOURCE_ERROR / 2, 2.0], False, "s.yaml")
    assert lines[0].startswith("Cannot decide: 2 layouts") and "#1 a, #2 b" in lines[0]
    assert lines[1] == "Measure them: dstoolkit tune s.yaml --mode real --budget 2 --seed-trials 2 -o tune_undecided"
    assert und.undecided_lines(["a", "b"], [1.0, 2.0], False) == []
    assert und.model_error(True)[0] == und.CPU_STEP_TIME_ERROR


def test_undecided_seed_limit_matches_tune():
    from dstoolkit.tune.seeding import MAX_SEED_TRIALS

    assert und.MAX_TUNE_SEED_TRIALS == MAX_SEED_TRIALS


# -- per-kernel fixed cost ----------------------------------------------------------------------------------
def test_layer_kernels_counted_from_the_block_structure():

    plan = _plan().model_copy(update={"attention_impl": "flash"})
    # llama-3-8b, fused QKV: GEMMs 2 + gated MLP 3 = 5; core 1; elementwise 2 norms + 2 adds + SiLU and gate + RoPE
    # q, k = 8. forward 5 + 1 + 8 = 14, backward 2*5 + 2*1 + 8 = 20
    assert hc.layer_kernels(plan, 0) == 34
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    full = plan.model_copy(update={"checkpoint": CheckpointPolicy(kind="full")})
    assert hc.layer_kernels(full, 0) == 34 + 14  # a recomputed block runs its forward again
    # eager attention: QK^T, softmax, PV forward (3) and 6 backward kernels
    assert hc.layer_kernels(plan.model_copy(update={"attention_impl": "eager"}), 0) == 34 + 2 + 4
    # Mixtral's MoE block: GEMMs 2 + router 1 + grouped gate/up/down 3 = 6; elementwise 8 + top-k, softmax, permute,
    # unpermute = 12: forward 6 + 1 + 12 = 19, backward 12 + 2 + 12 = 26
    moe = plan.model_copy(update={"shape": get_preset("mixtral-8x7b")})
    assert moe.shape.is_moe_layer(0) and hc.layer_kernels(moe, 0) == 45


def test_kernel_launch_cost_adds_per_block_and_micro_batch(monkeypatch):
    import dstoolkit.estimate.cluster_model as cm

    plan = _plan().model_copy(update={"attention_impl": "flash"})
    tok = cm.tokens_per_micro(plan)
    monkeypatch.setattr(hc, "KERNEL_LAUNCH_S", 0.0)
    bare = cm.layer_compute_s(plan, 0, tok, 1e6, 2e12)
    monkeypatch.setattr(hc, "KERNEL_LAUNCH_S", 5e-6)
    assert cm.layer_compute_s(plan, 0, tok, 1e6, 2e12) - bare == pytest.approx(34 * 5e-6)


# -- the host floor: kernels issued from Python, DeepSpeed's per-tensor hooks --------------------------------
def _small(mb: int, stage: int = 2, framework: str = "deepspeed") -> RunPlan:
    from dstoolkit.models.hf import shape_from_hf_dict

    shape = shape_from_hf_dict({"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
                                "num_hidden_layers": 16, "num_attention_heads": 16, "vocab_size": 32000})
    ds = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 16 // mb, "bf16": {"enabled": True},
          "zero_optimization": {"stage": stage}}
    return RunPlan(shape=shape, ds_config=ds, world_size=8, gpus_per_node=8, gpu=get_gpu("A100-80G"), seq_len=1024,
                   precision="bf16", attention_impl="sdpa", framework=framework)


def test_layer_param_tensors_counted_from_the_block_structure():

    # HF Llama block: q, k, v, o + gate, up, down + 2 RMSNorm weights (benchmarks/host_overhead.py counts 9)
    assert hc.layer_param_tensors(_small(1), 0) == 9
    moe = _plan().model_copy(update={"shape": get_preset("mixtral-8x7b"), "attention_impl": "flash"})
    # fused QKV + o (2), 2 norms, router 1, 8 local experts x 3 matrices
    assert hc.layer_param_tensors(moe, 0) == 2 + 2 + 1 + 24


def test_gpt2_block_counts_one_qkv_tensor():
    from dstoolkit.models.hf import shape_from_hf_dict

    shape = shape_from_hf_dict({"model_type": "gpt2", "n_embd": 1024, "n_layer": 16, "n_head": 16, "vocab_size": 50257,
                                "n_positions": 1024})
    assert shape.qkv_fused
    plan = _small(1).model_copy(update={"shape": shape})
    # transformers GPT2Block: c_attn, c_proj, c_fc, mlp.c_proj, each with a bias, + ln_1 and ln_2 (weight, bias);
    # benchmarks/host_overhead.py counts 12 on the built block
    assert hc.layer_param_tensors(plan, 0) == 12
    # forward GEMMs c_attn, c_proj, c_fc, c_proj = 4 (a Llama block under sdpa: q, k, v, o + gate, up, down = 7)
    llama = _small(1)
    fwd_gemm_llama, fwd_gemm_gpt2 = 7, 4
    # every forward GEMM launches 3 kernels per micro batch (forward, data and weight gradient)
    gemm_diff = 3 * (fwd_gemm_llama - fwd_gemm_gpt2)
    # elementwise ops: Llama 2 norms + 2 adds + SiLU and gate product + RoPE on q and k = 8; GPT-2 without RoPE and
    # the gate product: 5; each runs once forward and once backward
    elem_diff = 2 * (8 - 5)
    assert hc.layer_kernels(llama, 0) - hc.layer_kernels(plan, 0) == gemm_diff + elem_diff


def test_transformers_built_fused_qkv_is_read_from_the_module_tree():
    pytest.importorskip("transformers")
    from dstoolkit.models.hf import shape_from_transformers

    neox = shape_from_transformers({"model_type": "gpt_neox", "hidden_size": 256, "num_hidden_layers": 2,
                                    "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 1000})
    assert neox.qkv_fused  # gpt_neox.layers.{i}.attention.query_key_value: 256 -> 768
    llama = shape_from_transformers({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
                                     "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000})
    assert not llama.qkv_fused  # q_proj, k_proj, v_proj


def test_host_floor_binds_at_small_micro_batches_only():
    import dstoolkit.estimate.cluster_model as cm
    from dstoolkit.estimate.step_time import gpu_compute_s

    mem_bw = 2.039e12
    for mb, binds in ((1, True), (16, False)):
        plan = _small(mb)
        host = sum(hc.host_layer_s(plan, i) for i in range(16)) + hc.host_micro_step_s(plan)
        t = gpu_compute_s(plan, mem_bw)
        # one stage, no bubble: the step's compute is accum x max(GPU time of a micro batch, host time)
        gpu_only = ps.pipeline_compute_s(plan, lambda i, s: cm.layer_compute_s(plan, i, cm.tokens_per_micro(plan), s, mem_bw)
                                         / cm.FRAMEWORK_EFFICIENCY, 0.0)
        assert (t == pytest.approx(host * plan.ds.grad_accum)) is binds
        assert t >= gpu_only and t >= host * plan.ds.grad_accum * (1 - 1e-9)


def test_deepspeed_zero_stage_sets_the_hook_cost_other_frameworks_pay_none():

    h = {z: hc.host_layer_s(_small(1, z), 0) for z in (1, 2, 3)}
    kernels = hc.layer_kernels(_small(1), 0) * (hc.HOST_S_PER_KERNEL + hc.HOST_ATEN_OPS_PER_KERNEL * hc.KERNEL_LAUNCH_S)
    assert h[1] == pytest.approx(kernels + 9 * hc.HOST_S_PER_PARAM_TENSOR[1])
    assert h[2] == pytest.approx(kernels + 9 * hc.HOST_S_PER_PARAM_TENSOR[2])
    assert h[3] == pytest.approx(kernels + 9 * hc.HOST_S_PER_PARAM_TENSOR[3])
    assert h[1] <= h[2] < h[3]
    assert hc.host_layer_s(_small(1, 3, "fsdp"), 0) == pytest.approx(kernels)
    assert hc.host_micro_step_s(_small(1, 3, "fsdp")) == hc.HOST_S_PER_MICRO_STEP[0]


def test_optimizer_step_host_work_counts_the_stage_tensors_deepspeed_only():

    for z in (0, 1, 2, 3):
        plan = _small(4, z)
        assert hc.host_step_s(plan) == pytest.approx(hc.HOST_S_PER_STEP[z] + 16 * 9 * hc.HOST_S_PER_STEP_PER_PARAM_TENSOR[z])
    assert hc.host_step_s(_small(4, 2, "megatron")) == 0.0


def test_host_constants_are_the_committed_measurement(repo_root):
    """The shipped host constants are `constants()` of benchmarks/results/host_overhead_cpu_202612.json."""
    import importlib.util
    import json

    path = repo_root / "benchmarks" / "host_overhead.py"
    spec = importlib.util.spec_from_file_location("host_overhead", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = json.loads((repo_root / "benchmarks" / "results" / "host_overhead_cpu_202612.json").read_text())
    want = mod.constants(doc)
    assert want["HOST_S_PER_KERNEL"] == hc.HOST_S_PER_KERNEL
    assert want["HOST_ATEN_OPS_PER_KERNEL"] == hc.HOST_ATEN_OPS_PER_KERNEL == 2.6
    rec = json.loads((repo_root / "benchmarks" / "results" / "host_recompute_cpu_202612.json").read_text())
    assert mod.recompute_constants(rec) == {"HOST_RECOMPUTE_REPLAY": hc.HOST_RECOMPUTE_REPLAY}
    for name in ("HOST_S_PER_PARAM_TENSOR", "HOST_S_PER_MICRO_STEP", "HOST_S_PER_STEP", "HOST_S_PER_STEP_PER_PARAM_TENSOR"):
        assert {int(k): v for k, v in want[name].items()} == getattr(hc, name), name


def test_a_recomputed_block_costs_the_measured_replay_of_host_time_on_top_of_its_plain_one():
    """host_layer_s: plain kernels x (host per kernel + the CUDA launch of each ATen op behind one), and a
    recomputed block (1 + HOST_RECOMPUTE_REPLAY) x that: the checkpoint machinery costs more host time than the
    third of the kernels its replayed forward adds (benchmarks/results/host_recompute_cpu_202612.md)."""
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    plain = _small(1, 0, "megatron")
    full = plain.model_copy(update={"checkpoint": CheckpointPolicy(kind="full")})
    assert full.checkpoint.checkpointed_layers(16)[0] and not plain.checkpoint.checkpointed_layers(16)[0]
    per_kernel = hc.HOST_S_PER_KERNEL + hc.HOST_ATEN_OPS_PER_KERNEL * hc.KERNEL_LAUNCH_S
    assert hc.host_layer_s(plain, 0) == pytest.approx(hc.layer_kernels(plain, 0) * per_kernel)
    assert hc.host_layer_s(full, 0) == pytest.approx(hc.layer_kernels(plain, 0) * per_kernel * (1 + hc.HOST_RECOMPUTE_REPLAY))
    # the GPU side still counts the replayed forward's kernels once more (layer_kernels with recompute)
    assert hc.layer_kernels(full, 0) > hc.layer_kernels(full, 0, recompute=False) == hc.layer_kernels(plain, 0)
