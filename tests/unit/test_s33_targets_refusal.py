"""`estimate SPEC` and `sweep SPEC` refuse the targets `generate` refuses, for the same reason (s33 finding 10).

Before: a model Megatron's GPT cannot build (Falcon's parallel attention + MLP block, `architecture_gaps`) got
Megatron-LM and Megatron-DeepSpeed step times, memory and a "best for megatron-lm" row from estimate and sweep, while
generate wrote no files for those targets. Now all three ask `targets.target_refusal` (the argument builders'
refusals): estimate prints `--target X: not estimated: <reason>` (docs/generate-and-targets.md), sweep leaves X out of
its rankings with that reason.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.generate import generate
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.targets import target_refusal
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import load_spec

transformers = pytest.importorskip("transformers")

PARALLEL_BLOCK = "cannot express a parallel attention + MLP block"
MEGATRON = ("megatron-lm", "megatron-deepspeed")


@pytest.fixture(scope="module")
def falcon_spec(tmp_path_factory):
    """A 1B-sized Falcon (parallel attention + MLP, one norm per block) on 1 x 8 H100, every target asked."""
    root = tmp_path_factory.mktemp("falcon")
    transformers.FalconConfig(vocab_size=32000, hidden_size=2048, num_hidden_layers=8, num_attention_heads=16,
                              multi_query=True, parallel_attn=True, bias=False, new_decoder_architecture=False,
                              alibi=False).save_pretrained(root / "model")
    (root / "spec.yaml").write_text(
        "name: falcon-small\nmodel:\n  hf_config: model/config.json\n"
        "cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
        "training: {seq_len: 2048, global_batch: 64, precision: bf16}\n"
        "targets: [deepspeed, hf, accelerate, megatron-lm, megatron-deepspeed]\n")
    return root / "spec.yaml"


def _run(capsys, *argv):
    rc = main(list(argv))
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_one_rule_refuses_both_megatron_targets(falcon_spec):
    spec = load_spec(falcon_spec)
    shape = resolve_spec_model(spec)
    cand = Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1)
    for t in MEGATRON:
        why = target_refusal(t, spec, shape, cand)  # the builder's own words (megatron-deepspeed names itself)
        assert why is not None and PARALLEL_BLOCK in why, (t, why)
    assert target_refusal("deepspeed", spec, shape, cand) is None
    assert target_refusal("hf", spec, shape, cand) is None


def test_generate_refuses_with_the_same_reason(falcon_spec):
    spec = load_spec(falcon_spec)
    shape = resolve_spec_model(spec)
    res = generate(spec, shape, strategies=["zero1"], targets=("deepspeed", "hf", *MEGATRON))
    out = res.generated[0]
    cand = out.per_target["deepspeed"].candidate
    for t in MEGATRON:
        assert t not in out.per_target
        assert out.targets_skipped[t] == target_refusal(t, spec, shape, cand)


def test_estimate_prints_not_estimated_for_megatron_targets(falcon_spec, capsys):
    rc, out, err = _run(capsys, "estimate", str(falcon_spec))
    assert rc == 0, err
    for t in MEGATRON:
        assert f"--target {t}: not estimated: {PARALLEL_BLOCK}" in out
    assert "estimated under Megatron-Core" not in out  # no Megatron-LM figures
    assert "figures for --target deepspeed (" in out  # megatron-deepspeed is not among the figures' targets


def test_estimate_json_assumptions_say_not_estimated(falcon_spec, capsys):
    rc, out, err = _run(capsys, "estimate", str(falcon_spec), "--format", "json")
    assert rc == 0, err
    notes = json.loads(out)["assumptions"]
    assert any(n.startswith(f"--target megatron-lm: not estimated: {PARALLEL_BLOCK}") for n in notes)


def test_estimate_of_a_megatron_target_alone_is_refused_with_the_fix(falcon_spec, capsys):
    rc, out, err = _run(capsys, "estimate", str(falcon_spec), "--target", "megatron-lm")
    assert rc == 2
    assert f"--target megatron-lm: {PARALLEL_BLOCK}" in err
    assert "--target deepspeed" in err  # the fix: a target that runs the model


def test_sweep_leaves_megatron_targets_out_with_the_reason(falcon_spec, capsys):
    rc, out, err = _run(capsys, "sweep", str(falcon_spec), "--top", "1")
    assert rc == 0, err
    assert f"== megatron-lm: not estimated: {PARALLEL_BLOCK}" in out
    assert "== megatron-lm: estimated under" not in out
    for t in MEGATRON:
        assert f"best for {t}: not estimated: {PARALLEL_BLOCK}" in out
    assert "--target megatron-deepspeed: not estimated (not in this ranking)" in out
    assert "best for deepspeed: zero" in out


def test_sweep_json_lists_not_estimated(falcon_spec, capsys):
    rc, out, err = _run(capsys, "sweep", str(falcon_spec), "--top", "1", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert set(doc["not_estimated"]) == set(MEGATRON)
    assert all(why.startswith(PARALLEL_BLOCK) for why in doc["not_estimated"].values())
    assert "megatron-lm" not in doc["best_per_target"]
    lm = next(g for g in doc["groups"] if g["targets"] == ["megatron-lm"])
    assert lm["ranked"] == [] and set(lm["not_estimated"]) == {"megatron-lm"}


def test_sweep_of_a_megatron_target_alone_says_why(falcon_spec, capsys):
    rc, out, err = _run(capsys, "sweep", str(falcon_spec), "--target", "megatron-lm")
    assert rc == 1
    assert f"--target megatron-lm: not estimated: {PARALLEL_BLOCK}" in out
    assert "e.g. --target deepspeed" in out
