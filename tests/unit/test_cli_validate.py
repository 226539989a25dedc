"""`dstoolkit validate / schema` as users and CI run them: exit codes, output formats, bad input, no heavy imports."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dstoolkit.cli import main

GOOD = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}


def write(tmp_path, name, content):
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return str(p)


def test_good_config_exits_0(tmp_path, capsys):
    assert main(["validate", write(tmp_path, "ds.json", GOOD), "--world-size", "2"]) == 0
    assert "1 file(s) checked: 0 error(s)" in capsys.readouterr().err


def test_errors_exit_1_compiler_style(tmp_path, capsys):
    path = write(tmp_path, "ds.json", {**GOOD, "zero_optimization": {"stage": 2, "comm_overlap": True}})
    assert main(["validate", path]) == 1
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if "DS101" in x][0]
    assert line.startswith(f"{path}:")
    assert ": error[DS101]: unknown key 'comm_overlap'" in line and "(did you mean 'overlap_comm'?)" in line


def test_world_size_flag_changes_the_verdict(tmp_path):
    path = write(tmp_path, "ds.json", GOOD)
    assert main(["validate", path, "--world-size", "2"]) == 0
    assert main(["validate", path, "--world-size", "4"]) == 1


def test_json_format_has_every_field(tmp_path, capsys):
    path = write(tmp_path, "ds.json", {**GOOD, "gradient_clipping": "1.0"})
    assert main(["validate", path, "--format", "json"]) == 1
    [f] = json.loads(capsys.readouterr().out)
    assert set(f) == {"file", "pointer", "line", "column", "severity", "code", "message", "suggestion"}
    assert (f["pointer"], f["code"], f["severity"]) == ("/gradient_clipping", "DS102", "error")
    assert isinstance(f["line"], int) and isinstance(f["column"], int)


def test_directory_is_walked_for_json(tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    write(tmp_path, "sub/a.json", GOOD)
    write(tmp_path, "b.json", {**GOOD, "fp16": {"enabled": True}})
    write(tmp_path, "notes.txt", "not a config")
    assert main(["validate", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "2 file(s) checked" in captured.err and "DS203" in captured.out


def test_mode_hf_and_version_flags(tmp_path):
    path = write(tmp_path, "ds.json", {**GOOD, "gradient_clipping": "auto"})
    assert main(["validate", path]) == 1
    assert main(["validate", path, "--mode", "hf"]) == 0
    removed = write(tmp_path, "old.json", {**GOOD, "sparse_attention": {"mode": "fixed"}})
    assert main(["validate", removed]) == 1
    assert main(["validate", removed, "--deepspeed-version", "0.16"]) == 0


@pytest.mark.parametrize("case", ["missing", "empty_dir", "binary", "yaml", "huge", "deep", "nan", "infinity",
                                  "bad_version"])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, case):
    if case == "missing":
        argv, expect = [str(tmp_path / "nope.json")], "no such file or directory"
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        argv, expect = [str(tmp_path / "empty")], "contains no *.json"
    elif case == "binary":
        argv, expect = [write(tmp_path, "x.json", bytes(range(256)) * 4)], "binary"
    elif case == "yaml":
        argv, expect = [write(tmp_path, "x.json", "train_batch_size: 8\nzero_optimization:\n  stage: 2\n")], "YAML"
    elif case == "huge":
        big = tmp_path / "big.json"
        with open(big, "w") as fh:
            fh.write('{"a": "')
            fh.write("x" * (50 * 2**20))
            fh.write('"}')
        argv, expect = [str(big)], "MiB"
    elif case == "deep":
        argv, expect = [write(tmp_path, "x.json", '{"a":' * 10_000 + "1" + "}" * 10_000)], "nesting deeper"
    elif case == "nan":
        argv, expect = [write(tmp_path, "x.json", '{"train_batch_size": 8, "gradient_clipping": NaN}')], "NaN"
    elif case == "infinity":
        argv, expect = [write(tmp_path, "x.json", '{"train_batch_size": 8, "gradient_clipping": -Infinity}')], \
            "Infinity"
    else:
        argv, expect = [write(tmp_path, "x.json", GOOD), "--deepspeed-version", "0.12"], "not modelled"
    assert main(["validate", *argv]) == 2
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert expect in text
    assert "Traceback" not in text


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "x.json", "--world-size", "0"])
    assert exc.value.code == 2


def test_validate_imports_neither_torch_nor_deepspeed(tmp_path, repo_root):
    path = write(tmp_path, "ds.json", GOOD)
    code = ("import sys; from dstoolkit.cli import main; rc = main(['validate', %r]); "
            "heavy = [m for m in ('torch', 'deepspeed') if m in sys.modules]; print('HEAVY', heavy, rc)" % path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert "HEAVY [] 0" in out.stdout, out.stdout + out.stderr
    # a clean config is checked against the committed JSON Schema: the validate verb itself imports not even
    # pydantic (the dispatcher in dstoolkit/cli/__init__.py may, through other verbs' modules)
    code2 = ("import sys; from dstoolkit.cli.validate import _standalone; rc = _standalone([%r]); "
             "heavy = [m for m in ('torch', 'deepspeed', 'pydantic') if m in sys.modules]; print('HEAVY', heavy, rc)"
             % path)
    out = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert "HEAVY [] 0" in out.stdout, out.stdout + out.stderr
    code = "import sys, dstoolkit.validate; print([m for m in ('torch', 'deepspeed') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize("where", ["ds_configs/schema", "dstoolkit/dsconfig"])
def test_committed_json_schema_matches_the_code(repo_root, where):
    # ds_configs/schema/ is the public copy (editors, other tools); dstoolkit/dsconfig/ is the copy
    # `dstoolkit validate` checks against at run time.
    from dstoolkit.dsconfig.export import schema_text

    committed = (repo_root / where / "deepspeed_config.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(), (f"{where}/deepspeed_config.schema.json is stale: run "
                                        f"`dstoolkit schema -o {where}/deepspeed_config.schema.json --force`")


def test_schema_describes_fields_and_auto(repo_root):
    schema = json.loads((repo_root / "ds_configs" / "schema" / "deepspeed_config.schema.json").read_text())
    zero = schema["$defs"]["ZeroConfig"]["properties"]
    assert "stage3_prefetch_bucket_size" in zero and "description" in zero["stage3_prefetch_bucket_size"]
    assert {"const": "auto", "type": "string"} in zero["reduce_bucket_size"]["anyOf"]
    assert schema["additionalProperties"] is False
    assert "Fp8Config" in schema["$defs"]


def test_schema_command_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "s.json"
    out.write_text("{}")
    assert main(["schema", "-o", str(out)]) == 2
    assert out.read_text() == "{}"
    assert main(["schema", "-o", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["title"].startswith("DeepSpeed config")
    assert main(["schema", "-o", str(out)]) == 0  # identical content: nothing to do


def test_pre_commit_hook_definition(repo_root):
    import yaml

    hooks = yaml.safe_load((repo_root / ".pre-commit-hooks.yaml").read_text())
    assert hooks[0]["id"] == "dstoolkit-validate" and hooks[0]["entry"] == "dstoolkit validate"


def test_standalone_module_entry(tmp_path, repo_root):
    path = write(tmp_path, "ds.json", {**GOOD, "gradient_clipping": "1.0"})
    out = subprocess.run([sys.executable, "-m", "dstoolkit.cli.validate", path, "--format", "json"],
                         capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert out.returncode == 1 and json.loads(out.stdout)[0]["code"] == "DS102"


SPEC = """name: s
model: {model_type: llama, hidden_size: 256, num_attention_heads: 4, num_hidden_layers: 2, intermediate_size: 688,
        vocab_size: 32000}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}
