"""Rule LY020 states the head rule of the Ulysses implementation each target runs, and no advice points to a target
that then refuses.

Before: LY020 asked DeepSpeed's DistributedAttention rule (a key/value head per rank) of every launcher, and
Megatron-LM's reason (all-to-all context parallelism) said "or --target megatron-deepspeed (DeepSpeed-Ulysses splits
them unevenly)" where megatron-deepspeed then refused with LY020 (llama-3-8b, tp 2, ulysses 8: 4 kv heads per TP
rank). A 12-head model at ulysses 8 passed spec / validate / generate --target megatron-deepspeed, which Megatron-DeepSpeed
refuses (ParallelAttention asserts num_attention_heads % ds_sequence_parallel_size == 0, megatron/model/transformer.py
at f4157bea) and `estimate --config` refused with DS226. UlyssesSPAttentionHF (ALST), which replicates key/value heads
when the degree is a multiple of them, had no rule.
"""
from __future__ import annotations

import itertools
import re

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.planner import resolve_spec
from dstoolkit.generate.rules import check_candidate
from dstoolkit.generate.targets import sequence_sharding_reason, spec_for_targets
from dstoolkit.layout import LayoutFacts, check_layout
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import spec_from_dict


def ly020(**facts) -> list[str]:
    return [v.message for v in check_layout(LayoutFacts(cp=1, **facts), ("LY020",))]


def test_megatron_deepspeed_needs_the_degree_to_divide_the_attention_heads():
    [msg] = ly020(sp=8, num_heads=12, kv_heads=12, tp=1, ulysses_impl="megatron-deepspeed")
    assert msg == ("sp=8 does not divide the 12 attention heads: Megatron-DeepSpeed asserts num_attention_heads % "
                   "ds_sequence_parallel_size == 0 (megatron/model/transformer.py ParallelAttention), whatever "
                   "DeepSpeed's DistributedAttention could split")
    # DistributedAttention alone splits 12 key/value heads over 8 ranks unevenly (uneven_heads_all2all)
    assert ly020(sp=8, num_heads=12, kv_heads=12, tp=1) == []
    assert ly020(sp=4, num_heads=12, kv_heads=12, tp=1, ulysses_impl="megatron-deepspeed") == []


def test_each_implementation_refuses_its_own_counts():
    llama8b = {"num_heads": 32, "kv_heads": 8, "tp": 1}
    # ALST replicates 8 key/value heads twice at sp 16; DistributedAttention would leave ranks without one
    assert ly020(sp=16, ulysses_impl="alst", **llama8b) == []
    assert ly020(sp=16, ulysses_impl="megatron-deepspeed", **llama8b)[0].startswith(
        "sp=16 exceeds the 8 key/value heads on each TP rank (8 / tp 1)")
    assert ly020(sp=16, ulysses_impl="megatron-core", **llama8b)[0].startswith(
        "sp=16: Megatron-LM's all-to-all context parallelism needs the key/value heads of each TP rank (8 / tp 1 = 8) "
        "divisible by it")
    assert "is not divisible by SP size 4 or vice versa" in ly020(sp=4, num_heads=24, kv_heads=6, tp=1,
                                                                  ulysses_impl="alst")[0]
    assert ly020(sp=4, num_heads=24, kv_heads=6, tp=1, ulysses_impl="megatron-deepspeed") == []  # 6 >= 4, uneven


def test_the_fix_lists_the_degrees_that_split_and_divide_the_ranks():
    [v] = check_layout(LayoutFacts(world=8, cp=1, sp=8, num_heads=12, kv_heads=12, tp=1, pp=1,
                                   ulysses_impl="megatron-deepspeed"), ("LY020",))
    # 3, 6 and 12 split the heads but not the 8 ranks
    assert v.fix == ("use sp 2 or 4, or context parallelism (cp, Megatron-LM's ring attention: no head split) for "
                     "longer sequences")


LLAMA8B = """\
name: u
model: {{preset: llama-3-8b}}
cluster: {{nodes: 4, gpus_per_node: 8, gpu: H100-SXM}}
training: {{seq_len: 32768, precision: bf16, global_batch: 16, micro_batch: 1, zero_stage: 2, ulysses: {u},
           activation_checkpointing: none, tp: 2, pp: 1}}
"""


