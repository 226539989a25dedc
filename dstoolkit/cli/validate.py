"""`dstoolkit validate PATH...`: check DeepSpeed configs before launch (CI, pre-commit, editor).

A YAML file named on the command line that holds a dstoolkit spec (model: / cluster: / training:) is checked as a
spec: everything `estimate`, `sweep` and `generate` would refuse it for, located at its YAML line (SPxxx, LYxxx),
and a warning (SP007) when its layout is estimated not to fit (dstoolkit.generate.io.spec_file_findings).

A folder `dstoolkit generate` wrote is checked file by file as what each file is, at the layout it was generated
for (dstoolkit.validate.folder: ds_config.json strict, ds_config_hf.json in hf mode, accelerate_config.yaml as
accelerate's config, world size / tp / pp / ep from the folder's layout.json; spec.yaml, model_config.json and
training_args.json are not DeepSpeed configs and are not checked as such).

Exit codes: 0 no errors, 1 errors found, 2 usage or unreadable input. Imports neither torch nor deepspeed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from dstoolkit.cli.options import (EXIT_FINDINGS, EXIT_INPUT, EXIT_OK, add_deepspeed_version_flag, add_format_flag,
                                   add_parallel_flags, add_world_flags, exit_map, positive_int as _positive_int)
from dstoolkit.dsconfig.versions import normalize_version
from dstoolkit.validate.engine import validate_config
from dstoolkit.validate.explain import UnknownCode, explain
from dstoolkit.validate.findings import Finding, has_spec_sections
from dstoolkit.validate.folder import CONFIG_KINDS, generated_root, read_layouts, validate_generated
from dstoolkit.validate.parse import MAX_TEXT_BYTES, decode_bytes

CONFIG_GLOB_SUFFIX = ".json"  # directory walks skip *.schema.json (JSON Schema files, not configs)
SPEC_SUFFIXES = (".yaml", ".yml", ".json")  # a file with these holding a spec (looks_like_spec) is checked as one


def _spec_findings(path: str, text: str) -> Optional[list[Finding]]:
    """What a spec file's check finds (dstoolkit.generate.io.spec_file_findings), or None when `text` is not a spec."""
    is_json = path.lower().endswith(".json")
    if is_json:  # cheap first: a JSON DeepSpeed config never pays for the spec check
        try:
            if not has_spec_sections(json.loads(text)):
                return None
        except (ValueError, RecursionError):  # not JSON, or nested too deep: validate_config says which
            return None
    # start-up time: the spec check loads the spec models and the sweep; only a spec-like file pays for them
    from dstoolkit.generate.io import looks_like_spec, spec_file_findings

    return spec_file_findings(path) if is_json or looks_like_spec(text) else None


