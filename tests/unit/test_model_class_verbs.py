"""--model-class on every verb that builds a model: estimate (had it), generate, sweep, tune, fp8 plan, from
one definition in dstoolkit/cli/options.py; on spec verbs it sets model.model_class for the run."""
from __future__ import annotations

import argparse
import pathlib

import pytest

pytest.importorskip("transformers")

KIMI = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "released" / "moonshotai--Kimi-K2-Instruct.json"


def _spec(tmp_path, model: dict) -> pathlib.Path:
    import yaml

    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"name": "k", "model": model, "cluster": {"nodes": 32, "gpus_per_node": 8},
                                 "training": {"seq_len": 4096, "global_batch": 256}}))
    return p


def test_every_verb_has_the_one_flag():
    from dstoolkit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verbs = {"estimate": sub.choices["estimate"], "generate": sub.choices["generate"], "sweep": sub.choices["sweep"],
             "tune": sub.choices["tune"]}
    fp8 = next(a for a in sub.choices["fp8"]._actions if isinstance(a, argparse._SubParsersAction))
    verbs["fp8 plan"] = fp8.choices["plan"]
    for verb, p in verbs.items():
        opt = next((a for a in p._actions if "--model-class" in a.option_strings), None)
        assert opt is not None and opt.metavar == "CLASS" and "transformers class" in opt.help, verb


def test_sweep_with_model_class(tmp_path, capsys):
    from dstoolkit.cli import main

    spec = _spec(tmp_path, {"hf_config": str(KIMI)})
    assert main(["sweep", str(spec), "--top", "1"]) == 2
    assert "--model-class DeepseekV3ForCausalLM" in capsys.readouterr().err
    rc = main(["sweep", str(spec), "--top", "1", "--model-class", "DeepseekV3ForCausalLM", "--format", "json"])
    out = capsys.readouterr().out
    assert rc in (0, 1) and '"model": "moonshotai--Kimi-K2-Instruct"' in out


def test_generate_with_model_class(tmp_path, capsys):
    from dstoolkit.cli import main

    spec = _spec(tmp_path, {"hf_config": str(KIMI)})
    rc = main(["generate", str(spec), "--out", str(tmp_path / "out"), "--strategy", "zero1-ep",
               "--model-class", "DeepseekV3ForCausalLM"])
    captured = capsys.readouterr()
    assert rc in (0, 1), captured.err
    assert "--model-class" not in captured.err


def test_fp8_plan_with_model_class(capsys):
    from dstoolkit.cli import main

    assert main(["fp8", "plan", str(KIMI), "--model-class", "DeepseekV3ForCausalLM", "--ep", "64"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.{" in out and "mlp.experts.gate_up_proj" in out  # the model's own linear layers


def test_tune_estimate_mode_with_model_class(tmp_path, capsys):
    pytest.importorskip("optuna")
    from dstoolkit.cli import main

    spec = _spec(tmp_path, {"hf_config": KIMI.name})
    (tmp_path / KIMI.name).write_text(KIMI.read_text())  # a relative hf_config: the copy must still find it
    rc = main(["tune", str(spec), "--budget", "1", "--mode", "estimate", "--out", str(tmp_path / "t"),
               "--model-class", "DeepseekV3ForCausalLM", "--no-progress"])
    err = capsys.readouterr().err
    assert rc in (0, 1) and "model_class" not in err, err


def test_model_class_on_a_preset_spec_names_the_field(tmp_path, capsys):
    from dstoolkit.cli import main

    spec = _spec(tmp_path, {"preset": "tiny"})
    assert main(["sweep", str(spec), "--model-class", "LlamaForCausalLM"]) == 2
    err = capsys.readouterr().err
    assert "the spec's model is the preset 'tiny' (model.preset)" in err
