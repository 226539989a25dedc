"""The tuning study in estimate mode (no ranks launched): bundled large specs, resume, interrupt, refusal."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.validate.engine import validate_config
from dstoolkit.tune import TuneInputError, TuneOptions, run_study
from dstoolkit.tune.records import STUDY_DB, STUDY_NAME

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _opts(repo_root, name, out, **kw):
    base = dict(spec_path=repo_root / "ds_configs" / f"{name}.yaml", out_dir=out, budget=4, mode="estimate",
                progress=False)
    base.update(kw)
    return TuneOptions(**base)


@pytest.mark.parametrize("name", ["llama3_8b_1x8_h100", "mixtral_8x7b_2x8_h100", "deepseek_v3_32x8_h800"])
def test_estimate_mode_on_bundled_large_specs(repo_root, tmp_path, name):
    import optuna

    res = run_study(_opts(repo_root, name, tmp_path / "o"))
    assert res.evaluated == 4, res.stop_reason
    # Every trial in the database is in the report, pruned ones with their reason.
    stored = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{tmp_path / 'o' / STUDY_DB}")
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert [t["number"] for t in report["trials"]] == [t.number for t in stored.trials]
    for t in report["trials"]:
        if t["state"] == "PRUNED":
            assert t["reason"] and t["code"], t
    # The estimator's best-ranked point is tried first.
    assert report["trials"][0]["seeded_by"] == "estimator ranking"
    # The best config is the best evaluated value, and passes validate_config at the spec's layout.
    ok = [t for t in report["trials"] if t["state"] == "COMPLETE"]
    assert report["best"]["value"] == max(t["value"] for t in ok)
    best_cfg = json.loads((tmp_path / "o" / "best_ds_config.json").read_text())
    cand = report["best"]["point"]["candidate"]
    from dstoolkit.spec import load_spec

    spec = load_spec(repo_root / "ds_configs" / f"{name}.yaml")
    findings = validate_config(best_cfg, world_size=spec.cluster.world_size, tp=cand["tp"], pp=cand["pp"],
                               gpus_per_node=spec.cluster.gpus_per_node, mode="strict")
    assert not [f for f in findings if str(f.severity).lower().endswith("error")]
    # The estimate agrees with the objective (estimate mode: tokens/s = global tokens / step time).
    e = report["best"]["estimate"]
    assert report["best"]["value"] == pytest.approx(
        spec.training.global_batch * spec.training.seq_len / e["step_time_s"], rel=1e-9)
    assert (tmp_path / "o" / "objective_vs_trial.png").read_bytes()[:8] == PNG_MAGIC
    assert "| # | status |" in (tmp_path / "o" / "report.md").read_text()


def test_memory_objective_minimises_estimated_memory(repo_root, tmp_path):
    res = run_study(_opts(repo_root, "llama3_8b_1x8_h100", tmp_path / "m", objective="memory", budget=5))
    ok = [t for t in res.trials if t["state"] == "COMPLETE"]
    assert res.best["value"] == min(t["value"] for t in ok)
    assert res.best["value"] == res.best["estimate"]["memory_per_rank_bytes"]


def test_resume_continues_the_same_study(repo_root, tmp_path):
    out = tmp_path / "r"
    first = run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=3))
    assert not first.resumed and first.evaluated == 3
    second = run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=6))
    assert second.resumed and second.evaluated == 6
    # The first trials are kept as they were (same numbers, same points, same values).
    assert [(t["number"], t["label"], t["value"]) for t in second.trials[: len(first.trials)]] == \
        [(t["number"], t["label"], t["value"]) for t in first.trials]


def test_interrupted_trial_is_closed_and_retried_on_resume(repo_root, tmp_path):
    import optuna

    out = tmp_path / "i"
    calls = []

    def interrupt_on_second(point, chk):
        calls.append(point.label)
        if len(calls) == 2:
            raise KeyboardInterrupt
        from dstoolkit.tune.objective import TrialOutcome

        return TrialOutcome(status="ok", value=1000.0 - len(calls))

    with pytest.raises(KeyboardInterrupt):
        run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=4), lookup=interrupt_on_second)
    stored = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{out / STUDY_DB}")
    assert [t.state.name for t in stored.trials][-1] == "RUNNING"
    res = run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=4))
    assert res.resumed and res.evaluated == 4
    interrupted = [t for t in res.trials if t["status"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["state"] == "FAIL" and not interrupted[0]["counted"]
    retried = [t for t in res.trials if t["number"] > interrupted[0]["number"] and t["label"] == interrupted[0]["label"]]
    assert retried and retried[0]["status"] == "ok"


def test_out_dir_is_never_overwritten_silently(repo_root, tmp_path):
    out = tmp_path / "x"
    run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=2))
    with pytest.raises(TuneInputError, match="different spec/objective/mode"):
        run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=2, objective="memory"))
    other = tmp_path / "y"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(TuneInputError, match="holds no study"):
        run_study(_opts(repo_root, "tiny_moe_cpu", other, budget=2))
    res = run_study(_opts(repo_root, "tiny_moe_cpu", out, budget=2, objective="memory", force=True))
    assert not res.resumed and res.evaluated == 2


def test_cli_json_and_errors(repo_root, tmp_path, capsys):
    spec = str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml")
    rc = main(["tune", spec, "--budget", "3", "--out", str(tmp_path / "c"), "--mode", "estimate", "--format", "json",
               "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["evaluated"] == 3 and out["best"]["status"] == "ok"
    assert out["status_counts"].get("ok") == 3
    rc = main(["tune", spec, "--budget", "0", "--out", str(tmp_path / "d"), "--mode", "estimate"])
    assert rc == 2 and "--budget 0" in capsys.readouterr().err
    rc = main(["tune", str(repo_root / "ds_configs" / "llama3_8b_1x8_h100.yaml"), "--budget", "2", "--out",
               str(tmp_path / "e"), "--mode", "real"])
    assert rc == 2 and "use --mode estimate" in capsys.readouterr().err
    rc = main(["tune", str(tmp_path / "nope.yaml"), "--budget", "2", "--out", str(tmp_path / "f")])
    assert rc == 2 and "nope.yaml: no such file (check the path)" in capsys.readouterr().err


def test_seed_count_grows_with_the_estimators_ties():
    from dstoolkit.tune.seeding import default_seed_trials, estimate_band_size

    # a third of the budget when the estimator has one clear best
    assert [default_seed_trials(b) for b in (1, 3, 5, 7, 10, 30)] == [1, 1, 2, 2, 3, 5]
    # ties: up to half the budget (rounded up), never more than 5, never fewer than the base
    assert [default_seed_trials(b, band_size=4) for b in (1, 3, 5, 7, 10)] == [1, 2, 3, 4, 4]
    assert default_seed_trials(20, band_size=9) == 5
    assert default_seed_trials(10, band_size=1) == 3
    # throughput: within 5% below the best; memory: within 5% above the least
    assert estimate_band_size([100.0, 96.0, 95.0, 94.9, 50.0], "throughput") == 3
    assert estimate_band_size([10.0, 10.5, 10.6, 20.0], "memory") == 2
    assert estimate_band_size([], "throughput") == 0
