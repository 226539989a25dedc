"""dstoolkit/cli/options.py: the one error -> exit-code map, and the flags every verb shares."""
import argparse
import json
import subprocess
import sys
from typing import get_args

import pytest

from dstoolkit.cli import build_parser, main
from dstoolkit.cli.options import (CHECKPOINT_POLICIES, EXIT_FINDINGS, EXIT_INPUT, EXIT_OK, FORMAT_CHOICES, InputError,
                                   exit_map, positive_int)

# ------------------------------------------------------------------------------------------------------------
# The exit map
# ------------------------------------------------------------------------------------------------------------


def _spec_error():
    from dstoolkit.spec.errors import SpecError, SpecFinding

    return SpecError([SpecFinding(file="s.yaml", line=3, col=5, path="training.seq_len", problem="must be > 0",
                                  fix="set a positive sequence length")])


def _spec_load_error():
    from dstoolkit.generate.io import SpecLoadError

    return SpecLoadError("s.yaml:3:5: error: training.seq_len: must be > 0")


def _validation_error():
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    try:
        CheckpointPolicy(kind="bogus")
    except ValueError as exc:
        return exc
    raise AssertionError("CheckpointPolicy accepted kind='bogus'")


def _validator_error():
    from pydantic import BaseModel, field_validator

    class Plan(BaseModel):
        seq_len: int

        @field_validator("seq_len")
        @classmethod
        def _positive(cls, v: int) -> int:
            if v <= 0:
                raise ValueError(f"seq_len={v}: the sequence length must be > 0")
            return v

    try:
        Plan(seq_len=-5)
    except ValueError as exc:
        return exc
    raise AssertionError("the validator accepted seq_len=-5")


def _output_exists():
    from dstoolkit.generate.writer import OutputExistsError

    return OutputExistsError("out exists; pass --force")


def _tune_input_error():
    from dstoolkit.tune.space import TuneInputError

    return TuneInputError("--budget must be >= 1")


def _bench_input_error():
    from dstoolkit.runtime.bench.harness import BenchInputError

    return BenchInputError("no *.jsonl results in r/")


CASES = [
    ("input-error", lambda: InputError("--top must be >= 1 (got 0)"), EXIT_INPUT,
     "dstoolkit demo: error: --top must be >= 1 (got 0)"),
    ("value-error", lambda: ValueError("unknown model preset 'llama-9'"), EXIT_INPUT,
     "dstoolkit demo: error: unknown model preset 'llama-9'"),
    ("spec-error", _spec_error, EXIT_INPUT,
     "dstoolkit demo: error: s.yaml:3:5: training.seq_len: must be > 0 (set a positive sequence length)"),
    ("spec-load-error-verbatim", _spec_load_error, EXIT_INPUT, "s.yaml:3:5: error: training.seq_len: must be > 0"),
    ("pydantic-first-error", _validation_error, EXIT_INPUT, "dstoolkit demo: error: kind: Input should be"),
    # a validator's own message, without pydantic's "Value error, " prefix
    ("pydantic-validator-error", _validator_error, EXIT_INPUT,
     "dstoolkit demo: error: seq_len: seq_len=-5: the sequence length must be > 0\n"),
    ("tune-input", _tune_input_error, EXIT_INPUT, "dstoolkit demo: error: --budget must be >= 1"),
    ("bench-input", _bench_input_error, EXIT_INPUT, "dstoolkit demo: error: no *.jsonl results in r/"),
    ("output-exists", _output_exists, EXIT_INPUT, "dstoolkit demo: error: out exists; pass --force"),
    ("os-error", lambda: FileNotFoundError(2, "No such file or directory", "x.json"), EXIT_INPUT,
     "dstoolkit demo: error: x.json: No such file or directory"),
    ("missing-package", lambda: ModuleNotFoundError("No module named 'optuna'", name="optuna.samplers"), EXIT_INPUT,
     "dstoolkit demo: error: optuna is not installed: dstoolkit demo needs dstoolkit[tune]: pip install 'dstoolkit[tune]'"),
]


@pytest.mark.parametrize("make, code, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_exit_map_turns_known_errors_into_one_message_and_a_code(capsys, make, code, message):
    exc = make()

    @exit_map("demo")
    def run(args):
        raise exc

    assert run(argparse.Namespace()) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message), captured.err
    assert captured.err.count("\n") == 1  # one line
    assert "Traceback" not in captured.err


