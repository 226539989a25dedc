"""Located spec errors: field paths mapped back to the YAML line and column of the spec file. No torch import."""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

import yaml

Loc = tuple[Union[str, int], ...]


# ----------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------


class SpecFieldError(ValueError):
    """A validation problem tied to a field path, raised inside validators.

    `loc` is relative to the model whose validator raises it (pydantic prepends the model's own location),
    so `load_spec` can point at the exact YAML line of the offending key.
    """

    def __init__(self, loc: Loc, problem: str, fix: str):
        self.loc = tuple(loc)
        self.problem = problem
        self.fix = fix
        path = ".".join(str(p) for p in self.loc)
        super().__init__(f"{path + ': ' if path else ''}{problem} ({fix})")


@dataclass(frozen=True)
class SpecFinding:
    """One located problem in a spec file."""

    file: str
    line: Optional[int]
    col: Optional[int]
    path: str
    problem: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}: " if self.line is not None else (f"{self.file}: " if self.file else "")
        return f"{where}{self.path + ': ' if self.path else ''}{self.problem} ({self.fix})"


class SpecError(ValueError):
    """Invalid spec. Each line of the message reads ``file:line:col: <field path>: <problem> (<fix>)``."""

    def __init__(self, findings: Sequence[SpecFinding]):
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

    def finding(self, loc: Loc, problem: str, fix: str, at_key: bool = False) -> SpecFinding:
        line, col = self.locate(loc, at_key)
        return SpecFinding(str(self.path), line, col, _dotted(loc), problem, fix)


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
    close = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return close[0] if close else None


