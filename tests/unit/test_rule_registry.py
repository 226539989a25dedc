"""The rule registry is the one declaration of each cross-field rule: codes table, pydantic validator,
--explain and docs/rules.md are all read from it."""
from __future__ import annotations

from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.rules import RULES
from dstoolkit.layout.constraints import CONSTRAINTS
from dstoolkit.validate import findings
from dstoolkit.validate.explain import DOCS_PATH, UnknownCode, explain, rules_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_every_rule_has_code_title_and_explanation():
    rules = RULES
    assert len(rules) >= 19
    for code, r in rules.items():
        assert code.startswith("DS2") and r.code == code
        assert r.title and len(r.explanation) > 40, code
        assert r.severity in ("error", "warning")


def test_codes_table_comes_from_the_registry():
    codes = findings.CODES
    for code, r in RULES.items():
        assert codes[code] == r.title
    assert set(codes) == set(findings.KEY_CODES) | set(RULES)
    assert not set(findings.KEY_CODES) & set(RULES)


def test_docs_rules_md_is_generated_from_the_registries():
    text = (ROOT / DOCS_PATH).read_text(encoding="utf-8")
    assert text == rules_markdown(), "regenerate: python -m dstoolkit.validate.explain --write docs/rules.md"
    for code in list(RULES) + list(CONSTRAINTS):
        assert f"### {code}: " in text


def test_explain_rule_and_constraint():
    text = explain("ds204")
    assert text.startswith("DS204: offload_param needs ZeRO stage 3\n") and "stage3.py" in text
    assert explain("LY001").startswith("LY001: model-parallel degrees must divide the world size")
    assert explain("DS101").startswith("DS101: unknown key")
    with pytest.raises(UnknownCode) as info:
        explain("DS2O4")
    assert info.value.hint == "DS204"


def test_cli_explain(capsys):
    assert main(["validate", "--explain", "DS204"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DS204: offload_param needs ZeRO stage 3") and RULES["DS204"].explanation[:30] in out
    assert main(["validate", "--explain", "LY009"]) == 0
    assert "ep must divide the data-parallel size" in capsys.readouterr().out
    assert main(["validate", "--explain", "DS2O4"]) == 2
    assert "did you mean 'DS204'?" in capsys.readouterr().err


def test_rule_violations_carry_the_registry_code():
    from dstoolkit.dsconfig.rules import RuleContext, run_rules

    cfg = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
           "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}}
    got = {(v.code, v.severity) for v in run_rules(cfg, RuleContext(world_size=8))}
    assert got == {("DS201", "error"), ("DS206", "warning")}


def test_deprecations_are_declared_on_the_fields():
    from dstoolkit.dsconfig.ds_zero import ZeroConfig
    from dstoolkit.validate.keys import deprecated_keys

    declared = {name: (f.json_schema_extra or {}) for name, f in ZeroConfig.model_fields.items()
                if isinstance(f.json_schema_extra, dict) and f.json_schema_extra.get("deprecated")}
    assert set(declared) == {"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
                             "stage3_gather_fp16_weights_on_model_save"}
    from_schema = deprecated_keys("ZeroConfig")  # what the fast path reads
    assert {k: v.get("new_param") for k, v in from_schema.items()} == {k: v.get("new_param") for k, v in declared.items()}
    assert deprecated_keys(None)["bfloat16"]["new_param"] == "bf16"
