"""`dstoolkit schema [-o FILE]`: write the JSON Schema of the DeepSpeed config (for editors and CI). ``-o -`` is
stdout, as no -o.

The committed copy lives at ds_configs/schema/deepspeed_config.schema.json; a test regenerates it and fails
on any difference. VS Code: ``"json.schemas": [{"fileMatch": ["*ds_config*.json", "ds_configs/**/*.json"],
"url": "./ds_configs/schema/deepspeed_config.schema.json"}]``.
"""
from __future__ import annotations

import os
import sys

from dstoolkit.cli.options import EXIT_OK, InputError, add_force_flag, add_out_flag, exit_map
from dstoolkit.common.atomic import atomic_write_text as write_atomic  # cli/resolve.py imports it from here
from dstoolkit.common.atomic import check_output_path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("schema", help="write the DeepSpeed config JSON Schema",
                              description="Print (or write with -o) the JSON Schema generated from dstoolkit.dsconfig.")
    add_out_flag(p, metavar="FILE", help="write here instead of stdout ('-': stdout)", dest="output")
    add_force_flag(p, help="overwrite FILE when it exists with different content")
    p.set_defaults(run=run)


@exit_map("schema")
def run(args) -> int:
    # start-up time: `dstoolkit --help` imports every verb module; this loads when the verb runs
    from dstoolkit.dsconfig.export import schema_text

    to_file = bool(args.output) and args.output != "-"  # "-": stdout, the convention
    flag = f"-o {args.output}"
    if to_file:  # a folder, a path under a file, an unwritable one: refused first, naming -o (common.atomic)
        check_output_path(args.output, name=flag, suggest="deepspeed_config.schema.json")
    text = schema_text()
    if not to_file:
        sys.stdout.write(text)
        return EXIT_OK
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8", errors="replace") as fh:
            if fh.read() == text:
                print(f"{args.output}: up to date", file=sys.stderr)
                return EXIT_OK
        if not args.force:
            raise InputError(f"{args.output} exists and differs; pass --force to overwrite")
    write_atomic(args.output, text, name=flag)
    print(f"wrote {args.output}", file=sys.stderr)
    return EXIT_OK
