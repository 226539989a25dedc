"""The "what would make it fit" offload advice names every field it changes and shows an offload layout (s33
estimator finding 6).

Before: on a ZeRO-0 spec it read "allow CPU offload (training.offload: true): e.g. zero2 tp1 pp1 mb1 ckpt=none", but it
also set training.zero_stage: auto (offload alone at ZeRO-0 is an error), and its example had no offload: the stage
change made it fit, which the next suggestion already says.
"""
from __future__ import annotations

from dstoolkit.generate.sweep import what_would_fit
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import Spec


def _spec(zero_stage) -> Spec:
    return Spec.model_validate({
        "name": "t", "model": {"preset": "llama-3-8b"}, "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM"},
        "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "precision": "bf16", "optimizer": "adamw",
                     "activation_checkpointing": "none", "tp": 1, "pp": 1, "zero_stage": zero_stage,
                     "offload": False}})


def test_offload_advice_names_the_stage_change_and_shows_an_offload_layout():
    spec = _spec(0)
    advice = what_would_fit(spec, resolve_spec_model(spec))
    offload = [a for a in advice if a.startswith("allow CPU offload")]
    assert len(offload) == 1
    assert offload[0].startswith("allow CPU offload (training.offload: true, training.zero_stage: auto): e.g. zero")
    example = offload[0].split("e.g. ", 1)[1]
    assert " offload=opt" in example


def test_offload_advice_applied_as_written_is_a_valid_spec_whose_layout_offloads():
    spec = _spec(0)
    data = spec.model_dump(exclude_none=True)
    data["training"].update({"offload": True, "zero_stage": "auto"})  # what the text names
    applied = Spec.model_validate(data)
    from dstoolkit.generate.sweep import run_sweep

    res = run_sweep(applied, resolve_spec_model(applied), top=50, validate=False, advise=False)
    assert any(r.candidate.offload_optimizer for r in res.ranked)
