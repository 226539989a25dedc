"""Megatron-LM figures are for what its files run (s37 finding 3).

Before: the megatron-lm group resolved and estimated zero3-offload with parameter offload (params and grads 0 GiB on
the device, "offload | opt+param") and zero++ with hpZ / quantized collectives (faster, bigger), while
megatron_lm_args writes --optimizer-cpu-offload only for the first and zero3's very files for the second. Now
Megatron-LM's files get neither strategy (`targets.zero_gaps_reason`, in targets_skipped), the sweep / estimate drop
its layouts with parameter offload or ZeRO++ (code "target"), and estimate says so in one line. Megatron-DeepSpeed
keeps both: its ds_config.json gives them to DeepSpeed's engine.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.generate import generate
from dstoolkit.generate.candidates import STRATEGIES, Candidate
from dstoolkit.generate.core import GenerateError
from dstoolkit.generate.planner import resolve_spec
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.generate import targets
from dstoolkit.generate.targets import strategy_unavailable_for, target_unavailable_reason
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import load_spec

PARAM_GAP = ("Megatron-LM has no parameter offload (its one offload flag is --optimizer-cpu-offload, "
             "megatron/training/arguments.py at d98e8a64; Megatron-FSDP keeps the parameter shards on the GPU): its "
             "files would offload the optimizer alone")
ZEROPP_GAP = ("Megatron-LM has no ZeRO++ (Megatron-FSDP has no qwZ / qgZ quantized collectives nor hpZ secondary "
              "partition): its files would be plain ZeRO-3's (megatron_lm.uses_megatron_fsdp)")
PARAM_WAY = ("zero2-offload offloads the optimizer; `dstoolkit sweep SPEC --target megatron-lm` with "
             "training.offload: true estimates ZeRO-3 with the optimizer offloaded (zero3 offload=opt)")
ZEROPP_WAY = "the zero3 strategy's megatron-lm files are those files"


def _spec(tmp_path, training: str):
    p = tmp_path / "spec.yaml"
    p.write_text(
        "name: l2mini\nmodel:\n  model_type: llama\n  hidden_size: 2048\n  intermediate_size: 5504\n"
        "  num_hidden_layers: 8\n  num_attention_heads: 16\n  num_key_value_heads: 16\n  vocab_size: 32000\n"
        "  max_position_embeddings: 4096\n  tie_word_embeddings: false\n"
        "cluster: {nodes: 2, gpus_per_node: 8, gpu: A100-80G}\n"
        f"training: {{seq_len: 2048, global_batch: 64, precision: bf16, {training}}}\n")
    spec = load_spec(p)
    return spec, resolve_spec_model(spec)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """ZeRO-3, tp 1, mb 1, no recompute, offload and ZeRO++ open: one layout per strategy."""
    return _spec(tmp_path_factory.mktemp("l2"), "tp: 1, pp: 1, micro_batch: 1, activation_checkpointing: none, "
                                               "zero_stage: 3, offload: true, zeropp: true")


def test_generate_gives_megatron_lm_neither_strategy(fixed):
    spec, shape = fixed
    res = generate(spec, shape, strategies=["zero3", "zero3-offload", "zero++"],
                   targets=["megatron-lm", "megatron-deepspeed"])
    out = {o.name: o for o in res.generated}
    assert "megatron-lm" in out["zero3"].per_target and "zero3/megatron_lm_args.txt" in res.files
    assert out["zero3-offload"].targets_skipped == {"megatron-lm": f"{PARAM_GAP}; {PARAM_WAY}"}
    assert out["zero++"].targets_skipped == {"megatron-lm": f"{ZEROPP_GAP}; {ZEROPP_WAY}"}
    for name in ("zero3-offload", "zero++"):
        assert "megatron-lm" not in out[name].per_target
        assert f"{name}/megatron_lm_args.txt" not in res.files and f"{name}/launch_megatron_lm.sh" not in res.files
        assert f"{name}/megatron_deepspeed_args.txt" in res.files  # Megatron-DeepSpeed keeps its files
    # ... whose ds_config.json turns the features on in DeepSpeed's engine (zero.Init / the ZeRO-3 optimizer read them)
    z = {n: json.loads(res.files[f"{n}/ds_config.json"])["zero_optimization"] for n in ("zero3-offload", "zero++")}
    assert z["zero3-offload"]["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert z["zero++"]["zero_quantized_weights"] is True and z["zero++"]["zero_quantized_gradients"] is True
    assert out["zero3-offload"].per_target["megatron-deepspeed"].candidate.offload_param is True
    assert out["zero++"].per_target["megatron-deepspeed"].candidate.zeropp is True


def test_megatron_lm_alone_refuses_the_strategy_by_name(fixed):
    spec, shape = fixed
    with pytest.raises(GenerateError) as err:
        generate(spec, shape, strategies=["zero++"], targets=["megatron-lm"])
    assert str(err.value) == f"strategy 'zero++' cannot be generated for {shape.name}: {ZEROPP_GAP}; {ZEROPP_WAY}"
    res = generate(spec, shape, targets=["megatron-lm"])  # the defaults: zero3 only, each other one with its reason
    assert [o.name for o in res.generated] == ["zero3"]
    skipped = {s.name: s.reason for s in res.skipped}
    assert skipped["zero3-offload"] == f"megatron-lm: {PARAM_GAP}; {PARAM_WAY}"
    assert skipped["zero++"] == f"megatron-lm: {ZEROPP_GAP}; {ZEROPP_WAY}"


def test_strategy_rule_is_megatron_lm_only():
    for group in (["deepspeed", "megatron-deepspeed"], ["hf", "accelerate"]):
        for name in ("zero3-offload", "zero++"):
            assert strategy_unavailable_for(group, STRATEGIES[name], is_moe=False) is None
    assert strategy_unavailable_for(["megatron-lm"], STRATEGIES["zero3"], is_moe=False) is None
    assert strategy_unavailable_for(["megatron-lm"], STRATEGIES["zero2-offload"], is_moe=False) is None


def test_sweep_estimates_only_what_megatron_lm_runs(fixed):
    spec, shape = fixed
    res = run_sweep(spec, shape, top=10, validate=False, advise=False, targets=("megatron-lm",))
    modes = {(c.candidate.offload_optimizer, c.candidate.offload_param, c.candidate.zeropp) for c in res.ranked}
    assert modes == {(False, False, False), (True, False, False)}  # zero3 and zero3 offload=opt
    gone = {(d.candidate.offload_param, d.candidate.zeropp): (d.code, d.reason) for d in res.dropped}
    assert gone == {(True, False): ("target", f"megatron-lm: {PARAM_GAP}; {PARAM_WAY}"),
                    (False, True): ("target", f"megatron-lm: {ZEROPP_GAP}; {ZEROPP_WAY}")}
    ds = run_sweep(spec, shape, top=10, validate=False, advise=False, targets=("megatron-deepspeed",))
    assert {(c.candidate.offload_param, c.candidate.zeropp) for c in ds.ranked} == {(False, False), (True, False),
                                                                                    (False, True)}


def test_candidate_rule():
    shape = None  # the ZeRO rule reads the layout only
    off = Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, micro_batch=1)
    assert target_unavailable_reason("megatron-lm", off, shape) == f"{PARAM_GAP}; {PARAM_WAY}"
    assert target_unavailable_reason("megatron-lm", off.model_copy(update={"offload_param": False}), shape) is None
    for t in ("deepspeed", "megatron-deepspeed"):
        assert target_unavailable_reason(t, off, shape) is None


def test_estimate_says_so_in_one_line(fixed):
    spec, shape = fixed
    r = resolve_spec(spec, shape, ("megatron-lm",))
    assert not r.candidate.offload_param and not r.candidate.zeropp
    line = f"--target megatron-lm: {PARAM_GAP}; {ZEROPP_GAP}: the layouts with them are not estimated for it"
    assert r.assumptions.count(line) == 1
    assert targets.zero_gaps_note(spec, ("megatron-lm",)) == line
    assert targets.zero_gaps_note(spec, ("deepspeed",)) is None
    # offload at ZeRO-2 only (no parameter offload open) and ZeRO++ off: nothing to say
    plain = spec.model_copy(update={"training": spec.training.model_copy(update={"zero_stage": 2, "zeropp": False})})
    assert targets.zero_gaps_note(plain, ("megatron-lm",)) is None
