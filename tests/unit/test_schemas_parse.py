"""The lenient reader: same data as hjson (DeepSpeed's reader) on the corpus, warnings for hjson-only syntax,
errors for duplicate keys, input errors for NaN/Infinity, depth, size, YAML and binary."""
from __future__ import annotations

import json

import hjson
import pytest

from dstoolkit.validate.parse import MAX_DEPTH, decode_bytes, parse_text


def test_same_data_as_hjson_on_every_json_corpus_file(corpus_dir):
    compared = 0
    for path in sorted(corpus_dir.iterdir()):
        if path.suffix in (".tsv", ".yaml"):
            continue
        text = path.read_text(encoding="utf-8")
        ours = parse_text(text, path.name)
        assert not ours.fatal, path.name
        assert json.loads(json.dumps(ours.data)) == json.loads(json.dumps(hjson.loads(text))), path.name
        compared += 1
    assert compared == 107


def test_comments_and_trailing_commas_warn():
    r = parse_text('{\n // c\n "a": [1, 2,],\n}', "x")
    assert r.data == {"a": [1, 2]}
    assert {(f.code, f.severity) for f in r.findings} == {("DS010", "warning"), ("DS011", "warning")}
    assert [f.line for f in r.findings if f.code == "DS010"] == [2]


def test_duplicate_key_is_an_error_last_wins():
    r = parse_text('{"a": 1,\n "a": 2}', "x")
    assert r.data == {"a": 2}
    [f] = r.findings
    assert (f.code, f.severity, f.line, f.pointer) == ("DS013", "error", 2, "/a")


def test_unquoted_placeholder_is_a_string_like_hjson():
    text = '{"stage": ZERO_STAGE,\n "x": 1}'
    r = parse_text(text, "x")
    assert r.data == hjson.loads(text) == {"stage": "ZERO_STAGE,", "x": 1}
    assert any(f.code == "DS012" for f in r.findings)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_infinity_are_input_errors(literal):
    r = parse_text('{"gradient_clipping": %s}' % literal, "x")
    assert r.fatal and r.findings[-1].code == "DS002"


def test_depth_limit():
    r = parse_text("[" * 10_000 + "]" * 10_000, "x")
    assert r.fatal and r.findings[-1].code == "DS003" and str(MAX_DEPTH) in r.findings[-1].message


def test_yaml_is_recognised():
    r = parse_text("zero_optimization:\n  stage: 2\n", "x")
    assert r.fatal and r.findings[-1].code == "DS006" and "YAML" in r.findings[-1].message


def test_binary_and_undecodable():
    assert decode_bytes(b"\x00\x01\x02", "x")[1].code == "DS005"
    assert decode_bytes(b"\xff\xfe\xfa{", "x")[1].code == "DS005"
    assert decode_bytes('{"a": 1}'.encode("utf-8-sig"), "x")[0] == '{"a": 1}'


def test_top_level_not_an_object():
    assert parse_text("[1, 2]", "x").findings[-1].code == "DS007"
    assert parse_text("", "x").findings[-1].code == "DS007"
