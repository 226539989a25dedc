"""`dstoolkit ckpt reshard DIR --out OUT`: a DeepSpeed ZeRO-1/2/3 checkpoint -> a universal checkpoint (DeepSpeed's
own ds_to_universal), resumable at another world size or ZeRO stage with `"checkpoint": {"load_universal": true}`.

Exit codes: 0 written, 1 failed (no space left on device), 2 bad input (not a checkpoint, incomplete, a target
layout it cannot reach, OUT exists or lies under a file), 130 interrupted (Ctrl-C, SIGTERM). OUT is written all or
nothing: a failed or interrupted run leaves no OUT, and a killed run's temporary .OUT.dstoolkit-partial-* folder is
removed by the next run.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dstoolkit.ckpt.layout import parse_target
from dstoolkit.cli.ckpt_inspect import first_paragraph
from dstoolkit.cli.options import EXIT_INTERRUPTED, EXIT_OK, add_out_flag, exit_map
from dstoolkit.runtime.ckpt.outputs import OutputSpaceError, sigterm_as_interrupt


def add_subparser(sub) -> None:
    p = sub.add_parser("reshard", help="convert to a DeepSpeed universal checkpoint (resume at another layout)",
                       description=first_paragraph(__doc__))
    p.add_argument("dir", metavar="DIR", help="the checkpoint (root with `latest`, or one tag folder)")
    add_out_flag(p, required=True, metavar="OUT", help="new folder for the universal checkpoint "
                 "(OUT/<tag>/ and OUT/latest_universal); must not exist")
    p.add_argument("--to", metavar="KEY=N,...", default=None,
                   help="the layout you will resume at, checked before converting: world=N,zero=S,tp=T,pp=P,ep=E")
    p.set_defaults(run=run)


@exit_map("ckpt reshard", failures=(OutputSpaceError,))
def run(args) -> int:
    target = parse_target(args.to) if args.to is not None else None
    out = Path(args.out)
    # torch-free: the output refused at once, before torch is imported (to_universal asks it again)
    from dstoolkit.runtime.ckpt.outputs import check_new_output_folder

    check_new_output_folder(Path(args.dir), out, "--out", "_universal")
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.ckpt.reshard import to_universal

    try:
        with sigterm_as_interrupt():
            info = to_universal(Path(args.dir), out, target=target)
    except KeyboardInterrupt:
        print(f"dstoolkit ckpt reshard: interrupted; nothing was written to {out} (rerun the same command)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"wrote universal checkpoint {out / info.tag} from {info.tag_dir} (ZeRO-{info.zero_stage}, "
          f"dp={info.dp}, step {info.step})")
    print(f"resume: add \"checkpoint\": {{\"load_universal\": true}} to the new run's DeepSpeed JSON and call "
          f"engine.load_checkpoint('{out}')")
    return EXIT_OK