def test_exit_map_failures_are_exit_1_and_return_values_pass_through(capsys):
    @exit_map("demo", failures=(RuntimeError,))
    def failing(args):
        raise RuntimeError("rank 1 exited with code 3")

    assert failing(None) == EXIT_FINDINGS
    assert capsys.readouterr().err == "dstoolkit demo: failed: rank 1 exited with code 3\n"

    @exit_map("demo")
    def returning(args):
        return args

    assert returning(None) == EXIT_OK
    assert returning(EXIT_FINDINGS) == EXIT_FINDINGS
    assert returning.__name__ == "returning"


@pytest.mark.parametrize("exc", [KeyError("bug"), RuntimeError("bug"), KeyboardInterrupt(), SystemExit(3),
                                 ModuleNotFoundError("No module named 'dstoolkit.gone'", name="dstoolkit.gone")])
def test_exit_map_lets_bugs_and_interrupts_through(exc):
    @exit_map("demo")
    def run(args):
        raise exc

    with pytest.raises(type(exc)):
        run(None)


def test_exit_codes():
    assert (EXIT_OK, EXIT_FINDINGS, EXIT_INPUT) == (0, 1, 2)


@pytest.mark.parametrize("argv, needle", [
    (["sweep", "missing.yaml"], "missing.yaml: no such file (check the path)"),
    (["generate", "missing.yaml", "--out", "{tmp}/out"], "missing.yaml: no such file (check the path)"),
    (["generate", "{tmp}", "--out", "{tmp}/out"], "{tmp}: is a folder, not a file (give the spec's YAML file)"),
    (["sweep", "{tmp}"], "{tmp}: is a folder, not a file"),
    (["estimate", "{tmp}"], "dstoolkit estimate: error: {tmp}: is a folder, not a file"),
    (["tune", "{tmp}", "--budget", "1", "-o", "{tmp}/t"], "dstoolkit tune: error: {tmp}: is a folder, not a file"),
    (["tune", "{tmp}/nope.yaml", "--budget", "1", "-o", "{tmp}/t"],
     "dstoolkit tune: error: {tmp}/nope.yaml: no such file (check the path)"),
    (["estimate", "--config", "{tmp}/nope.json", "--model", "tiny", "--world-size", "2"],
     "dstoolkit estimate: error: --config"),
    (["resolve", "{tmp}/nope.json", "-o", "{tmp}/r.json", "--world-size", "2"],
     "dstoolkit resolve: error: {tmp}/nope.json: no such file"),
    (["schema", "--output", "{tmp}"], "dstoolkit schema: error: -o {tmp}: is a folder, not a file, so no file "
     "can be written in its place; give the path of the file to write"),
    (["fp8", "plan", "llama-9"], "dstoolkit fp8 plan: error:"),
    (["report", "{tmp}"], "dstoolkit report: error:"),
    (["train", "--spec", "{tmp}/s.yaml", "--config", "{tmp}/ds.json", "--steps", "1"],
     "dstoolkit train: error: --spec {tmp}/s.yaml: no such file"),
    (["train", "--spec", "{tmp}", "--config", "{tmp}/ds.json", "--steps", "1"],
     "dstoolkit train: error: --spec {tmp}: is a folder, not a file"),
    (["resolve", "{tmp}", "-o", "{tmp}/r.json", "--world-size", "2"], "dstoolkit resolve: error: {tmp}: is a folder, not a file"),
])
def test_bad_input_through_each_verb_is_exit_2_without_traceback(tmp_path, capsys, argv, needle):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == EXIT_INPUT
    err = capsys.readouterr().err
    assert needle.replace("{tmp}", str(tmp_path)) in err
    assert "Traceback" not in err


def test_options_module_is_stdlib_only():
    code = ("import sys, dstoolkit.cli.options; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core', 'torch', 'yaml')"
            " or (m.startswith('dstoolkit.') and m not in ('dstoolkit.cli', 'dstoolkit.cli.options',"
            " 'dstoolkit.common', 'dstoolkit.common.extras'))))")  # extras: stdlib only, the extra names
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ------------------------------------------------------------------------------------------------------------
# Shared flags
# ------------------------------------------------------------------------------------------------------------


