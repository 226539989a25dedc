"""Reading a spec file: YAML in, a validated `Spec` out, or findings located at ``file:line:col``.

``spec.yaml:12:15: training.micro_batch: 'abc' is not valid: ... (expected: ...)``. No torch import.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import yaml
from pydantic import BaseModel, ValidationError

from dstoolkit.common.paths import A_FOLDER, NO_SUCH_FILE, input_file_problem
from dstoolkit.layout.dims import LayoutError
from dstoolkit.spec.errors import (Loc, SpecError, SpecFieldError, SpecSource, _did_you_mean, _dotted, _walk,
                                   spec_finding)
from dstoolkit.spec.model import ModelSpec, Spec
from dstoolkit.validate.findings import Finding

# ----------------------------------------------------------------------------------------------------------
# YAML loading
# ----------------------------------------------------------------------------------------------------------


def _check_duplicate_keys(node: Optional[yaml.Node], source: SpecSource, loc: Loc = ()) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Node] = {}
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is not None and key in seen:
                first = seen[key].start_mark.line + 1
                raise SpecError([spec_finding(
                    str(source.path), k.start_mark.line + 1, k.start_mark.column + 1, loc + (key,),
                    f"duplicate key {key!r} (first given on line {first})", "remove one of them", "SP001",
                )])
            if key is not None:
                seen[key] = k
            _check_duplicate_keys(v, source, loc + ((key,) if key is not None else ()))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, source, loc + (i,))


def _model_class_at(path: Sequence[Union[str, int]]) -> tuple[Optional[type[BaseModel]], Optional[Any]]:
    """(model class that holds the last element of `path`, its FieldInfo) by walking Spec's annotations."""

    cls: Optional[type[BaseModel]] = Spec
    info = None
    for i, el in enumerate(path):
        if cls is None or not isinstance(el, str) or el not in cls.model_fields:
            return (cls if i == len(path) - 1 else None), None
        info = cls.model_fields[el]
        if i == len(path) - 1:
            return cls, info
        nxt = None
        for arg in (typing.get_args(info.annotation) or (info.annotation,)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                nxt = arg
        cls = nxt
    return cls, info


def _section_class(info: Any) -> Optional[type[BaseModel]]:
    """The pydantic model a field holds when it is a plain nested section (not a union of several kinds)."""
    ann = getattr(info, "annotation", None)
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _describe(info: Any) -> str:
    if info is None or not info.description:
        return "see the field docs in dstoolkit/spec/ (model.py, cluster.py, cluster_fields.py)"
    return "expected: " + " ".join(info.description.split())


def _findings_from_validation(err: ValidationError, source: SpecSource) -> list[Finding]:
    raw = []
    for e in err.errors(include_url=False):
        loc: Loc = tuple(e["loc"])
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, LayoutError):  # a validator that let dstoolkit.layout's error through
            ctx_err = SpecFieldError((), ctx_err.message, ctx_err.fix, ctx_err.code)
        custom = isinstance(ctx_err, SpecFieldError)
        if custom:
            loc = loc + ctx_err.loc
        # Rebuild the user's path: keep elements that exist in the YAML; drop pydantic's union-branch tags
        # (e.g. 'int', "literal['auto']", 'GpuSpec'); keep a final absent element for missing/custom errors.
        node, clean, union_point = source.root, [], None
        for i, el in enumerate(loc):
            sub, _, matched = _walk(node, (el,))
            if matched:
                node = sub
                clean.append(el)
            elif i == len(loc) - 1 and (custom or e["type"] == "missing"):
                clean.append(el)
            else:
                if union_point is None:
                    union_point = tuple(clean)
        raw.append((e, tuple(clean), union_point, ctx_err if custom else None))

    # Within one union, errors from branches whose *type* does not match the input ("string_type",
    # "model_type", ...) are noise when another branch got further: drop them.
    keep = []
    for e, clean, up, ce in raw:
        if up is not None and e["type"].endswith("_type"):
            if any(o_up == up and not o["type"].endswith("_type") for o, _, o_up, _ in raw):
                continue
        keep.append((e, clean, up, ce))

    grouped: dict[tuple, list] = {}
    for item in keep:
        grouped.setdefault(item[1], []).append(item)

    findings = []
    for clean, items in grouped.items():
        e, _, _, ce = items[0]
        if ce is not None:
            # a field validator's own value (no sub-path) is SP003; a rule across fields SP004
            findings.append(source.finding(clean, ce.problem, ce.fix, code=ce.code or ("SP004" if ce.loc else "SP003")))
            continue
        if e["type"] == "missing":
            parent = _dotted(clean[:-1]) or "the top level"
            _, info = _model_class_at(clean)
            findings.append(source.finding(clean, "required field is missing",
                                           f"add `{clean[-1]}:` under {parent}; {_describe(info)}", code="SP005"))
            continue
        if e["type"] == "extra_forbidden":
            cls, _ = _model_class_at(clean)
            allowed = list(cls.model_fields) if cls is not None else []
            guess = _did_you_mean(str(clean[-1]), allowed)
            fix = f"did you mean {guess!r}?" if guess else f"remove it; allowed keys: {', '.join(allowed)}"
            findings.append(source.finding(clean, f"unknown key {clean[-1]!r}", fix, at_key=True, code="SP002"))
            continue
        if e["type"] in ("model_type", "model_attributes_type", "dict_type") and len(items) == 1:
            cls, info = _model_class_at(clean)
            section = _section_class(info)
            value = e.get("input")
            if section is not None:
                fix = f"write {_dotted(clean)} as a mapping with keys: {', '.join(section.model_fields)}"
                if section is ModelSpec and isinstance(value, str):
                    fix = f"write `model: {{preset: {value}}}` (or hf_config: / inline HF fields)"
                shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
                findings.append(source.finding(clean, f"{shown} is not a mapping", fix, code="SP003"))
                continue
        if e["type"] == "value_error" and len(items) == 1:
            msg = e["msg"].removeprefix("Value error, ")
            _, info = _model_class_at(clean)
            findings.append(source.finding(clean, msg, _describe(info), code="SP003"))
            continue
        msgs = []
        for it in items:
            m = it[0]["msg"].removeprefix("Value error, ")
            if m not in msgs:
                msgs.append(m)
        _, info = _model_class_at(clean)
        value = e.get("input")
        shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
        findings.append(source.finding(clean, f"{shown} is not valid: {' or '.join(msgs)}", _describe(info), code="SP003"))
    findings.sort(key=lambda f: (f.line or 0, f.column or 0))
    return findings


