"""launch.sh (deepspeed launcher + torchrun alternative), the hostfile and a Slurm sbatch script.

No torch import, no logic in the shell: every value computed here is inserted with `shlex.quote`, so no
value from a spec can inject a command, and free text (names) only ever appears inside quoted assignments,
never in comments or `#SBATCH` lines (those get `slurm_safe_name`).
"""
from __future__ import annotations

import re
import shlex
from typing import Optional

from dstoolkit.common.cpu_env import shell_exports
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import is_cpu_cluster
from dstoolkit.generate.shell import env_default, node_rank_why, require_set, run_forwarding_signals_lines
from dstoolkit.spec import Spec

TRAIN_MODULE = "dstoolkit.runtime.train.trainer"
DEFAULT_STEPS = 20  # a short smoke run; override with STEPS=N
DEFAULT_MASTER_PORT = 29500  # torch.distributed / DeepSpeed default rendezvous port
GPU_OMP_THREADS = 8  # CPU threads per GPU rank for data loading / host work (16-core-per-8-GPU nodes and up)
DEFAULT_DIST_TIMEOUT_S = 600  # trainer --dist-timeout-s default (DeepSpeed's init default, 10 min); see runtime/train/trainer_inputs.py


MEGATRON_ALTERNATIVE = ("or launch_megatron_deepspeed.sh / launch_megatron_lm.sh, which build those groups "
                        "(dstoolkit generate --target megatron-deepspeed / megatron-lm)")
"""Where a layout that splits the model runs without a trainer of the user's own."""


def bundled_trainer_problem(cand: Candidate) -> Optional[str]:
    """Why the bundled example trainer (`TRAIN_MODULE`) cannot run `cand`, or None.

    It is data parallel only: it builds no tensor- or pipeline-parallel group and hands DeepSpeed no mpu, so
    DeepSpeed counts every rank as data parallel and stops at start-up on the batch check
    (train_batch_size != micro x accumulation x world size) for a config made for tp x pp > 1. launch.sh then
    requires TRAIN_MODULE (`render_launch_sh`) and `generate` says so where it recommends it.
    """
    split = [f"{k} {v}" for k, v in (("tp", cand.tp), ("pp", cand.pp)) if v > 1]
    if not split:
        return None
    return (f"layout {cand.label} has {' and '.join(split)}, and the bundled example trainer ({TRAIN_MODULE}) is "
            "data parallel only (DeepSpeed would stop at start-up on its batch check)")


def slurm_safe_name(name: str) -> str:
    """A job name Slurm and bash can both take in a `#SBATCH` line: [A-Za-z0-9._-], at most 64 characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64]
    return safe or "dstoolkit"


def render_hostfile(spec: Spec) -> str:
    """DeepSpeed hostfile: `localhost slots=G` on one node, placeholder host names on several."""
    g = spec.cluster.gpus_per_node
    if spec.cluster.nodes == 1:
        return f"localhost slots={g}\n"
    lines = [f"{HOSTFILE_PLACEHOLDER_MARK} (one line per node, slots = ranks per node),",
             "# or run slurm.sbatch, which writes a hostfile from SLURM_JOB_NODELIST."]
    lines += [f"{placeholder_host(spec.cluster.nodes, i)} slots={g}" for i in range(spec.cluster.nodes)]
    return "\n".join(lines) + "\n"


HOSTFILE_PLACEHOLDER_MARK = "# Replace node-NN with your host names"
"""The first line of a multi-node hostfile as generated: launch.sh takes a hostfile holding it for unedited."""


def placeholder_host(nodes: int, i: int) -> str:
    """The hostfile's placeholder name of node `i` of `nodes` (node-0, or node-00 from 11 nodes on)."""
    return f"node-{i:0{len(str(nodes - 1))}d}"


def _multi_node_checks(nodes: int) -> list[str]:
    """launch.sh on several nodes: stop (exit 2, one line) before anything starts when a launch run on every node
    (torchrun, NO_SSH=1) has no NODE_RANK, and when MASTER_ADDR would be the unedited hostfile's placeholder host
    (every launcher: the deepspeed launcher would ssh to it, the others rendezvous at it)."""
    node0 = placeholder_host(nodes, 0)
    return [
        'if [ "${LAUNCHER:-deepspeed}" = torchrun ] || [ "${NO_SSH:-0}" != 0 ]; then  # run on every node: which one?',
        "  " + require_set("NODE_RANK", node_rank_why(nodes), me="launch.sh"),
        "fi",
        f'if [ -z "${{MASTER_ADDR:-}}" ] && [ "$(awk \'!/^#/ && NF {{print $1; exit}}\' "$HOSTFILE")" = {node0} ] &&',
        f'   grep -qF {shlex.quote(HOSTFILE_PLACEHOLDER_MARK)} "$HOSTFILE"; then',
        f'  echo "launch.sh: MASTER_ADDR is not set and $HOSTFILE still names the placeholder host {node0}: write your '
        f'host names into it (node 0 first), or set MASTER_ADDR=<node 0\'s address, the same on every node>" >&2; exit 2',
        "fi",
    ]


