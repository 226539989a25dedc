#!/usr/bin/env bash
# HF Trainer with DeepSpeed; run on every node.
# NOTE: Ulysses sequence parallelism is not generated for HF: sequence_parallel_size in the JSON only changes DeepSpeed's batch arithmetic; the script itself must register deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF and pass its mpu to deepspeed.initialize, which HF Trainer does not do
set -euo pipefail
torchrun --standalone --nproc_per_node 2 your_train.py --output_dir out --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --learning_rate 0.003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --warmup_steps 0 --logging_steps 1 --save_strategy no --report_to none --bf16 --use_cpu --ddp_backend gloo --deepspeed ds_config_hf.json
