"""What every verb of `dstoolkit` shares: the exit codes, the error -> exit-code map, and flag definitions.

* Exit codes: ``EXIT_OK`` (0) ok, ``EXIT_FINDINGS`` (1) the command ran and found problems (errors in a
  config, nothing fits, a failed run), ``EXIT_INPUT`` (2) usage or input error. argparse itself exits 2 on
  usage errors; ``EXIT_INTERRUPTED`` (130) is Ctrl-C, ``EXIT_TERMINATED`` (143) SIGTERM (``exit_for_signal``).
* ``exit_map(verb)`` wraps a verb's ``run(args)``: input problems (``InputError`` and every other
  ``ValueError`` - ``SpecError``, ``SpecLoadError``, ``TuneInputError``, ``BenchInputError``, pydantic's
  ``ValidationError`` ... -, ``OSError``, a missing optional package, an existing output folder) become one
  message on stderr and ``EXIT_INPUT``, never a traceback. Anything else is a bug and propagates.
* ``add_*_flags`` / ``add_*_flag``: a flag used by more than one verb is spelled, typed and checked here once.

Stdlib only: `dstoolkit validate` imports this module and must start fast (no pydantic, no torch).
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Any, Callable, Optional, Sequence

from dstoolkit.common.extras import missing_extra_message, require_verb_extra

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""128 + SIGTERM (15), the shell's convention: `tune` and `train` stopped by SIGTERM (kill, a scheduler)."""


def exit_for_signal(signum: int) -> int:
    """The exit code of a command stopped by a signal: 128 + its number (SIGINT -> EXIT_INTERRUPTED, SIGTERM ->
    EXIT_TERMINATED)."""
    return 128 + int(signum)

# ----------------------------------------------------------------------------------------------------------
# Errors -> exit codes
# ----------------------------------------------------------------------------------------------------------


class InputError(ValueError):
    """Bad input a verb found itself; printed as ``dstoolkit VERB: error: MESSAGE``, exit ``EXIT_INPUT``."""


# Exceptions whose message already says where and what (``FILE:LINE:COL: error: ...``): printed as they are.
# (module, class name): looked up in sys.modules only, so this module imports none of them; an exception
# of a class whose module was never imported cannot have been raised.
_VERBATIM: tuple[tuple[str, str], ...] = (
    ("dstoolkit.generate.io", "SpecLoadError"),
)
# Input errors that are not ValueErrors.
_INPUT_EXTRA: tuple[tuple[str, str], ...] = (
    ("dstoolkit.generate.writer", "OutputExistsError"),
)


def _is_instance(exc: BaseException, names: Sequence[tuple[str, str]]) -> bool:
    for module, name in names:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def validation_error_text(exc: BaseException) -> Optional[str]:
    """``loc: msg`` of a pydantic ValidationError's first error (pydantic's own text spans many lines, and it
    prefixes a validator's own message with "Value error, "); None for any other exception."""
    core = sys.modules.get("pydantic_core")
    cls = getattr(core, "ValidationError", None)
    if not (isinstance(cls, type) and isinstance(exc, cls)):
        return None
    errors = exc.errors()  # type: ignore[attr-defined]
    if not errors:
        return str(exc)
    return pydantic_error_text(errors[0])


def pydantic_error_text(error: dict, loc_prefix: str = "") -> str:
    """``loc: msg`` of one entry of a pydantic ValidationError's errors(), `loc_prefix` before its location, without
    the "Value error, " pydantic puts before a validator's own message."""
    loc = ".".join(str(x) for x in error.get("loc", ()))
    return f"{loc_prefix + loc + ': ' if loc else ''}{str(error.get('msg', '')).removeprefix('Value error, ')}"


def error_message(verb: str, message: str) -> str:
    """The one error line format: ``dstoolkit VERB: error: MESSAGE``."""
    return f"dstoolkit {verb}: error: {message}"


def input_error(verb: str, message: str) -> int:
    """Print ``dstoolkit VERB: error: MESSAGE`` on stderr and return ``EXIT_INPUT``."""
    print(error_message(verb, message), file=sys.stderr)
    return EXIT_INPUT


