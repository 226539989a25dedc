"""A small JSON Schema checker for the subset `DeepSpeedConfig.model_json_schema()` emits ($ref, anyOf, type,
const, enum, numeric bounds, properties / additionalProperties / required, items).

`validate_config` checks configs against the committed schema file with this, so the hot path imports no
pydantic and builds no models. The schema is generated from the pydantic models (dstoolkit.dsconfig.export);
tests check the file is current and that this checker and pydantic agree on the corpus and on mutations.
Semantics follow our pydantic types: an integral float is an integer (JSON Schema 2020-12 agrees), booleans are
never numbers, strings are never numbers or booleans.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Optional

from dstoolkit.dsconfig.facts import FLOAT_INT_LIMIT

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dsconfig",
                           "deepspeed_config.schema.json")
"""Package copy of ds_configs/schema/deepspeed_config.schema.json (written by `dstoolkit schema`)."""

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "boolean": "a boolean", "string": "a string",
               "object": "an object", "array": "a list", "null": "null"}


@dataclass(frozen=True)
class Issue:
    """One schema violation: kind is unknown_key, type, range or missing."""

    kind: str
    path: tuple
    message: str
    choices: tuple = ()
    """For unknown_key: the keys allowed at that place."""


_cache: dict[str, dict] = {}


def load_schema(path: str = SCHEMA_FILE) -> dict:
    """The committed schema (cached); falls back to generating it from the models if the file is missing."""
    if path not in _cache:
        try:
            with open(path, encoding="utf-8") as fh:
                _cache[path] = json.load(fh)
        except OSError:
            # start-up time: the validate fast path (a clean config against the committed schema) imports no pydantic
            from dstoolkit.dsconfig.export import json_schema

            _cache[path] = json_schema()
    return _cache[path]


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        # pydantic (DeepSpeed's config models) reads an integral float as an int only below 2**63 (int_parsing_size)
        return "integer" if value == value and abs(value) < FLOAT_INT_LIMIT and value == int(value) else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _type_ok(expected: str, value: Any) -> bool:
    t = json_type(value)
    return t == expected or (expected == "number" and t == "integer")


def _same(a: Any, b: Any) -> bool:
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _got(value: Any) -> str:
    """What a type message says it got: "null", or the JSON type and the value."""
    return "null" if value is None else f"{json_type(value)} {_show(value)}"


class Checker:
    """Check values against one schema document."""

    def __init__(self, schema: dict):
        self.root = schema

    def resolve(self, node: dict) -> dict:
        seen = 0
        while "$ref" in node and seen < 50:
            ref = node["$ref"]
            target: Any = self.root
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            seen += 1
        return node

    def check(self, node: dict, value: Any, path: tuple = ()) -> list[Issue]:
        node = self.resolve(node)
        if "anyOf" in node:
            return self._any_of(node["anyOf"], value, path)
        issues: list[Issue] = []
        if "const" in node and not _same(value, node["const"]):
            return [Issue("range", path, f"must be {node['const']!r}")]
        if "enum" in node and not any(_same(value, e) for e in node["enum"]):
            shown = node.get("x-shown-enum", node["enum"])  # the values to name (ZeRO stage: not its tolerated strings)
            options = [repr(e) if isinstance(e, str) else json.dumps(e) for e in shown]
            text = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
            return [Issue("range", path, f"must be {text}")]
        expected = node.get("type")
        if isinstance(expected, str) and not _type_ok(expected, value):
            return [Issue("type", path, f"expected {_TYPE_WORDS.get(expected, expected)}, got {_got(value)}")]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for key, op, word in (("exclusiveMinimum", lambda v, b: v > b, "greater than"),
                                  ("minimum", lambda v, b: v >= b, "greater than or equal to"),
                                  ("exclusiveMaximum", lambda v, b: v < b, "less than"),
                                  ("maximum", lambda v, b: v <= b, "less than or equal to")):
                if key in node and not op(value, node[key]):
                    issues.append(Issue("range", path, f"must be {word} {node[key]}"))
                    return issues
        if isinstance(value, dict):
            props = node.get("properties", {})
            extra = node.get("additionalProperties", True)
            for key in node.get("required", []):
                if key not in value:
                    issues.append(Issue("missing", path + (key,), f"required key {key!r} is missing"))
            for key, item in value.items():
                if key in props:
                    issues += self.check(props[key], item, path + (key,))
                elif extra is False:
                    issues.append(Issue("unknown_key", path + (key,), f"unknown key {key!r}", tuple(props)))
                elif isinstance(extra, dict):
                    issues += self.check(extra, item, path + (key,))
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                issues += self.check(node["items"], item, path + (i,))
        return issues

    def _any_of(self, branches: list, value: Any, path: tuple) -> list[Issue]:
        results = []
        for branch in branches:
            issues = self.check(branch, value, path)
            if not issues:
                return []
            results.append((self.resolve(branch), issues))
        vt = json_type(value)

        def matches(b: dict) -> bool:
            if "const" in b:
                return _same(value, b["const"])
            t = b.get("type")
            return t is None or _type_ok(t, value) or (t == "number" and vt == "integer")

        typed = [(b, i) for b, i in results if matches(b)]
        if typed:
            return min(typed, key=lambda bi: len(bi[1]))[1]
        words = []
        for b, _ in results:
            w = f"'{b['const']}'" if "const" in b else _TYPE_WORDS.get(b.get("type", ""), b.get("type", "a value"))
            if w not in words:
                words.append(w)
        return [Issue("type", path, f"expected {' or '.join(words)}, got {_got(value)}")]


def check_config(data: Any, schema: Optional[dict] = None) -> list[Issue]:
    """All schema issues of ``data`` against the DeepSpeed config schema."""
    schema = schema or load_schema()
    return Checker(schema).check(schema, data, ())
