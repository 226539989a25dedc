"""`dstoolkit <verb>`: one module per verb under dstoolkit/cli/.

Each verb module defines ``add_parser(subparsers)`` and ``run(args) -> int`` and must import
torch/deepspeed only inside ``run`` so that ``dstoolkit validate`` starts fast.
Exit codes: 0 ok, 1 findings, 2 usage or input error.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Sequence

from dstoolkit import __version__

DESCRIPTION = """\
Know before you launch: check DeepSpeed configs (validate, resolve, schema),
generate them from a model + cluster + training spec (generate, sweep, tune),
estimate memory and step time (estimate, fp8), then run and measure (train,
bench, report, ckpt)."""
"""What `dstoolkit --help` opens with: what the verbs are for, for a user (the module docstring is for developers)."""
START_HERE = """\
start here:
  launch/demo.sh                      generate -> validate -> estimate -> a short real 2-rank DeepSpeed
                                      run on the bundled spec ds_configs/tiny_cpu.yaml (CPU is enough)
  dstoolkit validate ds_config.json --world-size 8
                                      check a config you already have before you queue it
  dstoolkit generate ds_configs/tiny_cpu.yaml -o out/tiny
                                      write configs and launchers from a spec (copy one under ds_configs/)
  dstoolkit VERB --help               one verb's flags; README.md and docs/ have an example of each

exit codes: 0 ok, 1 findings (errors in a config, nothing fits, ...), 2 usage or input error"""
"""The epilog of `dstoolkit --help` (tests/unit/test_s35_front_cli.py checks the paths it names exist)."""

# verb -> module. Order is the order shown in --help.
VERBS: dict[str, str] = {
    "validate": "dstoolkit.cli.validate",
    "schema": "dstoolkit.cli.schema",
    "resolve": "dstoolkit.cli.resolve",
    "generate": "dstoolkit.cli.generate",
    "sweep": "dstoolkit.cli.sweep",
    "estimate": "dstoolkit.cli.estimate",
    "fp8": "dstoolkit.cli.fp8",
    "bench": "dstoolkit.cli.bench",
    "report": "dstoolkit.cli.report",
    "train": "dstoolkit.cli.train",
    "tune": "dstoolkit.cli.tune",
    "ckpt": "dstoolkit.cli.ckpt",
}


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep the message on one line, no traceback."""


def _verb_modules(only: str | None = None):
    for verb, mod in VERBS.items():
        if only is not None and verb != only:
            continue
        if importlib.util.find_spec(mod) is None:  # TODO(#2): drop once every verb module exists
            continue
        yield verb, importlib.import_module(mod)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only=VERB``) one that knows just that verb: importing every verb
    module costs ~0.5 s that `dstoolkit validate` must not pay."""

    parser = _Parser(prog="dstoolkit", description=DESCRIPTION, epilog=START_HERE,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"dstoolkit {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb, module in _verb_modules(only):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `dstoolkit` command. Output piped into a reader that stops early (`dstoolkit sweep ... | head -1`) ends
    the command quietly with exit 0, as CPython's sysconfig CLI does (gh-110786): the BrokenPipeError is caught
    here, at the entry point, with stdout flushed inside the try and then pointed at /dev/null so that the flush
    at exit does not fail again (https://docs.python.org/3/library/signal.html#note-on-sigpipe; that note's
    example exits 1, which `set -o pipefail` reads as a failure of a command that did its work)."""
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # a reader that went away is seen here, not at interpreter exit
    except BrokenPipeError:
        _stdout_to_devnull()
        return 0


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null: what is still buffered for stdout is dropped at exit, not raised."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # a stdout without a descriptor (an embedding caller's, a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _dispatch(argv: Sequence[str] | None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    only = argv[0] if argv and argv[0] in VERBS else None
    parser = build_parser(only)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("dstoolkit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
