"""hf / accelerate at ZeRO-3 get no AutoTP: transformers 5 loads a checkpoint into a ZeRO-3 model through
integrations/deepspeed.py _load_state_dict_into_zero3_model, whose _apply_weight_conversions_to_state_dict raises
NotImplementedError whenever tensor_parallel.autotp_size > 1 (every model has weight conversions), so a
ds_config_hf.json at stage 3 with a tensor_parallel section made from_pretrained fail (runplan.autotp.
HF_ZERO3_AUTOTP_NOTE). DeepSpeed's own engine runs AutoTP at stage 3, so only the HF targets are refused.

Before: hf_unavailable_reason let zero3 tp>1 through, the HF group of llama-3-8b on 1x8 H100 picked
`zero3 tp2 pp1 mb1 ckpt=none` (the deepspeed target's layout) and wrote tensor_parallel.autotp_size 2 at stage 3.
Now that layout is the HF sweep's "target" drop, the HF files and figures are a tp-1 layout, the notes say why, and a
pinned training.tp 2 gets no HF files with the reason.
"""
from __future__ import annotations

import json
import textwrap

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.core import generate
from dstoolkit.generate.hf_targets import hf_unavailable_reason
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.runplan.autotp import HF_ZERO3_AUTOTP_NOTE, hf_zero3_autotp_refusal

SPEC = """\
name: l3
model: {{preset: llama-3-8b}}
cluster: {{nodes: 1, gpus_per_node: 8, gpu: H100-SXM}}
training: {{seq_len: 8192, global_batch: 128, micro_batch: auto, precision: bf16, lr: 0.0003, train_steps: 100,
            activation_checkpointing: auto, tp: {tp}, pp: auto, zero_stage: auto}}
"""


def _load(tmp_path, tp="auto"):
    (tmp_path / "s.yaml").write_text(textwrap.dedent(SPEC.format(tp=tp)))
    return load_spec_and_shape(tmp_path / "s.yaml")


def test_refusal_only_for_autotp_at_stage_3():
    assert hf_zero3_autotp_refusal(3, 1, "x") is None
    for stage in (0, 1, 2):
        assert hf_zero3_autotp_refusal(stage, 2, "x") is None
    msg = hf_zero3_autotp_refusal(3, 4, "tp (tensor_parallel.autotp_size)")
    assert msg.startswith("tp (tensor_parallel.autotp_size)=4 at ZeRO stage 3: " + HF_ZERO3_AUTOTP_NOTE)
    assert "NotImplementedError" in msg and "training.tp: 1 or auto" in msg


def test_hf_unavailable_reason_refuses_autotp_at_zero3(tmp_path):
    _, shape = _load(tmp_path)
    for cand in (Candidate(zero_stage=3, tp=2, micro_batch=1),
                 Candidate(zero_stage=3, tp=2, micro_batch=1, offload_optimizer=True, offload_param=True),
                 Candidate(zero_stage=3, tp=2, micro_batch=1, zeropp=True)):
        assert hf_unavailable_reason(cand, shape) == hf_zero3_autotp_refusal(3, 2, "tp (tensor_parallel.autotp_size)")
    assert hf_unavailable_reason(Candidate(zero_stage=3, tp=1, micro_batch=1), shape) is None
    assert hf_unavailable_reason(Candidate(zero_stage=2, tp=2, micro_batch=1), shape) is None


def test_generate_hf_at_zero3_is_tp1_with_the_reason(tmp_path):
    spec, shape = _load(tmp_path)
    res = generate(spec, shape, strategies=["zero3", "zero1"], targets=["deepspeed", "hf"])
    by = {o.name: o for o in res.generated}
    z3 = by["zero3"]
    assert z3.per_target["deepspeed"].candidate.tp == 2  # DeepSpeed's engine keeps AutoTP at stage 3
    hf = z3.per_target["hf"]
    assert (hf.candidate.zero_stage, hf.candidate.tp) == (3, 1)  # the HF figures are those of the files: tp 1
    ds = json.loads(z3.files["ds_config_hf.json"])
    assert "tensor_parallel" not in ds and ds["zero_optimization"]["stage"] == 3
    args = json.loads(z3.files["training_args.json"])
    assert args["per_device_train_batch_size"] == hf.candidate.micro_batch
    assert args["gradient_accumulation_steps"] == 128 // (hf.candidate.micro_batch * 8)  # dp 8 (tp 1)
    note = (f"# NOTE: No tensor_parallel section (AutoTP) at ZeRO-3, and the estimate is for tp 1: "
            f"{HF_ZERO3_AUTOTP_NOTE}. AutoTP runs at ZeRO stage 0-2 (strategies zero0, zero1, zero2).")
    assert note in z3.files["launch_hf.sh"].splitlines()
    # ZeRO-1 keeps AutoTP for HF (transformers' ordinary loading path) and has no stage-3 note
    z1 = by["zero1"]
    tp1 = z1.per_target["hf"].candidate.tp
    assert json.loads(z1.files["ds_config_hf.json"]).get("tensor_parallel") == ({"autotp_size": tp1} if tp1 > 1 else None)
    assert not any("No tensor_parallel section" in line for line in z1.files["launch_hf.sh"].splitlines())


def test_pinned_tp2_at_zero3_gets_no_hf_files(tmp_path):
    spec, shape = _load(tmp_path, tp=2)
    res = generate(spec, shape, strategies=["zero3"], targets=["deepspeed", "hf"])
    [z3] = res.generated
    assert z3.targets_skipped == {"hf": hf_zero3_autotp_refusal(3, 2, "tp (tensor_parallel.autotp_size)")}
    assert "ds_config_hf.json" not in z3.files and "launch_hf.sh" not in z3.files
    assert z3.per_target["deepspeed"].candidate.tp == 2