def exit_code_for(verb: str, exc: BaseException,
                  failures: tuple[type[BaseException], ...] = ()) -> Optional[tuple[int, str]]:
    """(exit code, stderr text) for a known kind of exception, or None for anything else (a bug).

    `failures`: exception types that mean "the command ran and failed" for this verb (exit ``EXIT_FINDINGS``,
    ``dstoolkit VERB: failed: MESSAGE``), e.g. RuntimeError from a benchmark's ranks.
    """
    if isinstance(exc, BrokenPipeError):
        return None  # stdout's reader went away (`| head`): the entry point (`dstoolkit.cli.main`) ends quietly
    if failures and isinstance(exc, failures):
        return EXIT_FINDINGS, f"dstoolkit {verb}: failed: {exc}"
    if _is_instance(exc, _VERBATIM):
        return EXIT_INPUT, str(exc)
    text = validation_error_text(exc)
    if text is not None:
        return EXIT_INPUT, error_message(verb, text)
    top = (getattr(exc, "name", None) or "").split(".")[0]
    if isinstance(exc, ModuleNotFoundError) and top and top != __name__.split(".")[0]:
        # an optional dependency; a missing dstoolkit module is a bug and keeps its traceback
        return EXIT_INPUT, error_message(verb, missing_extra_message(verb, top))
    if isinstance(exc, OSError):
        what = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else (exc.strerror or str(exc))
        return EXIT_INPUT, error_message(verb, what)
    if isinstance(exc, ValueError) or _is_instance(exc, _INPUT_EXTRA):
        return EXIT_INPUT, error_message(verb, str(exc))
    return None


def exit_map(verb: str, *, failures: tuple[type[BaseException], ...] = ()) -> Callable:
    """Decorator for a verb's ``run(args) -> int``: the one place exceptions become exit codes.

    ``run`` returns an exit code (None = ``EXIT_OK``); a known exception (see `exit_code_for`) prints its
    message on stderr and returns its code. KeyboardInterrupt and SystemExit pass through (the dispatcher
    turns Ctrl-C into ``EXIT_INTERRUPTED``); any other exception is a bug and keeps its traceback.
    """
    def wrap(body: Callable[[Any], Optional[int]]) -> Callable[[Any], int]:
        @functools.wraps(body)
        def run(args) -> int:
            try:
                require_verb_extra(verb)  # a core-only install names the extra, before anything is launched
                rc = body(args)
            except Exception as exc:  # noqa: BLE001 - filtered by exit_code_for, re-raised when unknown
                known = exit_code_for(verb, exc, failures)
                if known is None:
                    raise
                code, text = known
                print(text, file=sys.stderr)
                return code
            return EXIT_OK if rc is None else int(rc)

        return run

    return wrap


# ----------------------------------------------------------------------------------------------------------
# Argument types
# ----------------------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    """argparse type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0 (e.g. fp8 plan's --skip-first)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def unit_fraction(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {value}")
    return value


def add_training_plan_flags(p: argparse.ArgumentParser) -> None:
    """--tokens / --gpu-hour-price: the time and cost to train (`dstoolkit.estimate.training_plan`). Parsed there
    (`parse_token_count`, `check_gpu_hour_price`), so every verb gives the same error for the same bad value."""
    p.add_argument("--tokens", metavar="N", default=None,
                   help="tokens to train (14.8T, 300B, 2e12): adds steps, wall time and GPU-hours, the spec's "
                        "batch ramp counted step by step")
    p.add_argument("--gpu-hour-price", type=float, default=None, metavar="PRICE",
                   help="price per GPU-hour (e.g. 2.0; with --tokens): adds the cost, in the price's currency")


FORMATS = ("text", "json")
"""What ``args.format`` holds after parsing."""
_FORMAT_ALIASES = {"table": "text"}
"""Other names a user may type: ``table`` is another name for ``text`` (the older spelling of most verbs)."""
FORMAT_CHOICES = FORMATS + tuple(_FORMAT_ALIASES)
"""What --format accepts and its help lists: FORMATS and the aliases."""


def _format(text: str) -> str:
    return _FORMAT_ALIASES.get(text, text)


# ----------------------------------------------------------------------------------------------------------
# Shared flags
# ----------------------------------------------------------------------------------------------------------


def add_format_flag(p: argparse.ArgumentParser, help: str = "output format (default: text; table is the same as text)"
                    ) -> None:
    """``--format text|table|json`` (``table`` = ``text``); ``args.format`` is always ``"text"`` or ``"json"``:
    argparse converts with ``type`` before it checks ``choices``, so the listed alias arrives as its target."""
    p.add_argument("--format", type=_format, choices=FORMAT_CHOICES, default="text", help=help)


