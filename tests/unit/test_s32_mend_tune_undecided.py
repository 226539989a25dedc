"""sweep's "Measure ...: dstoolkit tune --mode real" promises only what real mode runs (review s32 #4): real mode is
data parallel only (tune.space, data_parallel_only), so the command counts and seeds the undecided tp1 pp1 layouts
and names the others as not measurable by tune. Checked against run_sweep's own ranking and the seeds tune builds for
that command in real mode (no trial runs)."""
from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from dstoolkit.cli.sweep import _undecided_json, _undecided_ranked
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.generate.undecided import undecided_lines
from dstoolkit.models import resolve_spec_model
from dstoolkit.spec import load_spec
from dstoolkit.tune import options as tune_options
from dstoolkit.tune.options import TuneOptions, _load_space
from dstoolkit.tune.seeding import one_per_layout
from dstoolkit.tune.study import seed_plan

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _seeds_of_command(cmd: str, tmp_path, monkeypatch) -> list[str]:
    """The layouts `dstoolkit tune ... --mode real --budget n --seed-trials k` seeds (as run_study builds them)."""
    argv = shlex.split(cmd)
    assert argv[:2] == ["dstoolkit", "tune"] and "--mode" in argv and argv[argv.index("--mode") + 1] == "real"
    budget, k = int(argv[argv.index("--budget") + 1]), int(argv[argv.index("--seed-trials") + 1])
    spec_path = pathlib.Path(argv[2])
    monkeypatch.setattr(tune_options, "_local_ranks", lambda: (True, 64))  # as on a machine that runs the spec
    opts = TuneOptions(spec_path=ROOT / spec_path, out_dir=tmp_path / "t", budget=budget, mode="real",
                       seed_trials=k)
    spec, space, _ = _load_space(opts)
    _, _, pool, n_seed = seed_plan(opts, spec, space, spec.cluster.world_size)
    return [p.candidate.label for p in one_per_layout(pool, n_seed)]


@pytest.mark.parametrize("name", ["llama3_8b_1x8_h100.yaml", "tiny_cpu.yaml"])
def test_tune_command_seeds_the_measurable_undecided_layouts(name, tmp_path, monkeypatch):
    rel = f"ds_configs/{name}"
    spec = load_spec(ROOT / rel)
    shape = resolve_spec_model(spec)
    res = run_sweep(spec, shape, top=3)
    ranked = _undecided_ranked(res, spec, shape, ())
    doc = _undecided_json(ranked, spec, rel)
    listed = [ranked[i - 1].candidate.label for i in doc["tune_positions"]]
    assert listed and all(re.search(r"\btp1 pp1\b", x) for x in listed)
    assert sorted(listed + doc["not_measurable_by_tune"]) == sorted(doc["labels"])
    seeds = _seeds_of_command(doc["tune_command"], tmp_path, monkeypatch)
    assert seeds == listed[:5]


def test_llama3_8b_names_the_tp_pp_layouts_as_not_measurable():
    spec = load_spec(ROOT / "ds_configs" / "llama3_8b_1x8_h100.yaml")
    shape = resolve_spec_model(spec)
    res = run_sweep(spec, shape, top=3)
    ranked = _undecided_ranked(res, spec, shape, ())
    lines = undecided_lines([r.candidate.label for r in ranked], [r.estimate.step_time_s for r in ranked], False,
                            "s.yaml", shown=3)
    doc = _undecided_json(ranked, spec, "s.yaml")
    n = len(doc["tune_positions"])
    assert lines[1].startswith(f"Measure the {n} that tune's real mode runs (")
    assert lines[1].endswith(f"--mode real --budget {n} --seed-trials {min(n, 5)} -o tune_undecided")
    assert lines[2].startswith(f"The other {len(doc['not_measurable_by_tune'])} are not measurable by tune (TP/PP > 1")


def test_none_measurable_prints_no_command():
    lines = undecided_lines(["zero1 tp2 pp1 mb1 ckpt=none", "zero1 tp1 pp2 mb1 ckpt=none"], [1.0, 1.01], False)
    assert len(lines) == 2 and "tune" not in lines[0]
    assert lines[1].startswith("None of them is measurable by `dstoolkit tune --mode real`")
    assert "--budget" not in lines[1]