def render_launch_sh(spec: Spec, cand: Candidate, *, strategy: str, is_moe: bool) -> str:
    """The launch script for one strategy folder (see the module docstring for the quoting rule)."""
    q = shlex.quote
    cpu = is_cpu_cluster(spec)
    nodes, g = spec.cluster.nodes, spec.cluster.gpus_per_node
    own = bundled_trainer_problem(cand)
    lines = [
        "#!/usr/bin/env bash",
        f"# dstoolkit generate: strategy {strategy}. Regenerate instead of editing.",
        "#",
        "#   bash launch.sh                      # deepspeed launcher, with the hostfile next to this script",
        "#   NO_SSH=1 NODE_RANK=k bash launch.sh # deepspeed launcher run on every node k, no ssh between nodes",
        "#   LAUNCHER=torchrun bash launch.sh    # torchrun alternative (multi-node: run on every node, set NODE_RANK)",
        "#   DRY_RUN=1 bash launch.sh            # print the command instead of running it",
        "#   bash launch.sh --no-progress        # extra arguments go to the trainer (both launchers)",
        "#",
        "# Checkpoints go to CKPT_DIR (the spec's training.save_dir, relative to where you launch) every",
        "# SAVE_EVERY steps (training.save_interval_steps). Restart after a failure: relaunch the same command",
        "# with --resume added (on every node): it continues from the newest intact checkpoint.",
        "# SIGTERM / Ctrl-C to this script stops the launcher and every rank it started (exit 143 / 130).",
        "#",
        "# Overrides (environment): STEPS, SEED, METRICS_OUT, CKPT_DIR, SAVE_EVERY, HOSTFILE, MASTER_ADDR, MASTER_PORT,",
        "# NODE_RANK,",
        *(["# TRAIN_MODULE (default: the dstoolkit example trainer; Megatron users: generate --target megatron-lm|megatron-deepspeed),"]
          if own is None else
          ["# TRAIN_MODULE (REQUIRED for this layout: your own trainer module, which builds the tensor / pipeline",
           "# groups and takes the arguments of TRAIN_ARGS below; the bundled example trainer is data parallel only),"]),
        f"# DIST_TIMEOUT_S (default {DEFAULT_DIST_TIMEOUT_S}): every process group's timeout; a collective stuck on a dead",
        "# peer or cut link fails the job after this long instead of hanging (torch's gloo default: 30 min),",
        "# NO_SSH=1 (deepspeed launcher: start only this node's ranks, node NODE_RANK of the hostfile).",
        "set -euo pipefail",
        'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        "",
        f"RUN_NAME={q(spec.name)}",
        f"NNODES={q(str(nodes))}",
        f"NPROC_PER_NODE={q(str(g))}",
        *_train_module_lines(own),
        f'STEPS="${{STEPS:-{DEFAULT_STEPS}}}"',
        'SEED="${SEED:-0}"',
        'METRICS_OUT="${METRICS_OUT:-$HERE/metrics.jsonl}"',
        *env_default("CKPT_DIR", spec.training.save_dir),
        f'SAVE_EVERY="${{SAVE_EVERY:-{spec.training.save_interval()}}}"',
        'HOSTFILE="${HOSTFILE:-$HERE/hostfile}"',
        *(_multi_node_checks(nodes) if nodes > 1 else []),
        "MASTER_ADDR=\"${MASTER_ADDR:-$(awk '!/^#/ && NF {print $1; exit}' \"$HOSTFILE\")}\"",
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"',
        f'DIST_TIMEOUT_S="${{DIST_TIMEOUT_S:-{DEFAULT_DIST_TIMEOUT_S}}}"',
        "",
    ]
    if cpu:
        lines.append("# One BLAS thread per rank (the deepspeed launcher does not set it), and glibc malloc reusing freed")
        lines.append("# memory instead of page-faulting large tensors in every step (dstoolkit/common/cpu_env.py).")
        lines.extend(shell_exports())
    else:
        lines.append(f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{GPU_OMP_THREADS}}}"')
        if cand.tp > 1:
            lines.append("# Megatron TP/SP overlap needs kernels queued in order on one hardware queue.")
            lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=1")
    lines.append('export DSTOOLKIT_RUN_NAME="$RUN_NAME"')
    lines.append("")
    train = ('TRAIN_ARGS=(--deepspeed_config "$HERE/ds_config.json" --spec "$HERE/../spec.yaml" '
             '--steps "$STEPS" --seed "$SEED" --metrics-out "$METRICS_OUT" --dist-timeout-s "$DIST_TIMEOUT_S" '
             '--checkpoint-dir "$CKPT_DIR" --save-every "$SAVE_EVERY"')
    if is_moe:
        train += f" --ep-size {q(str(cand.ep))}"
    lines.append(train + ")")
    lines.append('TRAIN_ARGS+=("$@")  # extra arguments: to the trainer, whichever launcher')
    ssh = " --no_ssh_check" if nodes == 1 else ""
    lines += [
        "",
        'case "${LAUNCHER:-deepspeed}" in',
        "  deepspeed)",
        "    NODE_ARGS=()",
        '    if [ "${NO_SSH:-0}" != 0 ]; then NODE_ARGS=(--no_ssh --node_rank "${NODE_RANK:-0}"); fi',
        f'    CMD=(deepspeed --hostfile "$HOSTFILE"{ssh} "${{NODE_ARGS[@]}}" --master_addr "$MASTER_ADDR"',
        '         --master_port "$MASTER_PORT" --module "$TRAIN_MODULE" "${TRAIN_ARGS[@]}") ;;',
        "  torchrun)",
        '    CMD=(torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank "${NODE_RANK:-0}"',
        '         --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m "$TRAIN_MODULE" "${TRAIN_ARGS[@]}") ;;',
        "  *)",
        '    echo "launch.sh: LAUNCHER must be deepspeed or torchrun, got ${LAUNCHER@Q}" >&2',
        "    exit 2 ;;",
        "esac",
        'if [ -n "${DRY_RUN:-}" ]; then printf \'%q \' "${CMD[@]}"; echo; exit 0; fi',
        "# A torch-extension build lock left by a killed build makes every rank wait on it silently: remove it",
        "# (one line naming it) or wait on a live build, saying so (dstoolkit/runtime/jitlock.py).",
        '"${PYTHON:-python}" -m dstoolkit.runtime.jitlock --who launch.sh ||',
        '  echo "launch.sh: torch-extension lock check failed or a build still holds its lock (see above)" >&2',
        *run_forwarding_signals_lines("CMD", me="launch.sh"),
    ]
    return "\n".join(lines) + "\n"


