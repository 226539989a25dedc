"""The layout constraints, each declared once with a stable code, a title, the facts it reads, an explanation
and a check, asked here. What they read and how they are declared: `registry`; the rules: `degree_rules` and
`step_rules`. Pure Python, imports only `dstoolkit.layout`.

Callers build a `LayoutFacts` from what they know (a spec, a sweep candidate, a DeepSpeed JSON plus
--world-size, a `RunPlan`) and ask `check_layout`. Unknown facts are None and the constraints that need them
stay quiet. `names` maps fact names to the caller's field names, so a spec error says ``training.tp`` and a
sweep drop reason says ``tp``:

    facts = LayoutFacts(world=16, tp=4, pp=8)
    [v.code for v in check_layout(facts)]   # ['LY001']

`python -m dstoolkit.layout.constraints` prints the table (code, title, facts, explanation).
"""
from __future__ import annotations

from typing import Mapping, Optional

# the rules register themselves in code order: the ranks' split (LY001-LY016), then a step over them (LY017-LY024)
from dstoolkit.layout import degree_rules, step_rules  # noqa: F401
from dstoolkit.layout.dims import LayoutError
from dstoolkit.layout.registry import CONSTRAINTS, LayoutFacts, Violation


def check_layout(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
                 names: Optional[Mapping[str, str]] = None) -> list[Violation]:
    """Every violated constraint: all of them in code order, or those in `codes` in that order."""
    names = dict(names or {})

    def n(field: str) -> str:
        return names.get(field, field)

    out: list[Violation] = []
    order = list(CONSTRAINTS) if codes is None else [c for c in codes if c in CONSTRAINTS]
    for code in order:
        c = CONSTRAINTS[code]
        hit = c.check(facts, n)
        if hit is not None:
            # A check may name the fact to point at as a third element; it goes first in `fields`.
            pointed = (hit[2],) + tuple(f for f in c.fields if f != hit[2]) if len(hit) > 2 else c.fields
            out.append(Violation(code, c.name, c.title, hit[0], hit[1], pointed))
    return out


def first_violation(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
                    names: Optional[Mapping[str, str]] = None) -> Optional[Violation]:
    """The first violated constraint, or None."""
    found = check_layout(facts, codes, names)
    return found[0] if found else None


def require(facts: LayoutFacts, codes: Optional[tuple[str, ...]] = None,
            names: Optional[Mapping[str, str]] = None) -> None:
    """Raise `LayoutError` for the first violated constraint."""
    v = first_violation(facts, codes, names)
    if v is not None:
        raise LayoutError(v.code, v.message, v.fix)


def explain(code: str) -> str:
    """A constraint's code, title, facts and explanation, for `--explain` and the docs."""
    c = CONSTRAINTS.get(code.upper())
    if c is None:
        raise KeyError(f"no layout constraint {code!r} (known: {', '.join(CONSTRAINTS)})")
    return f"{c.code} ({c.name}): {c.title}\nreads: {', '.join(c.fields)}\n\n{c.explanation}"



if __name__ == "__main__":  # pragma: no cover - documentation helper
    for c in CONSTRAINTS.values():
        print(f"{c.code}  {c.name:15} {c.title}  [{', '.join(c.fields)}]")
