#!/usr/bin/env bash
# dstoolkit generate: strategy zero3-offload, accelerate launch with the DeepSpeed plugin (on every node). Regenerate instead of editing.
#
#   bash launch_accelerate.sh YOUR_TRAIN.py [arguments for it ...]
#   DRY_RUN=1 bash launch_accelerate.sh YOUR_TRAIN.py   # print the command instead of running it
# Your arguments follow the generated TrainingArguments flags: a flag you repeat wins. Config paths are
# absolute from this script's folder, so it runs from any directory. MASTER_PORT overrides the port (29500).
# NOTE: No tensor_parallel section (AutoTP) at ZeRO-3, and the estimate is for tp 1: transformers 5 loads a pretrained checkpoint into a ZeRO-3 model through integrations/deepspeed.py _load_state_dict_into_zero3_model, which runs the model's weight conversions through _apply_weight_conversions_to_state_dict (every model has some: conversion_mapping.get_model_conversion_mapping adds the legacy renamings even for Llama), and that raises NotImplementedError ('Weight conversions ... with DeepSpeed Tensor Parallelism are not yet implemented') whenever the DeepSpeed config's tensor_parallel.autotp_size > 1, so from_pretrained fails under HF Trainer / Accelerate (HfDeepSpeedConfig). AutoTP runs at ZeRO stage 0-2 (strategies zero0, zero1, zero2).
# NOTE: Optimizer offload: DeepSpeed JIT-builds its CPU Adam op once per machine (~/.cache/torch_extensions); keep the optimizer from the JSON (no optim=... override).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ME=launch_accelerate.sh
if [ $# -lt 1 ]; then echo "$ME: usage: bash $ME YOUR_TRAIN.py [arguments for it ...]" >&2; exit 2; fi
SCRIPT="$1"; shift
MASTER_PORT="${MASTER_PORT:-29500}"
NODE_ARGS=(--main_process_port "$MASTER_PORT")
CMD=(accelerate launch --config_file "$HERE/accelerate_config.yaml" --deepspeed_config_file "$HERE/ds_config_hf.json" "${NODE_ARGS[@]}" "$SCRIPT" --output_dir checkpoints --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --learning_rate 0.003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --warmup_steps 0 --logging_steps 1 --save_strategy steps --save_steps 1000 --report_to none --lr_scheduler_type constant --bf16 --use_cpu --ddp_backend gloo "$@")
if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "${CMD[@]}"; echo; exit 0; fi
# Run the launcher as a job of its own (its own process group), not exec'ed: on TERM / INT every process
# under it is stopped (the deepspeed runner alone exits on SIGTERM and leaves its ranks training), then
# launch_accelerate.sh exits 143 (TERM) / 130 (INT). Processes still alive 30 s after the launcher are killed.
job_tree() {  # the pids under $1, itself included (from ps)
  ps -A -o pid= -o ppid= | awk -v root="$1" '{p[$1] = $2} END {t[root] = 1; n = 1; while (n) {n = 0;
    for (c in p) if (!(c in t) && (p[c] in t)) {t[c] = 1; n = 1}} for (c in t) print c}'
}
stop_job() {  # $1: the signal's name, $2: the exit code; a second TERM / INT kills what is left at once
  STOP_RC="$2"; if [ -z "$LAUNCHER_PID" ]; then exit "$STOP_RC"; fi
  STOP_TREE="$(job_tree "$LAUNCHER_PID")"
  trap 'kill -KILL -- -"$LAUNCHER_PID" $STOP_TREE 2>/dev/null; echo "launch_accelerate.sh: killed the launcher and its ranks" >&2; exit "$STOP_RC"' TERM INT
  kill -"$1" -- -"$LAUNCHER_PID" 2>/dev/null || kill -"$1" "$LAUNCHER_PID" 2>/dev/null || true
  wait "$LAUNCHER_PID" 2>/dev/null || true
  local t pid left
  for ((t = 0; t < 30; t++)); do
    left=""; for pid in $STOP_TREE; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done
    if [ -z "$left" ]; then break; fi; sleep 1
  done
  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; fi
  echo "launch_accelerate.sh: interrupted by SIG$1: the launcher and its ranks were stopped" >&2
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
