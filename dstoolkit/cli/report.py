"""`dstoolkit report RESULTS_DIR`: markdown tables and PNG plots rendered from benchmark JSON Lines results."""
from __future__ import annotations

import json
import sys

from dstoolkit.cli.options import EXIT_OK, add_force_flag, add_format_flag, add_out_flag, exit_map


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="render benchmark results (*.jsonl) into markdown tables and PNG plots",
                              description=__doc__.splitlines()[0])
    p.add_argument("results_dir", metavar="RESULTS_DIR", help="folder holding the *.jsonl files written by `dstoolkit bench`")
    add_out_flag(p, metavar="REPORT.md", help="markdown file to write (default RESULTS_DIR/report.md)")
    p.add_argument("--include", default="*.jsonl", metavar="GLOB",
                   help="only result files matching these comma-separated globs (e.g. 'comm_*.jsonl,train_*.jsonl'); default *.jsonl")
    add_force_flag(p, help="replace an existing report (the JSONL files are never touched)")
    add_format_flag(p, help="text (or table): print the markdown; json: print what was written")
    p.set_defaults(run=run)


@exit_map("report")  # BenchInputError (no results, report exists): exit 2
def run(args) -> int:
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.bench.report_render import render_report

    res = render_report(args.results_dir, out=args.out, force=args.force, pattern=args.include)
    for s in res.skipped:  # left out of the tables: said here, and listed at the end of the report
        print(f"dstoolkit report: warning: left out {s}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"markdown": str(res.markdown_path), "plots": [str(p) for p in res.plots], "counts": res.counts,
                          "skipped": res.skipped}))
    else:
        print(res.markdown)
        print(f"wrote {res.markdown_path} and {len(res.plots)} plot(s)"
              + (f"; left out {len(res.skipped)} line(s), listed above" if res.skipped else ""), file=sys.stderr)
    return EXIT_OK
