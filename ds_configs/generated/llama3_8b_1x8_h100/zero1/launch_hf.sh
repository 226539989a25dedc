#!/usr/bin/env bash
# dstoolkit generate: strategy zero1, HF Trainer with DeepSpeed (torchrun on every node). Regenerate instead of editing.
#
#   bash launch_hf.sh YOUR_TRAIN.py [arguments for it ...]
#   DRY_RUN=1 bash launch_hf.sh YOUR_TRAIN.py   # print the command instead of running it
# Your arguments follow the generated TrainingArguments flags: a flag you repeat wins. Config paths are
# absolute from this script's folder, so it runs from any directory. MASTER_PORT overrides the port (29500).
# NOTE: AutoTP: tensor_parallel.autotp_size=2; DeepSpeed shards the HF model at deepspeed.initialize (HF Trainer passes the config through). Ranks of one TP group must see the same batch; data parallel size is 4.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ME=launch_hf.sh
if [ $# -lt 1 ]; then echo "$ME: usage: bash $ME YOUR_TRAIN.py [arguments for it ...]" >&2; exit 2; fi
SCRIPT="$1"; shift
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_ARGS=(--standalone)
CMD=(torchrun "${NODE_ARGS[@]}" --nproc_per_node 8 "$SCRIPT" --deepspeed "$HERE/ds_config_hf.json" --output_dir checkpoints --per_device_train_batch_size 1 --gradient_accumulation_steps 32 --learning_rate 0.0003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --warmup_steps 2000 --logging_steps 1 --save_strategy steps --save_steps 1000 --report_to none --max_steps 100000 --bf16 "$@")
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