def load_spec(path: Union[str, Path], *, targets: Sequence[str] = ()) -> Spec:
    """Read a YAML spec file and validate it.

    Args:
        path: The spec file.
        targets: Launchers given on the command line (`--target`): they replace the spec's `targets` for this run
            (as `generate`, `sweep` and `estimate` read them), so the rules that follow each target's engine
            (`spec.target_engines.rule_engines`: context parallelism, the pipeline schedule, Ulysses beside Megatron
            sequence parallelism, recompute_modules) are asked for them, and their fixes name the flag.

    Returns:
        The validated `Spec`, remembering its source so later errors (e.g. from `resolve_model`) point at lines.

    Raises:
        SpecError: unreadable file, YAML syntax error, duplicate key, wrong type, unknown key (with
            did-you-mean), missing field, or a broken cross-field rule. Each message line reads
            ``file:line:col: <field path>: <problem> (<fix>)``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        problem = input_file_problem(path)
        fix = {NO_SUCH_FILE: "check the path", A_FOLDER: "give the spec's YAML file"}.get(
            problem or "", "check the file's permissions")
        problem = problem or f"cannot read spec file: {exc.strerror or exc}"
        raise SpecError([spec_finding(str(path), None, None, (), problem, fix, "SP006")]) from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise SpecError([spec_finding(str(path), line, None, (), f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                                      f"at offset {exc.start})", "save the spec as UTF-8", "SP001")]) from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        source = SpecSource(path, root)
        _check_duplicate_keys(root, source)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([spec_finding(str(path), line, col, "<yaml>", f"YAML syntax error: {problem}",
                                      "fix the YAML syntax at this position", "SP001")]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}, not a mapping"
        raise SpecError([spec_finding(str(path), 1, 1, (), f"spec file is {what}",
                                      "write a mapping with model:, cluster: and training: sections", "SP001")])
    if targets:  # the command line's launchers are the run's (cli.options.targets_of reads them first)
        data = {**data, "targets": list(dict.fromkeys(targets))}
    try:
        spec = Spec.model_validate(data, context={"targets_from": "--target"} if targets else None)
    except ValidationError as exc:
        raise SpecError(_findings_from_validation(exc, source)) from None
    spec._source = source
    spec.model._source = source
    return spec


def spec_from_dict(data: dict, *, name: str = "<spec>") -> Spec:
    """Validate an in-memory spec mapping; errors are `SpecError` without line numbers."""
    try:
        return Spec.model_validate(data)
    except ValidationError as exc:
        # A node tree of the data itself lets union tags be told from field names; positions are dropped.
        try:
            root = yaml.compose(yaml.safe_dump(data, sort_keys=False), Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = yaml.MappingNode("tag:yaml.org,2002:map", [])
        findings = _findings_from_validation(exc, SpecSource(Path(name), root))
        raise SpecError([dataclasses.replace(f, file=name, line=None, column=None) for f in findings]) from None
