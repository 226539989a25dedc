"""The user's own module: `--model package.module:callable` (tests/fixtures/user_models.py) counted exactly,
its FLOPs traced, its linear layers planned for FP8, and every bad input refused with the field, the value
and the fix."""
from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from dstoolkit.models import UserModelError, count_params, is_module_ref, load_model  # noqa: E402

REF = "tests.fixtures.user_models:build"
DS = "ds_configs/generated/tiny_cpu/zero2/ds_config.json"


def test_counts_equal_the_modules_own_parameters():
    from tests.fixtures.user_models import build

    shape = load_model(REF, model_kwargs='{"d": 128, "layers": 3}')
    direct = sum(p.numel() for p in build(d=128, layers=3).parameters())
    assert count_params(shape).total == shape.measured.total == direct
    assert shape.source == "user" and shape.num_hidden_layers == 3 and shape.hidden_size == 128
    assert shape.num_attention_heads == 4 and shape.vocab_size == 1000
    roles = shape.measured.by_role()
    assert roles["embedding"] == 1000 * 128 and roles["lm_head"] == 1000 * 128
    assert roles["attention"] == 3 * (128 * 384 + 128 * 128)


def test_traced_flops_are_6n_plus_the_attention_term():
    # TinyLM: matmul parameters N (q/k/v/o, MLP, head) and sdpa over T keys: 6N + 12·L·h·T per token exactly.
    from dstoolkit.estimate.flops import flops_per_token

    d, layers, vocab = 256, 4, 1000
    shape = load_model(REF, model_kwargs=f'{{"d": {d}, "layers": {layers}}}')
    n_matmul = layers * (4 * d * d + 2 * d * 4 * d) + d * vocab
    t = shape.traced_flops
    assert t is not None and t.device == "meta"
    assert t.per_token == pytest.approx(6 * n_matmul, rel=1e-6)
    assert t.per_token_per_seq == pytest.approx(12 * layers * d, rel=1e-6)
    f = flops_per_token(shape, 1024)
    assert f.path == "traced" and f.model == pytest.approx(6 * n_matmul + 12 * layers * d * 1024, rel=1e-6)


def test_a_class_with_example_inputs_and_no_blocks():
    shape = load_model("tests.fixtures.user_models:MLPNet", model_kwargs='{"d_in": 32, "hidden": 64}')
    assert shape.measured.total == 32 * 64 + 64 + 64 * 32 + 32
    assert shape.num_hidden_layers == 1 and any("whole module is one layer" in n for n in shape.notes)
    # 6 FLOPs per weight per token, less the input gradient of the first linear (its input needs no grad).
    assert shape.traced_flops.per_token == pytest.approx(6 * 2 * 32 * 64 - 2 * 32 * 64, rel=1e-6)


def test_a_builder_that_needs_real_tensors_is_built_on_the_cpu():
    shape = load_model("tests.fixtures.user_models:needs_real_tensors")
    assert any("built on the CPU" in n for n in shape.notes)
    assert shape.traced_flops is not None and shape.traced_flops.device == "cpu"


@pytest.mark.parametrize("ref, kwargs, match", [
    ("nopkg_xyz.models:build", None, r"--model 'nopkg_xyz.models:build': module 'nopkg_xyz.models' is not importable"
                                     r".*add its folder to PYTHONPATH"),
    ("tests.fixtures.user_models:missing", None, r"has no attribute 'missing' \(name one of its callables: .*build"),
    ("tests.fixtures.user_models:not_a_module", None, r"returned a dict, not a torch.nn.Module"),
    ("tests.fixtures.user_models:NOT_CALLABLE", None, r"is a int object, not a callable"),
    (REF, "{d: 1}", r"--model-kwargs '\{d: 1\}': not JSON .*give a JSON object"),
    (REF, "[1, 2]", r"--model-kwargs '\[1, 2\]': expected a JSON object of keyword arguments, got list"),
    (REF, '{"width": 3}', r"--model-kwargs .*raised TypeError: build\(\) got an unexpected keyword argument 'width'"),
])
def test_bad_input_names_the_field_value_and_fix(ref, kwargs, match):
    with pytest.raises(UserModelError, match=match):
        load_model(ref, model_kwargs=kwargs)


def test_module_refs_are_told_apart_from_paths_and_presets():
    assert is_module_ref(REF) and is_module_ref("mypkg.models:MyNet")
    assert not is_module_ref("llama-3-8b") and not is_module_ref("cfg/config.json") and not is_module_ref("C:\\x.json")


def test_estimate_cli_names_the_flops_path(capsys):
    from dstoolkit.cli import main

    rc = main(["estimate", "--config", DS, "--model", REF, "--model-kwargs", '{"d": 128, "layers": 2}',
               "--world-size", "2", "--gpu", "cpu", "--seq-len", "128"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "FLOPs path: traced: traced on the meta device" in out
    assert "model tests.fixtures.user_models:build" in out


def test_cli_errors_are_one_line_exit_2(capsys):
    from dstoolkit.cli import main

    rc = main(["estimate", "--config", DS, "--model", "tests.fixtures.user_models:missing", "--world-size", "2",
               "--gpu", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("dstoolkit estimate: error: --model 'tests.fixtures.user_models:missing'")
    rc = main(["fp8", "plan", REF, "--model-kwargs", "not json"])
    err = capsys.readouterr().err
    assert rc == 2 and "--model-kwargs 'not json': not JSON" in err


def test_fp8_plan_takes_the_modules_own_linear_layers(capsys):
    from dstoolkit.cli import main

    rc = main(["fp8", "plan", REF, "--model-kwargs", '{"d": 512}', "--seq-len", "2048", "--format", "json"])
    import json

    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    names = {e["name"] for e in doc["report"]["swapped"]}
    assert "blocks.0.attn.qkv" in names and "blocks.3.mlp.2" in names
    assert {g["kind"] for g in doc["groups"]} >= {"blocks.{0..3}.attn.qkv", "head"}
    assert any("linear layers from the model as built" in n for n in doc["notes"])


def test_spec_module_form_and_its_located_errors(tmp_path):
    import yaml

    from dstoolkit.generate import SpecLoadError, load_spec_and_shape

    def spec(model):
        p = tmp_path / "spec.yaml"
        p.write_text(yaml.safe_dump({"name": "u", "model": model, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
                                     "training": {"seq_len": 128, "global_batch": 4}}))
        return p

    _, shape = load_spec_and_shape(spec({"module": REF, "module_kwargs": {"d": 64, "layers": 2}}))
    assert shape.source == "user" and shape.hidden_size == 64
    with pytest.raises(SpecLoadError, match=r"spec.yaml:\d+:\d+: model.module_kwargs: .*unexpected keyword"):
        load_spec_and_shape(spec({"module": REF, "module_kwargs": {"zz": 1}}))
    with pytest.raises(SpecLoadError, match=r"model.module: 'tests.fixtures.user_models:nope': .*has no attribute"):
        load_spec_and_shape(spec({"module": "tests.fixtures.user_models:nope"}))
    with pytest.raises(SpecLoadError, match=r"model.module='.*' and preset are exclusive"):
        load_spec_and_shape(spec({"module": REF, "preset": "tiny"}))


def test_the_core_still_imports_without_torch():
    code = "import sys, dstoolkit.models, dstoolkit.estimate, dstoolkit.fp8.plan, dstoolkit.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
