"""`dstoolkit ckpt export DIR --hf OUT`: the consolidated weights of a ZeRO checkpoint (DeepSpeed's zero_to_fp32) as
safetensors plus config.json, loadable by transformers `from_pretrained`.

Exit codes: 0 written, 1 failed (no space left on device), 2 bad input (not a checkpoint, incomplete, no
config.json, weights that do not fit it, OUT exists or lies under a file), 130 interrupted (Ctrl-C, SIGTERM). OUT
is written all or nothing, as by `ckpt reshard`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from dstoolkit.cli.ckpt_inspect import first_paragraph
from dstoolkit.cli.options import EXIT_INTERRUPTED, EXIT_OK, exit_map
from dstoolkit.runtime.ckpt.outputs import OutputSpaceError, sigterm_as_interrupt


def add_subparser(sub) -> None:
    p = sub.add_parser("export", help="consolidated safetensors + config.json for transformers from_pretrained",
                       description=first_paragraph(__doc__))
    p.add_argument("dir", metavar="DIR", help="the checkpoint (root with `latest`, a tag folder, or checkpoint-N/)")
    p.add_argument("--hf", required=True, metavar="OUT", help="new folder for model.safetensors + config.json")
    p.add_argument("--config", metavar="CONFIG_JSON", default=None,
                   help="the model's HF config.json, or the folder holding it (default: config.json beside the "
                   "tag folders or in DIR)")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the exported weights")
    p.set_defaults(run=run)


@exit_map("ckpt export", failures=(OutputSpaceError,))
def run(args) -> int:
    out = Path(args.hf)
    # torch-free: the output refused at once, before torch is imported (export_hf asks it again)
    from dstoolkit.runtime.ckpt.outputs import check_new_output_folder

    check_new_output_folder(Path(args.dir), out, "--hf", "_hf")
    # dstoolkit[train] side: loaded when the verb runs (`dstoolkit --help` imports every verb module)
    from dstoolkit.runtime.ckpt.export import export_hf

    try:
        with sigterm_as_interrupt():
            res = export_hf(Path(args.dir), out, config=Path(args.config) if args.config else None,
                            dtype=args.dtype)
    except KeyboardInterrupt:
        print(f"dstoolkit ckpt export: interrupted; nothing was written to {out} (rerun the same command)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"wrote {res.weights} ({res.tensors} tensors, {res.params} parameters, {args.dtype}) and {res.config} "
          f"from {res.source} (prefix stripped: {res.prefix!r})")
    print(f"weights from {res.weights_from}")
    return EXIT_OK
