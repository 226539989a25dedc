"""How the `hf` and `accelerate` targets launch the user's own script: the TrainingArguments as command-line flags,
the torchrun and ``accelerate launch`` lines, the accelerate config, and the launch script that runs on every node
(`dstoolkit.generate.hf_targets` builds the files that go with them). No torch import.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import is_cpu_cluster
from dstoolkit.generate.shell import node_rank_why, require_set, run_forwarding_signals_lines
from dstoolkit.spec import Spec

HF_DS_CONFIG = "ds_config_hf.json"
TRAINING_ARGS = "training_args.json"
ACCELERATE_CONFIG = "accelerate_config.yaml"


def training_args_flags(args: dict) -> list[str]:
    """`training_args` as HfArgumentParser command-line flags (``--name value``; booleans as ``--name``)."""
    out: list[str] = []
    for k, v in args.items():
        if v is True:
            out.append(f"--{k}")
        elif v is False or v is None:
            continue
        else:
            out += [f"--{k}", str(v)]
    return out


DEFAULT_MASTER_PORT = 29500  # torch.distributed / accelerate default rendezvous port


def _words(words: list[str]) -> str:
    """Shell words: literal values quoted; `"$VAR"` / `"${ARR[@]}"` references kept as they are."""
    return " ".join(w if w.startswith('"$') else shlex.quote(w) for w in words)


def hf_launch_line(spec: Spec, args: dict, *, script: str = '"$SCRIPT"') -> str:
    """The torchrun command of `launch_hf.sh` (one line, run on every node): the node arguments come from
    `NODE_ARGS` (`--standalone` on one node; `--nnodes N --node_rank $NODE_RANK --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT` on several: torchrun's static rendezvous, one job across the nodes), the config by
    absolute path from the script's folder, then the user's own arguments (`"$@"`: a flag given twice, the
    user's wins in HfArgumentParser)."""
    flags = training_args_flags({k: v for k, v in args.items() if k != "deepspeed"})
    words = ["torchrun", '"${NODE_ARGS[@]}"', "--nproc_per_node", str(spec.cluster.gpus_per_node), script]
    if args.get("deepspeed"):  # the JSON beside the script, wherever the folder is now (training_args.json's may be
        words += ["--deepspeed", f'"$HERE/{HF_DS_CONFIG}"']  # an absolute path written at generate time)
    return _words(words + flags + ['"$@"'])


def accelerate_config(spec: Spec, cand: Candidate, *, ds_config: str = HF_DS_CONFIG) -> dict:
    """An accelerate config (``accelerate launch --config_file``) whose DeepSpeed plugin reads the HF JSON.

    On several nodes ``deepspeed_multinode_launcher: standard`` makes accelerate start torchrun on each node
    (accelerate ``utils/launch.py`` ``prepare_deepspeed_cmd_env``): without it accelerate hands DeepSpeed's
    launcher ``--hostfile None`` and every node trains alone. The machine rank and main address come from the
    launch script (NODE_RANK, MASTER_ADDR), so one file serves every node. `ds_config` is the JSON's path as
    written: absolute where `generate` knows the folder (accelerate reads it relative to the directory it is launched
    from, not to the YAML: accelerate utils/dataclasses.py HfDeepSpeedConfig), relative in committed goldens; the
    launch script passes the JSON's current path either way (``--deepspeed_config_file``).
    """
    c = spec.cluster
    ds: dict[str, Any] = {"deepspeed_config_file": ds_config, "zero3_init_flag": cand.zero_stage == 3}
    if c.nodes > 1:
        ds["deepspeed_multinode_launcher"] = "standard"
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": ds,
        "machine_rank": 0,
        "main_training_function": "main",
        "num_machines": c.nodes,
        "num_processes": c.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": is_cpu_cluster(spec),
        "debug": False,
    }


def accelerate_config_comment(ds_config: str) -> list[str]:
    """The YAML's header: how far its `deepspeed_config_file` reaches (accelerate resolves a relative path against
    the directory it is launched from)."""
    if Path(ds_config).is_absolute():
        return [f"# deepspeed_config_file is this folder's {HF_DS_CONFIG} by absolute path, written by dstoolkit generate:",
                "# `accelerate launch --config_file` works from any directory. After moving the folder, regenerate it",
                "# or run launch_accelerate.sh, which passes the JSON's current path."]
    return [f"# deepspeed_config_file ({ds_config}) is relative to the directory accelerate is launched from: run",
            "# launch_accelerate.sh (it passes the JSON's path) or `accelerate launch` from this folder; `dstoolkit",
            "# generate -o DIR` writes it by absolute path."]


def accelerate_config_yaml(cfg: dict) -> str:
    """The accelerate config as YAML text (flat and one nested mapping: written by hand, no yaml import), after
    `accelerate_config_comment`."""
    def scalar(v: Any) -> str:  # a string YAML could read otherwise (a path with ': ' or ' #'): double-quoted
        plain = isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_./-]+", v) is not None
        return str(v) if plain else json.dumps(v)

    lines = accelerate_config_comment(str(cfg["deepspeed_config"]["deepspeed_config_file"]))
    for k, v in cfg.items():
        if isinstance(v, dict):
            lines.append(f"{k}:")
            lines += [f"  {kk}: {scalar(vv)}" for kk, vv in v.items()]
        else:
            lines.append(f"{k}: {scalar(v)}")
    return "\n".join(lines) + "\n"


