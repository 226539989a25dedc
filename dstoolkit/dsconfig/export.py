"""JSON Schema export of `DeepSpeedConfig` (what `dstoolkit schema` writes and editors consume)."""
from __future__ import annotations

import json

from dstoolkit.dsconfig.base import DSModel
from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

SCHEMA_ID = "urn:dstoolkit:deepspeed-config:0.19"  # an identifier, not a download location


def json_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a DeepSpeed 0.19 config, descriptions from field docstrings."""

    schema = DeepSpeedConfig.model_json_schema(by_alias=True)
    try:  # the fp8 sub-section is typed as a dict for import speed; publish Fp8Config's schema for it
        # start-up time: dsconfig.deepspeed keeps the FP8 model out of its import, so this does too
        from dstoolkit.dsconfig.fp8 import Fp8Config

        fp8 = Fp8Config.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
        defs = schema.setdefault("$defs", {})
        defs.update(fp8.pop("$defs", {}))
        defs["Fp8Config"] = fp8
        props = defs["DstoolkitSection"]["properties"]
        props["fp8"] = {"anyOf": [{"$ref": "#/$defs/Fp8Config"}, {"type": "null"}], "default": None,
                        "description": props["fp8"].get("description", "")}
    except ImportError:  # pragma: no cover
        pass
    _add_field_name_spellings(schema)
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID}
    out.update(schema)
    out["title"] = "DeepSpeed config (deepspeed 0.19)"
    return out


def schema_text() -> str:
    """`json_schema()` serialised deterministically (2-space indent, trailing newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _add_field_name_spellings(schema: dict) -> None:
    """DeepSpeed accepts both spellings of an aliased key (populate_by_name): stage3_max_live_parameters and
    max_live_parameters. model_json_schema lists only the alias; add the field name with the same schema."""

    todo = list(DSModel.__subclasses__())
    seen = set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        target = schema if cls.__name__ == schema.get("title") else schema.get("$defs", {}).get(cls.__name__)
        if not target or "properties" not in target:
            continue
        props = target["properties"]
        for name, field in cls.model_fields.items():
            if field.alias and field.alias != name and field.alias in props and name not in props:
                props[name] = {**props[field.alias], "description": f"Same as `{field.alias}` (DeepSpeed accepts "
                               "both spellings)."}
                props[name].pop("title", None)
