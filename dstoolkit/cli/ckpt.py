"""`dstoolkit ckpt inspect | reshard | export`: what a checkpoint holds, a universal copy to resume at another
layout, and a Hugging Face export. Start with `dstoolkit ckpt inspect CHECKPOINT_DIR`: it says what the folder is
and whether it is complete; reshard and export check what they need before writing anything and refuse, with the
reason, a checkpoint they cannot convert (docs/checkpoints.md).

Exit codes: 0 ok, 1 findings (inspect: the checkpoint is incomplete), 2 bad input.
"""
# One module per sub-verb (cli/ckpt_inspect.py, ckpt_reshard.py, ckpt_export.py); torch is imported only by reshard
# and export, inside their run.
from __future__ import annotations

from dstoolkit.cli import ckpt_export, ckpt_inspect, ckpt_reshard
from dstoolkit.cli.ckpt_inspect import first_paragraph


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("ckpt", help="inspect, reshard (universal) or export (HF) a DeepSpeed checkpoint",
                              description=first_paragraph(__doc__))
    sub = p.add_subparsers(dest="ckpt_cmd", metavar="CMD")
    sub.required = True
    for module in (ckpt_inspect, ckpt_reshard, ckpt_export):
        module.add_subparser(sub)
