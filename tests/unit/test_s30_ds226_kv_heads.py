"""DS226 asks the key/value-head rule of both implementations a DeepSpeed JSON's sequence_parallel_size runs under
(dstoolkit.layout.ulysses_heads): DeepSpeed's UlyssesSPAttentionHF (ALST: kv heads divisible by the degree or vice
versa) and Megatron-DeepSpeed's DistributedAttention (a kv head per rank of each TP rank).

Before: DS226 checked the attention heads only, so sequence_parallel_size 8 with 3 key/value heads passed, which
both implementations refuse, and an HF JSON with 12 kv heads at 8 passed, which ALST refuses at start-up."""
from __future__ import annotations

from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 8}


def ds226(kv, mode="strict", heads=48, world=16, tp=1):
    return [(f.severity, f.message, f.suggestion)
            for f in validate_config(BASE, world_size=world, num_heads=heads, num_kv_heads=kv, mode=mode, tp=tp)
            if f.code == "DS226"]


def test_both_implementations_refuse_is_an_error_with_the_degrees_that_work():
    [(sev, msg, fix)] = ds226(3)
    assert sev == "error"
    assert "UlyssesSPAttentionHF raises 'KV attention head count 3 is not divisible by SP size 8" in msg
    assert "exceeds the 3 key/value heads on each TP rank" in msg
    assert fix == "use sequence_parallel_size 1: no degree above 1 splits these heads and divides world size 16"
    [(_, _, fix)] = ds226(3, world=48)
    assert fix == ("use sequence_parallel_size 3, 6, 12, 24 or 48 (UlyssesSPAttentionHF takes them and they "
                   "divide world size 48)")


def test_one_implementation_refusing_is_a_warning_naming_the_other_unless_hf_mode_runs_alst():
    # 4 kv heads at 8: ALST replicates each twice; DistributedAttention needs a kv head per rank
    [(sev, msg, fix)] = ds226(4)
    assert sev == "warning" and "DistributedAttention asserts 'Number of key-value heads" in msg
    assert msg.endswith("DeepSpeed's UlyssesSPAttentionHF (ALST, HF models) takes it")
    assert ds226(4, mode="hf") == []
    # 12 kv heads at 8: DistributedAttention splits them unevenly; ALST refuses (and HF mode runs ALST)
    [(sev, msg, _)] = ds226(12)
    assert sev == "warning" and msg.endswith("Megatron-DeepSpeed's DistributedAttention takes it")
    [(sev, msg, fix)] = ds226(12, mode="hf")
    assert sev == "error" and "DistributedAttention" not in msg
    assert fix == "use sequence_parallel_size 2 or 4 (UlyssesSPAttentionHF takes them and they divide world size 16)"


def test_heads_that_both_take_pass_and_no_kv_count_asks_nothing():
    assert ds226(8) == [] and ds226(16) == [] and ds226(None) == []
    # TP 2 leaves 4 of 8 kv heads per TP rank: DistributedAttention refuses 8, ALST (no TP) takes it
    [(sev, msg, _)] = ds226(8, tp=2, world=32)
    assert sev == "warning" and "(8 / tp 2)" in msg
