"""s35 newcomer findings on the command line's front door: --format lists `table`, `dstoolkit --help` speaks to a
user, generate names a DeepSpeed config given as SPEC, resolve says only DS006 for YAML, and
`python -m dstoolkit.generate.bundled --help` prints help without regenerating anything."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from dstoolkit.cli import VERBS, build_parser, main
from dstoolkit.generate import bundled

TINY_CONFIG = "ds_configs/generated/tiny_cpu/zero2/ds_config.json"


def test_format_help_lists_table_and_table_still_means_text(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser("estimate").parse_args(["estimate", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--format {text,json,table}" in out
    args = build_parser("validate").parse_args(["validate", "x.json", "--format", "table"])
    assert args.format == "text"


def test_top_level_help_says_what_the_verbs_do_and_what_to_run_first(capsys, repo_root):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "dstoolkit/cli/" not in out and "one module per verb" not in out
    assert out.count("launch/demo.sh") == 1 and "start here:" in out
    # every verb is named in the opening paragraph, and the files the start commands use exist
    head = out.split("positional arguments:")[0]
    assert [v for v in VERBS if not re.search(rf"\b{v}\b", head)] == []
    for path in ("launch/demo.sh", "ds_configs/tiny_cpu.yaml"):
        assert path in out and (repo_root / path).is_file()


def test_generate_refuses_a_deepspeed_config_once_naming_what_takes_it(tmp_path, repo_root, capsys):
    config = tmp_path / "ok.json"
    shutil.copy(repo_root / TINY_CONFIG, config)
    out_dir = tmp_path / "out"
    rc = main(["generate", str(config), "-o", str(out_dir)])
    err = capsys.readouterr().err
    assert rc == 2 and not out_dir.exists()
    lines = err.strip().splitlines()
    assert lines == [
        f"dstoolkit generate: error: {config} is a DeepSpeed config (top-level train_batch_size, "
        "train_micro_batch_size_per_gpu, gradient_accumulation_steps, ...), not a spec: generate takes a spec "
        "(model + cluster + training sections), e.g. ds_configs/tiny_cpu.yaml; a DeepSpeed config goes to "
        f"`dstoolkit validate {config}` or `dstoolkit estimate --config {config} --model NAME --world-size N`"]
    assert "unknown key" not in err and "required field is missing" not in err


def test_generate_hjson_deepspeed_config_is_named_too(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text('// a comment, as DeepSpeed\'s hjson reader allows\n{"train_batch_size": 8, "bf16": {"enabled": true}}\n')
    assert main(["generate", str(config), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a DeepSpeed config (top-level train_batch_size, bf16)" in err


def test_generate_a_spec_with_a_missing_section_keeps_the_spec_loaders_error(tmp_path, capsys):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"name": "x", "model": {"preset": "tiny"}, "train_batch_size": 8}))
    assert main(["generate", str(spec), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "is a DeepSpeed config" not in err and "required field is missing" in err


def test_resolve_yaml_says_ds006_only(tmp_path, repo_root, capsys):
    out = tmp_path / "r.json"
    rc = main(["resolve", str(repo_root / "ds_configs/tiny_cpu.yaml"), "--world-size", "2", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    codes = re.findall(r"(?:error|warning)\[(DS\d+)\]", err)
    assert codes == ["DS006"]


def test_resolve_json_with_a_comment_and_a_syntax_error_keeps_both_findings(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text('// note\n{"train_batch_size": 8,, }\n')
    assert main(["resolve", str(config), "--world-size", "2", "-o", str(tmp_path / "r.json")]) == 2
    codes = re.findall(r"(?:error|warning)\[(DS\d+)\]", capsys.readouterr().err)
    assert codes[0] == "DS010" and len(codes) == 2


def test_bundled_help_prints_and_writes_nothing(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bundled, "regenerate_all", lambda root: calls.append(root) or [])
    monkeypatch.setattr("sys.argv", ["python -m dstoolkit.generate.bundled", "--help"])
    with pytest.raises(SystemExit) as exc:
        bundled.main()
    assert exc.value.code == 0 and calls == []
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m dstoolkit.generate.bundled") and "ds_configs/generated/<stem>/" in out


def test_bundled_unknown_argument_is_a_usage_error_and_writes_nothing(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(bundled, "regenerate_all", lambda root: calls.append(root) or [])
    monkeypatch.setattr("sys.argv", ["bundled", "--check"])
    with pytest.raises(SystemExit) as exc:
        bundled.main()
    assert exc.value.code == 2 and calls == []
    assert "unrecognized arguments: --check" in capsys.readouterr().err