def _layout_flag_conflict(args, in_generated: list[str]) -> Optional[str]:
    """The first layout flag that differs from a generated file's layout.json (`read_layouts`), as text, or None.
    --tp / --pp at their default 1 count as not given."""
    given = {"world_size": ("--world-size", args.world_size), "gpus_per_node": ("--gpus-per-node", args.gpus_per_node),
             "tp": ("--tp", None if args.tp == 1 else args.tp), "pp": ("--pp", None if args.pp == 1 else args.pp),
             "num_experts": ("--num-experts", args.num_experts), "ep": ("--ep-size", args.ep_size)}
    given = {k: fv for k, fv in given.items() if fv[1] is not None}
    if not given:
        return None
    for path in in_generated:
        try:
            layout = read_layouts(os.path.dirname(os.path.abspath(path))).get(os.path.basename(path))
        except ValueError:
            continue  # validate_generated reports the unreadable layout.json
        for key, (flag, value) in given.items():
            have = getattr(layout, key, None) if layout is not None else None
            if have is not None and have != value:
                return f"{flag} {value} for {path}, whose layout.json says {key} {have}"
    return None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("validate", help="check DeepSpeed config files (exit 0 ok, 1 errors, 2 bad input)",
                              description="Check DeepSpeed JSON configs against DeepSpeed's schema and cross-field "
                                          "rules. A directory is searched recursively for *.json. A dstoolkit spec "
                                          "(YAML with model:, cluster:, training:) is checked as a spec.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="config files, spec YAML files or directories")
    p.add_argument("--explain", metavar="CODE", help="print a rule's code, title and explanation (DS204, LY001, ...)"
                   " and exit; docs/rules.md lists them all")
    add_world_flags(p, world_help="total ranks (enables the exact batch-triad check)",
                    gpus_per_node_help="GPUs per node (ZeRO++ hpZ check)")
    add_parallel_flags(p, ("tp", "pp"))
    p.add_argument("--num-experts", type=_positive_int, help="MoE experts per layer (overrides dstoolkit.moe)")
    p.add_argument("--ep-size", type=_positive_int, help="expert-parallel size (overrides dstoolkit.moe)")
    p.add_argument("--mode", choices=("strict", "hf"), default="strict",
                   help='strict: "auto" is reported, an error unless DeepSpeed drops it for a working default '
                        '(docs/validate.md); hf: accept "auto" where HF Trainer/Accelerate fill it')
    add_deepspeed_version_flag(p)
    add_format_flag(p)
    p.add_argument("--no-warnings", action="store_true", help="print errors only")
    p.set_defaults(run=run)


def _print(text: str) -> None:
    """Print without ever failing on characters the terminal encoding cannot show."""
    enc = getattr(sys.stdout, "encoding", None) or "utf-8"
    print(text.encode(enc, "backslashreplace").decode(enc, "replace"))


def collect_files(paths: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Expand directories (recursively, *.json, sorted); return (files, problems as (path, message))."""
    files: list[str] = []
    problems: list[tuple[str, str]] = []
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                generated = generated_root(root) is not None
                found += [os.path.join(root, n) for n in sorted(names)
                          if (n.endswith(CONFIG_GLOB_SUFFIX) and not n.endswith(".schema.json"))
                          or (generated and n in CONFIG_KINDS)]
            if not found:
                problems.append((path, "directory contains no *.json config files"))
            files += found
        elif os.path.exists(path):
            files.append(path)
        else:
            problems.append((path, "no such file or directory"))
    return files, problems


def _explain(code: str) -> int:
    try:
        _print(explain(code))
    except UnknownCode as exc:
        print(f"dstoolkit validate: {exc}", file=sys.stderr)
        return 2
    return 0


@exit_map("validate")
def run(args) -> int:
    if getattr(args, "explain", None):
        return _explain(args.explain)
    if not args.paths:
        print("dstoolkit validate: error: give config files or directories (or --explain CODE)", file=sys.stderr)
        return 2

    try:
        version = normalize_version(args.deepspeed_version)
    except ValueError as exc:
        print(f"dstoolkit validate: {exc}", file=sys.stderr)
        return EXIT_INPUT
    files, problems = collect_files(args.paths)
    for path, msg in problems:
        print(f"dstoolkit validate: error: {path}: {msg}", file=sys.stderr)
    findings: list[Finding] = []
    if args.format == "json":  # a CI step reading the JSON sees the path that failed, as for an unreadable file
        findings += [Finding(file=path, pointer="", severity="error", code="DS008", message=msg)
                     for path, msg in problems]
    in_generated = [f for f in files if generated_root(f) is not None]
    files_plain = [f for f in files if f not in set(in_generated)]
    conflict = _layout_flag_conflict(args, in_generated)
    if conflict:  # the folder's layout.json says these; a different flag would be silently ignored
        print(f"dstoolkit validate: error: {conflict}: a generated folder's configs are checked at the layout its "
              "layout.json records: drop the flag, or copy the config out of the folder to check it at another "
              "layout", file=sys.stderr)
        return EXIT_INPUT
    not_configs: list[str] = []
    flags = {"world_size": args.world_size, "gpus_per_node": args.gpus_per_node, "tp": args.tp, "pp": args.pp,
             "num_experts": args.num_experts, "ep_size": args.ep_size}  # the layout a config is checked at
    if in_generated:
        def _read(path):
            with open(path, "rb") as fh:
                return decode_bytes(fh.read(), path)

        folder = validate_generated(in_generated, validate_config, deepspeed_version=version, read_text=_read,
                                    flags=flags)
        findings += folder.findings
        not_configs = folder.not_configs
    for path in files_plain:
        try:
            size = os.path.getsize(path)
            if size > MAX_TEXT_BYTES:
                findings.append(Finding(file=path, pointer="", severity="error", code="DS004",
                                        message=f"file is {size / 2**20:.1f} MiB; a DeepSpeed config is a few KiB "
                                                f"(limit {MAX_TEXT_BYTES // 2**20} MiB)"))
                continue
            with open(path, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            findings.append(Finding(file=path, pointer="", severity="error", code="DS008",
                                    message=f"cannot read file: {exc.strerror or exc}"))
            continue
        text, problem = decode_bytes(raw, path)
        if problem is not None:
            findings.append(problem)
            continue
        spec_found = _spec_findings(path, text) if path.lower().endswith(SPEC_SUFFIXES) else None
        if spec_found is not None:
            findings += spec_found
            continue
        findings += validate_config(text, source=path, **flags, mode=args.mode, deepspeed_version=version,
                                    ep_needs_experts=True)
    shown = [f for f in findings if f.severity == "error" or not args.no_warnings]
    n_err = sum(f.severity == "error" for f in findings)
    n_warn = sum(f.severity == "warning" for f in findings)
    if args.format == "json":
        _print(json.dumps([f.model_dump() for f in shown], indent=2))
    else:
        for f in shown:
            _print(f.format_text())
        bad = len({f.file for f in findings if f.severity == "error"})
        print(f"{len(files) - len(not_configs)} file(s) checked: {n_err} error(s), {n_warn} warning(s)"
              + (f" in {bad} file(s)" if bad else "")
              + (f"; {len(not_configs)} generated file(s) that are not DeepSpeed configs left alone "
                 f"({', '.join(sorted({os.path.basename(p) for p in not_configs}))})" if not_configs else ""),
              file=sys.stderr)
    if problems or any(f.is_input_error for f in findings):
        return EXIT_INPUT
    return EXIT_FINDINGS if n_err else EXIT_OK


def _standalone(argv=None) -> int:
    """`python -m dstoolkit.cli.validate PATH...`: the same command without building every other verb's parser."""
    parser = argparse.ArgumentParser(prog="dstoolkit")
    add_parser(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(["validate", *(sys.argv[1:] if argv is None else argv)])
    return args.run(args)


if __name__ == "__main__":  # pragma: no cover - exercised by benchmarks/validate_speed.py and the test below
    sys.exit(_standalone())
