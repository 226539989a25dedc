"""`estimate SPEC --target A --target B` plans each engine group as `generate` does.

Before: `resolve_spec` ran one sweep over targets of several engine groups under training.framework, so
`estimate u4.yaml --target megatron-lm --target hf` (Ulysses 4) printed DeepSpeed's engine's step (FusedAdam, 3.644 s in
the report) for a layout only megatron-lm runs, naming no target, and `--target megatron-lm --target deepspeed` did
the same although `--target deepspeed` alone refuses Ulysses.
"""
from __future__ import annotations

import pytest

from dstoolkit.cli import main
from dstoolkit.estimate import estimate_run
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.planner import resolve_spec

U4 = """\
name: u
model: {preset: llama-3-8b}
cluster: {nodes: 4, gpus_per_node: 8, gpu: H100-SXM}
training: {seq_len: 32768, precision: bf16, global_batch: 16, micro_batch: 1, zero_stage: 2, ulysses: 4,
           activation_checkpointing: none, tp: 2, pp: 1}
"""
NO_SPLIT = ("training.ulysses=4: {t} does not split sequences that way; generate with --target megatron-deepspeed / "
            "megatron-lm")


@pytest.fixture()
def u4(tmp_path):
    p = tmp_path / "u4.yaml"
    p.write_text(U4)
    return p


def _step(resolution) -> float:
    return estimate_run(resolution.plan).step_time_s


def test_megatron_lm_beside_a_target_that_cannot_run_the_spec_gets_megatron_cores_figures(u4):
    spec, shape = load_spec_and_shape(u4)
    alone = resolve_spec(spec, shape, ("megatron-lm",))
    for other in ("hf", "deepspeed"):
        r = resolve_spec(spec, shape, ("megatron-lm", other))
        assert r.plan.framework == "megatron" and r.targets == ["megatron-lm"]
        assert _step(r) == _step(alone)  # not DeepSpeed's engine's figure for megatron-lm's layout
        assert r.refused == {other: NO_SPLIT.format(t=other)}
        assert r.assumptions[0] == "figures for --target megatron-lm (estimated under Megatron-Core)"
        assert r.assumptions[-1] == f"--target {other}: not estimated: " + NO_SPLIT.format(t=other)


def test_two_groups_that_run_the_spec_each_under_its_engine(u4):
    spec, shape = load_spec_and_shape(u4)
    r = resolve_spec(spec, shape, ("megatron-lm", "megatron-deepspeed"))
    # DeepSpeed's engine group first (target_groups, as generate orders them), Megatron-Core's beside it
    assert r.targets == ["megatron-deepspeed"] and r.plan.framework == "deepspeed" and r.refused == {}
    [lm] = r.others
    assert lm.targets == ["megatron-lm"] and lm.plan.framework == "megatron"
    assert _step(r) == _step(resolve_spec(spec, shape, ("megatron-deepspeed",)))
    e = lm.sweep.winner.estimate
    assert r.assumptions == [
        "figures for --target megatron-deepspeed (estimated under DeepSpeed's engine)",
        f"--target megatron-lm (estimated under Megatron-Core): zero2 tp2 pp1 mb1 ckpt=none, {e.step_time_s:.4g} s/step, "
        f"{e.memory_per_rank_bytes / 2**30:.1f} GiB per rank; `dstoolkit estimate --target megatron-lm` shows its figures"]


def test_no_target_that_runs_the_spec_names_each_with_its_reason(u4):
    spec, shape = load_spec_and_shape(u4)
    with pytest.raises(ValueError) as exc:
        resolve_spec(spec, shape, ("deepspeed", "hf"))
    # the reason each target gives in generate (targets.target_refusal, 92980c4), one per target
    tail = " (generate writes no files for them either: ask a target that runs this spec)"
    assert str(exc.value) == ("u is not estimated for any requested target: --target deepspeed: "
                              + NO_SPLIT.format(t="deepspeed") + "; --target hf: " + NO_SPLIT.format(t="hf") + tail)
    with pytest.raises(ValueError) as exc:
        resolve_spec(spec, shape, ("deepspeed",))
    assert str(exc.value) == ("u is not estimated for any requested target: --target deepspeed: "
                              + NO_SPLIT.format(t="deepspeed") + tail)


def test_estimate_cli_says_which_targets_the_figures_are_for(u4, capsys):
    assert main(["estimate", str(u4), "--target", "megatron-lm"]) == 0
    alone = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step time ")]
    assert main(["estimate", str(u4), "--target", "megatron-lm", "--target", "hf"]) == 0
    out = capsys.readouterr().out
    assert "  assumed: figures for --target megatron-lm (estimated under Megatron-Core)\n" in out
    assert "  assumed: --target hf: not estimated: " + NO_SPLIT.format(t="hf") + "\n" in out
    assert [line for line in out.splitlines() if line.startswith("step time ")] == alone
    assert "ZeRO-2 (Megatron-Core DistributedOptimizer)" in out.splitlines()[0]  # not DeepSpeed's engine's ZeRO-2
