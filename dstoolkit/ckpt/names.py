"""DeepSpeed 0.19.8's checkpoint file names, declared once (runtime/engine.py `_get_ckpt_name`,
`_get_rank_zero_ckpt_name`, `_get_expert_ckpt_name`, `_get_optimizer_ckpt_name`; runtime/pipe/module.py
`ckpt_layer_path`; checkpoint/ds_to_universal.py for the universal `zero/<param>/<state>.pt` layout)."""
from __future__ import annotations

import re

MODEL_STATES = re.compile(r"^mp_rank_(?P<mp>\d+)_model_states\.pt$")
"""ZeRO 0-2 (and pipeline, MoE): one per model-parallel rank, written by data-parallel rank 0."""
ZERO3_MODEL_STATES = re.compile(r"^zero_pp_rank_(?P<dp>\d+)_mp_rank_(?P<mp>\d+)_model_states\.pt$")
"""ZeRO-3: one per data-parallel rank (the weights are partitioned, the file holds placeholders)."""
OPTIM_STATES = re.compile(r"^(?P<bf16>bf16_)?zero_pp_rank_(?P<dp>\d+)_mp_rank_(?P<mp>\d+)_optim_states\.pt$")
"""ZeRO 1-3 optimizer partition of one data-parallel rank (bf16_ prefix: the bf16 optimizer without ZeRO)."""
EXPERT_OPTIM_STATES = re.compile(r"^expp_rank_(?P<ep>\d+)_mp_rank_(?P<mp>\d+)_optim_states\.pt$")
"""MoE without ZeRO: the optimizer of one expert-parallel rank."""
EXPERT_STATES = re.compile(r"^layer_(?P<layer>\d+)_expert_(?P<expert>\d+)_mp_rank_(?P<mp>\d+)_model_states\.pt$")
"""MoE: one file per MoE layer and global expert (ep-independent)."""
PIPE_LAYER = re.compile(r"^layer_(?P<layer>\d+)(?:-(?P<repr>[A-Za-z0-9_-]+?))?-model_states\.pt$")
"""Pipeline: one file per layer (and model-parallel rank), written by the stage that owns the layer."""
LATEST = "latest"
LATEST_UNIVERSAL = "latest_universal"
UNIVERSAL_ZERO_DIR = "zero"
UNIVERSAL_STATE_FILES = ("fp32.pt", "exp_avg.pt", "exp_avg_sq.pt")
DSTOOLKIT_MANIFEST = "dstoolkit_manifest.json"
"""The project's trainer writes it (dstoolkit/runtime/train/ckpt.py): size and SHA-256 of every file."""
HF_TRAINER_STATE = "trainer_state.json"
HF_CHECKPOINT_DIR = re.compile(r"^checkpoint-(?P<step>\d+)$")
TRAINER_TAG_PREFIX = "step_"
"""The project trainer's tag names start with it (runtime/train/ckpt.py imports it as `TAG_PREFIX`: step_<8 digits>);
a user's own loop may use it too, without the manifest."""
STEP_TAG = re.compile(rf"^(?:global_step|{TRAINER_TAG_PREFIX})(?P<step>\d+)$")
"""DeepSpeed's default tag global_step<N>; the project's trainer writes step_<8 digits>."""
