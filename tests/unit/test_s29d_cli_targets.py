"""A --target given on the command line counts as the spec's targets for the rules that follow each target's engine.

Before: `sweep` / `generate s.yaml --target megatron-lm` with `cp: 4` in a spec left at framework deepspeed (no
`targets:`) was refused at spec load ("training.cp=4 with training.framework='deepspeed': DeepSpeed has no context
parallelism"), although the same spec with `targets: [megatron-lm]` loads: the command line's targets reached the sweep,
never the spec's checks (LY019 / LY022 / LY023 / LY024 and recompute_modules, spec/target_engines.py rule_engines).
One mechanism now: `load_spec(path, targets=...)` (and `generate.io.load_spec_and_shape(path, targets)`).
"""
from __future__ import annotations

import pytest
import yaml

from dstoolkit.cli import main
from dstoolkit.generate.io import SpecLoadError, load_spec_and_shape
from dstoolkit.spec import SpecError, load_spec

CP4 = """\
name: c
model: {{preset: llama-3-8b}}
cluster: {{nodes: 1, gpus_per_node: 8, gpu: H100-SXM}}
training: {{seq_len: 32768, precision: bf16, global_batch: 16, micro_batch: 1, zero_stage: 1, {extra}}}
"""


def write(tmp_path, extra: str):
    p = tmp_path / "s.yaml"
    p.write_text(CP4.format(extra=extra))
    return p


def test_load_spec_takes_the_command_lines_targets(tmp_path):
    p = write(tmp_path, "cp: 4, activation_checkpointing: full")
    with pytest.raises(SpecError, match=r"training\.cp=4 with training\.framework='deepspeed': DeepSpeed has no context "
                                        r"parallelism"):
        load_spec(p)
    spec = load_spec(p, targets=["megatron-lm"])
    assert spec.targets == ["megatron-lm"] and spec.training.framework == "deepspeed"
    spec, _ = load_spec_and_shape(p, ("megatron-lm",))
    assert spec.targets == ["megatron-lm"]


def test_the_fix_names_the_flag(tmp_path):
    p = write(tmp_path, "ulysses: 2, tp: 2, sequence_parallel: true, activation_checkpointing: full")
    with pytest.raises(SpecError) as exc:
        load_spec(p, targets=["megatron-deepspeed"])
    assert str(exc.value).endswith(
        "training.sequence_parallel: training.ulysses=2 with training.sequence_parallel: DeepSpeed-Ulysses and Megatron "
        "sequence parallelism do not combine (target megatron-deepspeed's engine: deepspeed) (turn sequence_parallel "
        "off, use cp in place of ulysses, or run it on Megatron-LM alone (--target megatron-lm alone), whose all-to-all "
        "context parallelism takes --sequence-parallel)")
    assert load_spec(p, targets=["megatron-lm"]).targets == ["megatron-lm"]
    interleaved = write(tmp_path, "pp: 4, pipeline_schedule: interleaved, virtual_stages: 2, "
                                  "activation_checkpointing: full")
    with pytest.raises(SpecError, match=r"DeepSpeed's pipeline engine runs 1F1B only \(set pipeline_schedule: 1f1b, or "
                                        r"drop --target deepspeed\)"):
        load_spec(interleaved, targets=["deepspeed", "megatron-lm"])
    modules = write(tmp_path, "recompute_modules: [layernorm], activation_checkpointing: selective")
    with pytest.raises(SpecError, match=r"recompute_modules=\['layernorm'\] is Megatron's --recompute-modules, and no "
                                        r"target runs Megatron-Core \(--target deepspeed\) \(add --target megatron-lm, "
                                        r"or remove recompute_modules\)"):
        load_spec(modules, targets=["deepspeed"])


def test_sweep_and_generate_load_the_spec_with_their_targets(tmp_path, capsys):
    p = write(tmp_path, "cp: 4, activation_checkpointing: full")
    assert main(["sweep", str(p), "--target", "megatron-lm"]) == 0
    assert "estimated under Megatron-Core, the engine of megatron-lm" in capsys.readouterr().out
    assert main(["generate", str(p), "-o", str(tmp_path / "g"), "--target", "megatron-lm", "--strategy", "zero1"]) == 0
    words = (tmp_path / "g" / "zero1" / "megatron_lm_args.txt").read_text().split()
    assert words[words.index("--context-parallel-size") + 1] == "4"
    # the folder's spec copy loads on its own: it names the targets it was generated for
    copy = tmp_path / "g" / "spec.yaml"
    assert yaml.safe_load(copy.read_text())["targets"] == ["megatron-lm"]
    assert load_spec(copy).training.cp == 4
    capsys.readouterr()
    assert main(["generate", str(p), "-o", str(tmp_path / "d"), "--target", "deepspeed"]) == 1  # loads, no layout
    assert "training.cp=4: deepspeed does not split sequences that way; generate with --target megatron-lm" in (
        capsys.readouterr().err)
    with pytest.raises(SpecLoadError, match=r"training\.cp=4 with training\.framework='deepspeed'"):
        load_spec_and_shape(p)  # without targets, as before


def test_estimate_and_model_class_paths_take_the_command_lines_targets(tmp_path, capsys):
    p = write(tmp_path, "cp: 4, activation_checkpointing: full")
    assert main(["estimate", str(p), "--target", "megatron-lm"]) == 0
    out = capsys.readouterr().out
    assert "cp=4" in out and "(Megatron-Core DistributedOptimizer)" in out
    assert main(["estimate", str(p)]) == 2  # no target: training.framework decides, and DeepSpeed has no cp
    assert "DeepSpeed has no context parallelism" in capsys.readouterr().err
    from dstoolkit.cli.spec_override import load_spec_and_shape_with

    # with --model-class the spec loads past the cp rule under the given target (a preset takes no model class: that
    # is the next check); without the target the cp rule refuses first
    with pytest.raises(SpecLoadError, match=r"--model-class LlamaForCausalLM: the spec's model is the preset"):
        load_spec_and_shape_with(p, "LlamaForCausalLM", ("megatron-lm",))
    with pytest.raises(SpecLoadError, match="DeepSpeed has no context parallelism"):
        load_spec_and_shape_with(p, "LlamaForCausalLM")
