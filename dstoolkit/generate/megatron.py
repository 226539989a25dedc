"""Megatron argument files per target: Megatron-LM (NVIDIA) and Megatron-DeepSpeed (deepspeedai), each in the
spelling its own argument parser accepts. No torch import.

`megatron_lm_args` (`dstoolkit.generate.megatron_lm`) / `megatron_deepspeed_args` (`dstoolkit.generate.megatron_deepspeed`),
over what both share (`dstoolkit.generate.megatron_common`), return the command line as a flat list of words (flags and values,
no quoting). `render_args_file` writes one word per line, unquoted; pass it as an array, never through word
splitting, so a value with brackets or spaces (``--moe-layer-freq [0,0,0,1,...]``,
``--step-batch-size-schedule 0:3072 ...``) reaches the parser as one word::

    mapfile -t ARGS < megatron_lm_args.txt
    torchrun ... pretrain_gpt.py "${ARGS[@]}"

`write_megatron_targets` writes the files of one strategy folder: the argument file and a launch script per
target (the launch script does exactly the above, plus the data/tokenizer arguments from ``DATA_ARGS``).

Checked against the real parsers (``parse_args`` + ``validate_args``) of Megatron-LM at d98e8a64 and of
Megatron-DeepSpeed at 4efb479d; see benchmarks/results/megatron_parsers_*.md for the per-file results and
benchmarks/megatron_parsers.py for the check. What each target cannot express is refused with
`UnsupportedTarget` (a reason, no file), never approximated silently.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

from dstoolkit.common.atomic import atomic_write_text
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import is_cpu_cluster
from dstoolkit.generate.megatron_common import UnsupportedTarget
from dstoolkit.generate.megatron_deepspeed import megatron_deepspeed_args, tree_check_lines
from dstoolkit.generate.megatron_lm import megatron_lm_args, uses_megatron_fsdp
from dstoolkit.generate.shell import env_default, node_rank_why, require_set, run_forwarding_signals_lines
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

TARGETS = ("megatron-lm", "megatron-deepspeed")
ARGS_FILE = {"megatron-lm": "megatron_lm_args.txt", "megatron-deepspeed": "megatron_deepspeed_args.txt"}
LAUNCH_FILE = {"megatron-lm": "launch_megatron_lm.sh", "megatron-deepspeed": "launch_megatron_deepspeed.sh"}
DEFAULT_PRETRAIN = {"megatron-lm": "Megatron-LM/pretrain_gpt.py", "megatron-deepspeed": "Megatron-DeepSpeed/pretrain_gpt.py"}
DEFAULT_DATA_ARGS = {"megatron-lm": "--mock-data --tokenizer-type NullTokenizer",
                     "megatron-deepspeed": "--tokenizer-type NullTokenizer"}
"""Data arguments without a dataset: Megatron-LM's synthetic data (what a launch script passes with MOCK_DATA=1,
saying so on stderr), and the tokenizer alone for Megatron-DeepSpeed, which has no mock dataset (the parser checks
in benchmarks/megatron_parsers.py use these). A launch script never falls back to them silently: without DATA_ARGS
(or MOCK_DATA=1 for Megatron-LM) it stops with a message naming DATA_ARGS."""


def render_args_file(words: Sequence[str]) -> str:
    """One word per line, unquoted (read it back with `mapfile -t ARGS < FILE`; never `$(cat FILE)`)."""
    for w in words:
        if "\n" in w or w == "":
            raise ValueError(f"argument word {w!r} cannot be written one per line")
    return "\n".join(words) + "\n"


def read_args_file(text: str) -> list[str]:
    """What `mapfile -t` gives back for a file written by `render_args_file`."""
    return text.splitlines()


def render_launch_script(spec: Spec, cand: Candidate, target: str, *, strategy: str,
                         pretrain_script: Union[str, Path], shape: ModelShape) -> str:
    """torchrun launch of the target's pretrain_gpt.py with the argument file beside the script (Megatron-DeepSpeed:
    after `megatron_deepspeed.tree_check_lines`, which stops a GQA model on a tree that cannot split its QKV)."""
    nodes, g = spec.cluster.nodes, spec.cluster.gpus_per_node
    args_file = ARGS_FILE[target]
    # Megatron-LM wants 1 with TP/SP (its validate_args asserts it); Megatron-FSDP asserts it is NOT 1.
    if target == "megatron-lm":
        cdmc = None if uses_megatron_fsdp(cand) else "1"
    else:
        cdmc = "1"  # Megatron-DeepSpeed refuses sequence parallelism without it; harmless otherwise
    name = "Megatron-LM" if target == "megatron-lm" else "Megatron-DeepSpeed"
    lines = [
        "#!/usr/bin/env bash",
        f"# dstoolkit generate: {name} launch, strategy {strategy}. Regenerate instead of editing.",
        "#",
        f"#   PRETRAIN=/path/to/{name}/pretrain_gpt.py bash {LAUNCH_FILE[target]}   # on every node, NODE_RANK=k",
        "#   (without PRETRAIN: PRETRAIN_DEFAULT below, relative to where you launch unless absolute; the script stops",
        "#   before starting ranks if it is not a file)",
        "#   DATA_ARGS='--data-path ... --tokenizer-type ... --tokenizer-model ...' is required"
        + (" (MOCK_DATA=1 instead: Megatron-LM's synthetic tokens)" if target == "megatron-lm" else ""),
        "#   extra arguments go to pretrain_gpt.py after the file's (argparse: the last occurrence wins)",
        f"# The arguments are read one per line into an array (mapfile), so no value is split or re-quoted.",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        *env_default("PRETRAIN", str(pretrain_script)),
        f'NNODES="${{NNODES:-{nodes}}}"',
        f'GPUS_PER_NODE="${{GPUS_PER_NODE:-{g}}}"',
    ]
    me = LAUNCH_FILE[target]
    lines += [
        'if [[ "$NNODES" -gt 1 ]]; then  # one job over the nodes: each node must say who it is and where rank 0 is',
        "    " + require_set("NODE_RANK", node_rank_why("$NNODES"), me=me),
        f'    [[ -n "${{MASTER_ADDR:-}}" ]] || {{ echo "{me}: MASTER_ADDR is not set: the address of node 0, the same on every node" >&2; exit 2; }}',
        'fi',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
        'MASTER_PORT="${MASTER_PORT:-29500}"',
    ]
    # before the data arguments, the tree check (which reads the tree beside it) and any rank: a PRETRAIN that is not a
    # file would make every rank fail with "can't open file" and torchrun end with a traceback
    lines += [
        'if [[ ! -f "$PRETRAIN" ]]; then',
        f'    echo "{me}: PRETRAIN=${{PRETRAIN@Q}} is not a file (from $PWD): set PRETRAIN=/path/to/{name}/pretrain_gpt.py '
        f'(or dstoolkit generate --pretrain-script PATH)" >&2; exit 2',
        'fi',
    ]
    lines.append('if [[ -z "${DATA_ARGS:-}" ]]; then')
    need = f"{me}: DATA_ARGS is not set: DATA_ARGS='--data-path PREFIX --tokenizer-type ... [--tokenizer-model ...]'"
    if target == "megatron-lm":
        lines += [
            '    if [[ "${MOCK_DATA:-0}" == 1 ]]; then',
            f'        echo "{me}: MOCK_DATA=1: training on Megatron-LM synthetic tokens (--mock-data), not on a dataset" >&2',
            f'        DATA_ARGS="{DEFAULT_DATA_ARGS[target]}"',
            '    else',
            f'        echo "{need}, or MOCK_DATA=1 for synthetic data" >&2; exit 2',
            '    fi',
        ]
    else:
        lines.append(f'    echo "{need} (Megatron-DeepSpeed has no mock dataset)" >&2; exit 2')
    lines.append('fi')
    if cdmc is not None:
        lines.append(f"export CUDA_DEVICE_MAX_CONNECTIONS={cdmc}")
    else:
        lines.append("unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP requires it unset (or > 1)")
    if target == "megatron-deepspeed" and is_cpu_cluster(spec):
        # DeepSpeed's CPU accelerator counts devices from LOCAL_SIZE (else NUMA nodes: 1 here); Megatron-DeepSpeed
        # sets local_rank = rank % device_count (megatron/initialize.py:213), which DeepSpeed then asserts equals
        # LOCAL_RANK (deepspeed/runtime/engine.py:1982): one device per rank of the node.
        lines.append('export LOCAL_SIZE="${LOCAL_SIZE:-$GPUS_PER_NODE}"')
    if target == "megatron-deepspeed":
        lines += tree_check_lines(shape, cand, me)
    lines += [
        f'mapfile -t ARGS < "$HERE/{args_file}"',
        'read -r -a DATA <<< "$DATA_ARGS"',
    ]
    extra = ""
    if target == "megatron-deepspeed":
        extra = ' --deepspeed_config "$HERE/ds_config.json"'  # absolute at run time, wherever the folder moved
    lines += [
        'CMD=(torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE"',
        '     --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"',
        f'     "$PRETRAIN" "${{ARGS[@]}}" "${{DATA[@]}}"{extra} "$@")',
        *run_forwarding_signals_lines("CMD", me=me),
    ]
    return "\n".join(lines) + "\n"


@dataclass
class TargetFiles:
    """What `megatron_target_files` produced: relative path -> text, and the targets it could not express."""

    files: dict[str, str]
    skipped: dict[str, str]


def megatron_target_files(folder: Union[None, str, Path], spec: Spec, shape: ModelShape, cand: Candidate,
                          targets: Iterable[str] = TARGETS, *, strategy: str = "",
                          pretrain_script: Union[None, str, Path, dict[str, str]] = None) -> TargetFiles:
    """The argument file and launch script of each target for one strategy folder, in memory.

    `folder` is where the folder will live (its absolute path goes into --deepspeed_config); None writes the
    path relative to the strategy folder (committed goldens, which must not name this machine's paths; the
    launch script passes the absolute path at run time either way).
    `pretrain_script`: target -> path of that project's pretrain_gpt.py, or one path for every target.
    """
    ds_config_path = Path("ds_config.json") if folder is None else Path(folder).expanduser().resolve() / "ds_config.json"
    targets = list(targets)
    if isinstance(pretrain_script, (str, Path)):
        pretrain_script = {t: str(pretrain_script) for t in targets}
    scripts = {**DEFAULT_PRETRAIN, **(pretrain_script or {})}
    files: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for target in dict.fromkeys(targets):
        if target not in TARGETS:
            raise ValueError(f"unknown Megatron target {target!r}; known: {', '.join(TARGETS)}")
        try:
            if target == "megatron-lm":
                words = megatron_lm_args(spec, shape, cand)
            else:
                words = megatron_deepspeed_args(spec, shape, cand, ds_config_path=ds_config_path)
        except UnsupportedTarget as exc:
            skipped[target] = str(exc)
            continue
        files[ARGS_FILE[target]] = render_args_file(words)
        files[LAUNCH_FILE[target]] = render_launch_script(spec, cand, target,
                                                          strategy=strategy or Path(folder or ".").resolve().name,
                                                          pretrain_script=scripts[target], shape=shape)
    return TargetFiles(files=files, skipped=skipped)


def write_megatron_targets(folder: Union[str, Path], spec: Spec, shape: ModelShape, cand: Candidate,
                           targets: Iterable[str] = TARGETS, *,
                           pretrain_script: Union[None, str, Path, dict[str, str]] = None) -> TargetFiles:
    """Write each target's argument file and launch script into `folder` (which must exist).

    Args:
        pretrain_script: target -> path of that project's pretrain_gpt.py, or one path for all targets
            (default: a relative placeholder; PRETRAIN=... overrides it when launching).

    Returns:
        The files written and, per target that cannot express this model/layout, the reason (nothing written).
    """

    out = megatron_target_files(folder, spec, shape, cand, targets, pretrain_script=pretrain_script)
    base = Path(folder)
    for rel, text in out.files.items():
        atomic_write_text(base / rel, text)
        if rel.endswith(".sh"):
            (base / rel).chmod(0o755)
    return out


__all__ = ["TARGETS", "ARGS_FILE", "LAUNCH_FILE", "DEFAULT_PRETRAIN", "DEFAULT_DATA_ARGS", "render_args_file",
           "read_args_file", "render_launch_script", "megatron_target_files", "write_megatron_targets", "TargetFiles"]
