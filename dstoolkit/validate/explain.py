"""`dstoolkit validate --explain CODE` and docs/rules.md, both read from the registries: the DeepSpeed
cross-field rules (dstoolkit.dsconfig.registry, DS2xx), the layout constraints (dstoolkit.layout.constraints,
LYxxx) and the per-key codes (dstoolkit.validate.findings.KEY_CODES, DS0xx / DS1xx).

    python -m dstoolkit.validate.explain --write docs/rules.md     # regenerate the docs page
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from dstoolkit.common.text import did_you_mean
from dstoolkit.dsconfig.rules import RULES
from dstoolkit.layout.constraints import CONSTRAINTS
from dstoolkit.validate.findings import INPUT_ERROR_PREFIX, KEY_CODES, SPEC_CODES, SPEC_INPUT_CODES

DOCS_PATH = "docs/rules.md"


class UnknownCode(KeyError):
    """No rule, constraint or finding has this code; `hint` is the closest known code (or None)."""

    def __init__(self, code: str, hint: Optional[str]):
        self.code = code
        self.hint = hint
        super().__init__(code)

    def __str__(self) -> str:
        return f"unknown code {self.code!r}" + (f" (did you mean {self.hint!r}?)" if self.hint else
                                                 " (see docs/rules.md for the list)")


def _key_code_note(code: str) -> str:
    if code.startswith(INPUT_ERROR_PREFIX):
        return ("An input problem: the file cannot be checked as a DeepSpeed config. `dstoolkit validate` exits 2 "
                "for it.")
    if code.startswith("DS01"):
        return ("A syntax note: DeepSpeed reads configs with hjson, which accepts this, but strict JSON tools "
                "do not.")
    return ("A per-key finding: the key or value is checked against the JSON Schema generated from the "
            "DeepSpeed models (dstoolkit/dsconfig/deepspeed_config.schema.json) and the section tables in "
            "dstoolkit.validate.keys. The finding names the key, the value and the fix.")


def _spec_code_note(code: str) -> str:
    if code in SPEC_INPUT_CODES:
        return ("An input problem: the file cannot be read as a dstoolkit spec. `dstoolkit validate` exits 2 for it.")
    if code == "SP007":
        return ("A warning from the estimator: the layout the spec asks for (or the one the sweep picks for its "
                "\"auto\" fields), named by its sweep label (offload included), fails the fit test `dstoolkit "
                "estimate` applies (generate.costing.fit_verdict): its peak + allowance is above the device memory "
                "per rank, or the states it offloads are above the host RAM per node, or both; the message names "
                "each that fails, with the figures. `dstoolkit estimate SPEC.yaml` prints the peak by phase, the "
                "host RAM per node and what would make it fit.")
    return ("A spec finding: the field path, the value and the fix are named, at the YAML line of the field "
            "(dstoolkit.spec; `dstoolkit validate`, `estimate`, `sweep` and `generate` read specs the same way).")


def known_codes() -> list[str]:
    """Every code `--explain` knows, in order: per-key, rules, layout constraints, spec codes."""
    return list(KEY_CODES) + list(RULES) + list(CONSTRAINTS) + list(SPEC_CODES)


def explain(code: str) -> str:
    """Code, title and explanation of a rule, layout constraint or finding code.

    Raises:
        UnknownCode: no such code (with the closest known one as a hint).
    """
    c = str(code).strip().upper()
    rules = RULES
    if c in rules:
        r = rules[c]
        return (f"{r.code}: {r.title}\nseverity: {r.severity}\nrule: {r.check.__module__}.{r.name}\n\n"
                f"{r.explanation}")
    if c in CONSTRAINTS:
        k = CONSTRAINTS[c]
        return f"{k.code}: {k.title}\nreads: {', '.join(k.fields)}\n\n{k.explanation}"
    if c in KEY_CODES:
        return f"{c}: {KEY_CODES[c]}\n\n{_key_code_note(c)}"
    if c in SPEC_CODES:
        return f"{c}: {SPEC_CODES[c]}\n\n{_spec_code_note(c)}"
    known = known_codes()
    digits = c[:2] + c[2:].replace("O", "0").replace("I", "1").replace("L", "1")  # DS2O4 -> DS204
    raise UnknownCode(str(code).strip(), digits if digits in known else did_you_mean(c, known, cutoff=0.6))


def rules_markdown() -> str:
    """docs/rules.md: every code with its title and explanation, generated from the registries."""
    out = ["# Rule and finding codes", "",
           "<!-- Generated from the registries by `python -m dstoolkit.validate.explain --write docs/rules.md`;",
           "     do not edit by hand (tests/unit/test_rule_registry.py checks it is current). -->", "",
           "`dstoolkit validate --explain CODE` prints one entry. Each rule is declared once: DeepSpeed rules with",
           "`@rule` in `dstoolkit/dsconfig/rules.py`, `rules_optim.py`, `rules_optim_values.py`, `rules_optim_engine.py`,",
           "`rules_types.py`, `rules_sched.py`, `rules_sched_torch.py` and `rules_parallel.py` (the docstring is the",
           "explanation),",
           "layout constraints with `@constraint` in `dstoolkit/layout/degree_rules.py` and",
           "`dstoolkit/layout/step_rules.py`.", "",
           "## DeepSpeed cross-field rules (DS2xx)", ""]
    for r in sorted(RULES.values(), key=lambda r: r.code):
        out += [f"### {r.code}: {r.title}", "", f"Severity: {r.severity}. Check: `{r.check.__module__}.{r.name}`.", "",
                " ".join(r.explanation.split()), ""]
    out += ["## Layout constraints (LYxxx)", "",
            "Checked for specs, sweep candidates and (through the DS2xx rules above) DeepSpeed configs.", ""]
    for k in CONSTRAINTS.values():
        out += [f"### {k.code}: {k.title}", "", f"Reads: {', '.join(k.fields)}.", "",
                " ".join(k.explanation.split()), ""]
    out += ["## Input, syntax and per-key codes (DS0xx, DS1xx)", "",
            "DS00x: the file cannot be checked (exit 2). DS01x: hjson-only syntax. DS1xx: per-key findings against",
            "the JSON Schema.", "", "| code | title |", "| --- | --- |"]
    out += [f"| {code} | {title.replace('|', '/')} |" for code, title in KEY_CODES.items()]
    out += ["", "## Spec codes (SPxxx)", "",
            "Findings on a dstoolkit spec (`dstoolkit validate SPEC.yaml`, and the errors `estimate`, `sweep` and",
            "`generate` print). SP001 and SP006: the file, or a file it names, cannot be read (exit 2). SP007 is a",
            "warning.", "",
            "| code | title |", "| --- | --- |"]
    out += [f"| {code} | {title.replace('|', '/')} |" for code, title in SPEC_CODES.items()]
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dstoolkit.validate.explain",
                                description="Print docs/rules.md (or one code's entry) from the registries.")
    p.add_argument("code", nargs="?", help="one code to explain")
    p.add_argument("--write", metavar="PATH", help="write the markdown page here")
    args = p.parse_args(argv)
    if args.code:
        try:
            print(explain(args.code))
        except UnknownCode as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    text = rules_markdown()
    if args.write:
        with open(args.write, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
