"""The house's import rules, read from the source (AST), not from a running interpreter:

- imports between dstoolkit packages flow one way, down the layer order below (function-level imports count:
  a loop hidden inside a function is still a loop);
- no import loop between modules;
- no import circle between the files of one package, type-only imports (`if TYPE_CHECKING:`) included: two
  files that need each other even for annotations hold one job, or a third file holds what both need;
- the core (everything below `runtime`) imports no torch, deepspeed, transformers, optuna or matplotlib at
  module level.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dstoolkit"

LAYERS = [
    ("__init__", "common"),
    ("hardware", "layout"),
    ("dsconfig",),
    ("validate",),
    ("spec",),
    ("models",),
    ("fp8",),
    ("runplan",),
    ("ckpt",),
    ("estimate",),
    ("generate",),
    ("runtime",),
    ("tune",),
    ("cli",),
    ("__main__",),
]
"""Bottom to top. A package may import packages of lower rows only (and itself). `__init__` is the root
package (its version string), imported by everything."""
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
CORE = {pkg for row in LAYERS[: RANK["runtime"]] for pkg in row}
HEAVY = ("torch", "deepspeed", "transformers", "optuna", "matplotlib", "transformer_engine")


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = p
    return out


MODULES = _modules()


def _package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(mod: str, path: pathlib.Path, type_checking: bool = False) -> list[tuple[str, int, bool]]:
    """(imported name, line, at module level) for every import statement in the file; `type_checking`: also
    those under `if TYPE_CHECKING:` (annotation-only imports, skipped by default)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = mod.split(".")[: None if is_pkg else -1]
                    parts = parts[: len(parts) - (child.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from pkg import name` imports pkg itself
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in MODULES else base, child.lineno, top))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and not type_checking:
                continue
            else:
                visit(child, top)

    visit(tree, True)
    return found


def _internal(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _edges(type_checking: bool = False) -> dict[str, set[tuple[str, int]]]:
    edges: dict[str, set[tuple[str, int]]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        for name, line, _ in _imports(mod, path, type_checking):
            if not name.startswith("dstoolkit"):
                continue
            target = _internal(name)
            if target and target != mod:
                edges[mod].add((target, line))
    return edges


def test_every_package_has_a_layer():
    packages = {_package(m) for m in MODULES}
    assert packages - set(RANK) == set(), "add the new package to LAYERS (and the README's layout map)"


def test_imports_flow_down_the_layers():
    upward = []
    for mod, targets in _edges().items():
        src = _package(mod)
        for target, line in targets:
            dst = _package(target)
            if dst != src and RANK[dst] >= RANK[src]:
                upward.append(f"{MODULES[mod].relative_to(ROOT.parent)}:{line}: {mod} -> {target}")
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return found


def test_no_import_loops():
    graph = {m: {t for t, _ in ts} for m, ts in _edges().items()}
    loops = []
    for comp in _cycles(graph):
        # a package __init__ re-exporting its own submodules is not a loop of the design
        members = [c for c in comp if not any(o.startswith(c + ".") for o in comp)]
        if len(members) > 1:
            loops.append(comp)
    assert loops == []


def _package_file_graph(edges: dict[str, set[tuple[str, int]]]) -> dict[str, set[str]]:
    """Imports between the files (not the __init__) of one package: module -> modules of the same folder."""
    files = {m for m, p in MODULES.items() if p.name != "__init__.py"}
    return {m: {t for t, _ in ts if t in files and t.rpartition(".")[0] == m.rpartition(".")[0]}
            for m, ts in edges.items() if m in files}


def test_no_import_circle_between_files_of_a_package():
    circles = [" <-> ".join(c) for c in _cycles(_package_file_graph(_edges(type_checking=True)))]
    assert circles == [], "move what both files need into a third file of the package"


def test_the_checker_sees_a_type_only_circle(tmp_path):
    # The circle rule must be able to fail: a.py imports b at module level, b.py imports a only for annotations.
    pkg = tmp_path / "dstoolkit" / "generate"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from dstoolkit.generate.b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                              "    from dstoolkit.generate.a import A\n\nclass B:\n    pass\n")
    graph = {"dstoolkit.generate.a": {n for n, _, _ in _imports("dstoolkit.generate.a", pkg / "a.py", True)},
             "dstoolkit.generate.b": {n for n, _, _ in _imports("dstoolkit.generate.b", pkg / "b.py", True)}}
    graph = {m: {n.rpartition(".")[0] if n.endswith((".A", ".B")) else n for n in ns} for m, ns in graph.items()}
    assert _cycles(graph) == [["dstoolkit.generate.a", "dstoolkit.generate.b"]]
    without_types = {n for n, _, _ in _imports("dstoolkit.generate.b", pkg / "b.py")}
    assert without_types == {"typing"}  # the default skips the TYPE_CHECKING block: the loop test cannot see it
    assert _cycles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


@pytest.mark.parametrize("heavy", HEAVY)
def test_core_imports_nothing_heavy_at_module_level(heavy):
    offenders = []
    for mod, path in MODULES.items():
        if _package(mod) not in CORE:
            continue
        for name, line, top in _imports(mod, path):
            if top and (name == heavy or name.startswith(heavy + ".")):
                offenders.append(f"{path.relative_to(ROOT.parent)}:{line}")
    assert offenders == []


def test_the_checker_sees_an_upward_import(tmp_path):
    # The rules above must be able to fail: a hand-made upward import is found by the same parser.
    fake = tmp_path / "dstoolkit" / "spec"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from dstoolkit.estimate import core\n\ndef f():\n    import torch\n")
    found = _imports("dstoolkit.spec.bad", fake / "bad.py")
    assert ("dstoolkit.estimate.core", 1, True) in found and ("torch", 4, False) in found
    assert RANK["estimate"] > RANK["spec"]
