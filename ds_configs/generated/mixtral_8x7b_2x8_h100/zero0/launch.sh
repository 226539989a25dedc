#!/usr/bin/env bash
# dstoolkit generate: strategy zero0. Regenerate instead of editing.
#
#   bash launch.sh                      # deepspeed launcher, with the hostfile next to this script
#   NO_SSH=1 NODE_RANK=k bash launch.sh # deepspeed launcher run on every node k, no ssh between nodes
#   LAUNCHER=torchrun bash launch.sh    # torchrun alternative (multi-node: run on every node, set NODE_RANK)
#   DRY_RUN=1 bash launch.sh            # print the command instead of running it
#   bash launch.sh --no-progress        # extra arguments go to the trainer (both launchers)
#
# Checkpoints go to CKPT_DIR (the spec's training.save_dir, relative to where you launch) every
# SAVE_EVERY steps (training.save_interval_steps). Restart after a failure: relaunch the same command
# with --resume added (on every node): it continues from the newest intact checkpoint.
# SIGTERM / Ctrl-C to this script stops the launcher and every rank it started (exit 143 / 130).
#
# Overrides (environment): STEPS, SEED, METRICS_OUT, CKPT_DIR, SAVE_EVERY, HOSTFILE, MASTER_ADDR, MASTER_PORT,
# NODE_RANK,
# TRAIN_MODULE (REQUIRED for this layout: your own trainer module, which builds the tensor / pipeline
# groups and takes the arguments of TRAIN_ARGS below; the bundled example trainer is data parallel only),
# DIST_TIMEOUT_S (default 600): every process group's timeout; a collective stuck on a dead
# peer or cut link fails the job after this long instead of hanging (torch's gloo default: 30 min),
# NO_SSH=1 (deepspeed launcher: start only this node's ranks, node NODE_RANK of the hostfile).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

RUN_NAME=mixtral_8x7b_2x8_h100
NNODES=2
NPROC_PER_NODE=8
NEEDS_OWN_TRAINER='TRAIN_MODULE must name your own trainer module: layout zero0 tp2 pp4 mb2 ckpt=full has tp 2 and pp 4, and the bundled example trainer (dstoolkit.runtime.train.trainer) is data parallel only (DeepSpeed would stop at start-up on its batch check); TRAIN_MODULE=your.module bash launch.sh (it gets the arguments of TRAIN_ARGS), or launch_megatron_deepspeed.sh / launch_megatron_lm.sh, which build those groups (dstoolkit generate --target megatron-deepspeed / megatron-lm)'
TRAIN_MODULE="${TRAIN_MODULE:-}"
if [ -z "$TRAIN_MODULE" ] || [ "$TRAIN_MODULE" = dstoolkit.runtime.train.trainer ]; then
  echo "launch.sh: $NEEDS_OWN_TRAINER" >&2; exit 2
fi
STEPS="${STEPS:-20}"
SEED="${SEED:-0}"
METRICS_OUT="${METRICS_OUT:-$HERE/metrics.jsonl}"
CKPT_DIR_DEFAULT=checkpoints
CKPT_DIR="${CKPT_DIR:-$CKPT_DIR_DEFAULT}"
SAVE_EVERY="${SAVE_EVERY:-1000}"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
if [ "${LAUNCHER:-deepspeed}" = torchrun ] || [ "${NO_SSH:-0}" != 0 ]; then  # run on every node: which one?
  if [ -z "${NODE_RANK:-}" ]; then echo "launch.sh: NODE_RANK is not set: a 2-node launch runs this script on every node with NODE_RANK=<this node's rank, 0..1>" >&2; exit 2; fi
fi
if [ -z "${MASTER_ADDR:-}" ] && [ "$(awk '!/^#/ && NF {print $1; exit}' "$HOSTFILE")" = node-0 ] &&
   grep -qF '# Replace node-NN with your host names' "$HOSTFILE"; then
  echo "launch.sh: MASTER_ADDR is not set and $HOSTFILE still names the placeholder host node-0: write your host names into it (node 0 first), or set MASTER_ADDR=<node 0's address, the same on every node>" >&2; exit 2
