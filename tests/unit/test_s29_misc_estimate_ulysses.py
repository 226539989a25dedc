"""`dstoolkit estimate --config ds.json --model ...` estimates the config's DeepSpeed-Ulysses degree
(sequence_parallel_size) as the spec form estimates training.ulysses.

Before, the flag form built its RunPlan at ulysses 1 whatever the JSON said: a config with sequence_parallel_size 4
and a batch triad written for dp = world / 4 was refused with the triad checked at dp = world ("train_batch_size 16
!= micro batch 1 x gradient accumulation 2 x dp 32 = 64"), and one without train_batch_size was estimated silently at
dp 32 with the whole sequence on every rank (llama-3-8b, 32 x H100, seq 32768: 262.70 GiB per rank, "does not fit";
at Ulysses 4 it is the spec form's 69.73 GiB class and fits).
"""
import json

from tests.unit.estimate_cli_runs import run_estimate as _run

SPEC = """\
name: u
model: {preset: llama-3-8b}
cluster: {nodes: 4, gpus_per_node: 8, gpu: H100-SXM}
training: {seq_len: 32768, precision: bf16, global_batch: 16, micro_batch: 1, zero_stage: 3, ulysses: 4,
           activation_checkpointing: none, tp: 1, pp: 1}
"""
FLAGS = ["--model", "llama-3-8b", "--world-size", "32", "--gpus-per-node", "8", "--seq-len", "32768"]
# a hand-written DeepSpeed JSON: DeepSpeed derives train_batch_size = micro x accum x world / sequence_parallel_size
SP4 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
       "zero_optimization": {"stage": 3}, "sequence_parallel_size": 4}


def _json(capsys, *argv):
    rc, out, err = _run(capsys, *argv, "--format", "json")
    assert rc == 0, err
    return json.loads(out)


def _spec_config(tmp_path):
    """The spec and the DeepSpeed JSON the spec form estimates it with (resolve_spec's plan)."""
    from dstoolkit.generate.planner import resolve_spec
    from dstoolkit.models.resolve import resolve_spec_model
    from dstoolkit.spec import load_spec

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(SPEC)
    spec = load_spec(spec_path)
    plan = resolve_spec(spec, resolve_spec_model(spec), ()).plan
    assert plan.ulysses == 4 and plan.ds_config["sequence_parallel_size"] == 4
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(plan.ds_config))
    return spec_path, cfg


def test_flag_form_estimates_the_spec_forms_run_from_its_config(tmp_path, capsys):
    spec_path, cfg = _spec_config(tmp_path)
    by_spec = _json(capsys, spec_path)
    by_flags = _json(capsys, "--config", cfg, *FLAGS)  # before: exit 2, the triad checked at dp 32
    assert by_flags["parallel"] == by_spec["parallel"] == {"dp": 8, "micro_batch": 1, "grad_accum": 2,
                                                            "zero_stage": 3}
    for key in ("memory_per_rank_bytes", "comm_bytes_per_step", "step_time_s", "step_time_breakdown_s", "mfu", "fits",
                "tokens_per_step"):
        assert by_flags[key] == by_spec[key], key
    assert by_flags["comm_bytes_per_step"]["ulysses_all_to_all"] > 0


def test_config_without_train_batch_size_is_no_longer_estimated_at_ulysses_1(tmp_path, capsys):
    sp4 = tmp_path / "sp4.json"
    sp4.write_text(json.dumps(SP4))
    sp1 = tmp_path / "sp1.json"
    sp1.write_text(json.dumps({k: v for k, v in SP4.items() if k != "sequence_parallel_size"}))
    with_sp, without = _json(capsys, "--config", sp4, *FLAGS), _run(capsys, "--config", sp1, *FLAGS, "--format",
                                                                     "json")[1]
    without = json.loads(without)
    assert with_sp["parallel"]["dp"] == 8 and without["parallel"]["dp"] == 32  # before: both 32
    assert with_sp["tokens_per_step"] == 32768 * 2 * 8  # micro 1 x accum 2 x dp 8 sequences
    assert "ulysses_all_to_all" in with_sp["comm_bytes_per_step"]
    assert "ulysses_all_to_all" not in without["comm_bytes_per_step"]
    # the estimator core's own figures for this run at Ulysses 4 (the RunPlan field the spec form sets)
    from dstoolkit.estimate import estimate_run
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models import get_preset
    from dstoolkit.runplan import RunPlan

    core = estimate_run(RunPlan(shape=get_preset("llama-3-8b"), ds_config=SP4, world_size=32, gpus_per_node=8,
                                gpu=get_gpu("H100-SXM"), seq_len=32768, ulysses=4, precision="bf16"))
    assert with_sp["memory_per_rank_bytes"]["total"] == core.memory.total
    assert with_sp["comm_bytes_per_step"] == dict(core.comm_bytes_per_step)
    assert with_sp["fits"] is True and without["fits"] is False  # before: both "does not fit" (262.70 GiB)
    rc, out, _ = _run(capsys, "--config", sp4, *FLAGS)
    assert rc == 0
    assert "32 x H100-SXM, tp=1 pp=1 ep=1 ulysses=4 dp=8; ZeRO-3" in out.splitlines()[0]


def test_ulysses_with_megatron_sequence_parallel_is_refused_naming_both(tmp_path, capsys):
    sp4 = tmp_path / "sp4.json"
    sp4.write_text(json.dumps(SP4))
    rc, out, err = _run(capsys, "--config", sp4, *FLAGS, "--tp", "2", "--sequence-parallel")
    assert (rc, out) == (2, "")
    # the config's key and value and the flag, named as the layout rule's message names them (its fix text is
    # dstoolkit.layout's)
    assert err.startswith(f"dstoolkit estimate: error: {sp4}: sequence_parallel_size=4 with --sequence-parallel: "
                          "DeepSpeed-Ulysses and Megatron sequence parallelism do not combine")
    assert err.endswith("layout rule LY023, `dstoolkit validate --explain LY023`)\n") and err.count("\n") == 1


def test_seq_len_that_does_not_split_over_the_ulysses_ranks_is_refused(tmp_path, capsys):
    sp4 = tmp_path / "sp4.json"
    sp4.write_text(json.dumps(SP4))
    rc, out, err = _run(capsys, "--config", sp4, *FLAGS, "--seq-len", "32770")
    assert (rc, out) == (2, "")
    assert err == (f"dstoolkit estimate: error: --seq-len=32770 does not split over {sp4}: sequence_parallel_size=4 "
                   "DeepSpeed-Ulysses ranks (use a seq_len divisible by 4; layout rule LY019, "
                   "`dstoolkit validate --explain LY019`)\n")