def test_megatron_lm_no_longer_advises_megatron_deepspeed_where_it_refuses(tmp_path):
    p = tmp_path / "u8.yaml"
    p.write_text(LLAMA8B.format(u=8))
    spec, shape = load_spec_and_shape(p)
    with pytest.raises(ValueError) as lm:
        resolve_spec(spec, shape, ("megatron-lm",))
    # generate's reason for the target (targets.target_refusal), and no advice to a target that refuses it too
    # (deepspeed: the last check below)
    assert str(lm.value) == (
        "u is not estimated for any requested target: --target "
        "megatron-lm: training.ulysses=8: Megatron-LM's all-to-all context parallelism needs the key/value heads of "
        "each TP rank (8 / tp 2 = 4) divisible by it (Transformer Engine's AttnFuncWithCPAndQKVOA2A: 'The number of "
        "attention heads needs to be divisible by CP size!'); use training.ulysses 2 or 4, or context parallelism (cp, "
        "Megatron-LM's ring attention: no head split) for longer sequences (generate writes no files for them either: "
        "ask a target that runs this spec)")
    with pytest.raises(ValueError, match=r"megatron-deepspeed: training\.ulysses=8 exceeds the 4 key/value heads on "
                                         r"each TP rank \(8 / tp 2\).*use training\.ulysses 2 or 4"):
        resolve_spec(spec, shape, ("megatron-deepspeed",))
    with pytest.raises(ValueError, match=r"deepspeed does not split sequences that way, and no launcher that does "
                                         r"takes 8 for these heads"):
        resolve_spec(spec, shape, ("deepspeed",))


def _shape(heads: int, kv: int) -> ModelShape:
    return ModelShape(name=f"h{heads}kv{kv}", model_type="llama", hidden_size=heads * 64, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=heads * 128, vocab_size=1024)


def _advised(why: str) -> list[str]:
    """The launchers a reason sends the user to."""
    m = re.search(r"generate with --target ([\w /-]+)$", why)
    return (m.group(1).split(" / ") if m else []) + re.findall(r"run it on ([\w-]+) \(", why)


def _refusal(target: str, cand: Candidate, shape: ModelShape):
    """What the sweep would drop the candidate for under `target` (its own reason, or LY020 under its engine)."""
    spec = spec_for_targets(spec_from_dict({"model": {"preset": "tiny"}, "cluster": {"nodes": 8, "gpus_per_node": 8},
                                            "training": {"seq_len": 4096, "global_batch": 512}}), (target,))
    v = check_candidate(spec, shape, cand, targets=(target,))
    return sequence_sharding_reason(target, cand, shape) or (v.message if v and v.code == "ulysses-heads" else None)


@pytest.mark.parametrize("heads,kv", [(12, 12), (32, 8), (24, 6), (16, 2), (64, 8), (28, 4)])
def test_advice_never_points_to_a_launcher_that_then_refuses(heads, kv):
    shape, advice = _shape(heads, kv), 0
    for tp, u in itertools.product((1, 2, 4), (2, 3, 4, 6, 8, 16)):
        if kv % tp or heads % tp:
            continue
        cand = Candidate(zero_stage=1, tp=tp, pp=1, micro_batch=1, ulysses=u)
        for target in ("deepspeed", "hf", "megatron-lm", "megatron-deepspeed"):
            for other in _advised(sequence_sharding_reason(target, cand, shape) or ""):
                advice += 1
                assert _refusal(other, cand, shape) is None, (target, other, tp, u)
    assert advice  # the grid does exercise advice


M12 = """\
name: m12
model: {model_type: llama, hidden_size: 768, intermediate_size: 2048, num_attention_heads: 12, num_key_value_heads: 12,
        num_hidden_layers: 4, vocab_size: 32000, max_position_embeddings: 8192}
cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}
training: {seq_len: 4096, precision: bf16, global_batch: 8, micro_batch: 1, zero_stage: 1, ulysses: U, tp: 1, pp: 1}
"""


def test_a_12_head_model_at_ulysses_8_is_refused_for_megatron_deepspeed_as_ds226_refuses_its_json(tmp_path, capsys):
    p = tmp_path / "m12.yaml"
    p.write_text(M12.replace("U", "8"))
    assert main(["generate", str(p), "-o", str(tmp_path / "g"), "--target", "megatron-deepspeed"]) == 1
    assert not (tmp_path / "g").exists()
    assert ("megatron-deepspeed: training.ulysses=8 does not divide the 12 attention heads: Megatron-DeepSpeed asserts "
            "num_attention_heads % ds_sequence_parallel_size == 0") in capsys.readouterr().err
    assert main(["validate", str(p)]) == 1
    assert "training.ulysses=8 does not divide the 12 attention heads" in capsys.readouterr().out
    # ulysses 4 divides 12: written, and the DeepSpeed JSON it writes passes DS226 in estimate --config
    p.write_text(M12.replace("U", "4"))
    assert main(["generate", str(p), "-o", str(tmp_path / "g4"), "--target", "megatron-deepspeed",
                 "--strategy", "zero1"]) == 0
    words = (tmp_path / "g4" / "zero1" / "megatron_deepspeed_args.txt").read_text().split()
    assert words[words.index("--ds-sequence-parallel-size") + 1] == "4"
