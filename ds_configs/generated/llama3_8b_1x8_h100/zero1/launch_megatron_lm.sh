#!/usr/bin/env bash
# dstoolkit generate: Megatron-LM launch, strategy zero1. Regenerate instead of editing.
#
#   PRETRAIN=/path/to/Megatron-LM/pretrain_gpt.py bash launch_megatron_lm.sh   # on every node, NODE_RANK=k
#   (without PRETRAIN: PRETRAIN_DEFAULT below, relative to where you launch unless absolute; the script stops
#   before starting ranks if it is not a file)
#   DATA_ARGS='--data-path ... --tokenizer-type ... --tokenizer-model ...' is required (MOCK_DATA=1 instead: Megatron-LM's synthetic tokens)
#   extra arguments go to pretrain_gpt.py after the file's (argparse: the last occurrence wins)
# The arguments are read one per line into an array (mapfile), so no value is split or re-quoted.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PRETRAIN_DEFAULT=Megatron-LM/pretrain_gpt.py
PRETRAIN="${PRETRAIN:-$PRETRAIN_DEFAULT}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
if [[ "$NNODES" -gt 1 ]]; then  # one job over the nodes: each node must say who it is and where rank 0 is
    if [ -z "${NODE_RANK:-}" ]; then echo "launch_megatron_lm.sh: NODE_RANK is not set: a $NNODES-node launch runs this script on every node with NODE_RANK=<this node's rank, 0..$((NNODES - 1))>" >&2; exit 2; fi
    [[ -n "${MASTER_ADDR:-}" ]] || { echo "launch_megatron_lm.sh: MASTER_ADDR is not set: the address of node 0, the same on every node" >&2; exit 2; }
fi
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
if [[ ! -f "$PRETRAIN" ]]; then
    echo "launch_megatron_lm.sh: PRETRAIN=${PRETRAIN@Q} is not a file (from $PWD): set PRETRAIN=/path/to/Megatron-LM/pretrain_gpt.py (or dstoolkit generate --pretrain-script PATH)" >&2; exit 2
fi
if [[ -z "${DATA_ARGS:-}" ]]; then
    if [[ "${MOCK_DATA:-0}" == 1 ]]; then
        echo "launch_megatron_lm.sh: MOCK_DATA=1: training on Megatron-LM synthetic tokens (--mock-data), not on a dataset" >&2
        DATA_ARGS="--mock-data --tokenizer-type NullTokenizer"
    else
        echo "launch_megatron_lm.sh: DATA_ARGS is not set: DATA_ARGS='--data-path PREFIX --tokenizer-type ... [--tokenizer-model ...]', or MOCK_DATA=1 for synthetic data" >&2; exit 2
    fi
fi
export CUDA_DEVICE_MAX_CONNECTIONS=1
mapfile -t ARGS < "$HERE/megatron_lm_args.txt"
read -r -a DATA <<< "$DATA_ARGS"
CMD=(torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE"
     --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
     "$PRETRAIN" "${ARGS[@]}" "${DATA[@]}" "$@")
# Run the launcher as a job of its own (its own process group), not exec'ed: on TERM / INT every process
# under it is stopped (the deepspeed runner alone exits on SIGTERM and leaves its ranks training), then
# launch_megatron_lm.sh exits 143 (TERM) / 130 (INT). Processes still alive 30 s after the launcher are killed.
job_tree() {  # the pids under $1, itself included (from ps)
  ps -A -o pid= -o ppid= | awk -v root="$1" '{p[$1] = $2} END {t[root] = 1; n = 1; while (n) {n = 0;
    for (c in p) if (!(c in t) && (p[c] in t)) {t[c] = 1; n = 1}} for (c in t) print c}'
}
stop_job() {  # $1: the signal's name, $2: the exit code; a second TERM / INT kills what is left at once
  STOP_RC="$2"; if [ -z "$LAUNCHER_PID" ]; then exit "$STOP_RC"; fi
  STOP_TREE="$(job_tree "$LAUNCHER_PID")"
  trap 'kill -KILL -- -"$LAUNCHER_PID" $STOP_TREE 2>/dev/null; echo "launch_megatron_lm.sh: killed the launcher and its ranks" >&2; exit "$STOP_RC"' TERM INT
  kill -"$1" -- -"$LAUNCHER_PID" 2>/dev/null || kill -"$1" "$LAUNCHER_PID" 2>/dev/null || true
  wait "$LAUNCHER_PID" 2>/dev/null || true
  local t pid left
  for ((t = 0; t < 30; t++)); do
    left=""; for pid in $STOP_TREE; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done
    if [ -z "$left" ]; then break; fi; sleep 1
  done
  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; fi
  echo "launch_megatron_lm.sh: interrupted by SIG$1: the launcher and its ranks were stopped" >&2
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