def accelerate_launch_line(spec: Spec, args: dict, *, config: str = ACCELERATE_CONFIG,
                           script: str = '"$SCRIPT"') -> str:
    """The ``accelerate launch`` command of `launch_accelerate.sh` (no --deepspeed: the plugin comes from the
    YAML; its JSON path and the node arguments from the script, `NODE_ARGS`)."""
    words = ["accelerate", "launch", "--config_file", f'"$HERE/{config}"', "--deepspeed_config_file",
             f'"$HERE/{HF_DS_CONFIG}"', '"${NODE_ARGS[@]}"', script]
    return _words(words + training_args_flags({k: v for k, v in args.items() if k != "deepspeed"}) + ['"$@"'])


def render_hf_launch_sh(spec: Spec, command: str, notes: list[str], *, name: str, what: str) -> str:
    """A launch script for the user's own script: `bash NAME YOUR_TRAIN.py [its arguments]`, on every node.

    Multi-node: NODE_RANK and MASTER_ADDR must be set (a one-line message names the missing one, exit 2);
    `command` (`hf_launch_line` / `accelerate_launch_line`) reads `NODE_ARGS`, `HERE` and `SCRIPT`.
    """
    nodes = spec.cluster.nodes
    multi = nodes > 1
    torch_style = command.startswith("torchrun")
    lines = [
        "#!/usr/bin/env bash",
        f"# dstoolkit generate: {what}. Regenerate instead of editing.",
        "#",
        f"#   bash {name} YOUR_TRAIN.py [arguments for it ...]",
    ]
    if multi:
        lines.append(f"#   (on each of the {nodes} nodes: NODE_RANK=k MASTER_ADDR=<node 0's address> bash {name} "
                     "YOUR_TRAIN.py ...; k = 0..{})".format(nodes - 1))
    lines += [
        f"#   DRY_RUN=1 bash {name} YOUR_TRAIN.py   # print the command instead of running it",
        "# Your arguments follow the generated TrainingArguments flags: a flag you repeat wins. Config paths are",
        "# absolute from this script's folder, so it runs from any directory. MASTER_PORT overrides the port"
        f" ({DEFAULT_MASTER_PORT}).",
        *[f"# NOTE: {n}" for n in notes],
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f"ME={shlex.quote(name)}",
        'if [ $# -lt 1 ]; then echo "$ME: usage: bash $ME YOUR_TRAIN.py [arguments for it ...]" >&2; exit 2; fi',
        'SCRIPT="$1"; shift',
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"',
    ]
    if multi:
        lines.append(require_set("NODE_RANK", node_rank_why(nodes)))
        lines.append(require_set("MASTER_ADDR", f"a {nodes}-node launch runs this script on every node with "
                                 "MASTER_ADDR=<node 0's address, the same on every node>"))
        if torch_style:
            lines.append(f'NODE_ARGS=(--nnodes {nodes} --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" '
                         '--master_port "$MASTER_PORT")')
        else:
            lines.append('NODE_ARGS=(--machine_rank "$NODE_RANK" --main_process_ip "$MASTER_ADDR" '
                         '--main_process_port "$MASTER_PORT")')
    else:
        lines.append('NODE_ARGS=(--standalone)' if torch_style else 'NODE_ARGS=(--main_process_port "$MASTER_PORT")')
    lines += [
        f"CMD=({command})",
        'if [ -n "${DRY_RUN:-}" ]; then printf \'%q \' "${CMD[@]}"; echo; exit 0; fi',
        *run_forwarding_signals_lines("CMD", me=name),
    ]
    return "\n".join(lines) + "\n"
