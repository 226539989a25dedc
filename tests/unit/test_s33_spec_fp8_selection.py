"""A DeepSpeed-framework fp8 spec is priced with `fp8 plan`'s layer selection (s32 review, finding 3's main part):
dstoolkit's own Transformer Engine swap runs it, which keeps the LM head (and any fp8.layers skips) in bf16, so the
spec form (estimate SPEC, sweep, generate, tune) and `estimate --config` on the generated JSON price the same run;
Megatron and FSDP specs keep their frameworks' own FP8 layers."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.estimate import estimate_run
from dstoolkit.fp8.selection import fp8_selection
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.models import resolve_spec_model
from dstoolkit.runplan import plan_from_spec
from dstoolkit.spec import load_spec

SPEC = """name: fp8_sel
model:
  preset: llama-3-8b
cluster:
  nodes: 1
  gpus_per_node: 8
  gpu: H100-SXM
training:
  seq_len: 2048
  global_batch: 16
  micro_batch: 2
  tp: 1
  pp: 1
  zero_stage: 2
  activation_checkpointing: none
  precision: fp8
{extra}"""


def _spec(tmp_path, extra=""):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(extra=extra))
    return p, load_spec(p)


def _plan(spec):
    shape = resolve_spec_model(spec)
    return plan_from_spec(spec, build_ds_config(spec, shape, Candidate(zero_stage=2, micro_batch=2)), shape)


def test_deepspeed_spec_takes_the_plans_selection(tmp_path):
    _, spec = _spec(tmp_path)
    plan = _plan(spec)
    assert plan.fp8_selection == fp8_selection(plan.shape, Fp8Config(), micro_batch=2, seq_len=2048)
    assert plan.fp8_selection.lm_head is False
    assert plan.fp8_selection.blocks == (1.0,) * 32


def test_spec_layer_skips_are_priced_in_bf16(tmp_path):
    _, full = _spec(tmp_path)
    _, skip = _spec(tmp_path, "  fp8:\n    layers:\n      skip_first_layers: 4\n")
    sel = _plan(skip).fp8_selection
    assert sel.blocks == (0.0,) * 4 + (1.0,) * 28
    full_run, skip_run = estimate_run(_plan(full)), estimate_run(_plan(skip))
    assert skip_run.step_time_s > full_run.step_time_s
    assert skip_run.memory.fp8_weight_cache == full_run.memory.fp8_weight_cache * 28 // 32


@pytest.mark.parametrize("framework", ["megatron", "fsdp"])
def test_other_frameworks_pick_their_own_fp8_layers(tmp_path, framework):
    _, spec = _spec(tmp_path, f"  framework: {framework}\n")
    assert _plan(spec).fp8_selection is None


def test_skips_that_leave_no_block_name_the_spec_field(tmp_path):
    _, spec = _spec(tmp_path, "  fp8:\n    layers:\n      skip_first_layers: 40\n")
    with pytest.raises(ValueError) as e:
        _plan(spec)
    assert str(e.value).startswith("training.fp8.layers.skip_first_layers=40 keeps all 32 transformer blocks of "
                                   "llama-3-8b in bf16 (40 >= 32)")


def test_spec_form_equals_estimate_config_on_the_same_run(tmp_path, capsys):
    path, spec = _spec(tmp_path)
    assert main(["estimate", str(path), "--format", "json"]) == 0
    from_spec = json.loads(capsys.readouterr().out)
    cfg = tmp_path / "ds.json"
    shape = resolve_spec_model(spec)
    cfg.write_text(json.dumps(build_ds_config(spec, shape, Candidate(zero_stage=2, micro_batch=2))))
    assert main(["estimate", "--config", str(cfg), "--model", "llama-3-8b", "--gpu", "H100-SXM", "--world-size", "8",
                 "--seq-len", "2048", "--precision", "fp8", "--format", "json"]) == 0
    from_config = json.loads(capsys.readouterr().out)
    assert from_spec["step_time_s"] == from_config["step_time_s"]
    assert from_spec["memory_per_rank_bytes"]["peak"] == from_config["memory_per_rank_bytes"]["peak"]