training: {seq_len: 128, global_batch: 8, micro_batch: 2, precision: fp32, zero_stage: 1}
"""


@pytest.mark.parametrize("edit,rc,code,line,needle", [
    (None, 0, None, None, None),
    (("zero_stage: 1", "zero_stage: 1, tp: 3"), 1, "LY001", 5,
     "training.tp * training.pp = 3 * 1 = 3 does not divide the world size 2"),
    (("num_attention_heads: 4", "num_attention_heads: 4, num_key_value_heads: 1"), 1, "SP004", 5,
     "training.tp=2 does not divide num_key_value_heads=1"),
    (("precision: fp32", "precison: fp32"), 1, "SP002", 5, "did you mean 'precision'?"),
    (("training: {", "training: {tp: [1, "), 2, "SP001", None, "YAML syntax error"),
    (("seq_len: 128", "seq_len: 131072"), 0, "SP007", 5, "is estimated not to fit in 8 GiB per cpu"),
])
def test_a_spec_is_checked_as_a_spec(tmp_path, capsys, edit, rc, code, line, needle):
    """A YAML spec named on the command line gets what estimate / sweep / generate would refuse it for, at its line,
    not "this is YAML, not a JSON DeepSpeed config"; a layout estimated not to fit is a warning (exit 0)."""
    text = SPEC if edit is None else SPEC.replace(*edit)
    if code == "SP004":  # tp 2 over 1 KV head: the model against the layout, found once the model is resolved
        text = text.replace("zero_stage: 1", "zero_stage: 1, tp: 2")
    path = write(tmp_path, "spec.yaml", text)
    assert main(["validate", path, "--format", "json"]) == rc
    found = json.loads(capsys.readouterr().out)
    assert not any(f["code"] == "DS006" for f in found)
    if code is None:
        assert found == []
        return
    [f] = found
    assert f["code"] == code and needle in f["message"] + " " + (f["suggestion"] or "")
    assert f["severity"] == ("warning" if code == "SP007" else "error")
    if line is not None:
        assert f["line"] == line


def test_yaml_that_is_not_a_spec_is_still_refused_as_a_deepspeed_config(tmp_path, capsys):
    path = write(tmp_path, "accelerate.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n")
    assert main(["validate", path]) == 2
    assert "error[DS006]: this is YAML, not a JSON DeepSpeed config" in capsys.readouterr().out


def test_a_spec_missing_or_misspelling_a_section_or_written_as_json_is_still_a_spec(tmp_path, capsys):
    """Two of model / cluster / training make a file a spec: load_spec then names what is wrong, where the DeepSpeed
    check said "this is YAML, not a JSON DeepSpeed config" (DS006); a JSON spec is a spec, not a DeepSpeed config."""
    missing = write(tmp_path, "m.yaml", SPEC.split("training:")[0])
    assert main(["validate", missing, "--format", "json"]) == 1
    [f] = json.loads(capsys.readouterr().out)
    assert (f["code"], f["message"]) == ("SP005", "required field is missing")
    typo = write(tmp_path, "t.yaml", SPEC.replace("training:", "trainig:"))
    assert main(["validate", typo, "--format", "json"]) == 1
    assert ("unknown key 'trainig'", "did you mean 'training'?") in [
        (f["message"], f["suggestion"]) for f in json.loads(capsys.readouterr().out)]
    import yaml

    as_json = write(tmp_path, "s.json", json.dumps(yaml.safe_load(SPEC)))
    assert main(["validate", as_json, "--format", "json"]) == 0 and json.loads(capsys.readouterr().out) == []
    bad = write(tmp_path, "b.json", json.dumps({**yaml.safe_load(SPEC), "training": {"seq_len": 128}}))
    assert main(["validate", bad, "--format", "json"]) == 1
    assert {f["code"] for f in json.loads(capsys.readouterr().out)} == {"SP005"}  # global_batch missing, not DS2xx


def test_validate_resolves_a_spec_for_its_own_targets(tmp_path, capsys):
    """A spec whose targets are HF: pp 2 has no HF form, as estimate and generate say."""
    path = write(tmp_path, "hf.yaml", SPEC.replace("zero_stage: 1}", "zero_stage: 1, pp: 2}") + "targets: [hf]\n")
    assert main(["validate", path, "--format", "json"]) == 1
    [f] = json.loads(capsys.readouterr().out)
    assert f["code"] == "SP004" and "hf: pp=2: the DeepSpeed pipeline engine needs the model written as" in f["message"]
    assert main(["validate", write(tmp_path, "ds.yaml", SPEC.replace("zero_stage: 1}", "zero_stage: 1, pp: 2}"))]) == 0


def test_a_spec_that_is_not_utf8_is_named(tmp_path, capsys):
    path = tmp_path / "l1.yaml"
    path.write_bytes(("# caf\u00e9\n" + SPEC).encode("latin-1"))
    assert main(["estimate", str(path)]) == 2
    assert f"{path}:1:1: not UTF-8 text (byte 0xe9 at offset 5) (save the spec as UTF-8)" in capsys.readouterr().err


def test_spec_codes_are_explained():
    assert main(["validate", "--explain", "SP007"]) == 0
    assert main(["validate", "--explain", "sp001"]) == 0


def test_layout_flags_for_a_generated_folder_are_refused_not_ignored(repo_root, capsys):
    """A generated folder's layout.json fixes the layout; --world-size 3 was silently ignored (0 errors), while the
    same config copied out of the folder gives DS201."""
    cfg = str(repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json")
    assert main(["validate", cfg]) == 0
    capsys.readouterr()
    assert main(["validate", cfg, "--world-size", "2"]) == 0  # what layout.json says: fine
    capsys.readouterr()
    assert main(["validate", cfg, "--world-size", "3", "--tp", "2"]) == 2
    assert (f"error: --world-size 3 for {cfg}, whose layout.json says world_size 2: a generated folder's configs are "
            "checked at the layout its layout.json records") in capsys.readouterr().err
