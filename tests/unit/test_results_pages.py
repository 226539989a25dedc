"""The tables of measured figures in README.md and docs/*.md are rendered from benchmarks/results/ (house style:
tables come from results, never by hand), as docs/rules.md is rendered from the rule registries."""
from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from dstoolkit.runtime.bench import pages

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_committed_pages_equal_a_fresh_render():
    stale = pages.stale(REPO)
    assert not stale, f"regenerate: {pages.COMMAND} (stale: {[str(p.relative_to(REPO)) for p in stale]})"


def test_every_table_is_on_a_page_and_every_row_names_its_file():
    found = {}
    for page in pages.pages(REPO):
        for m in pages._BLOCK.finditer(page.read_text(encoding="utf-8")):
            found[m["name"]] = (page, m["body"])
    assert set(found) == set(pages.TABLES), "each renderer has its markers on one page and no page names an unknown one"
    page, body = found["fidelity"]
    assert page == REPO / "README.md"
    rows = [line for line in body.splitlines() if line.startswith("| ")][1:]
    assert len(rows) >= 12
    for row in rows:  # the last cell links a committed result file that exists
        last = row.rstrip(" |").rsplit("| ", 1)[-1]
        linked = [part.split(")")[0] for part in last.split("](")[1:]]
        assert linked and all((REPO / f).is_file() for f in linked), row


def _copy(tmp_path: pathlib.Path) -> pathlib.Path:
    """README.md, docs/ and benchmarks/results/ in a scratch root (never the checkout)."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    shutil.copy(REPO / "README.md", root / "README.md")
    for p in (REPO / "docs").glob("*.md"):
        shutil.copy(p, root / "docs" / p.name)
    shutil.copytree(REPO / pages.RESULTS, root / pages.RESULTS)
    return root


def test_a_hand_edit_is_caught_and_write_restores_the_render(tmp_path, capsys):
    root = _copy(tmp_path)
    readme = root / "README.md"
    fresh = readme.read_text(encoding="utf-8")
    edited = fresh.replace("worst error -0.0003%", "worst error -0.0002%", 1)
    assert edited != fresh
    readme.write_text(edited, encoding="utf-8")
    assert pages.main(["--check", "--root", str(root)]) == 1
    assert "README.md: generated tables differ" in capsys.readouterr().err
    assert pages.main(["--write", "--root", str(root)]) == 0
    assert readme.read_text(encoding="utf-8") == fresh
    assert pages.main(["--check", "--root", str(root)]) == 0


def test_figures_follow_the_result_file(tmp_path):
    root = _copy(tmp_path)
    f = root / pages.RESULTS / "memory_fidelity_cpu_202611.json"
    d = json.loads(f.read_text())
    d["worst_model_state_error"][0] = -0.0123
    f.write_text(json.dumps(d))
    assert pages.stale(root) == [root / "README.md"]
    page = pages.render_page((root / "README.md").read_text(encoding="utf-8"), root / "README.md", root)
    assert "worst error -1.2300% (z3-bf16-offload, rank 0)" in page


def test_a_missing_result_file_is_named(tmp_path, capsys):
    root = _copy(tmp_path)
    (root / pages.RESULTS / "cpu_malloc_202612.json").unlink()
    assert pages.main(["--check", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "cpu_malloc_202612.json: result file not found" in err and "Traceback" not in err


def test_an_unknown_table_name_is_refused(tmp_path):
    page = tmp_path / "README.md"
    text = "<!-- BEGIN generated: nosuch x -->\n<!-- END generated: nosuch -->\n"
    with pytest.raises(pages.PageError, match="unknown generated table 'nosuch'; known: fidelity"):
        pages.render_page(text, page, tmp_path, REPO / pages.RESULTS)


def test_no_torch_needed():
    code = "import sys, dstoolkit.runtime.bench.pages, dstoolkit.runtime.bench.result_tables, dstoolkit.runtime.bench.fidelity_table; print('torch' in sys.modules, 'deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_held_out_row_reads_its_own_result(tmp_path):
    """The held-out published runs have their own README row, read from their own file (never the fitted table's)."""
    root = _copy(tmp_path)
    f = root / pages.RESULTS / "published_runs_held_out_202612.jsonl"
    recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    done = [r for r in recs if r.get("event") == "run_done" and r.get("summary")][-1]
    done["summary"]["mape"], done["summary"]["new_layouts"]["mape"] = 0.123, 0.0456
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    page = pages.render_page((root / "README.md").read_text(encoding="utf-8"), root / "README.md", root)
    row = next(line for line in page.splitlines() if line.startswith("| throughput on GPU clusters; held out |"))
    assert "MAPE 12.3% (goal 10%: not met)" in row and "no fitted row has: MAPE 4.6%" in row
