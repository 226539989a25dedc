"""s35 newcomer findings on the docs: the README's test tiers tell one story (the command it calls the quick loop
selects no `dist` and no `slow` test, whichever paragraph says it), and the guides link the current Megatron parser
run, the one the README's generated fidelity table cites first."""
from __future__ import annotations

import pathlib
import re

from _pytest.mark.expression import Expression

REPO = pathlib.Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _selects(expr: str, marks: set) -> bool:
    return Expression.compile(expr).evaluate(lambda name, **_: name in marks)


def test_every_quick_or_fast_tier_the_readme_names_runs_no_dist_and_no_slow_test():
    # `-m "EXPR"` is / runs / : the quick loop (or the fast tier), wherever the README says it
    quick = re.findall(r'-m "([^"]+)"`?:?\s+(?:is |runs )?the (?:quick|fast)\b', README.replace("\n", " "))
    assert quick, "the README names no quick-loop command"
    for expr in quick:
        assert _selects(expr, set()), expr  # unit tests without markers run
        assert not _selects(expr, {"dist"}) and not _selects(expr, {"slow"}), expr
    assert len(set(quick)) == 1, quick  # one quick loop, the same wherever it is named


def test_megatron_parser_links_point_at_the_run_the_readme_cites_first():
    cited = re.findall(r"benchmarks/results/(megatron_parsers_\d+_run(\d+)\.md)", README)
    assert cited
    current = cited[0][0]
    newest = max(REPO.glob("benchmarks/results/megatron_parsers_*_run*.md"),
                 key=lambda p: int(re.search(r"_run(\d+)\.md$", p.name).group(1)))
    assert newest.name == current
    for doc in ("docs/benchmarks.md", "docs/generate-and-targets.md"):
        linked = re.findall(r"megatron_parsers_\d+_run\d+\.md", (REPO / doc).read_text())
        assert linked and set(linked) == {current}, (doc, linked)


def test_generate_guide_has_a_heading_for_force_and_no_wall_of_text():
    text = (REPO / "docs/generate-and-targets.md").read_text()
    headings = re.findall(r"^#{2,3} (.+)$", text, flags=re.M)
    assert "Existing output and `--force`" in headings
    after_generate = text.split("\n## Generate\n", 1)[1]
    assert len(re.findall(r"^### ", after_generate, flags=re.M)) >= 8
    # prose lines stay readable (table rows and link-only lines aside)
    long = [line[:60] for line in after_generate.splitlines() if len(line) > 120 and not line.startswith("|")]
    assert long == []