fi
MASTER_ADDR="${MASTER_ADDR:-$(awk '!/^#/ && NF {print $1; exit}' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"
DIST_TIMEOUT_S="${DIST_TIMEOUT_S:-600}"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
# Megatron TP/SP overlap needs kernels queued in order on one hardware queue.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export DSTOOLKIT_RUN_NAME="$RUN_NAME"

TRAIN_ARGS=(--deepspeed_config "$HERE/ds_config.json" --spec "$HERE/../spec.yaml" --steps "$STEPS" --seed "$SEED" --metrics-out "$METRICS_OUT" --dist-timeout-s "$DIST_TIMEOUT_S" --checkpoint-dir "$CKPT_DIR" --save-every "$SAVE_EVERY" --ep-size 1)
TRAIN_ARGS+=("$@")  # extra arguments: to the trainer, whichever launcher

case "${LAUNCHER:-deepspeed}" in
  deepspeed)
    NODE_ARGS=()
    if [ "${NO_SSH:-0}" != 0 ]; then NODE_ARGS=(--no_ssh --node_rank "${NODE_RANK:-0}"); fi
    CMD=(deepspeed --hostfile "$HOSTFILE" "${NODE_ARGS[@]}" --master_addr "$MASTER_ADDR"
         --master_port "$MASTER_PORT" --module "$TRAIN_MODULE" "${TRAIN_ARGS[@]}") ;;
  torchrun)
    CMD=(torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank "${NODE_RANK:-0}"
         --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m "$TRAIN_MODULE" "${TRAIN_ARGS[@]}") ;;
  *)
    echo "launch.sh: LAUNCHER must be deepspeed or torchrun, got ${LAUNCHER@Q}" >&2
    exit 2 ;;
esac
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
# A torch-extension build lock left by a killed build makes every rank wait on it silently: remove it
# (one line naming it) or wait on a live build, saying so (dstoolkit/runtime/jitlock.py).
"${PYTHON:-python}" -m dstoolkit.runtime.jitlock --who launch.sh ||
  echo "launch.sh: torch-extension lock check failed or a build still holds its lock (see above)" >&2
# Run the launcher as a job of its own (its own process group), not exec'ed: on TERM / INT every process
# under it is stopped (the deepspeed runner alone exits on SIGTERM and leaves its ranks training), then
# launch.sh exits 143 (TERM) / 130 (INT). Processes still alive 30 s after the launcher are killed.
job_tree() {  # the pids under $1, itself included (from ps)
  ps -A -o pid= -o ppid= | awk -v root="$1" '{p[$1] = $2} END {t[root] = 1; n = 1; while (n) {n = 0;
    for (c in p) if (!(c in t) && (p[c] in t)) {t[c] = 1; n = 1}} for (c in t) print c}'
}
stop_job() {  # $1: the signal's name, $2: the exit code; a second TERM / INT kills what is left at once
  STOP_RC="$2"; if [ -z "$LAUNCHER_PID" ]; then exit "$STOP_RC"; fi
  STOP_TREE="$(job_tree "$LAUNCHER_PID")"
  trap 'kill -KILL -- -"$LAUNCHER_PID" $STOP_TREE 2>/dev/null; echo "launch.sh: killed the launcher and its ranks" >&2; exit "$STOP_RC"' TERM INT
  kill -"$1" -- -"$LAUNCHER_PID" 2>/dev/null || kill -"$1" "$LAUNCHER_PID" 2>/dev/null || true
  wait "$LAUNCHER_PID" 2>/dev/null || true
  local t pid left
  for ((t = 0; t < 30; t++)); do
    left=""; for pid in $STOP_TREE; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done
    if [ -z "$left" ]; then break; fi; sleep 1
  done
  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; fi
  echo "launch.sh: interrupted by SIG$1: the launcher and its ranks were stopped" >&2
  exit "$STOP_RC"
}
LAUNCHER_PID=""
trap 'stop_job TERM 143' TERM
trap 'stop_job INT 130' INT
set -m
"${CMD[@]}" </dev/null &
LAUNCHER_PID=$!
set +m
RC=0; wait "$LAUNCHER_PID" || RC=$?
exit "$RC"