class _RecordSpelling(argparse.Action):
    """Store the value, and in `<dest>_flag` the option string it was given under (--world-size or an alias)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_flag", option_string)


def add_world_flags(p: argparse.ArgumentParser, *, world_size: bool = True, gpus_per_node: bool = True,
                    required: bool = False, default: Optional[int] = None, aliases: Sequence[str] = (),
                    world_help: str = "total ranks (GPUs)",
                    gpus_per_node_help: str = "GPUs (ranks) per node") -> None:
    """``--world-size N`` and ``--gpus-per-node G``, both positive integers. With `aliases`, ``world_size_flag``
    holds the spelling the user typed (None when none was), for messages that name the flag back."""
    if world_size:
        p.add_argument("--world-size", *aliases, dest="world_size", type=positive_int, required=required,
                       default=default, metavar="N", help=world_help,
                       action=_RecordSpelling if aliases else "store")
        if aliases:
            p.set_defaults(world_size_flag=None)
    if gpus_per_node:
        p.add_argument("--gpus-per-node", type=positive_int, default=None, metavar="G", help=gpus_per_node_help)


PARALLEL_HELP = {"tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "ep": "expert-parallel degree"}


def add_parallel_flags(p: argparse.ArgumentParser, dims: Sequence[str] = ("tp", "pp"), *,
                       default: Optional[int] = 1, help_suffix: str = "") -> None:
    """``--tp T`` / ``--pp P`` / ``--ep E`` (those in `dims`), positive integers."""
    for dim in dims:
        shown = f" (default {default})" if default is not None else ""
        p.add_argument(f"--{dim}", type=positive_int, default=default, metavar=dim[0].upper(),
                       help=PARALLEL_HELP[dim] + shown + help_suffix)


def add_out_flag(p: argparse.ArgumentParser, *, required: bool = False, metavar: str = "PATH",
                 help: str = "where to write", dest: str = "out") -> None:
    """``-o/--out/--output PATH`` (every verb that writes accepts all three spellings)."""
    p.add_argument("-o", "--out", "--output", dest=dest, required=required, default=None, metavar=metavar, help=help)


def add_force_flag(p: argparse.ArgumentParser, help: str = "overwrite existing output") -> None:
    """``--force``: replace existing output instead of refusing."""
    p.add_argument("--force", action="store_true", help=help)


MODEL_HELP = ("model preset name, a Hugging Face config.json, or your own module as package.module:callable "
              "(a function returning an nn.Module, or an nn.Module class; see --model-kwargs)")


def add_model_class_flag(p: argparse.ArgumentParser, *, spec: bool = False, model_arg: str = "--model") -> None:
    """``--model-class CLASS``: the transformers class to build an HF config with (a model_type transformers
    does not know, e.g. kimi_k2 -> DeepseekV3ForCausalLM). With ``spec=True`` it sets the spec's
    model.model_class (hf_config or inline fields) for this run. `model_arg`: how the verb takes the model (fp8
    plan: its positional SPEC|MODEL)."""
    where = "the spec's hf_config / inline model (as model.model_class)" if spec else f"{model_arg} config.json"
    p.add_argument("--model-class", metavar="CLASS", default=None,
                   help=f"build {where} with this transformers class, e.g. DeepseekV3ForCausalLM for a kimi_k2 config")


def add_model_kwargs_flag(p: argparse.ArgumentParser, *, model_arg: str = "--model") -> None:
    """``--model-kwargs JSON``: keyword arguments for ``MODEL_ARG package.module:callable``."""
    p.add_argument("--model-kwargs", metavar="JSON", default=None,
                   help=f"""with {model_arg} package.module:callable: its keyword arguments as a JSON object, """
                        """e.g. '{"d": 256}'""")


DEFAULT_DEEPSPEED_VERSION = "0.19"


def add_deepspeed_version_flag(p: argparse.ArgumentParser) -> None:
    """``--deepspeed-version V`` (checked by `dstoolkit.dsconfig.versions.normalize_version` when used)."""
    p.add_argument("--deepspeed-version", default=DEFAULT_DEEPSPEED_VERSION, metavar="V",
                   help=f"DeepSpeed release to check against: {DEFAULT_DEEPSPEED_VERSION} (default) or 0.16")


CALIBRATION_AUTO = "auto"
"""--calibration's word for the verb's default: the spec's own calibration (cluster.calibration, else
DSTOOLKIT_CALIBRATION, else this machine's for gpu: cpu, else the hardware table's nominal rates:
`dstoolkit.hardware.calibration.calibration_path` given no value)."""


def calibration_arg(text: str) -> Optional[str]:
    """--calibration's value, one parser for every verb: None for 'auto' (any case; `CALIBRATION_AUTO`: what the
    flag left out means), else the text as given (a calibration file, or a word `dstoolkit.hardware.calibration`
    reads: none / reference / machine)."""
    return None if str(text).strip().lower() == CALIBRATION_AUTO else text


def add_calibration_flag(p: argparse.ArgumentParser, *, words: Sequence[str] = ("reference", "machine"),
                         help: str = "") -> None:
    """``--calibration FILE.json|auto|...|none`` (measured rates for step-time estimates; ``auto``, the default: the
    spec's own calibration; ``none``: the hardware table's nominal rates), read by `calibration_arg`. `words`: the
    other words the verb takes."""
    metavar = "|".join(("FILE.json", CALIBRATION_AUTO, *words, "none"))
    p.add_argument("--calibration", metavar=metavar, type=calibration_arg, default=None,
                   help=help or "measured rates for the step-time estimate (a calibration JSON), or none")


CHECKPOINT_POLICIES = ("none", "full", "every-k", "ratio", "selective")
"""Every concrete recompute policy of TrainingSpec.activation_checkpointing (its "auto" is a choice the
generator or sweep makes, not a policy); a test checks this against dstoolkit.spec.checkpoint.PolicyKind."""


def add_checkpoint_flags(p: argparse.ArgumentParser, *, default: str = "none") -> None:
    """``--checkpoint POLICY`` with ``--every-k K`` (every-k) and ``--checkpoint-ratio R`` (ratio), as the
    spec's activation_checkpointing / checkpoint_every_k / checkpoint_ratio."""
    p.add_argument("--checkpoint", choices=CHECKPOINT_POLICIES, default=default,
                   help="activation recompute policy (as training.activation_checkpointing)")
    p.add_argument("--every-k", type=positive_int, default=2, metavar="K",
                   help="with --checkpoint every-k: recompute one block in k (default 2)")
    p.add_argument("--checkpoint-ratio", type=unit_fraction, default=None, metavar="R",
                   help="with --checkpoint ratio: fraction of blocks recomputed, from the first (default 1.0)")