def _leaf_parsers(parser: argparse.ArgumentParser, prefix: tuple = ()):
    """(verb path, parser) for every runnable (sub)command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for action in subs:
        for name, sub in action.choices.items():
            yield from _leaf_parsers(sub, prefix + (name,))


LEAVES = dict((" ".join(path), p) for path, p in _leaf_parsers(build_parser()))


def _option(parser: argparse.ArgumentParser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


WITH_FORMAT = {"validate", "resolve", "generate", "sweep", "estimate", "fp8 plan", "bench comm", "bench overlap",
               "bench train", "report", "train", "tune", "ckpt inspect"}


def test_every_verb_that_prints_a_table_has_the_same_format_flag():
    # schema prints the JSON Schema itself; ckpt reshard / export write a folder and print where
    assert set(LEAVES) == WITH_FORMAT | {"schema", "ckpt reshard", "ckpt export"}
    for verb in WITH_FORMAT:
        action = _option(LEAVES[verb], "--format")
        assert action is not None, verb
        assert tuple(action.choices) == FORMAT_CHOICES and action.default == "text", verb
        assert action.type("json") == "json" and action.type("table") == "text", verb


@pytest.mark.parametrize("verb", sorted(WITH_FORMAT))
def test_every_verb_with_format_accepts_json(verb):
    path = verb.split()
    parser = build_parser(path[0])
    required = {"validate": ["x.json"], "resolve": ["c.json", "-o", "o.json", "--world-size", "2"],
                "generate": ["s.yaml", "--out", "d"], "sweep": ["s.yaml"], "estimate": [], "fp8 plan": ["tiny"],
                "bench comm": [], "bench overlap": ["c.json"], "bench train": ["c.json"], "report": ["r"],
                "train": ["--spec", "s.yaml", "--config", "c.json", "--steps", "1"],
                "tune": ["s.yaml", "--budget", "1", "--out", "d"], "ckpt inspect": ["ck"]}[verb]
    args = parser.parse_args([*path, *required, "--format", "json"])
    assert args.format == "json"
    assert parser.parse_args([*path, *required, "--format", "table"]).format == "text"
    with pytest.raises(SystemExit):
        parser.parse_args([*path, *required, "--format", "yaml"])


def test_shared_flags_are_spelled_and_typed_once():
    for verb, parser in LEAVES.items():
        world = _option(parser, "--world-size")
        if world is not None:
            assert world.type is positive_int and world.dest == "world_size", verb
        for flag in ("--gpus-per-node", "--tp", "--pp", "--ep"):
            action = _option(parser, flag)
            if action is not None:
                assert action.type is positive_int, (verb, flag)
        out = _option(parser, "--out") or _option(parser, "--output") or _option(parser, "-o")
        if out is not None:
            assert set(out.option_strings) == {"-o", "--out", "--output"}, verb
        force = _option(parser, "--force")
        if force is not None:
            assert isinstance(force, argparse._StoreTrueAction), verb
    assert _option(LEAVES["bench train"], "--num-gpus") is _option(LEAVES["bench train"], "--world-size")


def test_checkpoint_policies_are_the_specs():
    from dstoolkit.spec.checkpoint import PolicyKind
    from dstoolkit.spec.model import TrainingSpec

    assert CHECKPOINT_POLICIES == get_args(PolicyKind)
    spec_values = get_args(TrainingSpec.model_fields["activation_checkpointing"].annotation)
    assert set(spec_values) == set(CHECKPOINT_POLICIES) | {"auto"}  # auto: the generator/sweep picks one
    assert tuple(_option(LEAVES["estimate"], "--checkpoint").choices) == CHECKPOINT_POLICIES


@pytest.fixture
def ds_json(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}))
    return cfg


def _activations(capsys, cfg, *extra) -> int:
    rc = main(["estimate", "--config", str(cfg), "--model", "tiny", "--world-size", "2", "--seq-len", "128",
               "--calibration", "none", "--format", "json", *extra])
    assert rc == EXIT_OK, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)["memory_per_rank_bytes"]["activations"]


def test_estimate_accepts_checkpoint_ratio(capsys, ds_json):
    none = _activations(capsys, ds_json, "--checkpoint", "none")
    half = _activations(capsys, ds_json, "--checkpoint", "ratio", "--checkpoint-ratio", "0.5")
    full = _activations(capsys, ds_json, "--checkpoint", "full")
    assert full < half < none
    # like the spec's checkpoint_ratio, the ratio defaults to 1.0: every block, the same as full
    assert _activations(capsys, ds_json, "--checkpoint", "ratio") == full


def test_estimate_checkpoint_ratio_needs_the_ratio_policy(capsys, ds_json):
    rc = main(["estimate", "--config", str(ds_json), "--model", "tiny", "--world-size", "2",
               "--checkpoint", "full", "--checkpoint-ratio", "0.5"])
    assert rc == EXIT_INPUT
    assert "--checkpoint-ratio is only used with --checkpoint ratio" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--config", str(ds_json), "--model", "tiny", "--world-size", "2",
              "--checkpoint", "ratio", "--checkpoint-ratio", "1.5"])
    assert exc.value.code == EXIT_INPUT
