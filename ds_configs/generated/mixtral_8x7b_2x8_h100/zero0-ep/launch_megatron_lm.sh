#!/usr/bin/env bash
# dstoolkit generate: Megatron-LM launch, strategy zero0-ep. Regenerate instead of editing.
#
#   PRETRAIN=/path/to/Megatron-LM/pretrain_gpt.py bash launch_megatron_lm.sh   # on every node, NODE_RANK=k
#   DATA_ARGS='--data-path ... --tokenizer-type ... --tokenizer-model ...' overrides the data arguments
#   extra arguments go to pretrain_gpt.py after the file's (argparse: the last occurrence wins)
# The arguments are read one per line into an array (mapfile), so no value is split or re-quoted.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PRETRAIN="${PRETRAIN:-Megatron-LM/pretrain_gpt.py}"
NNODES="${NNODES:-2}"
NODE_RANK="${NODE_RANK:-0}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
MASTER_ADDR="${MASTER_ADDR:-localhost}"
MASTER_PORT="${MASTER_PORT:-29500}"
DATA_ARGS="${DATA_ARGS:---mock-data --tokenizer-type NullTokenizer}"
export CUDA_DEVICE_MAX_CONNECTIONS=1
mapfile -t ARGS < "$HERE/megatron_lm_args.txt"
read -r -a DATA <<< "$DATA_ARGS"
exec torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    "$PRETRAIN" "${ARGS[@]}" "${DATA[@]}" "$@"