def checkpoint_policy(args):
    """The `CheckpointPolicy` for the flags of `add_checkpoint_flags`.

    Raises:
        InputError: --checkpoint-ratio given with a policy other than ratio.
    """
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    kind = args.checkpoint
    ratio = getattr(args, "checkpoint_ratio", None)
    if ratio is not None and kind != "ratio":
        raise InputError(f"--checkpoint-ratio is only used with --checkpoint ratio (got --checkpoint {kind})")
    if kind == "every-k":
        return CheckpointPolicy(kind="every-k", every_k=args.every_k)
    if kind == "ratio":
        return CheckpointPolicy(kind="ratio", ratio=1.0 if ratio is None else ratio)
    return CheckpointPolicy(kind=kind)


TARGET_NAMES = ("deepspeed", "megatron-lm", "megatron-deepspeed", "hf", "accelerate")
"""Launchers `--target` accepts, spelled out so that building a parser imports nothing (tests hold it equal to
dstoolkit.generate.targets.KNOWN_TARGETS)."""


def add_target_flag(p: argparse.ArgumentParser) -> None:
    """`--target T` (repeatable): only the layouts these launchers run (sweep, estimate; generate has its own)."""
    p.add_argument("--target", action="append", default=None, choices=TARGET_NAMES, metavar="TARGET",
                   help=f"launcher(s) the layout is for (repeatable): {', '.join(TARGET_NAMES)}; default: the "
                        "spec's targets, else every layout")


def targets_of(args, spec) -> tuple:
    """--target, else the spec's `targets` list (empty: no restriction)."""
    given = getattr(args, "target", None) or list(getattr(spec, "targets", None) or [])
    return tuple(dict.fromkeys(given))

