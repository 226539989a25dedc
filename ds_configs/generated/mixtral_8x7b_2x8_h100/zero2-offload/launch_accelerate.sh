#!/usr/bin/env bash
# accelerate launch with the DeepSpeed plugin.
# NOTE: AutoTP: tensor_parallel.autotp_size=2; DeepSpeed shards the HF model at deepspeed.initialize (HF Trainer passes the config through). Ranks of one TP group must see the same batch; data parallel size is 8.
# NOTE: Optimizer offload: DeepSpeed JIT-builds its CPU Adam op once per machine (~/.cache/torch_extensions); keep the optimizer from the JSON (no optim=... override).
# NOTE: Ulysses sequence parallelism is not generated for HF: sequence_parallel_size in the JSON only changes DeepSpeed's batch arithmetic; the script itself must register deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF and pass its mpu to deepspeed.initialize, which HF Trainer does not do
set -euo pipefail
accelerate launch --config_file accelerate_config.yaml --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port 29500 your_train.py --output_dir out --per_device_train_batch_size 16 --gradient_accumulation_steps 2 --learning_rate 0.0003 --adam_beta1 0.9 --adam_beta2 0.95 --adam_epsilon 1e-08 --weight_decay 0.1 --max_grad_norm 1.0 --warmup_steps 1000 --logging_steps 1 --save_strategy no --report_to none --max_steps 50000 --bf16 --gradient_checkpointing
