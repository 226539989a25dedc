#!/usr/bin/env bash
# dstoolkit generate: strategy zero1, accelerate launch with the DeepSpeed plugin (on every node). Regenerate instead of editing.
#
#   bash launch_accelerate.sh YOUR_TRAIN.py [arguments for it ...]
#   DRY_RUN=1 bash launch_accelerate.sh YOUR_TRAIN.py   # print the command instead of running it
# Your arguments follow the generated TrainingArguments flags: a flag you repeat wins. Config paths are
# absolute from this script's folder, so it runs from any directory. MASTER_PORT overrides the port (29500).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ME=launch_accelerate.sh
if [ $# -lt 1 ]; then echo "$ME: usage: bash $ME YOUR_TRAIN.py [arguments for it ...]" >&2; exit 2; fi
SCRIPT="$1"; shift
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_ARGS=(--main_process_port "$MASTER_PORT")
CMD=(accelerate launch --config_file "$HERE/accelerate_config.yaml" --deepspeed_config_file "$HERE/ds_config_hf.json" "${NODE_ARGS[@]}" "$SCRIPT" --output_dir checkpoints --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --learning_rate 0.003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --warmup_steps 0 --logging_steps 1 --save_strategy steps --save_steps 1000 --report_to none --lr_scheduler_type constant --bf16 --use_cpu --ddp_backend gloo "$@")
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
exec "${CMD[@]}"
