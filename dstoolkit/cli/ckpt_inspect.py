"""`dstoolkit ckpt inspect DIR`: format, tag and step, world size and dp/tp/pp/ep, ZeRO stage, dtypes, optimizer and
scheduler states, bytes per rank, and completeness (each missing or truncated file named), read from file names
and pickled metadata without torch.

Exit codes: 0 complete, 1 incomplete (missing / truncated / corrupt file), 2 not a checkpoint folder.
"""
from __future__ import annotations

import json
import os
import sys

from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.cli.options import EXIT_FINDINGS, EXIT_OK, add_format_flag, exit_map


def first_paragraph(doc: str) -> str:
    """A module docstring's first paragraph on one line: the description of `dstoolkit ckpt` and its sub-verbs
    (argparse re-wraps it; the first line alone would stop mid-sentence)."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def add_subparser(sub) -> None:
    p = sub.add_parser("inspect", help="what a checkpoint folder holds, and whether it is complete",
                       description=first_paragraph(__doc__))
    p.add_argument("dir", metavar="DIR", help="checkpoint root (with `latest`), a tag folder (global_stepN/), a "
                   "universal checkpoint, an HF Trainer output_dir or checkpoint-N/, or a `dstoolkit train` "
                   "--checkpoint-dir")
    p.add_argument("--no-crc", action="store_true",
                   help="skip the CRC check of every file member (check only that each archive is whole)")
    add_format_flag(p)
    p.set_defaults(run=run)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def render(info) -> str:
    deg = " ".join(f"{k}={getattr(info, k)}" for k in ("dp", "tp", "pp", "ep") if getattr(info, k) is not None)
    lines = [
        f"{info.tag_dir}",
        f"  format       {info.format}" + (f" ({'; '.join(info.notes[:1])})" if info.format == "hf-trainer" else ""),
        f"  tag          {info.tag} (step {info.step})" + (f"; tags here: {', '.join(info.tags)}" if len(info.tags) > 1 else ""),
        f"  world size   {info.world_size} ({deg or 'unknown'})",
        f"  ZeRO stage   {info.zero_stage}" + (f", optimizer offload to {info.offload}" if info.offload else ""),
        f"  dtypes       " + (", ".join(f"{k} {v}" for k, v in info.dtypes.items()) or "unknown"),
        f"  states       optimizer {'yes' if info.optimizer_states else 'no'}, scheduler "
        f"{'yes' if info.scheduler else 'no'}" + (f", experts per MoE layer {info.num_experts}" if info.num_experts else ""),
        f"  bytes        total {info.total_bytes} ({_mib(info.total_bytes)}): model states {info.model_state_bytes}, "
        f"optimizer states {info.optimizer_state_bytes}"
        + (f", other {info.other_bytes} (files without tensors: the manifest ...)" if info.other_bytes else ""),
    ]
    for r in info.ranks:
        lines.append(f"    rank {r.rank:<3} {r.bytes:>12}  {', '.join(r.files)}")
    if info.shared_bytes:
        lines.append(f"    shared   {info.shared_bytes:>12}  (written once: model states / experts)")
    if info.manifest_verified is not None:
        lines.append("  manifest     " + ("SHA-256 verified" if info.manifest_verified else
                                         f"NOT VERIFIED: {info.manifest_problem or 'see the problems below'}"))
    if info.manifest_absent:
        lines.append(f"  manifest     {info.manifest_absent}")
    for n in info.notes[1 if info.format == "hf-trainer" else 0:]:
        lines.append(f"  note         {n}")
    if info.complete:
        lines.append("  complete     yes")
    else:
        lines.append(f"  complete     NO ({len(info.problems)} problem(s))")
        for p in info.problems:
            lines.append(f"    {p.file}: {p.problem}" + (f" ({p.fix})" if p.fix else ""))
    return "\n".join(lines)


def add_resume_choice(info) -> None:
    """For the dstoolkit trainer's --checkpoint-dir: set `info.resume_tag` to the tag `dstoolkit train --resume`
    would load, and say so in a note when it is not the tag inspected (`latest` names an older one; the newest is
    incomplete and the trainer falls back) or when it would load none. The choice is the trainer's own
    (`resume_check.pick_resume` over `CheckpointManager.latest_valid`), asked read-only, never restated here."""
    from dstoolkit.runtime.train.ckpt import CheckpointManager
    from dstoolkit.runtime.train.resume_check import pick_resume

    found, refusal = pick_resume(CheckpointManager(info.root), engine=None)  # no engine: the layout is the run's
    tag = found.tag if found is not None else None
    info.resume_tag = tag
    if tag is None:
        info.notes.append(f"`dstoolkit train --resume` would load no checkpoint from here: {refusal}" if refusal
                          else "`dstoolkit train --resume` would start from step 0 (no checkpoint here)")
        return
    if tag == info.tag:
        return
    skipped = [("{}: the problems below".format(info.tag) if r.split(":", 1)[0] == info.tag else r)
               for r in found.rejected]
    latest = info.root / "latest"
    try:
        named = latest.read_text(encoding="utf-8").strip() if latest.is_file() else None
    except (OSError, UnicodeDecodeError):
        named = None
    why = (f"it skips what is not intact ({'; '.join(skipped)})" if skipped else
           "the newest intact tag" + (f"; the trainer does not follow {latest}, which names {info.tag}"
                                      if named == info.tag else ""))
    info.notes.append(f"`dstoolkit train --resume` would load {tag} (step {found.step}), not {info.tag}: {why}")


@exit_map("ckpt inspect")
def run(args) -> int:
    info = inspect_checkpoint(args.dir, crc=not args.no_crc)
    if info.format == "dstoolkit-trainer":
        add_resume_choice(info)
    rc = EXIT_OK if info.complete else EXIT_FINDINGS
    try:
        print(json.dumps(info.as_dict(), indent=1) if args.format == "json" else render(info))
        sys.stdout.flush()
    except BrokenPipeError:  # `ckpt inspect DIR | head`: the reader left; stop quietly, exit as the inspection did
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
        os.close(devnull)
    return rc
