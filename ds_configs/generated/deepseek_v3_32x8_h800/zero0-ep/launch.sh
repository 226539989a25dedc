#!/usr/bin/env bash
# dstoolkit generate: strategy zero0-ep. Regenerate instead of editing.
#
#   bash launch.sh                      # deepspeed launcher, with the hostfile next to this script
#   LAUNCHER=torchrun bash launch.sh    # torchrun alternative (multi-node: run on every node, set NODE_RANK)
#   DRY_RUN=1 bash launch.sh            # print the command instead of running it
#   bash launch.sh --no-progress        # extra arguments go to the trainer
#
# Overrides (environment): STEPS, SEED, METRICS_OUT, HOSTFILE, MASTER_ADDR, MASTER_PORT, NODE_RANK,
# TRAIN_MODULE (default: the dstoolkit example trainer; Megatron users: see megatron_args.txt).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

RUN_NAME=deepseek_v3_32x8_h800
NNODES=32
NPROC_PER_NODE=8
TRAIN_MODULE="${TRAIN_MODULE:-dstoolkit.train.trainer}"
STEPS="${STEPS:-20}"
SEED="${SEED:-0}"
METRICS_OUT="${METRICS_OUT:-$HERE/metrics.jsonl}"
HOSTFILE="${HOSTFILE:-$HERE/hostfile}"
MASTER_ADDR="${MASTER_ADDR:-$(awk '!/^#/ && NF {print $1; exit}' "$HOSTFILE")}"
MASTER_PORT="${MASTER_PORT:-29500}"

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
export DSTOOLKIT_RUN_NAME="$RUN_NAME"

TRAIN_ARGS=(--deepspeed_config "$HERE/ds_config.json" --spec "$HERE/../spec.yaml" --steps "$STEPS" --seed "$SEED" --metrics-out "$METRICS_OUT" --ep-size 16)

case "${LAUNCHER:-deepspeed}" in
  deepspeed)
    CMD=(deepspeed --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
         --module "$TRAIN_MODULE" "${TRAIN_ARGS[@]}") ;;
  torchrun)
    CMD=(torchrun --nnodes "$NNODES" --nproc_per_node "$NPROC_PER_NODE" --node_rank "${NODE_RANK:-0}"
         --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" -m "$TRAIN_MODULE" "${TRAIN_ARGS[@]}" "$@") ;;
  *)
    echo "launch.sh: LAUNCHER must be deepspeed or torchrun, got ${LAUNCHER@Q}" >&2
    exit 2 ;;
esac
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
