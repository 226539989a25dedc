"""`dstoolkit bench comm|overlap|train`: measure collectives, compute/comm overlap and training throughput.

`dstoolkit bench train CONFIG... -- COMMAND...` runs the user's own launch for each config (placeholders as in
`dstoolkit tune`, see dstoolkit/runtime/bench/usercmd.py).

Results are appended to JSON Lines files (``--out``); `dstoolkit report DIR` renders tables and plots from them.
torch/deepspeed are imported only inside `run`.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_OK, InputError, add_calibration_flag, add_format_flag,
                                   add_out_flag, add_world_flags, exit_map)
from dstoolkit.cli.tune import accept_command
from dstoolkit.common.atomic import check_output_path
from dstoolkit.runtime.bench.results_jsonl import check_results_file


def _add_common(p: argparse.ArgumentParser) -> None:
    add_out_flag(p, metavar="FILE.jsonl",
                 help="append result records to this JSON Lines file (never overwritten; an interrupted run resumes)")
    p.add_argument("--no-resume", dest="resume", action="store_false",
                   help="start a new run even if the last run with the same config in --out was interrupted")
    add_format_flag(p)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars on stderr")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="kill the ranks after this many seconds (default 1800)")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmarks: collectives (comm), overlap, training throughput (train)",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="bench_kind", metavar="KIND")
    sub.required = True

    c = sub.add_parser("comm", help="collective bandwidth with nccl-tests columns (size count type time_us algbw busbw #wrong)")
    c.add_argument("--ops", default="all_reduce,all_gather,reduce_scatter,all_to_all,broadcast",
                   help="comma list of all_reduce, all_gather, reduce_scatter, all_to_all, broadcast (or 'all')")
    c.add_argument("--sizes", default="1K:256M", help="MIN:MAX[:FACTOR] (x2 steps) or a comma list; binary suffixes 1K=1024")
    c.add_argument("--dtype", default="float32", help="float32 | float16 | bfloat16 | float64 | int32 | int64 | int8 | uint8")
    c.add_argument("--iters", type=int, default=20, help="ops per timed repetition (nccl-tests -n; default 20)")
    c.add_argument("--warmup", type=int, default=5, help="untimed ops first (nccl-tests -w; default 5)")
    c.add_argument("--reps", type=int, default=5, help="timed repetitions per row: median and spread come from these (default 5)")
    c.add_argument("--time-budget-s", type=float, default=20.0,
                   help="per-row budget: iters shrinks for sizes that would take longer (default 20 s)")
    c.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl if CUDA is available, else gloo")
    add_world_flags(c, gpus_per_node=False, default=2,
                    world_help="ranks to launch on this node (ignored under torchrun/deepspeed, which set WORLD_SIZE)")
    _add_common(c)
    c.set_defaults(run=run)

    o = sub.add_parser("overlap", help="compute/communication overlap of real DeepSpeed engines (eta, slowdown)")
    o.add_argument("target", metavar="CONFIG|SPEC",
                   help="a DeepSpeed JSON config or a spec YAML (then every generated strategy is benched)")
    o.add_argument("--model", default="tiny", help="model preset or HF config.json for a JSON config (default: tiny)")
    o.add_argument("--strategy", action="append", default=None, help="with a SPEC: only these strategies (repeatable)")
    o.add_argument("--bucket-sizes", default="auto",
                   help="comma list of reduce_bucket_size values in elements (e.g. 5e5,2e6,5e8) or 'auto'")
    o.add_argument("--overlap", choices=("both", "on", "off"), default="both", help="overlap_comm settings to compare")
    o.add_argument("--steps", type=int, default=8, help="timed steps per measurement (default 8)")
    o.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    add_world_flags(o, gpus_per_node=False, default=2, world_help="ranks to launch (default 2)")
    o.add_argument("--backend", choices=("gloo", "nccl"), default=None)
    o.add_argument("--seq-len", type=int, default=None, help="override the spec's sequence length")
    o.add_argument("--micro-batch", type=int, default=None, help="override the config's micro batch")
    o.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the torch-profiler pass (it measures exposed comm directly and the compute slowdown)")
    _add_common(o)
    o.set_defaults(run=run)

    t = sub.add_parser("train", help="N real DeepSpeed steps per config through the deepspeed launcher, vs the estimate")
    t.add_argument("targets", nargs="+", metavar="CONFIG|SPEC|DIR",
                   help="DeepSpeed JSON configs, a spec YAML (all strategies generated from it), or generate output dirs")
    t.add_argument("--spec", default=None, help="spec YAML giving the model/cluster for JSON configs")
    t.add_argument("--steps", type=int, default=10, help="training steps per config (default 10)")
    t.add_argument("--skip-steps", type=int, default=2, help="first steps excluded from timing (warm-up; default 2)")
    add_world_flags(t, gpus_per_node=False, default=2, aliases=("--num-gpus", "--nproc"),
                    world_help="ranks per config through the deepspeed launcher (default 2); --world-size, "
                               "--num-gpus (the deepspeed launcher's word) and --nproc (dstoolkit train's) are one flag")
    t.add_argument("--strategy", action="append", default=None, help="with a SPEC: only these strategies (repeatable)")
    # bench's loader (runtime/bench/train_estimate.load_calibration) takes a file, auto or none
    add_calibration_flag(t, words=(),
                         help="measured rates for the estimate (dstoolkit.estimate.Calibration JSON); 'auto' "
                              "(default): the spec's own calibration, as estimate and tune use it (this machine's "
                              "for gpu: cpu); 'none': the hardware table")
    t.add_argument("--shrink", default=None, metavar="auto|KEY=N,...",
                   help="train each config's own transformers architecture shrunk to fit 2 CPU ranks "
                        "(dstoolkit.runtime.shrink; the batch is fitted to the ranks, the estimate is of the shrunk run)")
    _add_common(t)

    # `-- COMMAND...`: the user's own launch per config instead of the example trainer; placeholders as in
    # `dstoolkit tune` ({config}, {hf_config}, {accelerate_config}, {micro_batch}, {grad_accum}, {precision}...)
    accept_command(t)
    t.set_defaults(run=run)


def check_common(args) -> None:
    """The flags every bench shares, refused before any rank starts (exit 2): InputError; an --out that cannot be
    written (`dstoolkit.common.atomic.check_output_path`'s errors: under a path part that is a file, ending with a
    separator, '-', a link to nothing, an unwritable folder or file); an existing --out that is not a results file
    records may be appended to (`results_jsonl.check_results_file`: a user's JSON document, a text file)."""
    if not (args.timeout_s > 0 and math.isfinite(args.timeout_s)):
        raise InputError(f"--timeout-s {args.timeout_s}: must be a positive number of seconds (default 1800)")
    if args.out:
        out = Path(args.out)
        flag = f"--out {args.out}"
        if out.is_dir():
            raise InputError(f"{flag}: is a folder; pass the JSON Lines file to append to, e.g. "
                             f"--out {out / (args.bench_kind + '.jsonl')}")
        # a file in the path, --out new/, an unwritable folder: atomic's one wording (records are appended)
        check_output_path(args.out, name=flag, append=True, suggest=f"{args.bench_kind}.jsonl")
        check_results_file(out, name=flag)


@exit_map("bench", failures=(RuntimeError,))  # BenchInputError: exit 2; RuntimeError (a rank failed): exit 1
def run(args) -> int:
    check_common(args)
    if args.bench_kind == "comm":
        return _run_comm(args)
    if args.bench_kind == "overlap":
        # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
        from dstoolkit.runtime.bench import overlap

        return overlap.cli_run(args)
    if args.bench_kind == "train":
        # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
        from dstoolkit.runtime.bench import train

        return train.cli_run(args)
    raise InputError(f"unknown bench {args.bench_kind!r}")


def _default_backend() -> str:
    # optional extra (dstoolkit[train]): torch only when the verb runs, never at `dstoolkit --help`
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _run_comm(args) -> int:
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.bench import comm, comm_options

    opts = comm_options.CommOptions(
        ops=comm_options.parse_ops(args.ops),
        sizes=comm_options.parse_sizes(args.sizes),
        dtype=comm_options.parse_dtype(args.dtype),
        iters=args.iters,
        warmup=args.warmup,
        reps=args.reps,
        backend=args.backend or _default_backend(),
        world_size=args.world_size,
        out=args.out,
        resume=args.resume,
        time_budget_s=args.time_budget_s,
        timeout_s=args.timeout_s,
        progress=args.progress,
    )
    rows = comm.run_comm(opts)
    if not rows:  # non-zero ranks under a launcher print nothing
        return EXIT_OK
    if args.format == "json":
        print(comm.json_rows(rows))
    else:
        print(comm.format_table(rows))
    return EXIT_FINDINGS if any(int(r.get("#wrong", 0)) for r in rows) else EXIT_OK
