"""The project trainer's checkpoint manifest (split from dstoolkit.ckpt.inspect): `dstoolkit_manifest.json` lists
each file of a tag with its size and SHA-256, written last; `verify_manifest` checks the files against it. No torch
import."""
from __future__ import annotations

import json
from pathlib import Path

from dstoolkit.ckpt import names as N
from dstoolkit.ckpt.info import CheckpointInfo, Problem
from dstoolkit.common.filehash import sha256_file


MANIFEST_RECORD = '{"bytes": N, "sha256": "HEX"}'


def verify_manifest(tag_dir: Path, info: CheckpointInfo) -> None:
    mpath = tag_dir / N.DSTOOLKIT_MANIFEST
    if not mpath.is_file():
        if info.format == "dstoolkit-trainer":
            info.problems.append(Problem(str(mpath), "is missing: the save did not finish (the trainer writes it "
                                         "last)"))
            info.manifest_verified, info.manifest_problem = False, f"{N.DSTOOLKIT_MANIFEST} is missing"
        return
    fix = "re-save the checkpoint (the trainer writes the manifest last, from the files on disk)"
    try:
        manifest = json.loads(mpath.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        info.problems.append(Problem(str(mpath), f"is not valid JSON ({str(exc).splitlines()[0][:120]}): {fix}"))
        info.manifest_verified, info.manifest_problem = False, f"{N.DSTOOLKIT_MANIFEST} is not valid JSON"
        return
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        if not isinstance(manifest, dict):
            what = f"it is a JSON {type(manifest).__name__}"
        elif "files" in manifest:
            what = f"its \"files\" is a JSON {type(files).__name__ if files is not None else 'null'}"
        else:
            what = "it has no \"files\" object"
        info.problems.append(Problem(str(mpath), f"is damaged: {what}, not {{file name: {MANIFEST_RECORD}}}; {fix}"))
        info.manifest_verified, info.manifest_problem = False, f"{N.DSTOOLKIT_MANIFEST} is damaged"
        return
    if not files:
        info.problems.append(Problem(str(mpath), f"lists no files; {fix}"))
        info.manifest_verified, info.manifest_problem = False, f"{N.DSTOOLKIT_MANIFEST} lists no files"
        return
    counts = {"damaged": 0, "missing": 0, "size": 0, "sha": 0}
    for rel, rec in sorted(files.items()):
        parts = Path(rel).parts
        if not rel or Path(rel).is_absolute() or ".." in parts:
            info.problems.append(Problem(str(mpath), f"is damaged: it lists {rel!r}, which is not a file inside the "
                                         f"tag folder; {fix}"))
            counts["damaged"] += 1
            continue
        if (not isinstance(rec, dict) or not isinstance(rec.get("bytes"), int) or isinstance(rec.get("bytes"), bool)
                or not isinstance(rec.get("sha256"), str)):
            info.problems.append(Problem(str(mpath), f"is damaged: the record of {rel!r} is {json.dumps(rec)[:80]}, "
                                         f"not {MANIFEST_RECORD}; {fix}"))
            counts["damaged"] += 1
            continue
        p = tag_dir / rel
        if not p.is_file():
            info.problems.append(Problem(str(p), "is missing (listed in the manifest)"))
            counts["missing"] += 1
        elif p.stat().st_size != rec["bytes"]:
            info.problems.append(Problem(str(p), f"is {p.stat().st_size} bytes, the manifest says {rec['bytes']} "
                                         "(truncated)" if p.stat().st_size < rec["bytes"] else
                                         f"is {p.stat().st_size} bytes, the manifest says {rec['bytes']}"))
            counts["size"] += 1
        elif sha256_file(p) != rec["sha256"]:
            info.problems.append(Problem(str(p), "does not match its SHA-256 in the manifest (corrupted)"))
            counts["sha"] += 1
    info.manifest_verified = not any(counts.values())
    info.manifest_problem = _summary(counts) if any(counts.values()) else None


def absent_manifest(info: CheckpointInfo, crc: bool) -> None:
    """A step_* tag in a folder where no tag has its manifest (`info.format` not the trainer's): DeepSpeed tags a loop
    of one's own saved under the trainer's tag prefix (engine.save_checkpoint(dir, tag="step_100")). The trainer
    writes the manifest before it renames a tag into place (runtime/train/ckpt.py `CheckpointManager._commit`), so
    none of its folders lacks one in every tag. Says so (`info.manifest_absent`) and that `dstoolkit train --resume`
    does not load them: its pre-flight (runtime/train/resume_check.py `resume_refusal`) takes every step_* tag
    without a manifest for an unfinished save of its own."""
    if info.format == "dstoolkit-trainer" or not info.tag.startswith(N.TRAINER_TAG_PREFIX):
        return
    checked = "zip end record and CRC" if crc else "zip end record (CRC skipped: --no-crc)"
    info.manifest_absent = (f"none: no step_* tag here has {N.DSTOOLKIT_MANIFEST}, so these are DeepSpeed tags "
                            "saved outside `dstoolkit train` and file sizes and SHA-256 cannot be verified; checked "
                            f"instead: each torch file's {checked}, and that every rank's file is there")
    info.notes.append(f"`dstoolkit train --resume` does not load {info.tag}: it resumes only the step_* tags it "
                      f"saved, each with its {N.DSTOOLKIT_MANIFEST}, and takes these for unfinished saves. Load it "
                      f"with DeepSpeed's engine.load_checkpoint({str(info.root)!r}, tag={info.tag!r}) in your own "
                      "loop, or `dstoolkit ckpt export` / `reshard` it")


def _summary(counts: dict[str, int]) -> str:
    """The header's few words for what the manifest check found (`verify_manifest`'s counts)."""
    def n(k: int, what: str) -> str:
        return f"{k} file{'s' if k != 1 else ''} {what}"

    parts = [text for key, text in (("damaged", f"{counts['damaged']} damaged record(s) in {N.DSTOOLKIT_MANIFEST}"),
                                    ("missing", n(counts["missing"], "missing")),
                                    ("size", n(counts["size"], "of another size than listed")),
                                    ("sha", n(counts["sha"], "failing SHA-256"))) if counts[key]]
    return ", ".join(parts)
