"""s34 newcomer findings 4 and 5: `dstoolkit validate` on a spec dropped the field name that generate / sweep /
estimate print ("error[SP003]: -8 is not valid: ..." with no `training.global_batch`), and LY001 (tp * pp does not
divide the world) pointed at `training.tp` when tp was 1 and pp the degree at fault."""
from __future__ import annotations

from dstoolkit.cli import main

SPEC = """\
name: s
model: {{preset: tiny}}
cluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu}}
training:
  seq_len: 128
  global_batch: {gb}
  micro_batch: 1
  tp: {tp}
  pp: {pp}
"""


def _validate(tmp_path, capsys, **kw):
    p = tmp_path / "s.yaml"
    p.write_text(SPEC.format(**kw))
    assert main(["validate", str(p)]) == 1
    return capsys.readouterr().out.splitlines()[0].removeprefix(str(p))


def test_validate_names_the_field_of_a_spec_value(tmp_path, capsys):
    assert _validate(tmp_path, capsys, gb=-8, tp=1, pp=1) == (
        ":6:17: error[SP003]: training.global_batch: -8 is not valid: Input should be greater than 0 "
        "(expected: Sequences per optimizer step over all data-parallel ranks.)")


def test_ly001_points_at_the_degree_at_fault(tmp_path, capsys):
    line = _validate(tmp_path, capsys, gb=8, tp=1, pp=3)
    assert line.startswith(":9:7: error[LY001]: training.tp * training.pp = 1 * 3 = 3 does not divide")  # pp's line
    line = _validate(tmp_path, capsys, gb=8, tp=3, pp=1)
    assert line.startswith(":8:7: error[LY001]: ")  # tp's line


def test_ly001_blame_rule():
    from dstoolkit.layout.constraints import check_layout
    from dstoolkit.layout.registry import LayoutFacts

    def pointed(**kw):
        return check_layout(LayoutFacts(sp=1, **kw), ("LY001",))[0].fields[0]

    assert pointed(world=12, tp=8, pp=3) == "tp"  # 8 does not divide 12, 3 does
    assert pointed(world=12, tp=4, pp=8) == "pp"  # 8 does not divide 12, 4 does
    assert pointed(world=8, tp=2, pp=8) == "pp"   # each divides 8 alone, the product 16 does not: the last one