def _train_module_lines(own: Optional[str]) -> list[str]:
    """TRAIN_MODULE: the bundled trainer by default; for a layout it cannot run (`own`: why), the user's, required
    before anything starts (one line naming the reason and the ways out, exit 2; DRY_RUN included)."""
    if own is None:
        return [f'TRAIN_MODULE="${{TRAIN_MODULE:-{TRAIN_MODULE}}}"']
    why = (f"TRAIN_MODULE must name your own trainer module: {own}; TRAIN_MODULE=your.module bash launch.sh "
           f"(it gets the arguments of TRAIN_ARGS), {MEGATRON_ALTERNATIVE}")
    return [
        f"NEEDS_OWN_TRAINER={shlex.quote(why)}",
        'TRAIN_MODULE="${TRAIN_MODULE:-}"',
        f'if [ -z "$TRAIN_MODULE" ] || [ "$TRAIN_MODULE" = {TRAIN_MODULE} ]; then',
        '  echo "launch.sh: $NEEDS_OWN_TRAINER" >&2; exit 2',
        "fi",
    ]


def render_sbatch(spec: Spec, *, strategy: str) -> str:
    """A Slurm batch script that writes the hostfile from the allocation and runs launch.sh."""
    q = shlex.quote
    cpu = is_cpu_cluster(spec)
    nodes, g = spec.cluster.nodes, spec.cluster.gpus_per_node
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={slurm_safe_name(spec.name)}-{slurm_safe_name(strategy)}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
    ]
    if not cpu:
        lines.append(f"#SBATCH --gpus-per-node={g}")
    lines += [
        "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
        f"# dstoolkit generate: strategy {strategy}. Submit from this folder: sbatch slurm.sbatch",
        "# (sbatch runs a copy of this file, so the folder comes from STRATEGY_DIR or SLURM_SUBMIT_DIR).",
        "# SLURM_LAUNCHER=torchrun runs torchrun on every node through srun (no ssh between nodes needed).",
        "# Arguments after the script name go to launch.sh and on to the trainer:",
        "#   sbatch slurm.sbatch --resume   (after a failure: continue from the newest checkpoint in CKPT_DIR)",
        "set -euo pipefail",
        'HERE="${STRATEGY_DIR:-${SLURM_SUBMIT_DIR:-$(pwd)}}"',
        f"SLOTS={q(str(g))}",
        'export HOSTFILE="$HERE/hostfile.slurm-${SLURM_JOB_ID:-local}"',
        'scontrol show hostnames "$SLURM_JOB_NODELIST" | awk -v s="$SLOTS" \'{print $1 " slots=" s}\' > "$HOSTFILE"',
        'export MASTER_ADDR="$(head -n1 "$HOSTFILE" | cut -d" " -f1)"',
        f'export MASTER_PORT="${{MASTER_PORT:-{DEFAULT_MASTER_PORT}}}"',
        'if [ "${SLURM_LAUNCHER:-deepspeed}" = torchrun ]; then',
        '  srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\',
        '    bash -c \'NODE_RANK="$SLURM_NODEID" LAUNCHER=torchrun exec bash "$1/launch.sh" "${@:2}"\' _ "$HERE" "$@"',
        "else",
        '  exec bash "$HERE/launch.sh" "$@"',
        "fi",
    ]
    return "\n".join(lines) + "\n"
