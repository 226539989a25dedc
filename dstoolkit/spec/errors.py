"""Located spec errors: field paths mapped back to the YAML line and column of the spec file. No torch import.

A spec problem is a `dstoolkit.validate.findings.Finding`, the same record `dstoolkit validate` returns for
DeepSpeed configs, with a code of its own (`dstoolkit.validate.findings.SPEC_CODES`; layout violations keep their
``LYxxx`` code) and `path` set, so it prints ``file:line:col: <field path>: <problem> (<fix>)``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import yaml

from dstoolkit.common.text import did_you_mean
from dstoolkit.validate.findings import Finding, pointer_of

Loc = tuple[Union[str, int], ...]


# ----------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------


class SpecFieldError(ValueError):
    """A validation problem tied to a field path, raised inside validators.

    `loc` is relative to the model whose validator raises it (pydantic prepends the model's own location),
    so `load_spec` can point at the exact YAML line of the offending key. `code`: the finding's code (an
    ``LYxxx`` layout code, say); None lets the loader choose (SP003 for a field's own value, SP004 for a
    cross-field rule).
    """

    def __init__(self, loc: Loc, problem: str, fix: str, code: Optional[str] = None):
        self.loc = tuple(loc)
        self.problem = problem
        self.fix = fix
        self.code = code
        path = ".".join(str(p) for p in self.loc)
        super().__init__(f"{path + ': ' if path else ''}{problem} ({fix})")


def spec_finding(file: str, line: Optional[int], col: Optional[int], loc: Union[Loc, str], problem: str,
                 fix: str, code: str = "SP004") -> Finding:
    """A located spec `Finding`. `loc` is the field path (a tuple, or already dotted text such as "<yaml>")."""
    if isinstance(loc, str):
        path, pointer = loc, (pointer_of(tuple(loc.split("."))) if loc and not loc.startswith("<") else "")
    else:
        path, pointer = _dotted(loc), pointer_of(loc)
    return Finding(file=file, pointer=pointer, line=line, column=col, severity="error", code=code, message=problem,
                   suggestion=fix, path=path)


def SpecFinding(file: str, line: Optional[int], col: Optional[int], path: str, problem: str, fix: str,  # noqa: N802
                code: str = "SP004") -> Finding:
    """The former spec-only record's constructor, kept for callers that build one positionally; returns a
    `Finding` (use `spec_finding`)."""
    return spec_finding(file, line, col, path, problem, fix, code)


class SpecError(ValueError):
    """Invalid spec. Each line of the message reads ``file:line:col: <field path>: <problem> (<fix>)``;
    `findings` holds the `Finding`s."""

    def __init__(self, findings: Sequence[Finding]):
        self.findings = list(findings)
        super().__init__("\n".join(str(f) for f in self.findings))


# ----------------------------------------------------------------------------------------------------------
# Source positions (YAML nodes)
# ----------------------------------------------------------------------------------------------------------


class SpecSource:
    """The YAML node tree of a loaded spec, used to map field paths back to line:col."""

    def __init__(self, path: Path, root: yaml.Node):
        self.path = Path(path)
        self.root = root

    def locate(self, loc: Loc, at_key: bool = False) -> tuple[Optional[int], Optional[int]]:
        """1-based (line, col) of the deepest node `loc` reaches.

        Points at the value for a scalar, at the key for a mapping/sequence value, when only a prefix of `loc`
        exists (a missing field) or when `at_key` (an unknown key).
        """
        node, key_node, matched = _walk(self.root, loc)
        use_key = at_key or len(matched) < len(loc) or not isinstance(node, yaml.ScalarNode)
        target = key_node if key_node is not None and use_key else node
        if target is None:
            return 1, 1
        return target.start_mark.line + 1, target.start_mark.column + 1

    def finding(self, loc: Loc, problem: str, fix: str, at_key: bool = False, code: str = "SP004") -> Finding:
        line, col = self.locate(loc, at_key)
        return spec_finding(str(self.path), line, col, tuple(loc), problem, fix, code)


def _mapping_get(node: yaml.MappingNode, key: Union[str, int]) -> Optional[tuple[yaml.Node, yaml.Node]]:
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == str(key):
            return k, v
    return None


def _walk(root: Optional[yaml.Node], loc: Loc) -> tuple[Optional[yaml.Node], Optional[yaml.Node], list]:
    """Follow `loc` through the node tree as far as it exists: (node, its key node, matched path)."""
    node, key_node, matched = root, None, []
    for el in loc:
        if isinstance(node, yaml.MappingNode):
            hit = _mapping_get(node, el)
            if hit is not None:
                key_node, node = hit
                matched.append(el)
                continue
        elif isinstance(node, yaml.SequenceNode) and isinstance(el, int) and 0 <= el < len(node.value):
            key_node, node = None, node.value[el]
            matched.append(el)
            continue
        break
    return node, key_node, matched


def _dotted(loc: Iterable[Union[str, int]]) -> str:
    out = ""
    for el in loc:
        if isinstance(el, int):
            out += f"[{el}]"
            continue
        name = str(el) if str(el).isprintable() and str(el).strip() else repr(el)  # keep a message one line
        out += f".{name}" if out else name
    return out


def _did_you_mean(word: str, options: Iterable[str]) -> Optional[str]:
    """`dstoolkit.common.text.did_you_mean` at the spec's cutoff (0.6)."""
    return did_you_mean(str(word), options, cutoff=0.6)
